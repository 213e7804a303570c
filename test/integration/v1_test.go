package integration

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// expectV1 checks a v1 answer: the capitalised envelope, the HTTP status and
// "success" or "error" (v1 never answers "fail").
func expectV1(t *testing.T, r response, httpStatus int, status string) {
	t.Helper()
	if r.HTTPStatus != httpStatus || r.Status != status {
		t.Fatalf("got HTTP %d %q, want HTTP %d %q; body %s", r.HTTPStatus, r.Status, httpStatus, status, r.Raw)
	}
	if !bytes.HasPrefix(r.Raw, []byte(`{"Status":"`+status+`","Data":`)) {
		t.Fatalf("not a v1 envelope: %s", r.Raw)
	}
	if r.ContentType != "application/json" {
		t.Fatalf("Content-Type %q", r.ContentType)
	}
}

// v1Data returns the Data member of a v1 answer.
func v1Data(t *testing.T, r response, v any) {
	t.Helper()
	var env struct {
		Data json.RawMessage `json:"Data"`
	}
	if err := json.Unmarshal(r.Raw, &env); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(env.Data, v); err != nil {
		t.Fatalf("data %s: %v", env.Data, err)
	}
}

func TestV1Endpoints(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	anon := c.client(nil, nil)
	_, root := getChain(t, c, anon)

	r := do(t, anon, http.MethodGet, c.url("/status"), nil)
	expectV1(t, r, http.StatusOK, "success")
	var st struct {
		StatusCode    int
		StatusMessage string
	}
	v1Data(t, r, &st)
	if st.StatusCode != 2 || st.StatusMessage != msgReady {
		t.Fatalf("status %+v", st)
	}
	expectV1(t, do(t, anon, http.MethodGet, c.url("/manifest"), nil), http.StatusConflict, "error")

	// POST /manifest takes the manifest itself; those bytes are stored.
	f := newFixture(t)
	key := recoveryKeys(t, 1)[0]
	f.set("RecoveryKeys", map[string]any{"owner": publicKeyPEM(t, key)})
	raw := f.bytes(t)
	r = do(t, anon, http.MethodPost, c.url("/manifest"), raw)
	expectV1(t, r, http.StatusOK, "success")
	var set struct{ RecoverySecrets map[string][]byte }
	v1Data(t, r, &set)
	secret, err := rsa.DecryptOAEP(sha256.New(), nil, key, set.RecoverySecrets["owner"], nil)
	if err != nil {
		t.Fatalf("recovery secret from v1: %v", err)
	}

	r = do(t, anon, http.MethodGet, c.url("/manifest"), nil)
	expectV1(t, r, http.StatusOK, "success")
	var m struct {
		ManifestSignatureRootECDSA []byte
		ManifestSignature          string
		Manifest                   []byte
	}
	v1Data(t, r, &m)
	sum := sha256.Sum256(raw)
	if !bytes.Equal(m.Manifest, raw) || m.ManifestSignature != hex.EncodeToString(sum[:]) ||
		!ecdsa.VerifyASN1(root.PublicKey.(*ecdsa.PublicKey), sum[:], m.ManifestSignatureRootECDSA) {
		t.Fatal("v1 manifest, fingerprint or signature wrong")
	}
	// ...and v2 sees the same manifest.
	checkManifest(t, c, c.client(root, nil), root, raw)

	r = do(t, anon, http.MethodGet, c.url("/quote"), nil)
	expectV1(t, r, http.StatusOK, "success")
	var q struct {
		Cert  string
		Quote *string
	}
	v1Data(t, r, &q)
	if q.Quote != nil || len(parseChain(t, q.Cert)) != 2 {
		t.Fatalf("v1 quote %s", r.Raw)
	}

	alice := f.users["alice"].cert
	bob := f.users["bob"].cert
	ac, bc := c.client(nil, &alice), c.client(nil, &bob)

	// Secrets: v1 upload (Key as an array of byte values) is seen by v2.
	keyBytes := bytes.Repeat([]byte{3}, 32)
	arr, _ := json.Marshal(toInts(keyBytes))
	r = do(t, ac, http.MethodPost, c.url("/secrets"), `{"userkey":{"Key":`+string(arr)+`}}`)
	expectV1(t, r, http.StatusOK, "success")
	if got := getSecrets(t, c, ac, "userkey")["userkey"]; !bytes.Equal(got.Private, keyBytes) {
		t.Fatal("v1 secret upload not visible through v2")
	}
	r = do(t, ac, http.MethodGet, c.url("/secrets?s=userkey&s=symkey"), nil)
	expectV1(t, r, http.StatusOK, "success")
	var secs map[string]struct {
		Type    string
		Private []byte
		Public  []byte
	}
	v1Data(t, r, &secs)
	if secs["userkey"].Type != "symmetric-key" || !bytes.Equal(secs["userkey"].Public, keyBytes) || len(secs["symkey"].Private) != 16 {
		t.Fatalf("v1 secrets %s", r.Raw)
	}
	if !bytes.Contains(r.Raw, []byte(`"Type":"symmetric-key"`)) {
		t.Errorf("v1 secrets must use capitalised names: %s", r.Raw)
	}
	expectV1(t, do(t, anon, http.MethodGet, c.url("/secrets?s=symkey"), nil), http.StatusUnauthorized, "error")

	// Package update through v1, seen in the v2 log; the v1 log is text.
	expectV1(t, do(t, ac, http.MethodPost, c.url("/update"), packageUpdate(2)), http.StatusOK, "success")
	r = do(t, anon, http.MethodGet, c.url("/update"), nil)
	expectV1(t, r, http.StatusOK, "success")
	var text string
	v1Data(t, r, &text)
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if !strings.HasSuffix(text, "\n") || len(lines) != 3 || !strings.Contains(lines[2], "SecurityVersion increased") {
		t.Fatalf("v1 log %q", text)
	}
	if v2log := getLog(t, c, anon); len(v2log) != 3 || v2log[2].Update != "SecurityVersion increased" {
		t.Fatalf("v2 log %+v", v2log)
	}

	// Full update through v1: pending, acknowledged, cancelled.
	next := newFixtureFrom(t, raw, func(f *fixture) { f.set("Packages.extra", map[string]any{"Debug": true}) })
	expectV1(t, do(t, ac, http.MethodPost, c.url("/update"), next), http.StatusOK, "success")
	r = do(t, anon, http.MethodGet, c.url("/update-manifest"), nil)
	expectV1(t, r, http.StatusOK, "success")
	var pending struct {
		Manifest     []byte   `json:"manifest"`
		MissingUsers []string `json:"missingUsers"`
	}
	v1Data(t, r, &pending)
	if !bytes.Equal(pending.Manifest, next) || fmt.Sprint(pending.MissingUsers) != "[bob]" {
		t.Fatalf("v1 pending %s", r.Raw)
	}
	r = do(t, ac, http.MethodPost, c.url("/update-cancel"), nil)
	expectV1(t, r, http.StatusOK, "success")
	var msg string
	v1Data(t, r, &msg)
	if msg != "Update successfully cancelled" {
		t.Fatalf("cancel %q", msg)
	}
	expectV1(t, do(t, ac, http.MethodPost, c.url("/update"), next), http.StatusOK, "success")
	r = do(t, bc, http.MethodPost, c.url("/update-manifest"), next)
	expectV1(t, r, http.StatusOK, "success")
	v1Data(t, r, &msg)
	if msg != "All users have acknowledged the update manifest. Update successfully applied" {
		t.Fatalf("acknowledge %q", msg)
	}
	checkManifest(t, c, c.client(root, nil), root, next)

	// Recovery through v1 is off by default (docs/design/decisions.md#d11): 403 naming the setting.
	r = do(t, anon, http.MethodPost, c.url("/recover"), toInts(secret))
	expectV1(t, r, http.StatusForbidden, "error")
	if !strings.Contains(r.Message, "QUARRY_ENABLE_V1_RECOVER=1") || !strings.Contains(r.Message, "--enable-v1-recover") {
		t.Fatalf("v1 recover disabled: message %q does not name the setting", r.Message)
	}
}

func TestV1Recover(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 2, 0)
	s.c.env = append(s.c.env, "QUARRY_ENABLE_V1_RECOVER=1") // off by default, docs/design/decisions.md#d11
	s.breakKey(t)
	anon := s.c.client(nil, nil)
	for i, name := range []string{"key1", "key2"} {
		r := do(t, anon, http.MethodPost, s.c.url("/recover"), toInts(s.secrets[name]))
		expectV1(t, r, http.StatusOK, "success")
		var d struct {
			StatusMessage string
			Remaining     int
		}
		v1Data(t, r, &d)
		if d.Remaining != 1-i {
			t.Fatalf("remaining %d", d.Remaining)
		}
		if i == 0 {
			// Malformed bodies and a reused share are refused with
			// error, never fail.
			for _, body := range []string{"[1,2,300]", "{", "[]"} {
				expectV1(t, do(t, anon, http.MethodPost, s.c.url("/recover"), body), http.StatusBadRequest, "error")
			}
			expectV1(t, do(t, anon, http.MethodPost, s.c.url("/recover"), toInts(s.secrets[name])), http.StatusBadRequest, "error")
		}
	}
	s.checkRecovered(t)
}

func TestV2ChangesSeenThroughV1(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	f := newFixture(t)
	raw := f.bytes(t)
	expect(t, setManifest(t, c, c.client(nil, nil), raw), http.StatusOK, "success")
	r := do(t, c.client(nil, nil), http.MethodGet, c.url("/manifest"), nil)
	var m struct{ Manifest []byte }
	v1Data(t, r, &m)
	if !bytes.Equal(m.Manifest, raw) {
		t.Fatal("v2 manifest not seen through v1")
	}
	alice := f.users["alice"].cert
	ac := c.client(nil, &alice)
	expect(t, postSecrets(t, c, ac, map[string]any{"userkey": map[string]any{"key": bytes.Repeat([]byte{8}, 32)}}), http.StatusOK, "success")
	r = do(t, ac, http.MethodGet, c.url("/secrets?s=userkey"), nil)
	var secs map[string]struct{ Private []byte }
	v1Data(t, r, &secs)
	if !bytes.Equal(secs["userkey"].Private, bytes.Repeat([]byte{8}, 32)) {
		t.Fatal("v2 upload not seen through v1")
	}
}

func TestV1NeverFails(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", "QUARRY_MAX_MANIFEST_SIZE=4096", "QUARRY_ENABLE_V1_RECOVER=1")
	stranger, _ := newUserCert(t, "stranger")
	sc := c.client(nil, &stranger)
	anon := c.client(nil, nil)
	for _, tc := range []struct {
		method, path string
		hc           *http.Client
		body         any
		status       int
	}{
		{http.MethodGet, "/manifest", anon, nil, http.StatusConflict},
		{http.MethodPost, "/manifest", anon, "not json", http.StatusBadRequest},
		{http.MethodPost, "/manifest", anon, `{"Packages":{}}`, http.StatusBadRequest},
		{http.MethodPost, "/manifest", anon, "", http.StatusBadRequest},
		{http.MethodPost, "/manifest", anon, strings.Repeat("x", 8192), http.StatusRequestEntityTooLarge},
		{http.MethodPost, "/recover", anon, "[1,2,3]", http.StatusConflict},
		{http.MethodPost, "/recover", anon, "[1,2,300]", http.StatusConflict}, // state before body (docs/design/decisions.md#d16)
		{http.MethodPost, "/recover", anon, "{", http.StatusConflict},
		{http.MethodGet, "/secrets", anon, nil, http.StatusBadRequest},
		{http.MethodGet, "/secrets?s=", anon, nil, http.StatusBadRequest},
		{http.MethodGet, "/secrets?s=x", sc, nil, http.StatusConflict},
		{http.MethodPost, "/secrets", sc, "{", http.StatusConflict}, // state before body (docs/design/decisions.md#d16)
		{http.MethodGet, "/update", anon, nil, http.StatusConflict},
		{http.MethodPost, "/update", sc, "not json", http.StatusConflict},
		{http.MethodGet, "/update-manifest", anon, nil, http.StatusNotFound},
		{http.MethodPost, "/update-manifest", sc, "{}", http.StatusConflict},
		{http.MethodPost, "/update-cancel", sc, nil, http.StatusConflict},
		{http.MethodPost, "/status", anon, nil, http.StatusMethodNotAllowed},
		{http.MethodGet, "/nope", anon, nil, http.StatusNotFound},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := do(t, tc.hc, tc.method, c.url(tc.path), tc.body)
			expectV1(t, r, tc.status, "error")
			if bytes.Contains(r.Raw, []byte(`"fail"`)) {
				t.Fatalf("v1 answered fail: %s", r.Raw)
			}
		})
	}
	// With a manifest, the errors of the running state.
	f := newFixture(t)
	expectV1(t, do(t, anon, http.MethodPost, c.url("/manifest"), f.bytes(t)), http.StatusOK, "success")
	expectV1(t, do(t, anon, http.MethodPost, c.url("/manifest"), f.bytes(t)), http.StatusConflict, "error")
	bob := f.users["bob"].cert
	bc := c.client(nil, &bob)
	for _, tc := range []struct {
		method, path string
		hc           *http.Client
		body         any
		status       int
	}{
		{http.MethodGet, "/secrets?s=symkey", sc, nil, http.StatusUnauthorized},
		{http.MethodGet, "/secrets?s=nope", bc, nil, http.StatusNotFound},
		{http.MethodPost, "/secrets", bc, `{"userkey":{"Key":"AAAA"}}`, http.StatusForbidden},
		{http.MethodPost, "/update", bc, packageUpdate(5), http.StatusForbidden},
		{http.MethodPost, "/update-manifest", bc, "{}", http.StatusNotFound},
		{http.MethodPost, "/update-cancel", bc, nil, http.StatusNotFound},
	} {
		t.Run("running "+tc.method+" "+tc.path, func(t *testing.T) {
			expectV1(t, do(t, tc.hc, tc.method, c.url(tc.path), tc.body), tc.status, "error")
		})
	}
}

func toInts(b []byte) []int {
	out := make([]int, len(b))
	for i, v := range b {
		out[i] = int(v)
	}
	return out
}

// newFixtureFrom parses a manifest and changes it.
func newFixtureFrom(t *testing.T, raw []byte, change func(f *fixture)) []byte {
	t.Helper()
	f := &fixture{}
	if err := json.Unmarshal(raw, &f.tree); err != nil {
		t.Fatal(err)
	}
	change(f)
	return f.bytes(t)
}
