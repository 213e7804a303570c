package marble_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/marble"
)

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// newCA returns a Coordinator CA as the Coordinator makes it.
func newCA(t *testing.T) *ca.Authority {
	t.Helper()
	a, err := ca.New(rand.Reader, ca.Names{DNS: []string{"localhost"}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// issue returns the Env of an activation of a Marble of type typ at a, as
// the Coordinator hands it out (the MARBLE_PREDEFINED_* variables), with
// the DNS names of the Marble's CSR.
func issue(t *testing.T, a *ca.Authority, typ string, dns ...string) map[string][]byte {
	t.Helper()
	csrKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: dns, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}, csrKey)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := a.IssueMarbleCert(rand.Reader, csr, uuid.NewString(), typ, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.Key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		marble.EnvMarbleRoot:       pemOf("CERTIFICATE", a.MarbleRoot.Raw),
		marble.EnvCertificateChain: append(pemOf("CERTIFICATE", leaf.Cert.Raw), pemOf("CERTIFICATE", a.Intermediate.Raw)...),
		marble.EnvPrivateKey:       pemOf("PRIVATE KEY", keyDER),
		marble.EnvCoordinatorRoot:  pemOf("CERTIFICATE", a.Root.Raw),
	}
}

func credentials(t *testing.T, env map[string][]byte) *marble.Credentials {
	t.Helper()
	c, err := (&marble.Parameters{Env: env}).Credentials()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// certSecret returns a certificate that chains to a's Marble Root but is
// no Marble certificate, as a certificate secret of the manifest (or one
// that claims a Marble type in another extension).
func certSecret(t *testing.T, a *ca.Authority, ext ...pkix.Extension) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:    big.NewInt(7),
		Subject:         pkix.Name{CommonName: uuid.NewString()},
		NotBefore:       time.Now().Add(-time.Hour),
		NotAfter:        time.Now().Add(time.Hour),
		ExtKeyUsage:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		DNSNames:        []string{"localhost"},
		IPAddresses:     []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtraExtensions: ext,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.MarbleRoot, &key.PublicKey, a.IntermediateKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestCredentials(t *testing.T) {
	a := newCA(t)
	env := issue(t, a, "backend", "backend.example")
	c := credentials(t, env)
	if c.MarbleType != "backend" {
		t.Errorf("MarbleType = %q, want backend", c.MarbleType)
	}
	if c.UUID != c.Certificate.Leaf.Subject.CommonName || uuid.Validate(c.UUID) != nil {
		t.Errorf("UUID = %q, want the certificate's common name %q", c.UUID, c.Certificate.Leaf.Subject.CommonName)
	}
	if !c.MarbleRoot.Equal(a.MarbleRoot) || !c.CoordinatorRoot.Equal(a.Root) || len(c.Certificate.Certificate) != 2 {
		t.Errorf("credentials do not hold the Marble Root, the Coordinator root and the chain of two")
	}

	// From the environment, as in a program quarry-premain started.
	for k, v := range env {
		t.Setenv(k, string(v))
	}
	fromEnv, err := marble.CredentialsFromEnv()
	if err != nil || fromEnv.UUID != c.UUID {
		t.Errorf("CredentialsFromEnv = %v, %v; want the same credentials", fromEnv, err)
	}
	t.Setenv(marble.EnvPrivateKey, "")
	if _, err := marble.CredentialsFromEnv(); !errors.Is(err, marble.ErrNoCredentials) || !strings.Contains(err.Error(), marble.EnvPrivateKey) {
		t.Errorf("without the key: %v, want ErrNoCredentials naming %s", err, marble.EnvPrivateKey)
	}

	other := newCA(t)
	otherEnv := issue(t, other, "backend")
	secret := certSecret(t, a)
	secretKey, _ := x509.MarshalPKCS8PrivateKey(secret.PrivateKey)
	for name, tc := range map[string]struct {
		env  map[string][]byte
		want string
	}{
		"missing root":         {with(env, marble.EnvMarbleRoot, nil), marble.EnvMarbleRoot + " is not set"},
		"two roots":            {with(env, marble.EnvMarbleRoot, append(env[marble.EnvMarbleRoot], env[marble.EnvMarbleRoot]...)), "does not hold one PEM certificate"},
		"key of another":       {with(env, marble.EnvPrivateKey, otherEnv[marble.EnvPrivateKey]), "private key does not match"},
		"root of another":      {with(env, marble.EnvMarbleRoot, otherEnv[marble.EnvMarbleRoot]), "not issued under the Marble Root"},
		"coordinator root bad": {with(env, marble.EnvCoordinatorRoot, []byte("x")), marble.EnvCoordinatorRoot},
		"certificate secret": {with(with(env, marble.EnvCertificateChain, pemOf("CERTIFICATE", secret.Certificate[0])), marble.EnvPrivateKey, pemOf("PRIVATE KEY", secretKey)),
			"not a Marble certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := (&marble.Parameters{Env: tc.env}).Credentials()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Credentials: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// with returns a copy of env with name set to v (deleted if v is nil).
func with(env map[string][]byte, name string, v []byte) map[string][]byte {
	out := map[string][]byte{}
	for k, val := range env {
		out[k] = val
	}
	if v == nil {
		delete(out, name)
	} else {
		out[name] = v
	}
	return out
}

func TestMarbleTypeExtension(t *testing.T) {
	a := newCA(t)
	c := credentials(t, issue(t, a, "front end/ü"))
	// The value is the name's bytes, not a DER string.
	var raw []byte
	for _, e := range c.Certificate.Leaf.Extensions {
		if e.Id.Equal(marble.OIDMarbleType) {
			raw = e.Value
		}
	}
	if string(raw) != "front end/ü" {
		t.Fatalf("extension value %q, want the raw name", raw)
	}
	if typ, err := marble.MarbleType(c.Certificate.Leaf); err != nil || typ != "front end/ü" {
		t.Errorf("MarbleType = %q, %v", typ, err)
	}
	secret := certSecret(t, a)
	leaf, _ := x509.ParseCertificate(secret.Certificate[0])
	if _, err := marble.MarbleType(leaf); !errors.Is(err, marble.ErrNotMarbleCert) {
		t.Errorf("MarbleType of a certificate secret: %v, want ErrNotMarbleCert", err)
	}
	if _, err := marble.MarbleType(nil); !errors.Is(err, marble.ErrNotMarbleCert) {
		t.Errorf("MarbleType(nil): %v, want ErrNotMarbleCert", err)
	}
	if _, err := marble.MarbleUUID(a.MarbleRoot); !errors.Is(err, marble.ErrNotMarbleCert) {
		t.Errorf("MarbleUUID of the Marble Root: %v, want ErrNotMarbleCert", err)
	}
	// A DER-encoded string is not what the Coordinator writes; it is read
	// as the raw bytes it is, so it never equals the plain name.
	der, _ := asn1.Marshal("backend")
	forged := certSecret(t, a, pkix.Extension{Id: marble.OIDMarbleType, Value: der})
	fl, _ := x509.ParseCertificate(forged.Certificate[0])
	if typ, _ := marble.MarbleType(fl); typ == "backend" {
		t.Errorf("a DER string in the extension reads as %q", typ)
	}
}

// handshake runs a TLS handshake between a server and a client
// configuration over loopback TCP and returns each side's error and the
// server's and client's view of the connection.
func handshake(t *testing.T, server, client *tls.Config, serverName string) (scs, ccs tls.ConnectionState, serr, cerr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		err error
		cs  tls.ConnectionState
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		sc := tls.Server(c, server)
		err = sc.Handshake()
		if err == nil {
			// TLS 1.3: the server checks the client's certificate
			// after the client's handshake ended; read to see it.
			_, err = sc.Read(make([]byte, 1))
		}
		done <- result{err, sc.ConnectionState()}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	client = client.Clone()
	client.ServerName = serverName
	cc := tls.Client(raw, client)
	cerr = cc.Handshake()
	if cerr == nil {
		_, _ = cc.Write([]byte{1})
	}
	ccs = cc.ConnectionState()
	r := <-done
	cc.Close()
	return r.cs, ccs, r.err, cerr
}

func TestTLSConfigs(t *testing.T) {
	a := newCA(t)
	front := credentials(t, issue(t, a, "frontend", "frontend.example"))
	back := credentials(t, issue(t, a, "backend", "backend.example"))

	// Mutual TLS; each side reads the other's type.
	scs, ccs, serr, cerr := handshake(t, back.ServerTLSConfig("frontend"), front.ClientTLSConfig("backend"), "backend.example")
	if serr != nil || cerr != nil {
		t.Fatalf("handshake: server %v, client %v", serr, cerr)
	}
	if typ, err := marble.PeerMarbleType(&scs); err != nil || typ != "frontend" {
		t.Errorf("server sees %q, %v; want frontend", typ, err)
	}
	if typ, err := marble.PeerMarbleType(&ccs); err != nil || typ != "backend" {
		t.Errorf("client sees %q, %v; want backend", typ, err)
	}
	// Unrestricted: any Marble; loopback is always among the names.
	if _, _, serr, cerr := handshake(t, back.ServerTLSConfig(), front.ClientTLSConfig(), "127.0.0.1"); serr != nil || cerr != nil {
		t.Errorf("unrestricted handshake: server %v, client %v", serr, cerr)
	}

	other := credentials(t, issue(t, newCA(t), "frontend", "frontend.example"))
	secret := certSecret(t, a)
	secretCreds := *front
	secretCreds.Certificate = secret
	rotated, err := a.Rotate(rand.Reader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	afterUpdate := credentials(t, issue(t, rotated, "frontend"))

	for name, tc := range map[string]struct {
		server, client *tls.Config
		host           string
		serverErr      error // matched with errors.Is, if set
		clientFails    bool  // the server's certificate is wrong; else the client's
	}{
		"client of another type":              {back.ServerTLSConfig("frontend"), back.ClientTLSConfig(), "backend.example", marble.ErrPeerType, false},
		"server of another type":              {front.ServerTLSConfig(), back.ClientTLSConfig("backend"), "127.0.0.1", nil, true},
		"client of another Coordinator":       {back.ServerTLSConfig(), other.ClientTLSConfig(), "backend.example", nil, false},
		"server of another Coordinator":       {other.ServerTLSConfig(), back.ClientTLSConfig(), "frontend.example", nil, true},
		"client with a certificate secret":    {back.ServerTLSConfig(), secretCreds.ClientTLSConfig(), "backend.example", marble.ErrNotMarbleCert, false},
		"server with a certificate secret":    {secretCreds.ServerTLSConfig(), back.ClientTLSConfig(), "localhost", nil, true},
		"server name not in the certificate":  {back.ServerTLSConfig(), front.ClientTLSConfig(), "evil.example", nil, true},
		"client activated after an update":    {back.ServerTLSConfig(), afterUpdate.ClientTLSConfig(), "backend.example", nil, false},
		"client without a certificate at all": {back.ServerTLSConfig(), &tls.Config{RootCAs: back.ClientTLSConfig().RootCAs}, "backend.example", nil, false},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, serr, cerr := handshake(t, tc.server, tc.client, tc.host)
			if serr == nil && cerr == nil {
				t.Fatal("the handshake succeeded")
			}
			if tc.serverErr != nil && !errors.Is(serr, tc.serverErr) {
				t.Errorf("server error %v, want %v", serr, tc.serverErr)
			}
			if tc.clientFails && cerr == nil {
				t.Errorf("the client accepted the server (server error %v)", serr)
			}
			if !tc.clientFails && serr == nil {
				t.Errorf("the server accepted the client (client error %v)", cerr)
			}
		})
	}
	if _, err := marble.PeerMarbleType(&tls.ConnectionState{}); err == nil {
		t.Error("PeerMarbleType of an unverified connection succeeded")
	}
}
