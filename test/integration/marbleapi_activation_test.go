package integration

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
)

// TestMarbleAPIActivation activates a Marble over the real Marble API and
// checks what it gets: its Files, Env and Argv rendered with its secrets,
// and MARBLE_PREDEFINED_* — a leaf for its canonical UUID and type, issued
// by the Marble Root that the server presents, with the key handed out.
// The shared secret is the one an admin reads; the per-Marble key is the
// same for a UUID across a restart and differs for another UUID.
func TestMarbleAPIActivation(t *testing.T) {
	t.Parallel()
	s := newMarbleSetup(t)
	inter, coordRoot := getChain(t, s.c, s.c.client(nil, nil))
	m := newTestMarble(t)
	var presented []*x509.Certificate
	p, err := callActivate(t, s.c.meshAddr, []tls.Certificate{m.cert},
		&marblepb.ActivationReq{CSR: m.csr, MarbleType: "backend", UUID: strings.ToUpper(marbleUUIDA)}, &presented)
	if err != nil {
		t.Fatal(err)
	}
	a := parseActivated(t, p)

	// The leaf.
	if a.leaf.Subject.CommonName != marbleUUIDA {
		t.Errorf("leaf CN = %q, want the canonical UUID %s", a.leaf.Subject.CommonName, marbleUUIDA)
	}
	if typ, ok := marbleType(a.leaf); !ok || typ != "backend" {
		t.Errorf("leaf marble-type extension = %q %v, want backend", typ, ok)
	}
	if err := a.leaf.CheckSignatureFrom(a.marbleRoot); err != nil {
		t.Errorf("the leaf is not issued by the Marble Root in MARBLE_PREDEFINED_ROOT_CA: %v", err)
	}
	leafKey := a.leaf.PublicKey.(*ecdsa.PublicKey)
	if !leafKey.Equal(&a.key.PublicKey) {
		t.Error("MARBLE_PREDEFINED_PRIVATE_KEY is not the leaf's key")
	}
	if leafKey.Equal(m.cert.PrivateKey.(*ecdsa.PrivateKey).Public()) {
		t.Error("the leaf reuses the Marble's own key")
	}
	if a.leaf.IsCA || len(a.leaf.DNSNames) != 1 || a.leaf.DNSNames[0] != "localhost" {
		t.Errorf("leaf: CA %v, DNS SANs %v (want the CSR's)", a.leaf.IsCA, a.leaf.DNSNames)
	}
	if !a.chain[1].Equal(inter) {
		t.Error("the chain's second certificate is not the Coordinator intermediate of /api/v2/quote")
	}
	if !a.coordRoot.Equal(coordRoot) {
		t.Error("MARBLE_PREDEFINED_COORDINATOR_ROOT_CA is not the root of /api/v2/quote")
	}
	if len(presented) != 4 || !presented[1].Equal(a.marbleRoot) || !presented[2].Equal(inter) || !presented[3].Equal(coordRoot) {
		t.Error("the Marble API does not present its serving certificate, then the Marble Root that MARBLE_PREDEFINED_ROOT_CA holds, the intermediate and the root (docs/trust.md)")
	} else if k, ok := presented[0].PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() || !presented[0].IsCA || presented[0].CheckSignatureFrom(coordRoot) != nil {
		t.Error("the Marble API's serving certificate is not a CA certificate for a P-256 key signed by the root (docs/trust.md)")
	}
	// The Marble Root shares the intermediate's key and subject.
	if !bytes.Equal(a.marbleRoot.RawSubject, inter.RawSubject) || !a.marbleRoot.PublicKey.(*ecdsa.PublicKey).Equal(inter.PublicKey) {
		t.Error("the Marble Root does not share the intermediate's subject and key")
	}

	// The parameters.
	env, files := p.GetEnv(), p.GetFiles()
	if got := p.GetArgv(); len(got) != 2 || got[0] != "./backend" || got[1] != "--serve" {
		t.Errorf("Argv = %q", got)
	}
	if string(files["/raw"]) != "hello" {
		t.Errorf("NoTemplates file = %q", files["/raw"])
	}
	if string(env["LEAF"]) != string(env["MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN"][:len(env["LEAF"])]) {
		t.Error("the template's .MarbleRun.MarbleCert is not the leaf")
	}
	if string(env["MARBLE_PREDEFINED_ROOT_CA"]) == "overridden" {
		t.Error("the manifest's Env overrode a reserved variable")
	}
	if _, ok := env["MARBLE_TTLS_CONFIG"]; ok {
		t.Error("MARBLE_TTLS_CONFIG without TLS tags")
	}
	shared := getSecrets(t, s.c, s.adminClient(), "shared")["shared"]
	if want := hex.EncodeToString(shared.Private); string(files["/keys/shared"]) != want || string(env["SHARED"]) != want {
		t.Errorf("shared secret: file %q env %q, the admin reads %s", files["/keys/shared"], env["SHARED"], want)
	}
	mineA := string(files["/keys/mine"])
	if len(mineA) != 64 || string(env["MINE"]) != mineA {
		t.Errorf("per-Marble key: file %q env %q", mineA, env["MINE"])
	}

	// Per-Marble keys: the same UUID gets the same key, also after a
	// restart; another UUID another one.
	s.c.restart()
	again := m.mustActivate(t, s.c, "backend", marbleUUIDA)
	if string(again.GetFiles()["/keys/mine"]) != mineA {
		t.Error("the per-Marble key of a UUID changed across a restart")
	}
	if b := parseActivated(t, again); b.leaf.Equal(a.leaf) || !b.marbleRoot.Equal(a.marbleRoot) {
		t.Error("a new activation must get a new leaf from the same Marble Root")
	}
	other := m.mustActivate(t, s.c, "backend", marbleUUIDB)
	if got := string(other.GetFiles()["/keys/mine"]); got == mineA || len(got) != 64 {
		t.Errorf("another UUID got per-Marble key %q (the first: %q)", got, mineA)
	}
	if string(other.GetFiles()["/keys/shared"]) != string(files["/keys/shared"]) {
		t.Error("another UUID got another shared secret")
	}
}

// TestMarbleAPIMaxActivations: with MaxActivations 2, two activations
// succeed; after SIGKILL and a restart the third is refused.
func TestMarbleAPIMaxActivations(t *testing.T) {
	t.Parallel()
	s := newMarbleSetup(t)
	m := newTestMarble(t)
	m.mustActivate(t, s.c, "limited", marbleUUIDA)
	m.mustActivate(t, s.c, "limited", marbleUUIDA) // the same UUID counts again
	s.c.restart()
	_, err := m.activate(t, s.c, "limited", marbleUUIDB)
	expectCode(t, err, codes.PermissionDenied, `marble verification failed: reached max activations count (2) for marble type "limited"`)
	// Other types are not affected.
	m.mustActivate(t, s.c, "backend", marbleUUIDB)
}

// TestMarbleAPIRefusals sends every bad activation that simulation can
// produce and checks its code and message; none of them changes the state:
// afterwards the Marble type with MaxActivations 1 still activates once.
func TestMarbleAPIRefusals(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	m := newTestMarble(t)
	_, err := m.activate(t, c, "needstoken", marbleUUIDA)
	expectCode(t, err, codes.FailedPrecondition, "cannot accept marbles in current state")

	hc := c.client(nil, nil)
	root := fetchRoot(t, c, hc)
	admin, adminPEM := newUserCert(t, "admin")
	expect(t, setManifest(t, c, hc, marbleManifest(t, adminPEM)), http.StatusOK, "success")
	s := &marbleSetup{c: c, root: root, admin: admin}

	badSig := append([]byte(nil), m.csr...)
	badSig[len(badSig)-3] ^= 0xff
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
		req   *marblepb.ActivationReq
		code  codes.Code
		msg   string
	}{
		{"unknown marble type", nil, &marblepb.ActivationReq{CSR: m.csr, MarbleType: "nope", UUID: marbleUUIDA},
			codes.PermissionDenied, "marble verification failed: unknown marble type requested"},
		// An unknown package cannot be reached: a validated manifest names
		// only defined packages, and package updates cannot remove one.
		{"unparsable UUID", nil, &marblepb.ActivationReq{CSR: m.csr, MarbleType: "needstoken", UUID: "not-a-uuid"},
			codes.InvalidArgument, "invalid UUID: "},
		{"empty UUID", nil, &marblepb.ActivationReq{CSR: m.csr, MarbleType: "needstoken"},
			codes.InvalidArgument, "invalid UUID: "},
		{"garbage CSR", nil, &marblepb.ActivationReq{CSR: []byte("garbage"), MarbleType: "needstoken", UUID: marbleUUIDA},
			codes.Internal, "generating marble authentication secrets: parsing CSR: "},
		{"CSR with a bad signature", nil, &marblepb.ActivationReq{CSR: badSig, MarbleType: "needstoken", UUID: marbleUUIDA},
			codes.Internal, "generating marble authentication secrets: signature over CSR is invalid: "},
		{"oversized request", nil, &marblepb.ActivationReq{Quote: make([]byte, 300<<10), CSR: m.csr, MarbleType: "needstoken", UUID: marbleUUIDA},
			codes.ResourceExhausted, "larger than max"},
		{"template on a user-defined secret not uploaded", nil, &marblepb.ActivationReq{CSR: m.csr, MarbleType: "needstoken", UUID: marbleUUIDA},
			codes.Internal, "customizing marble parameters: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certs := tc.certs
			if certs == nil {
				certs = []tls.Certificate{m.cert}
			}
			_, err := callActivate(t, c.meshAddr, certs, tc.req, nil)
			expectCode(t, err, tc.code, tc.msg)
		})
	}
	t.Run("no client certificate", func(t *testing.T) {
		_, err := callActivate(t, c.meshAddr, nil, &marblepb.ActivationReq{CSR: m.csr, MarbleType: "needstoken", UUID: marbleUUIDA}, nil)
		if code := status.Code(err); code != codes.Unavailable && code != codes.Unauthenticated {
			t.Fatalf("without a client certificate: %v, want the handshake to fail", err)
		}
		// The handshake itself: the server demands a certificate.
		conn, err := tls.Dial("tcp", c.meshAddr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
		if err == nil {
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Fatalf("TLS handshake without a client certificate: %v, want the alert 'certificate required'", err)
		}
	})

	// None of the refusals counted: upload the token, then exactly one
	// activation of "needstoken" succeeds.
	expect(t, postSecrets(t, c, s.adminClient(), map[string]any{"token": map[string]any{"key": []byte("tok")}}), http.StatusOK, "success")
	p := m.mustActivate(t, c, "needstoken", marbleUUIDA)
	if string(p.GetEnv()["TOKEN"]) != "tok" {
		t.Errorf("TOKEN = %q", p.GetEnv()["TOKEN"])
	}
	_, err = m.activate(t, c, "needstoken", marbleUUIDB)
	expectCode(t, err, codes.PermissionDenied, `reached max activations count (1) for marble type "needstoken"`)

	// Recovery mode (state 1): no activations.
	c.kill()
	if err := os.Remove(filepath.Join(c.sealDir, "sealed_key")); err != nil {
		t.Fatal(err)
	}
	c.start()
	expectState(t, c, c.client(nil, nil), 1, msgRecovery)
	_, err = m.activate(t, c, "backend", marbleUUIDA)
	expectCode(t, err, codes.FailedPrecondition, "cannot accept marbles in current state")
}

// TestMarbleAPIPresentsNewMarbleRootAfterUpdate: a package update renews
// the Marble Root; the Marble API presents the new one at once and issues
// leaves from it.
func TestMarbleAPIPresentsNewMarbleRootAfterUpdate(t *testing.T) {
	t.Parallel()
	s := newMarbleSetup(t)
	m := newTestMarble(t)
	var before, after []*x509.Certificate
	p, err := callActivate(t, s.c.meshAddr, []tls.Certificate{m.cert}, &marblepb.ActivationReq{CSR: m.csr, MarbleType: "backend", UUID: marbleUUIDA}, &before)
	if err != nil {
		t.Fatal(err)
	}
	old := parseActivated(t, p)
	expect(t, do(t, s.adminClient(), http.MethodPost, s.c.url("/api/v2/update"),
		map[string][]byte{"manifest": []byte(`{"Packages":{"pkg":{"SecurityVersion":2}}}`)}), http.StatusOK, "success")
	p, err = callActivate(t, s.c.meshAddr, []tls.Certificate{m.cert}, &marblepb.ActivationReq{CSR: m.csr, MarbleType: "backend", UUID: marbleUUIDA}, &after)
	if err != nil {
		t.Fatal(err)
	}
	renewed := parseActivated(t, p)
	if renewed.marbleRoot.Equal(old.marbleRoot) {
		t.Fatal("the package update did not renew the Marble Root")
	}
	if len(after) != 4 || !after[1].Equal(renewed.marbleRoot) || after[1].Equal(before[1]) || after[0].Equal(before[0]) || !after[3].Equal(before[3]) {
		t.Fatal("the Marble API does not present the renewed Marble Root (with a new serving certificate)")
	}
	if err := renewed.leaf.CheckSignatureFrom(renewed.marbleRoot); err != nil {
		t.Fatalf("new leaf: %v", err)
	}
	if !renewed.coordRoot.Equal(old.coordRoot) {
		t.Fatal("the Coordinator root changed with a package update")
	}
}
