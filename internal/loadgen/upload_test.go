package loadgen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

// TestUploadManifest: the manifest is valid for the Coordinator, and each
// user has exactly one role, which writes exactly its own user-defined
// secret.
func TestUploadManifest(t *testing.T) {
	users, err := NewUploadUsers(3)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := UploadManifest(users)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckManifest(raw); err != nil {
		t.Fatalf("the upload manifest is not valid: %v", err)
	}
	var m struct {
		Secrets map[string]struct{ UserDefined bool }
		Users   map[string]struct{ Roles []string }
		Roles   map[string]struct {
			ResourceNames []string
			Actions       []string
		}
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for _, u := range users {
		roles := m.Users[u.Name].Roles
		if len(roles) != 1 {
			t.Fatalf("user %s has roles %v", u.Name, roles)
		}
		role := m.Roles[roles[0]]
		if !slices.Equal(role.ResourceNames, []string{u.Secret}) || !slices.Equal(role.Actions, []string{"WriteSecret"}) || !m.Secrets[u.Secret].UserDefined {
			t.Fatalf("user %s: role %+v, secret %+v", u.Name, role, m.Secrets[u.Secret])
		}
	}
}

// TestRunUpload: every user uploads its own secret with its own
// certificate, a new 256-bit key each time; refusals count as non-2xx.
func TestRunUpload(t *testing.T) {
	users, err := NewUploadUsers(3)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	keys := map[string]bool{}
	bad := ""
	refuse := false
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req v2.SecretsSetRequest
		err := json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		defer mu.Unlock()
		cn := ""
		if r.TLS != nil && len(r.TLS.PeerCertificates) == 1 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		i := slices.IndexFunc(users, func(u UploadUser) bool { return u.Name == cn })
		switch {
		case r.Method != http.MethodPost || r.URL.Path != v2.PathSecrets || err != nil || i < 0 || len(req.Secrets) != 1:
			bad = r.Method + " " + r.URL.Path + " from " + cn
		case len(req.Secrets[users[i].Secret].Key) != 32:
			bad = cn + " did not upload a 256-bit key for its own secret"
		default:
			keys[string(req.Secrets[users[i].Secret].Key)] = true
		}
		if refuse {
			w.WriteHeader(http.StatusUnauthorized)
		}
		w.Write([]byte(`{"status":"success","data":null}`))
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cfg := &tls.Config{RootCAs: x509.NewCertPool()}
	cfg.RootCAs.AddCert(srv.Certificate())
	addr := srv.Listener.Addr().String()
	eventually(t, 300*time.Millisecond, func(window time.Duration) bool {
		res, err := RunUpload(context.Background(), UploadConfig{Addr: addr, Users: users, Duration: window, TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if bad != "" {
			t.Fatal(bad)
		}
		if res.Errors != 0 || res.Non2xx != 0 {
			t.Fatalf("%d errors, %d non-2xx: %s", res.Errors, res.Non2xx, res.FirstError)
		}
		t.Logf("window %v: %d uploads, %d different keys", window, res.Requests, len(keys))
		return res.Requests >= int64(len(users)) && len(keys) >= len(users)
	})
	mu.Lock()
	refuse = true
	mu.Unlock()
	eventually(t, 300*time.Millisecond, func(window time.Duration) bool {
		res, err := RunUpload(context.Background(), UploadConfig{Addr: addr, Users: users, Duration: window, TLS: cfg})
		if err != nil {
			t.Fatal(err)
		}
		if res.Non2xx != res.Requests {
			t.Fatalf("%d of %d refused uploads counted as non-2xx", res.Non2xx, res.Requests)
		}
		return res.Requests > 0 && res.FirstError != ""
	})
}
