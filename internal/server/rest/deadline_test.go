package rest

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// slowCore is a Coordinator whose update log waits for its context to end.
type slowCore struct{ Coordinator }

func (slowCore) UpdateLog(ctx context.Context) ([]string, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestRequestDeadline: a use case still running at the request's deadline
// is answered 503 with Retry-After, in the request's generation, and its
// cause is logged, not shown.
func TestRequestDeadline(t *testing.T) {
	h := New(slowCore{}, Options{MaxManifestBytes: 4096, RequestTimeout: time.Millisecond})
	for _, tc := range []struct{ path, prefix string }{
		{"/api/v2/update", `{"status":"error",`},
		{"/update", `{"Status":"error",`},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, tc.path, nil))
		body := w.Body.String()
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.HasPrefix(body, tc.prefix) ||
			!json.Valid([]byte(body)) || !strings.Contains(body, "did not finish within") || strings.Contains(body, "deadline exceeded") {
			t.Errorf("%s: answer %d Retry-After %q: %s", tc.path, w.Code, w.Header().Get("Retry-After"), body)
		}
	}
}

// stallingStore is a data store whose armed Save stalls until the request's
// deadline and then fails: after writing (landed), or not. Once it has
// failed, every later Save fails too and, if unreadable, every Load.
type stallingStore struct {
	store.Store
	landed, unreadable bool

	mu            sync.Mutex
	armed, failed bool
}

func (s *stallingStore) arm() {
	s.mu.Lock()
	s.armed = true
	s.mu.Unlock()
}

func (s *stallingStore) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	s.mu.Lock()
	armed, failed := s.armed, s.failed
	s.mu.Unlock()
	switch {
	case failed:
		return "", errors.New("disk broken")
	case !armed:
		return s.Store.Save(ctx, blob, prev)
	}
	if s.landed {
		if _, err := s.Store.Save(context.WithoutCancel(ctx), blob, prev); err != nil {
			return "", err
		}
	}
	<-ctx.Done()
	s.mu.Lock()
	s.failed = true
	s.mu.Unlock()
	return "", fmt.Errorf("disk stalled: %w", ctx.Err())
}

func (s *stallingStore) Load(ctx context.Context) ([]byte, store.Revision, error) {
	s.mu.Lock()
	broken := s.failed && s.unreadable
	s.mu.Unlock()
	if broken {
		return nil, "", errors.New("disk unreadable")
	}
	return s.Store.Load(ctx)
}

// TestRequestDeadlineSaysWhatWasStored: a change that fails past the
// request's deadline is answered with what the core knows it left in the
// store: nothing (the store kept the old state: retry), the change itself
// (it landed and the old state could not be put back: do not repeat it),
// or unknown (the store could not be read back: check first). A fresh
// Coordinator on the same store finds what the answer said.
func TestRequestDeadlineSaysWhatWasStored(t *testing.T) {
	for _, tc := range []struct {
		name               string
		landed, unreadable bool
		want, wantNot      string
		counter            uint64 // what a fresh Coordinator finds
	}{
		{"nothing stored", false, false, "was abandoned; nothing was stored; retry later", "WAS stored", 0},
		{"stored", true, false, "the change WAS stored, but the store reported an error afterwards (see the Coordinator's log); do not repeat the request", "nothing was stored", 5},
		{"unknown", true, true, "whether the change was stored is unknown (the store could not be read back); check the state before repeating", "nothing was stored", 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			data := &stallingStore{Store: memstore.New(), landed: tc.landed, unreadable: tc.unreadable}
			keys := memstore.New()
			c, err := core.New(ctx, core.Options{Data: data, Key: keys, KeySealer: seal.SimulationKeySealer{}})
			if err != nil {
				t.Fatal(err)
			}
			// The deadline must pass while the write stalls, not before
			// the commit begins (then nothing is stored, rightly said so).
			s := &counterSetup{h: New(c, Options{MaxManifestBytes: 1 << 20, RequestTimeout: time.Second}), c: c}
			raw := `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p","Parameters":{"Argv":["./m"]}}},"Config":{"FeatureGates":["MonotonicCounter"]}}`
			if _, err := c.SetManifest(ctx, []byte(raw)); err != nil {
				t.Fatal(err)
			}
			s.marble = activatedMarble(t, c)
			data.arm()

			code, env := s.post(t, http.MethodPost, counterPath, `{"name":"c","value":5}`, s.marble)
			msg, _ := env["message"].(string)
			if code != http.StatusServiceUnavailable || env["status"] != "error" || !strings.Contains(msg, tc.want) || strings.Contains(msg, tc.wantNot) {
				t.Fatalf("answer %d %v, want 503 saying %q", code, env, tc.want)
			}
			fresh, err := core.New(ctx, core.Options{Data: data.Store, Key: keys, KeySealer: seal.SimulationKeySealer{}})
			if err != nil {
				t.Fatal(err)
			}
			if got, err := fresh.SetMonotonicCounter(ctx, []*x509.Certificate{s.marble}, "c", 0); err != nil || got != tc.counter {
				t.Fatalf("the stored counter is %d (%v), want %d", got, err, tc.counter)
			}
		})
	}
}
