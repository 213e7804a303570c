package integration

import (
	"crypto/tls"
	"net/http"
	"os/exec"
	"strings"
	"testing"
)

// impostor returns a client certificate whose chain is the attacker's own
// self-signed leaf (with its private key) followed by a victim's public
// certificate: what anybody can build from GET /api/v2/manifest.
func impostor(t *testing.T, victim tls.Certificate) tls.Certificate {
	t.Helper()
	own, _ := newUserCert(t, "mallory")
	return tls.Certificate{
		Certificate: [][]byte{own.Certificate[0], victim.Certificate[0]},
		PrivateKey:  own.PrivateKey,
	}
}

// userEndpoint is a request to an endpoint that needs a manifest user.
type userEndpoint struct {
	method, path string
	body         any
	v1           bool
}

// userEndpoints lists every endpoint that needs a user, in both
// generations, each with a body it would accept from an authorised user.
func userEndpoints() []userEndpoint {
	secret := map[string]any{"userkey": map[string]any{"key": make([]byte, 32)}}
	return []userEndpoint{
		{method: http.MethodGet, path: "/api/v2/secrets?s=symkey"},
		{method: http.MethodPost, path: "/api/v2/secrets", body: map[string]any{"secrets": secret}},
		{method: http.MethodPost, path: "/api/v2/update", body: map[string][]byte{"manifest": packageUpdate(2)}},
		{method: http.MethodPost, path: "/api/v2/update-manifest", body: map[string][]byte{"manifest": packageUpdate(2)}},
		{method: http.MethodPost, path: "/api/v2/update-cancel"},
		{method: http.MethodGet, path: "/secrets?s=symkey", v1: true},
		{method: http.MethodPost, path: "/secrets", body: map[string]any{"userkey": map[string]any{"Key": make([]byte, 32)}}, v1: true},
		{method: http.MethodPost, path: "/update", body: packageUpdate(2), v1: true},
		{method: http.MethodPost, path: "/update-manifest", body: packageUpdate(2), v1: true},
		{method: http.MethodPost, path: "/update-cancel", v1: true},
	}
}

// TestLeafOnlyIdentifiesUser: a chain whose leaf is nobody's is refused
// with 401 on every endpoint that needs a user, even when a user's public
// certificate follows it (decision D14); the state does not change.
func TestLeafOnlyIdentifiesUser(t *testing.T) {
	c := startCoordinator(t, "")
	f := newFixture(t)
	expect(t, setManifest(t, c, c.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	alice := f.users["alice"].cert
	for _, victim := range []string{"alice", "bob"} {
		fake := impostor(t, f.users[victim].cert)
		hc := c.client(nil, &fake)
		for _, ep := range userEndpoints() {
			t.Run(victim+" "+ep.method+" "+ep.path, func(t *testing.T) {
				r := do(t, hc, ep.method, c.url(ep.path), ep.body)
				if ep.v1 {
					expectV1(t, r, http.StatusUnauthorized, "error")
				} else {
					expect(t, r, http.StatusUnauthorized, "fail")
				}
				if !strings.Contains(r.Message, "client certificate") {
					t.Fatalf("message %q does not name the client certificate", r.Message)
				}
			})
		}
	}
	// Nothing changed: the user-defined secret is still unset, the package
	// still at version 1, no update pending.
	ac := c.client(nil, &alice)
	if got := getSecrets(t, c, ac, "userkey")["userkey"]; len(got.Private) != 0 {
		t.Fatal("the impostor set a secret")
	}
	if entries := getLog(t, c, ac); len(entries) != 1 { // "Initial manifest set"
		t.Fatalf("the update log has entries: %+v", entries)
	}
	expect(t, do(t, ac, http.MethodGet, c.url("/api/v2/update-manifest"), nil), http.StatusNotFound, "fail")
	// The user's own leaf, followed by anything, still works.
	chain := tls.Certificate{Certificate: [][]byte{alice.Certificate[0], f.users["bob"].cert.Certificate[0]}, PrivateKey: alice.PrivateKey}
	getSecrets(t, c, c.client(nil, &chain), "symkey")
}

// TestV1RecoverOffByDefault: in recovery mode the unsigned v1 recover is
// refused with 403 naming the setting (D11); the state stays in recovery,
// and the signed v2 recover still works.
func TestV1RecoverOffByDefault(t *testing.T) {
	s := newRecoverySetup(t, 1, 0)
	s.breakKey(t)
	anon := s.c.client(nil, nil)
	r := do(t, anon, http.MethodPost, s.c.url("/recover"), toInts(s.secrets["key1"]))
	expectV1(t, r, http.StatusForbidden, "error")
	for _, want := range []string{"--enable-v1-recover", "QUARRY_ENABLE_V1_RECOVER=1", "/api/v2/recover", "signature"} {
		if !strings.Contains(r.Message, want) {
			t.Errorf("message %q does not contain %q", r.Message, want)
		}
	}
	expectState(t, s.c, anon, 1, msgRecovery)
	s.upload(t, "key1", 0)
	s.checkRecovered(t)
}

// TestNewSettingsOnTheCommandLine: the new settings appear in --help (the
// v1 recover switch with its reason), bad values stop the Coordinator with
// exit code 2 naming the setting, and the secret limits reach the core.
func TestNewSettingsOnTheCommandLine(t *testing.T) {
	out, err := exec.Command(coordinatorBin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, want := range []string{"-enable-v1-recover", "QUARRY_ENABLE_V1_RECOVER", "carries no signature",
		"-max-secrets", "QUARRY_MAX_SECRETS", "-max-secret-generation", "QUARRY_MAX_SECRET_GENERATION"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("--help does not mention %q", want)
		}
	}
	for _, tc := range []struct{ env, want string }{
		{"QUARRY_ENABLE_V1_RECOVER=yes", "enable-v1-recover [QUARRY_ENABLE_V1_RECOVER]"},
		{"QUARRY_MAX_SECRETS=-3", "max-secrets [QUARRY_MAX_SECRETS]"},
		{"QUARRY_MAX_SECRET_GENERATION=forever", "max-secret-generation [QUARRY_MAX_SECRET_GENERATION]"},
	} {
		code, log := runCoordinatorOnce(t, tc.env)
		if code != 2 || !strings.Contains(log, tc.want) {
			t.Errorf("%s: exit %d, want 2 naming %q\n%s", tc.env, code, tc.want, log)
		}
	}

	c := startCoordinator(t, "", "QUARRY_MAX_SECRETS=2")
	r := setManifest(t, c, c.client(nil, nil), newFixture(t).bytes(t)) // three secrets
	expect(t, r, http.StatusBadRequest, "fail")
	if !strings.Contains(r.Message, "at most 2 (QUARRY_MAX_SECRETS)") {
		t.Fatalf("message %q", r.Message)
	}
	c = startCoordinator(t, "", "QUARRY_MAX_SECRET_GENERATION=1ms")
	f := newFixture(t)
	f.set("Secrets.rsa", map[string]any{"Type": "cert-rsa", "Size": 2048, "Shared": true})
	r = setManifest(t, c, c.client(nil, nil), f.bytes(t))
	expect(t, r, http.StatusBadRequest, "fail")
	if !strings.Contains(r.Message, "QUARRY_MAX_SECRET_GENERATION") {
		t.Fatalf("message %q", r.Message)
	}
	// Without limits the same manifest is accepted.
	c = startCoordinator(t, "", "QUARRY_MAX_SECRETS=0", "QUARRY_MAX_SECRET_GENERATION=0")
	expect(t, setManifest(t, c, c.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
}
