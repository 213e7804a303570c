package marbleapi

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// TestWithTheCore drives the real core (in memory, simulation) through the
// server: the refusals keep the core's messages and codes, also the
// Internal ones (docs/design/behaviour.md#activation-checks), and the server presents the Marble
// Root that the activation hands out.
func TestWithTheCore(t *testing.T) {
	ctx := context.Background()
	c, err := core.New(ctx, core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(c, c.MarbleTLSCertificate, Options{})
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(ctx) })

	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "MarbleRun Marble"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	client := dial(t, ln.Addr().String(), selfSigned(t, "MarbleRun Marble", false))
	const id = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
	call := func(typ, uuid string, csr []byte, opts ...grpc.CallOption) (*marblepb.ActivationResp, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return client.Activate(ctx, &marblepb.ActivationReq{CSR: csr, MarbleType: typ, UUID: uuid}, opts...)
	}

	_, err = call("m", id, csr)
	expectStatus(t, err, codes.FailedPrecondition, "cannot accept marbles in current state")

	manifest := `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p","Parameters":{"Argv":["./m"],"Env":{"X":"{{hex .Secrets.k.Private}}"}}}},` +
		`"Secrets":{"k":{"Type":"symmetric-key","Size":128}}}`
	if _, err := c.SetManifest(ctx, []byte(manifest)); err != nil {
		t.Fatal(err)
	}
	_, err = call("nope", id, csr)
	expectStatus(t, err, codes.PermissionDenied, "marble verification failed: unknown marble type requested")
	_, err = call("m", "not-a-uuid", csr)
	expectStatus(t, err, codes.InvalidArgument, "invalid UUID: invalid UUID length: 10")
	_, err = call("m", id, []byte("garbage"))
	expectStatus(t, err, codes.Internal, "")
	if msg := err.Error(); !strings.Contains(msg, "generating marble authentication secrets: parsing CSR: ") {
		t.Fatalf("garbage CSR: %v", err)
	}

	var p peer.Peer
	resp, err := call("m", id, csr, grpc.Peer(&p))
	if err != nil {
		t.Fatal(err)
	}
	env := resp.GetParameters().GetEnv()
	if len(env["X"]) != 32 || resp.GetParameters().GetArgv()[0] != "./m" {
		t.Fatalf("parameters = %v", resp.GetParameters())
	}
	blk, _ := pem.Decode(env[core.EnvRootCA])
	presented := p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates
	if blk == nil || len(presented) != 4 || !bytes.Equal(presented[1].Raw, blk.Bytes) {
		t.Fatal("the server does not present its serving certificate, then the Marble Root that MARBLE_PREDEFINED_ROOT_CA holds and its chain")
	}
	// Then the intermediate and the root (docs/trust.md); the serving
	// certificate, whose key the handshake proved, is a CA signed by the
	// root key.
	rootBlk, _ := pem.Decode(env[core.EnvCoordinatorRoot])
	if rootBlk == nil || !bytes.Equal(presented[3].Raw, rootBlk.Bytes) || presented[2].CheckSignatureFrom(presented[3]) != nil {
		t.Fatal("the server's chain does not end in the intermediate and the root of MARBLE_PREDEFINED_COORDINATOR_ROOT_CA")
	}
	if !presented[0].IsCA || presented[0].CheckSignatureFrom(presented[3]) != nil {
		t.Fatal("the serving certificate is not a CA certificate signed by the root key")
	}
	// The Marble's certificate is signed with the intermediate key: it
	// verifies against the Marble Root.
	leafBlk, _ := pem.Decode(env[core.EnvCertificateChain])
	leaf, err := x509.ParseCertificate(leafBlk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.CheckSignatureFrom(presented[1]); err != nil {
		t.Fatalf("the Marble's certificate does not verify against the presented Marble Root: %v", err)
	}
}
