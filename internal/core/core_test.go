package core

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/manifest"
	"math/big"
	"time"
)

const minimalManifest = `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}}}`

type stores struct{ data, key *memstore.Store }

func newStores() stores { return stores{memstore.New(), memstore.New()} }

func newCore(t *testing.T, s stores) *Core {
	t.Helper()
	c, err := New(context.Background(), Options{Data: s.data, Key: s.key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func load(t *testing.T, s store.Store) []byte {
	t.Helper()
	b, _, err := s.Load(context.Background())
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTransitionTable(t *testing.T) {
	for _, tc := range []struct {
		from State
		on   event
		to   State
		ok   bool
	}{
		{StateUninitialized, eventStartFresh, StateAcceptingManifest, true},
		{StateUninitialized, eventStartSealed, StateAcceptingMarbles, true},
		{StateUninitialized, eventStartUnreadable, StateRecovery, true},
		{StateAcceptingManifest, eventManifestSet, StateAcceptingMarbles, true},
		{StateRecovery, eventManifestSet, StateAcceptingMarbles, true},
		{StateRecovery, eventRecovered, StateAcceptingMarbles, true},
		{StateAcceptingMarbles, eventManifestSet, StateAcceptingMarbles, false},
		{StateAcceptingManifest, eventRecovered, StateAcceptingManifest, false},
		{StateAcceptingMarbles, eventStartFresh, StateAcceptingMarbles, false},
	} {
		got, err := next(tc.from, tc.on)
		if tc.ok != (err == nil) || got != tc.to {
			t.Errorf("next(%d, %s) = %d, %v", tc.from, tc.on, got, err)
		}
		if err != nil && !errors.Is(err, ErrWrongState) {
			t.Errorf("error %v is not ErrWrongState", err)
		}
	}
	for op, states := range allowedIn {
		for _, s := range []State{StateRecovery, StateAcceptingManifest, StateAcceptingMarbles} {
			want := false
			for _, a := range states {
				want = want || a == s
			}
			if err := require(s, op); (err == nil) != want {
				t.Errorf("require(%d, %s) = %v", s, op, err)
			}
		}
	}
	for _, s := range []State{StateUninitialized, StateRecovery, StateAcceptingManifest, StateAcceptingMarbles} {
		if s.Message() == "" {
			t.Errorf("state %d has no message", s)
		}
	}
}

func TestFreshSetAndReload(t *testing.T) {
	s := newStores()
	c := newCore(t, s)
	if c.Status() != StateAcceptingManifest {
		t.Fatalf("fresh state %d", c.Status())
	}
	if load(t, s.data) != nil || load(t, s.key) != nil {
		t.Fatal("something was persisted before a manifest was set")
	}
	if _, err := c.Manifest(); !errors.Is(err, ErrWrongState) {
		t.Fatalf("Manifest before set: %v", err)
	}
	root := c.TLSCertificate().Leaf

	secrets, err := c.SetManifest(context.Background(), []byte(minimalManifest))
	if err != nil {
		t.Fatal(err)
	}
	if secrets == nil {
		t.Fatal("nil recovery secrets map")
	}
	if c.Status() != StateAcceptingMarbles {
		t.Fatalf("state after set %d", c.Status())
	}
	if entries, err := seal.DecodeKeyFile(load(t, s.key)); err != nil || len(entries) != 1 || load(t, s.data) == nil {
		t.Fatalf("state not persisted (key file: %d entries, %v)", len(entries), err)
	}
	if _, err := c.SetManifest(context.Background(), []byte(minimalManifest)); !errors.Is(err, ErrWrongState) {
		t.Fatalf("second set: %v", err)
	}

	c2 := newCore(t, s)
	if c2.Status() != StateAcceptingMarbles {
		t.Fatalf("reloaded state %d", c2.Status())
	}
	if !c2.TLSCertificate().Leaf.Equal(root) {
		t.Fatal("root changed across reload")
	}
	m, err := c2.Manifest()
	if err != nil || string(m.Raw) != minimalManifest {
		t.Fatalf("reloaded manifest %q, %v", m.Raw, err)
	}
}

func TestInvalidManifestChangesNothing(t *testing.T) {
	s := newStores()
	c := newCore(t, s)
	for _, raw := range []string{"", "{", `{"Packages":{}}`, `{"Packages":{"p":{}},"Marbles":{"m":{"Package":"q"}}}`} {
		_, err := c.SetManifest(context.Background(), []byte(raw))
		if !errors.Is(err, manifest.ErrInvalid) {
			t.Errorf("%q: err = %v, want ErrInvalid", raw, err)
		}
	}
	if c.Status() != StateAcceptingManifest || load(t, s.data) != nil {
		t.Fatal("state changed")
	}
}

func TestUnreadableStateEntersRecovery(t *testing.T) {
	setUp := func(t *testing.T) stores {
		s := newStores()
		if _, err := newCore(t, s).SetManifest(context.Background(), []byte(minimalManifest)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, s stores)
	}{
		{"missing key", func(t *testing.T, s stores) {
			if _, err := s.key.MoveAside(ctx, "x"); err != nil {
				t.Fatal(err)
			}
		}},
		{"wrong key", func(t *testing.T, s stores) {
			_, rev, _ := s.key.Load(ctx)
			if _, err := s.key.Save(ctx, bytes.Repeat([]byte{7}, 32), rev); err != nil {
				t.Fatal(err)
			}
		}},
		{"short key", func(t *testing.T, s stores) {
			_, rev, _ := s.key.Load(ctx)
			s.key.Save(ctx, []byte{1, 2, 3}, rev)
		}},
		{"corrupt data", func(t *testing.T, s stores) {
			b, rev, _ := s.data.Load(ctx)
			b[len(b)-1] ^= 1
			s.data.Save(ctx, b, rev)
		}},
		{"garbage data", func(t *testing.T, s stores) {
			_, rev, _ := s.data.Load(ctx)
			s.data.Save(ctx, []byte("x"), rev)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := setUp(t)
			tc.break_(t, s)
			data, key := load(t, s.data), load(t, s.key)
			c := newCore(t, s)
			if c.Status() != StateRecovery {
				t.Fatalf("state %d, want recovery", c.Status())
			}
			if _, err := c.Quote(ctx, nil); err != nil {
				t.Fatalf("quote in recovery: %v", err)
			}
			if !bytes.Equal(load(t, s.data), data) || !bytes.Equal(load(t, s.key), key) {
				t.Fatal("stores changed in recovery mode")
			}
			// A new manifest starts over and moves the old blobs aside.
			if _, err := c.SetManifest(ctx, []byte(minimalManifest)); err != nil {
				t.Fatal(err)
			}
			if c.Status() != StateAcceptingMarbles {
				t.Fatalf("state after set %d", c.Status())
			}
			if newCore(t, s).Status() != StateAcceptingMarbles {
				t.Fatal("new state does not load")
			}
		})
	}
}

func TestConcurrentWriterDetected(t *testing.T) {
	s := newStores()
	c := newCore(t, s)
	// Another writer stores a blob behind the Coordinator's back.
	if _, err := s.data.Save(context.Background(), []byte("other"), ""); err != nil {
		t.Fatal(err)
	}
	_, err := c.SetManifest(context.Background(), []byte(minimalManifest))
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("err = %v, want ErrConflict", err)
	}
	if c.Status() != StateAcceptingManifest {
		t.Fatal("state advanced although the write failed")
	}
	if string(load(t, s.data)) != "other" {
		t.Fatal("the other writer's blob was overwritten")
	}
}

func TestSealModeDisabledPersistsNothing(t *testing.T) {
	s := newStores()
	c := newCore(t, s)
	raw := `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}},"Config":{"SealMode":"Disabled"}}`
	if _, err := c.SetManifest(context.Background(), []byte(raw)); err != nil {
		t.Fatal(err)
	}
	if c.Status() != StateAcceptingMarbles || load(t, s.data) != nil || load(t, s.key) != nil {
		t.Fatal("Disabled seal mode persisted state")
	}
}

// failingIssuer fails like a broken quoting enclave (not simulation).
type failingIssuer struct{}

func (failingIssuer) Issue(context.Context, [64]byte) ([]byte, error) {
	return nil, errors.New("quoting enclave unreachable")
}

func TestQuoteFailureAtStart(t *testing.T) {
	s := newStores()
	opts := Options{Data: s.data, Key: s.key, KeySealer: seal.SimulationKeySealer{}, Issuer: failingIssuer{}}
	if _, err := New(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "quoting enclave unreachable") {
		t.Fatalf("a quote failure at start must stop the Coordinator: %v", err)
	}
	opts.AllowQuoteFailure = true
	c, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("development mode: %v", err)
	}
	if res, err := c.Quote(context.Background(), nil); err != nil || res.Quote != nil {
		t.Fatalf("cached quote: %v, %v", res.Quote, err)
	}
	if _, err := c.Quote(context.Background(), []byte("nonce")); err == nil {
		t.Fatal("a fresh quote that fails must be an error")
	}
}

// TestUploadThatBreaksATemplateIsRefused: the templates are dry-run with
// the uploaded values; a plain secret with a NUL used through string in an
// environment variable is refused and nothing is stored or logged.
func TestUploadThatBreaksATemplateIsRefused(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	cert, _ := x509.ParseCertificate(der)
	raw, _ := json.Marshal(map[string]any{
		"Packages": map[string]any{"p": map[string]any{"Debug": true}},
		"Marbles":  map[string]any{"m": map[string]any{"Package": "p", "Parameters": map[string]any{"Env": map[string]any{"PASSWORD": "{{ string .Secrets.pw }}"}}}},
		"Secrets":  map[string]any{"pw": map[string]any{"Type": "plain", "UserDefined": true}},
		"Users":    map[string]any{"alice": map[string]any{"Certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), "Roles": []string{"w"}}},
		"Roles":    map[string]any{"w": map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"pw"}, "Actions": []string{"WriteSecret", "ReadSecret"}}},
	})
	s := newStores()
	c := newCore(t, s)
	if _, err := c.SetManifest(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	peer := []*x509.Certificate{cert}
	blob := load(t, s.data)
	err := c.SetSecrets(context.Background(), peer, map[string]secrets.Upload{"pw": {Key: []byte("pa\x00ss")}})
	var ve *manifest.ValidationError
	if !errors.Is(err, ErrInvalidRequest) || !errors.As(err, &ve) || ve.Name != "m" || ve.Field != "Parameters.Env.PASSWORD" {
		t.Fatalf("err = %v (%+v), want an invalid request naming Marble m's PASSWORD", err, ve)
	}
	got, _ := c.Secrets(context.Background(), peer, []string{"pw"})
	if got["pw"].IsSet() || !bytes.Equal(load(t, s.data), blob) {
		t.Fatal("a refused upload changed the state")
	}
	if err := c.SetSecrets(context.Background(), peer, map[string]secrets.Upload{"pw": {Key: []byte("pass")}}); err != nil {
		t.Fatalf("a good upload: %v", err)
	}
}
