package marbleapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// marbleIdentity is a Marble's key on curve with its self-signed client
// certificate and CSR, as a premain makes them (MarbleRun's: P-384;
// Quarry's: P-256).
func marbleIdentity(b *testing.B, curve elliptic.Curve) (*tls.Config, []byte) {
	key, err := ecdsa.GenerateKey(curve, rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "MarbleRun Marble"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		b.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "MarbleRun Marble"}}, key)
	if err != nil {
		b.Fatal(err)
	}
	return &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, csr
}

// marbleKeys are the curves of a Marble's TLS key: MarbleRun's premain
// makes P-384 keys, Quarry's runtime P-256.
var marbleKeys = []struct {
	name  string
	curve elliptic.Curve
}{{"marble=p384", elliptic.P384()}, {"marble=p256", elliptic.P256()}}

// BenchmarkHandshake measures one full TLS handshake of the Marble API as a
// Marble makes it (a new process: no session to resume), with the
// Coordinator's real certificate (its P-256 serving key; "server=p384":
// the P-384 intermediate key, as before) and a Marble's P-384 or P-256
// client certificate, both ends in this process.
func BenchmarkHandshake(b *testing.B) {
	auth, err := ca.New(rand.Reader, ca.Names{}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	old := &tls.Certificate{Certificate: [][]byte{auth.MarbleRoot.Raw, auth.Intermediate.Raw, auth.Root.Raw}, PrivateKey: auth.IntermediateKey}
	for _, server := range []struct {
		name string
		cert func() *tls.Certificate
	}{{"server=p256", auth.MarbleTLSCertificate}, {"server=p384", func() *tls.Certificate { return old }}} {
		for _, k := range marbleKeys {
			b.Run(server.name+"/"+k.name, func(b *testing.B) {
				benchHandshake(b, TLSConfig(server.cert), k.curve)
			})
		}
	}
}

func benchHandshake(b *testing.B, srv *tls.Config, curve elliptic.Curve) {
	client, _ := marbleIdentity(b, curve)
	for b.Loop() {
		c, s := net.Pipe()
		done := make(chan error, 1)
		go func() { done <- tls.Server(s, srv).Handshake() }()
		if err := tls.Client(c, client).Handshake(); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		c.Close()
		s.Close()
	}
}

// BenchmarkActivate measures activations through the server and the real
// core (in memory, simulation), both ends in this process, over one kept
// connection and over a new connection per activation.
func BenchmarkActivate(b *testing.B) {
	ctx := context.Background()
	c, err := core.New(ctx, core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		b.Fatal(err)
	}
	manifest := `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p","Parameters":{"Argv":["./m"],"Env":{"X":"{{hex .Secrets.k.Private}}"}}}},` +
		`"Secrets":{"k":{"Type":"symmetric-key","Size":128,"Shared":true}}}`
	if _, err := c.SetManifest(ctx, []byte(manifest)); err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := New(c, c.MarbleTLSCertificate, Options{})
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Shutdown(ctx) })
	for _, k := range marbleKeys {
		cfg, csr := marbleIdentity(b, k.curve)
		req := &marblepb.ActivationReq{CSR: csr, MarbleType: "m", UUID: "6ba7b810-9dad-41d1-80b4-00c04fd430c8"}
		dial := func() *grpc.ClientConn {
			cc, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
			if err != nil {
				b.Fatal(err)
			}
			return cc
		}
		benchActivate(b, k.name, dial, req)
	}
}

func benchActivate(b *testing.B, key string, dial func() *grpc.ClientConn, req *marblepb.ActivationReq) {
	ctx := context.Background()
	for _, reconnect := range []bool{false, true} {
		name := "kept"
		if reconnect {
			name = "reconnect"
		}
		b.Run(key+"/"+name, func(b *testing.B) {
			kept := dial()
			defer kept.Close()
			for b.Loop() {
				cc := kept
				if reconnect {
					cc = dial()
				}
				if _, err := marblepb.NewMarbleClient(cc).Activate(ctx, req); err != nil {
					b.Fatal(err)
				}
				if reconnect {
					cc.Close()
				}
			}
		})
	}
}
