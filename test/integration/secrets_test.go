package integration

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/testpki"
)

type v2Secret struct {
	Type        string `json:"type"`
	Size        uint   `json:"size"`
	Shared      bool   `json:"shared"`
	UserDefined bool   `json:"userDefined"`
	Cert        []byte `json:"cert"`
	ValidFor    uint   `json:"validFor"`
	Private     []byte `json:"private"`
	Public      []byte `json:"public"`
}

func secretsURL(c *coordinator, names ...string) string {
	q := url.Values{}
	for _, n := range names {
		q.Add("s", n)
	}
	return c.url("/api/v2/secrets?" + q.Encode())
}

func getSecrets(t *testing.T, c *coordinator, hc *http.Client, names ...string) map[string]v2Secret {
	t.Helper()
	r := do(t, hc, http.MethodGet, secretsURL(c, names...), nil)
	expect(t, r, http.StatusOK, "success")
	var d struct {
		Secrets map[string]v2Secret `json:"secrets"`
	}
	decode(t, r, &d)
	return d.Secrets
}

func postSecrets(t *testing.T, c *coordinator, hc *http.Client, secrets map[string]any) response {
	t.Helper()
	return do(t, hc, http.MethodPost, c.url("/api/v2/secrets"), map[string]any{"secrets": secrets})
}

// secretsSetup is a running coordinator with a manifest of every secret type.
type secretsSetup struct {
	c          *coordinator
	f          *fixture
	alice, bob *http.Client
}

func newSecretsSetup(t *testing.T) *secretsSetup {
	t.Helper()
	c := startCoordinator(t, "")
	f := newFixture(t)
	all := []string{"symkey", "cert", "userkey"}
	add := func(name string, def map[string]any) {
		f.set("Secrets."+name, def)
		all = append(all, name)
	}
	for _, size := range []int{224, 256, 384, 521} {
		add(fmt.Sprintf("ecdsa%d", size), map[string]any{"Type": "cert-ecdsa", "Size": size, "Shared": true})
	}
	add("ed", map[string]any{"Type": "cert-ed25519", "Shared": true})
	add("rsa", map[string]any{"Type": "cert-rsa", "Size": 2048, "Shared": true, "ValidFor": 30,
		"Cert": map[string]any{"DNSNames": []string{"a.example", "b.example"}, "IPAddresses": []string{"10.0.0.7"}}})
	for _, size := range []int{8, 256, 4096} {
		add(fmt.Sprintf("sym%d", size), map[string]any{"Type": "symmetric-key", "Size": size, "Shared": true})
	}
	add("plain", map[string]any{"Type": "plain", "UserDefined": true})
	add("usercert", map[string]any{"Type": "cert-ecdsa", "Size": 256, "UserDefined": true})
	add("userrsa", map[string]any{"Type": "cert-rsa", "Size": 2048, "UserDefined": true})
	f.set("Roles.reader.ResourceNames", all)
	f.set("Roles.writer.ResourceNames", []string{"userkey", "plain", "usercert", "userrsa"})
	hc := c.client(nil, nil)
	expect(t, setManifest(t, c, hc, f.bytes(t)), http.StatusOK, "success")
	alice, bob := f.users["alice"].cert, f.users["bob"].cert
	return &secretsSetup{c: c, f: f, alice: c.client(nil, &alice), bob: c.client(nil, &bob)}
}

func TestSecretTypesAndSizes(t *testing.T) {
	t.Parallel()
	s := newSecretsSetup(t)
	inter, _ := getChain(t, s.c, s.alice)
	got := getSecrets(t, s.c, s.alice, "ecdsa224", "ecdsa256", "ecdsa384", "ecdsa521", "ed", "rsa", "cert", "sym8", "sym256", "sym4096", "symkey", "userkey")
	if len(got) != 12 {
		t.Fatalf("got %d secrets", len(got))
	}
	curves := map[string]elliptic.Curve{"ecdsa224": elliptic.P224(), "ecdsa256": elliptic.P256(), "ecdsa384": elliptic.P384(), "ecdsa521": elliptic.P521(), "cert": elliptic.P256()}
	now := time.Now()
	for name, sec := range got {
		t.Run(name, func(t *testing.T) {
			switch {
			case strings.HasPrefix(sec.Type, "cert-"):
				cert, err := x509.ParseCertificate(sec.Cert)
				if err != nil {
					t.Fatalf("cert: %v", err)
				}
				// Issued by the Marble root: intermediate subject and key.
				if cert.Issuer.CommonName != "MarbleRun Coordinator - Intermediate CA" {
					t.Errorf("issuer %q", cert.Issuer.CommonName)
				}
				if err := cert.CheckSignatureFrom(inter); err != nil {
					t.Errorf("not signed with the intermediate key: %v", err)
				}
				days := map[string]uint{"rsa": 30, "cert": 7}[name]
				if days == 0 {
					days = 365
				}
				if sec.ValidFor != days {
					t.Errorf("validFor %d, want %d", sec.ValidFor, days)
				}
				if d := cert.NotAfter.Sub(cert.NotBefore); d < time.Duration(days)*24*time.Hour-time.Minute || d > time.Duration(days)*24*time.Hour+time.Minute {
					t.Errorf("validity %v, want %d days", d, days)
				}
				if cert.NotBefore.After(now.Add(time.Minute)) || cert.NotAfter.Before(now) {
					t.Errorf("not valid now: %v..%v", cert.NotBefore, cert.NotAfter)
				}
				if cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign != 0 {
					t.Errorf("leaf secret certificate can sign certificates")
				}
				priv, err := x509.ParsePKCS8PrivateKey(sec.Private)
				if err != nil {
					t.Fatalf("private: %v", err)
				}
				pub, err := x509.ParsePKIXPublicKey(sec.Public)
				if err != nil {
					t.Fatalf("public: %v", err)
				}
				if !priv.(crypto.Signer).Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) ||
					!pub.(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) {
					t.Error("private, public and certificate keys differ")
				}
				switch k := cert.PublicKey.(type) {
				case *ecdsa.PublicKey:
					if k.Curve != curves[name] || sec.Type != "cert-ecdsa" || int(sec.Size) != k.Curve.Params().BitSize {
						t.Errorf("curve %v size %d", k.Curve.Params().Name, sec.Size)
					}
				case ed25519.PublicKey:
					if name != "ed" || sec.Size != 0 {
						t.Errorf("ed25519 for %s, size %d", name, sec.Size)
					}
				case *rsa.PublicKey:
					if name != "rsa" || k.N.BitLen() != 2048 {
						t.Errorf("rsa %d bits", k.N.BitLen())
					}
				}
				wantDNS, wantIPs := []string{"localhost"}, []string{"127.0.0.1", "::1"}
				switch name {
				case "rsa":
					wantDNS, wantIPs = []string{"a.example", "b.example"}, []string{"10.0.0.7"}
				case "cert":
					wantDNS = []string{"backend.example"}
				}
				if fmt.Sprint(cert.DNSNames) != fmt.Sprint(wantDNS) {
					t.Errorf("DNS SANs %v, want %v", cert.DNSNames, wantDNS)
				}
				var ips []string
				for _, ip := range cert.IPAddresses {
					ips = append(ips, ip.String())
				}
				if fmt.Sprint(ips) != fmt.Sprint(wantIPs) {
					t.Errorf("IP SANs %v, want %v", ips, wantIPs)
				}
			case sec.Type == "symmetric-key" && !sec.UserDefined:
				if len(sec.Private)*8 != int(sec.Size) || !bytes.Equal(sec.Private, sec.Public) || sec.Cert != nil {
					t.Errorf("symmetric key: %d bytes for size %d; private==public %v", len(sec.Private), sec.Size, bytes.Equal(sec.Private, sec.Public))
				}
			case sec.UserDefined:
				if sec.Private != nil || sec.Public != nil || sec.Cert != nil {
					t.Errorf("user-defined secret has a value before any upload")
				}
			}
			if !sec.Shared && !sec.UserDefined {
				t.Errorf("shared flag lost")
			}
		})
	}
	// The raw JSON uses the spec's lower-camel names (docs/design/decisions.md#d5).
	r := do(t, s.alice, http.MethodGet, secretsURL(s.c, "sym8", "ed"), nil)
	for _, want := range []string{`"type":"symmetric-key"`, `"userDefined":false`, `"private":"`, `"public":"`} {
		if !bytes.Contains(r.Data, []byte(want)) {
			t.Errorf("data %s lacks %s", r.Data, want)
		}
	}
	if bytes.Contains(r.Data, []byte(`"Type"`)) || bytes.Contains(r.Data, []byte(`"size":0`)) {
		t.Errorf("unexpected member in %s", r.Data)
	}
}

func TestSecretsAuthorisation(t *testing.T) {
	t.Parallel()
	s := newSecretsSetup(t)
	stranger, _ := newUserCert(t, "stranger")
	anon := s.c.client(nil, nil)
	unknown := s.c.client(nil, &stranger)
	// bob reads through "reader" but has no write role.
	for _, tc := range []struct {
		name   string
		hc     *http.Client
		method string
		secret string
		status int
	}{
		{"GET no certificate", anon, http.MethodGet, "symkey", http.StatusUnauthorized},
		{"GET unknown certificate", unknown, http.MethodGet, "symkey", http.StatusUnauthorized},
		{"GET with permission", s.bob, http.MethodGet, "symkey", http.StatusOK},
		{"POST no certificate", anon, http.MethodPost, "userkey", http.StatusUnauthorized},
		{"POST unknown certificate", unknown, http.MethodPost, "userkey", http.StatusUnauthorized},
		{"POST without permission", s.bob, http.MethodPost, "userkey", http.StatusForbidden},
		{"POST on a generated secret", s.alice, http.MethodPost, "symkey", http.StatusForbidden},
		{"POST with permission", s.alice, http.MethodPost, "userkey", http.StatusOK},
		{"GET unknown secret", s.alice, http.MethodGet, "nope", http.StatusNotFound},
		{"POST unknown secret", s.alice, http.MethodPost, "nope", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r response
			if tc.method == http.MethodGet {
				r = do(t, tc.hc, http.MethodGet, secretsURL(s.c, tc.secret), nil)
			} else {
				r = postSecrets(t, s.c, tc.hc, map[string]any{tc.secret: map[string]any{"key": bytes.Repeat([]byte{1}, 32)}})
			}
			if tc.status == http.StatusOK {
				expect(t, r, http.StatusOK, "success")
			} else {
				expect(t, r, tc.status, "fail")
			}
		})
	}
	t.Run("role on another secret", func(t *testing.T) { newUserCertAndManifestWithLimitedReader(t) })
	// Queries.
	expect(t, do(t, s.alice, http.MethodGet, s.c.url("/api/v2/secrets"), nil), http.StatusBadRequest, "fail")
	expect(t, do(t, s.alice, http.MethodGet, s.c.url("/api/v2/secrets?s="), nil), http.StatusBadRequest, "fail")
	expect(t, do(t, s.alice, http.MethodGet, s.c.url("/api/v2/secrets?s=symkey&s="), nil), http.StatusBadRequest, "fail")
}

// newUserCertAndManifestWithLimitedReader runs a coordinator where carol
// may read only symkey: asking for symkey and cert together is refused as a
// whole, and a role on another secret does not grant this one.
func newUserCertAndManifestWithLimitedReader(t *testing.T) (*coordinator, *http.Client) {
	t.Helper()
	c := startCoordinator(t, "")
	f := newFixture(t)
	carol, carolPEM := newUserCert(t, "carol")
	f.set("Users.carol", map[string]any{"Certificate": carolPEM, "Roles": []string{"symonly", "certwriter"}})
	f.set("Roles.symonly", map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"symkey"}, "Actions": []string{"ReadSecret"}})
	f.set("Roles.certwriter", map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"userkey"}, "Actions": []string{"WriteSecret"}})
	expect(t, setManifest(t, c, c.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	hc := c.client(nil, &carol)
	getSecrets(t, c, hc, "symkey")
	expect(t, do(t, hc, http.MethodGet, secretsURL(c, "symkey", "cert"), nil), http.StatusForbidden, "fail")
	expect(t, do(t, hc, http.MethodGet, secretsURL(c, "userkey"), nil), http.StatusForbidden, "fail")
	return c, hc
}

// leafCert makes a certificate for key (self-signed).
func leafCert(t *testing.T, priv crypto.Signer) []byte {
	t.Helper()
	return testpki.SelfSigned(t, "upload", testpki.Key(priv), testpki.Serial(1)).DER()
}

func TestUserSecretUploadRules(t *testing.T) {
	t.Parallel()
	s := newSecretsSetup(t)
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ec384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	ecCert := leafCert(t, ec)
	ecPriv, _ := x509.MarshalPKCS8PrivateKey(ec)
	ecPub, _ := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	otherPriv, _ := x509.MarshalPKCS8PrivateKey(other)
	otherPub, _ := x509.MarshalPKIXPublicKey(&other.PublicKey)
	ec384Cert := leafCert(t, ec384)
	edCert := leafCert(t, edPriv)
	for _, tc := range []struct {
		name   string
		secret string
		upload map[string]any
		ok     bool
		want   string
	}{
		{"symmetric key of the right size", "userkey", map[string]any{"key": bytes.Repeat([]byte{7}, 32)}, true, ""},
		{"symmetric key of the wrong size", "userkey", map[string]any{"key": []byte{1, 2}}, false, "size"},
		{"symmetric key with a certificate", "userkey", map[string]any{"key": bytes.Repeat([]byte{7}, 32), "cert": ecCert}, false, ""},
		{"plain data", "plain", map[string]any{"key": []byte("hello")}, true, ""},
		{"plain with a certificate", "plain", map[string]any{"cert": ecCert}, false, "plain"},
		{"certificate alone", "usercert", map[string]any{"cert": ecCert}, true, ""},
		{"certificate with matching private and public", "usercert", map[string]any{"cert": ecCert, "private": ecPriv, "public": ecPub}, true, ""},
		{"MarbleRun's capitalised members", "usercert", map[string]any{"Cert": ecCert, "Private": ecPriv}, true, ""},
		{"certificate with another private key", "usercert", map[string]any{"cert": ecCert, "private": otherPriv}, false, "does not belong"},
		{"certificate with another public key", "usercert", map[string]any{"cert": ecCert, "public": otherPub}, false, "is not the certificate's public key"},
		{"certificate of another key type", "usercert", map[string]any{"cert": edCert}, false, ""},
		{"certificate of another size", "usercert", map[string]any{"cert": ec384Cert}, false, ""},
		{"ecdsa certificate for an rsa secret", "userrsa", map[string]any{"cert": ecCert}, false, ""},
		{"both key and certificate", "usercert", map[string]any{"cert": ecCert, "key": []byte{1}}, false, ""},
		{"no certificate", "usercert", map[string]any{"private": ecPriv}, false, ""},
		{"garbage certificate", "usercert", map[string]any{"cert": []byte("not DER")}, false, ""},
		{"invalid base64", "usercert", map[string]any{"cert": "!!!"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := getSecrets(t, s.c, s.alice, tc.secret)[tc.secret]
			r := postSecrets(t, s.c, s.alice, map[string]any{tc.secret: tc.upload})
			if tc.ok {
				expect(t, r, http.StatusOK, "success")
				got := getSecrets(t, s.c, s.alice, tc.secret)[tc.secret]
				if k, ok := tc.upload["key"].([]byte); ok && (!bytes.Equal(got.Private, k) || !bytes.Equal(got.Public, k)) {
					t.Errorf("stored key differs: %+v", got)
				}
				if c, ok := tc.upload["cert"].([]byte); ok && (!bytes.Equal(got.Cert, c) || !bytes.Equal(got.Public, ecPub)) {
					t.Errorf("stored certificate or public key differs")
				}
				return
			}
			expect(t, r, http.StatusBadRequest, "fail")
			if !strings.Contains(r.Message, tc.want) {
				t.Errorf("message %q lacks %q", r.Message, tc.want)
			}
			if after := getSecrets(t, s.c, s.alice, tc.secret)[tc.secret]; fmt.Sprint(after) != fmt.Sprint(before) {
				t.Error("a rejected upload changed the secret")
			}
		})
	}
	// All-or-nothing: one bad secret rejects the whole request.
	r := postSecrets(t, s.c, s.alice, map[string]any{
		"userkey": map[string]any{"key": bytes.Repeat([]byte{9}, 32)},
		"plain":   map[string]any{"cert": ecCert},
	})
	expect(t, r, http.StatusBadRequest, "fail")
	if got := getSecrets(t, s.c, s.alice, "userkey")["userkey"]; bytes.Equal(got.Private, bytes.Repeat([]byte{9}, 32)) {
		t.Fatal("a partly rejected request stored a secret")
	}
	expect(t, postSecrets(t, s.c, s.alice, map[string]any{}), http.StatusBadRequest, "fail")
}

type logEntry struct {
	Time   string `json:"time"`
	Update string `json:"update"`
	User   string `json:"user"`
	Secret string `json:"secret"`
	Type   string `json:"type"`
}

func getLog(t *testing.T, c *coordinator, hc *http.Client) []logEntry {
	t.Helper()
	r := do(t, hc, http.MethodGet, c.url("/api/v2/update"), nil)
	expect(t, r, http.StatusOK, "success")
	var d struct {
		UpdateLog []string `json:"updateLog"`
	}
	decode(t, r, &d)
	var out []logEntry
	for _, line := range d.UpdateLog {
		var e logEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("log entry %q is not JSON: %v", line, err)
		}
		if _, err := time.Parse(time.RFC3339Nano, e.Time); err != nil {
			t.Fatalf("log entry time %q: %v", e.Time, err)
		}
		out = append(out, e)
	}
	return out
}

func TestUpdateLogAndRestart(t *testing.T) {
	t.Parallel()
	s := newSecretsSetup(t)
	key := bytes.Repeat([]byte{0x5a}, 32)
	expect(t, postSecrets(t, s.c, s.alice, map[string]any{"userkey": map[string]any{"key": key}, "plain": map[string]any{"key": []byte("data")}}), http.StatusOK, "success")
	log := getLog(t, s.c, s.alice)
	if len(log) != 3 || log[0].Update != "Initial manifest set" {
		t.Fatalf("log %+v", log)
	}
	for i, name := range []string{"plain", "userkey"} {
		e := log[i+1]
		if e.Update != "Secret set" || e.User != "alice" || e.Secret != name {
			t.Errorf("entry %+v", e)
		}
	}
	// SIGKILL right after the upload: nothing is lost.
	s.c.restart()
	got := getSecrets(t, s.c, s.alice, "userkey", "plain")
	if !bytes.Equal(got["userkey"].Private, key) || string(got["plain"].Public) != "data" {
		t.Fatalf("uploaded values lost across SIGKILL: %+v", got)
	}
	if len(getLog(t, s.c, s.alice)) != 3 {
		t.Fatal("update log lost across restart")
	}
	// Before a manifest: 409.
	c2 := startCoordinator(t, "")
	expect(t, do(t, c2.client(nil, nil), http.MethodGet, c2.url("/api/v2/update"), nil), http.StatusConflict, "fail")
	alice := s.f.users["alice"].cert
	expect(t, do(t, c2.client(nil, &alice), http.MethodGet, secretsURL(c2, "symkey"), nil), http.StatusConflict, "fail")
}

func TestParallelUploads(t *testing.T) {
	t.Parallel()
	s := newSecretsSetup(t)
	var wg sync.WaitGroup
	errs := make(chan string, 40)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for _, name := range []string{"userkey", "plain"} {
				body, _ := json.Marshal(map[string]any{"secrets": map[string]any{name: map[string]any{"key": bytes.Repeat([]byte{byte(i)}, 32)}}})
				resp, err := s.alice.Post(s.c.url("/api/v2/secrets"), "application/json", bytes.NewReader(body))
				if err != nil {
					errs <- err.Error()
					continue
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- resp.Status
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := len(getLog(t, s.c, s.alice)); n != 41 {
		t.Fatalf("log has %d entries, want 41 (1 + 40 uploads)", n)
	}
	s.c.restart()
	if n := len(getLog(t, s.c, s.alice)); n != 41 {
		t.Fatalf("after restart the log has %d entries, want 41", n)
	}
	if strings.Contains(s.c.Logs(), "DATA RACE") {
		t.Fatal("the race detector reported a data race in the coordinator")
	}
}
