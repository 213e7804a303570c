package marble_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/marble"
)

// counterServer is a Client API stand-in presenting a's root as its TLS
// certificate, as the Coordinator does, answering with h.
func counterServer(t *testing.T, a *ca.Authority, h http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{a.Root.Raw}, PrivateKey: a.RootKey}},
		ClientAuth:   tls.RequestClientCert,
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "https://")
}

func TestMonotonicCounter(t *testing.T) {
	a := newCA(t)
	c := credentials(t, issue(t, a, "backend"))
	ctx := context.Background()
	var got struct {
		Name  string `json:"name"`
		Value uint64 `json:"value"`
	}
	addr := counterServer(t, a, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/api/v2/monotonic-counter" {
			t.Errorf("request %s %s", r.Method, r.URL.Path)
		}
		if len(r.TLS.PeerCertificates) == 0 || !r.TLS.PeerCertificates[0].Equal(c.Certificate.Leaf) {
			t.Error("the Marble did not present its Marble certificate")
		}
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Error(err)
		}
		switch got.Name {
		case "off":
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"status":"fail","data":null,"message":"MonotonicCounter feature is not enabled in the manifest"}`)
		case "broken":
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, `<html>proxy</html>`)
		case "odd":
			io.WriteString(w, `{"status":"success","data":"seven"}`)
		default:
			io.WriteString(w, `{"status":"success","data":{"value":41}}`)
		}
	})

	if v, err := c.MonotonicCounter(ctx, addr, "requests", 42); err != nil || v != 41 || got.Name != "requests" || got.Value != 42 {
		t.Errorf("MonotonicCounter = %d, %v (sent %+v); want 41 for requests=42", v, err, got)
	}
	if v, err := c.ReadMonotonicCounter(ctx, addr, "requests"); err != nil || v != 41 || got.Value != 0 {
		t.Errorf("ReadMonotonicCounter = %d, %v (sent %+v); want 41 for value 0", v, err, got)
	}

	var ce *marble.CounterError
	_, err := c.MonotonicCounter(ctx, addr, "off", 1)
	if !errors.As(err, &ce) || ce.HTTPStatus != 403 || ce.Status != "fail" || ce.Message != "MonotonicCounter feature is not enabled in the manifest" {
		t.Errorf("feature gate off: %v, want the 403 fail with its message", err)
	}
	_, err = c.MonotonicCounter(ctx, addr, "broken", 1)
	if !errors.As(err, &ce) || ce.HTTPStatus != 502 || ce.Status != "" {
		t.Errorf("not JSend: %v, want a CounterError without JSend status", err)
	}
	if _, err = c.MonotonicCounter(ctx, addr, "odd", 1); !errors.As(err, &ce) {
		t.Errorf("success with data of another shape: %v, want a CounterError", err)
	}

	// Another Coordinator (another root) at the address: refused before
	// anything is sent.
	other := credentials(t, issue(t, newCA(t), "backend"))
	got.Name = ""
	if _, err := other.MonotonicCounter(ctx, addr, "requests", 50); !errors.Is(err, marble.ErrNotCoordinatorRoot) || got.Name != "" {
		t.Errorf("another root: %v (sent %+v), want ErrNotCoordinatorRoot and nothing sent", err, got)
	}
	// A server presenting a Marble certificate of the right Coordinator
	// is no Coordinator either.
	impostor := httptest.NewUnstartedServer(http.NotFoundHandler())
	impostor.TLS = &tls.Config{Certificates: []tls.Certificate{c.Certificate}}
	impostor.Config.ErrorLog = log.New(io.Discard, "", 0)
	impostor.StartTLS()
	defer impostor.Close()
	if _, err := c.MonotonicCounter(ctx, strings.TrimPrefix(impostor.URL, "https://"), "requests", 50); !errors.Is(err, marble.ErrNotCoordinatorRoot) {
		t.Errorf("a Marble certificate as server: %v, want ErrNotCoordinatorRoot", err)
	}
	if _, err := c.MonotonicCounter(ctx, addr, "", 1); err == nil {
		t.Error("empty name accepted")
	}
	if _, err := c.MonotonicCounter(ctx, "https://"+addr, "x", 1); err == nil || !strings.Contains(err.Error(), "host:port") {
		t.Errorf("URL instead of host:port: %v", err)
	}
}
