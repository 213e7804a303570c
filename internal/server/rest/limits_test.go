package rest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// noFilesStore fails every save as a file store does when the process has
// no file descriptor left.
type noFilesStore struct {
	*memstore.Store
	fail atomic.Bool
}

func (s *noFilesStore) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	if s.fail.Load() {
		return "", &os.PathError{Op: "open", Path: "/seal/sealed_key", Err: syscall.EMFILE}
	}
	return s.Store.Save(ctx, blob, prev)
}

// TestNoFilesAnswers503: a state change whose commit fails because the
// process is out of file descriptors (EMFILE) is answered 503 with
// Retry-After and a message saying so, not 500; the cause is logged. Once
// descriptors are free again the same request succeeds.
func TestNoFilesAnswers503(t *testing.T) {
	data, key := &noFilesStore{Store: memstore.New()}, &noFilesStore{Store: memstore.New()}
	c, err := core.New(context.Background(), core.Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	h := New(c, Options{MaxManifestBytes: 1 << 20, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	data.fail.Store(true)
	key.fail.Store(true)
	body, _ := json.Marshal(map[string][]byte{"manifest": []byte(`{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}}}`)})
	for _, path := range []string{"/api/v2/manifest", "/manifest"} {
		raw := body
		if path == "/manifest" {
			raw = []byte(`{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}}}`)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(raw)))
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "too many open files") ||
			strings.Contains(w.Body.String(), "sealed_key") {
			t.Fatalf("%s: answer %d Retry-After %q: %s", path, w.Code, w.Header().Get("Retry-After"), w.Body.String())
		}
	}
	if !strings.Contains(logs.String(), "sealed_key") {
		t.Fatalf("the cause is not logged: %s", logs.String())
	}
	if c.Status() != core.StateAcceptingManifest {
		t.Fatalf("state %d after the failed commits", c.Status())
	}
	data.fail.Store(false)
	key.fail.Store(false)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/api/v2/manifest", bytes.NewReader(body)))
	if w.Code != http.StatusOK {
		t.Fatalf("after the descriptors are back: %d %s", w.Code, w.Body.String())
	}
}

// blockingCore is a Coordinator whose update log waits until release is
// closed.
type blockingCore struct {
	Coordinator
	entered chan struct{}
	release chan struct{}
}

func (b blockingCore) UpdateLog(ctx context.Context) ([]string, error) {
	b.entered <- struct{}{}
	select {
	case <-b.release:
		return []string{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestRequestsPerSource429: a source with as many requests in progress as
// allowed gets 429 with Retry-After for the next, also over one HTTP/2
// connection with many streams; another source is served meanwhile, and
// the first is served again once its requests are answered.
func TestRequestsPerSource429(t *testing.T) {
	bc := blockingCore{entered: make(chan struct{}, 16), release: make(chan struct{})}
	srv := httptest.NewUnstartedServer(New(bc, Options{MaxManifestBytes: 4096, MaxRequestsPerSource: 2}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	client := func(src string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		tr := &http.Transport{DialContext: d.DialContext, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, ForceAttemptHTTP2: true}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second}
	}
	get := func(hc *http.Client) (*http.Response, string) {
		resp, err := hc.Get(srv.URL + "/api/v2/update")
		if err != nil {
			t.Error(err)
			return nil, ""
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp, string(raw)
	}
	one := client("127.0.0.1")
	done := make(chan int, 2)
	for range 2 {
		go func() {
			resp, _ := get(one)
			if resp == nil {
				done <- 0
				return
			}
			if resp.ProtoMajor != 2 {
				t.Errorf("%s, want HTTP/2", resp.Proto)
			}
			done <- resp.StatusCode
		}()
	}
	<-bc.entered
	<-bc.entered
	resp, body := get(one)
	if resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(body, "your address") || !strings.Contains(body, `"status":"fail"`) {
		t.Fatalf("a third request from the same address: %v %s", resp, body)
	}
	other := make(chan int, 1)
	go func() {
		resp, _ := get(client("127.0.0.2"))
		if resp == nil {
			other <- 0
			return
		}
		other <- resp.StatusCode
	}()
	<-bc.entered // the other address got in
	close(bc.release)
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Fatalf("an admitted request: %d", code)
		}
	}
	if code := <-other; code != http.StatusOK {
		t.Fatalf("the other address: %d", code)
	}
	if resp, body := get(one); resp == nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after the answers: %v %s", resp, body)
	}
}
