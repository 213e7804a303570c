package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/testpki"
)

// Marble instances of the Marble API tests.
const (
	marbleUUIDA = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
	marbleUUIDB = "7ba7b810-9dad-41d1-80b4-00c04fd430c8"
)

// oidMarbleType is the Marble certificate's extension naming its type.
var oidMarbleType = asn1.ObjectIdentifier{1, 3, 9903, 2, 1}

// marbleManifest is the manifest of the Marble API tests: "backend"
// (files and env from a shared and a per-Marble secret, a NoTemplates
// file, a manifest Env that tries to override a reserved variable),
// "limited" (MaxActivations 2) and "needstoken" (MaxActivations 1, a
// template on a user-defined secret); the user "admin" reads and writes
// the secrets and may update the package.
func marbleManifest(t *testing.T, adminPEM string, gates ...string) []byte {
	t.Helper()
	if gates == nil {
		gates = []string{}
	}
	doc := map[string]any{
		"Packages": map[string]any{"pkg": map[string]any{"SignerID": hexA, "ProductID": 1, "SecurityVersion": 1}},
		"Marbles": map[string]any{
			"backend": map[string]any{"Package": "pkg", "Parameters": map[string]any{
				"Files": map[string]any{
					"/keys/shared": "{{hex .Secrets.shared.Private}}",
					"/keys/mine":   "{{hex .Secrets.mine.Private}}",
					"/raw":         map[string]any{"Data": "aGVsbG8=", "Encoding": "base64", "NoTemplates": true},
				},
				"Env": map[string]any{
					"SHARED":                    "{{hex .Secrets.shared.Private}}",
					"MINE":                      "{{hex .Secrets.mine.Private}}",
					"LEAF":                      "{{pem .MarbleRun.MarbleCert.Cert}}",
					"MARBLE_PREDEFINED_ROOT_CA": "overridden",
				},
				"Argv": []string{"./backend", "--serve"},
			}},
			"limited": map[string]any{"Package": "pkg", "MaxActivations": 2,
				"Parameters": map[string]any{"Env": map[string]any{"MINE": "{{hex .Secrets.mine.Private}}"}}},
			"needstoken": map[string]any{"Package": "pkg", "MaxActivations": 1,
				"Parameters": map[string]any{"Env": map[string]any{"TOKEN": "{{string .Secrets.token}}"}}},
		},
		"Secrets": map[string]any{
			"shared": map[string]any{"Type": "symmetric-key", "Size": 128, "Shared": true},
			"mine":   map[string]any{"Type": "symmetric-key", "Size": 256},
			"token":  map[string]any{"Type": "plain", "UserDefined": true},
		},
		"Users": map[string]any{"admin": map[string]any{"Certificate": adminPEM, "Roles": []string{"reader", "writer", "packages"}}},
		"Roles": map[string]any{
			"reader":   map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"shared", "token"}, "Actions": []string{"ReadSecret"}},
			"writer":   map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"token"}, "Actions": []string{"WriteSecret"}},
			"packages": map[string]any{"ResourceType": "Packages", "ResourceNames": []string{"pkg"}, "Actions": []string{"UpdateSecurityVersion"}},
		},
		"Config": map[string]any{"FeatureGates": gates},
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// marbleSetup is a running Coordinator with marbleManifest set.
type marbleSetup struct {
	c     *coordinator
	root  *x509.Certificate // the Coordinator root (pinned)
	admin tls.Certificate
}

func newMarbleSetup(t *testing.T, gates ...string) *marbleSetup {
	t.Helper()
	return newMarbleSetupEnv(t, nil, gates...)
}

// newMarbleSetupEnv is newMarbleSetup with extra environment variables for
// the Coordinator.
func newMarbleSetupEnv(t *testing.T, env []string, gates ...string) *marbleSetup {
	t.Helper()
	c := startCoordinator(t, "", env...)
	hc := c.client(nil, nil)
	root := fetchRoot(t, c, hc)
	admin, adminPEM := newUserCert(t, "admin")
	expect(t, setManifest(t, c, hc, marbleManifest(t, adminPEM, gates...)), http.StatusOK, "success")
	return &marbleSetup{c: c, root: root, admin: admin}
}

// adminClient is an HTTPS client of the manifest user "admin".
func (s *marbleSetup) adminClient() *http.Client { return s.c.client(s.root, &s.admin) }

// testMarble is what a Marble brings to its activation, as the premain
// makes it: a P-384 key, a self-signed TLS client certificate and a CSR
// with the same key.
type testMarble struct {
	cert tls.Certificate
	csr  []byte
}

func newTestMarble(t *testing.T) *testMarble {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	self := testpki.SelfSigned(t, "MarbleRun Marble", testpki.Key(key), testpki.Loopback())
	tmpl := self.Cert
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "MarbleRun Marble"}, DNSNames: tmpl.DNSNames, IPAddresses: tmpl.IPAddresses}, key)
	if err != nil {
		t.Fatal(err)
	}
	return &testMarble{cert: self.TLS(), csr: csr}
}

// callActivate sends one activation to the Marble API at addr, over TLS
// without verifying the server (as Marbles do), presenting certs; peer, if
// not nil, receives the server's certificates.
func callActivate(t *testing.T, addr string, certs []tls.Certificate, req *marblepb.ActivationReq, peer *[]*x509.Certificate) (*marblepb.Parameters, error) {
	t.Helper()
	cfg := &tls.Config{InsecureSkipVerify: true, Certificates: certs, MinVersion: tls.VersionTLS12}
	if peer != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			*peer = cs.PeerCertificates
			return nil
		}
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := marblepb.NewMarbleClient(cc).Activate(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetParameters(), nil
}

// activate activates the Marble as typ with uuid (an empty quote: the
// Coordinator runs in simulation).
func (m *testMarble) activate(t *testing.T, c *coordinator, typ, uuid string) (*marblepb.Parameters, error) {
	t.Helper()
	return callActivate(t, c.meshAddr, []tls.Certificate{m.cert}, &marblepb.ActivationReq{CSR: m.csr, MarbleType: typ, UUID: uuid}, nil)
}

// mustActivate is activate that must succeed.
func (m *testMarble) mustActivate(t *testing.T, c *coordinator, typ, uuid string) *marblepb.Parameters {
	t.Helper()
	p, err := m.activate(t, c, typ, uuid)
	if err != nil {
		t.Fatalf("activating %s %s: %v", typ, uuid, err)
	}
	return p
}

// expectCode checks a gRPC error's code and that its message contains msg.
func expectCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Fatalf("error = %v, want %v containing %q", err, code, msg)
	}
}

// activated is what an activation hands the Marble for its identity.
type activated struct {
	leaf       *x509.Certificate // from MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN
	chain      []*x509.Certificate
	key        *ecdsa.PrivateKey // MARBLE_PREDEFINED_PRIVATE_KEY
	marbleRoot *x509.Certificate // MARBLE_PREDEFINED_ROOT_CA
	coordRoot  *x509.Certificate // MARBLE_PREDEFINED_COORDINATOR_ROOT_CA
	tls        tls.Certificate   // the leaf with its key, for the Client API
}

func parseActivated(t *testing.T, p *marblepb.Parameters) activated {
	t.Helper()
	env := p.GetEnv()
	var a activated
	a.chain = parseChain(t, string(env["MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN"]))
	if len(a.chain) != 2 {
		t.Fatalf("MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN has %d certificates, want the leaf and the intermediate", len(a.chain))
	}
	a.leaf = a.chain[0]
	roots := parseChain(t, string(env["MARBLE_PREDEFINED_ROOT_CA"]))
	coord := parseChain(t, string(env["MARBLE_PREDEFINED_COORDINATOR_ROOT_CA"]))
	if len(roots) != 1 || len(coord) != 1 {
		t.Fatalf("MARBLE_PREDEFINED_ROOT_CA %q, MARBLE_PREDEFINED_COORDINATOR_ROOT_CA %q", env["MARBLE_PREDEFINED_ROOT_CA"], env["MARBLE_PREDEFINED_COORDINATOR_ROOT_CA"])
	}
	a.marbleRoot, a.coordRoot = roots[0], coord[0]
	blk, _ := pem.Decode(env["MARBLE_PREDEFINED_PRIVATE_KEY"])
	if blk == nil || blk.Type != "PRIVATE KEY" {
		t.Fatalf("MARBLE_PREDEFINED_PRIVATE_KEY is not a PKCS #8 PEM: %q", env["MARBLE_PREDEFINED_PRIVATE_KEY"])
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	var ok bool
	if a.key, ok = k.(*ecdsa.PrivateKey); !ok {
		t.Fatalf("MARBLE_PREDEFINED_PRIVATE_KEY is a %T", k)
	}
	a.tls = tls.Certificate{Certificate: [][]byte{a.leaf.Raw}, PrivateKey: a.key, Leaf: a.leaf}
	return a
}

// marbleType returns the value of the leaf's marble-type extension.
func marbleType(c *x509.Certificate) (string, bool) {
	for _, e := range c.Extensions {
		if e.Id.Equal(oidMarbleType) {
			return string(e.Value), true
		}
	}
	return "", false
}
