package main

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/ca"
)

func TestReport(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "conf")
	if err := os.WriteFile(conf, []byte{0, 1, 'x'}, 0o640); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	args := []string{"testapp", "-env", "FOO, UNSET,PRE_*", "-exit", "3", conf, missing}
	environ := []string{"FOO=bar=baz", "PRE_A=1", "PRE_B=", "OTHER=x"}
	var stdout, stderr bytes.Buffer
	if code := run(args, environ, &stdout, &stderr); code != 3 {
		t.Fatalf("exit %d, want 3 (stderr %q)", code, stderr.String())
	}
	var r struct {
		Argv  []string
		Cwd   string
		Env   map[string]*string
		Files map[string]struct {
			Data        []byte
			Mode, Error string
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, stdout.Bytes())
	}
	if !slices.Equal(r.Argv, args) {
		t.Errorf("argv %q", r.Argv)
	}
	wd, _ := os.Getwd()
	if r.Cwd != wd {
		t.Errorf("cwd %q, want %q", r.Cwd, wd)
	}
	str := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return *p
	}
	if len(r.Env) != 4 || str(r.Env["FOO"]) != "bar=baz" || r.Env["UNSET"] != nil || str(r.Env["PRE_A"]) != "1" || str(r.Env["PRE_B"]) != "" {
		t.Errorf("env %v", r.Env)
	}
	if f := r.Files[conf]; !bytes.Equal(f.Data, []byte{0, 1, 'x'}) || f.Mode != "0640" || f.Error != "" {
		t.Errorf("file %s: %+v", conf, f)
	}
	if f := r.Files[missing]; f.Error == "" || f.Data != nil {
		t.Errorf("file %s: %+v, want an error", missing, f)
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"testapp", "-tls", "plain"},
		{"testapp", "-serve", ":0", "-connect", "x:1"},
		{"testapp", "-nosuchflag"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(args, nil, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}

// marble is one activated Marble's credentials, as a Coordinator hands
// them out.
type marble struct {
	uuid    string
	environ []string
	chain   string // PEM: leaf, Coordinator intermediate
	key     string // PEM
}

// newMarble issues a Marble certificate from auth and returns the
// MARBLE_PREDEFINED_* environment.
func newMarble(t *testing.T, auth *ca.Authority, uuid string) marble {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.IssueMarbleCert(rand.Reader, csr, uuid, "testapp", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.Key)
	if err != nil {
		t.Fatal(err)
	}
	m := marble{
		uuid:  uuid,
		chain: pemCert(leaf.Cert.Raw) + pemCert(auth.Intermediate.Raw),
		key:   string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
	}
	m.environ = []string{
		envRootCA + "=" + pemCert(auth.MarbleRoot.Raw),
		envChain + "=" + m.chain,
		envKey + "=" + m.key,
	}
	return m
}

func pemCert(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func newAuthority(t *testing.T) *ca.Authority {
	t.Helper()
	auth, err := ca.New(rand.Reader, ca.Names{DNS: []string{"localhost"}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return auth
}

// server runs testapp in server mode and returns the address it listens
// on, its output lines, and its exit status once done.
func server(t *testing.T, args, environ []string) (addr string, lines *bufio.Scanner, done <-chan int) {
	t.Helper()
	pr, pw := io.Pipe()
	ch := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		code := run(append([]string{"testapp"}, args...), environ, pw, &stderr)
		pw.Close()
		ch <- code
	}()
	sc := bufio.NewScanner(pr)
	sc.Buffer(nil, 1<<20)
	if !sc.Scan() {
		t.Fatalf("server printed no report (stderr %q)", stderr.String())
	}
	var r struct{ Listen string }
	if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Listen == "" {
		t.Fatalf("server report %s: %v", sc.Bytes(), err)
	}
	t.Cleanup(func() { go io.Copy(io.Discard, pr) })
	return r.Listen, sc, ch
}

type clientReport struct {
	Connect struct {
		Addr     string
		ServerCN string `json:"server_cn"`
		Reply    struct {
			Message  string
			ServerCN string `json:"server_cn"`
			ClientCN string `json:"client_cn"`
		}
	}
}

func client(t *testing.T, args, environ []string) (clientReport, int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"testapp"}, args...), environ, &stdout, &stderr)
	var r clientReport
	if code == 0 {
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("client report %s: %v", stdout.Bytes(), err)
		}
	}
	return r, code, stderr.String()
}

type acceptedLine struct {
	Accepted struct {
		Message        string
		ClientCN       string `json:"client_cn"`
		ClientVerified bool   `json:"client_verified"`
	}
}

func TestMutualTLSPredefined(t *testing.T) {
	auth := newAuthority(t)
	srv := newMarble(t, auth, "11111111-1111-4111-8111-111111111111")
	cli := newMarble(t, auth, "22222222-2222-4222-8222-222222222222")
	stranger := newMarble(t, newAuthority(t), "33333333-3333-4333-8333-333333333333")

	addr, lines, done := server(t, []string{"-serve", "127.0.0.1:0", "-timeout", "20s"}, srv.environ)

	// A Marble of another Coordinator is turned away, and so the server
	// keeps waiting.
	if _, code, stderr := client(t, []string{"-connect", addr, "-timeout", "5s"}, stranger.environ); code != 1 {
		t.Errorf("stranger: exit %d, want 1 (stderr %q)", code, stderr)
	}

	r, code, stderr := client(t, []string{"-connect", addr, "-message", "ping"}, cli.environ)
	if code != 0 {
		t.Fatalf("client: exit %d: %s", code, stderr)
	}
	if r.Connect.Addr != addr || r.Connect.ServerCN != srv.uuid || r.Connect.Reply.Message != "ping" ||
		r.Connect.Reply.ServerCN != srv.uuid || r.Connect.Reply.ClientCN != cli.uuid {
		t.Errorf("client report %+v", r)
	}
	if !lines.Scan() {
		t.Fatal("no accepted line")
	}
	var a acceptedLine
	if err := json.Unmarshal(lines.Bytes(), &a); err != nil {
		t.Fatal(err)
	}
	if a.Accepted.Message != "ping" || a.Accepted.ClientCN != cli.uuid || !a.Accepted.ClientVerified {
		t.Errorf("accepted %+v", a)
	}
	if code := <-done; code != 0 {
		t.Errorf("server exit %d", code)
	}
}

func TestMutualTLSTTLS(t *testing.T) {
	auth := newAuthority(t)
	srv := newMarble(t, auth, "44444444-4444-4444-8444-444444444444")
	cli := newMarble(t, auth, "55555555-5555-4555-8555-555555555555")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	ln.Close()

	root := pemCert(auth.MarbleRoot.Raw)
	ttls := func(m marble, incoming, outgoing map[string]any) string {
		for _, e := range []map[string]any{incoming, outgoing} {
			for k := range e {
				e[k] = map[string]any{"cacrt": root, "clicrt": m.chain, "clikey": m.key, "clientAuth": true}
			}
		}
		b, err := json.Marshal(map[string]any{"tls": map[string]any{"Incoming": incoming, "Outgoing": outgoing}})
		if err != nil {
			t.Fatal(err)
		}
		return envTTLS + "=" + string(b)
	}
	srvEnv := []string{ttls(srv, map[string]any{"*:" + port: nil}, map[string]any{})}
	cliEnv := []string{ttls(cli, map[string]any{}, map[string]any{addr: nil})}

	_, lines, done := server(t, []string{"-tls", "ttls", "-serve", addr, "-timeout", "20s"}, srvEnv)
	r, code, stderr := client(t, []string{"-tls", "ttls", "-connect", addr}, cliEnv)
	if code != 0 {
		t.Fatalf("client: exit %d: %s", code, stderr)
	}
	if r.Connect.ServerCN != srv.uuid || r.Connect.Reply.ClientCN != cli.uuid || r.Connect.Reply.Message != "hello" {
		t.Errorf("client report %+v", r)
	}
	lines.Scan()
	if code := <-done; code != 0 {
		t.Errorf("server exit %d", code)
	}

	// Without an entry for the address, the client says so.
	_, code, stderr = client(t, []string{"-tls", "ttls", "-connect", "127.0.0.1:1"}, cliEnv)
	if code != 1 || !strings.Contains(stderr, "Outgoing") {
		t.Errorf("exit %d, stderr %q; want 1 naming the missing Outgoing entry", code, stderr)
	}
}

func TestServerTimeout(t *testing.T) {
	m := newMarble(t, newAuthority(t), "66666666-6666-4666-8666-666666666666")
	_, _, done := server(t, []string{"-serve", "127.0.0.1:0", "-timeout", "200ms"}, m.environ)
	select {
	case code := <-done:
		if code != 1 {
			t.Errorf("exit %d, want 1 after the timeout", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("server did not end at its timeout")
	}
}
