package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// Variables of the Coordinator's parameters (docs/design/behaviour.md#activation-response).
const (
	envRootCA    = "MARBLE_PREDEFINED_ROOT_CA"
	envChain     = "MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN"
	envKey       = "MARBLE_PREDEFINED_PRIVATE_KEY"
	envTTLS      = "MARBLE_TTLS_CONFIG"
	maxLineBytes = 64 << 10
)

type report struct {
	Argv    []string           `json:"argv"`
	Cwd     string             `json:"cwd"`
	Env     map[string]*string `json:"env"`
	Files   map[string]file    `json:"files"`
	Listen  string             `json:"listen,omitempty"`
	Connect *connectResult     `json:"connect,omitempty"`
}

type file struct {
	Data  string `json:"data,omitempty"` // base64
	Mode  string `json:"mode,omitempty"`
	Error string `json:"error,omitempty"`
}

type connectResult struct {
	Addr     string `json:"addr"`
	ServerCN string `json:"server_cn"`
	Reply    reply  `json:"reply"`
}

// reply is the server's answer line.
type reply struct {
	Message  string `json:"message"`
	ServerCN string `json:"server_cn"`
	ClientCN string `json:"client_cn"`
}

type accepted struct {
	Accepted struct {
		Message        string `json:"message"`
		ClientCN       string `json:"client_cn"`
		ClientVerified bool   `json:"client_verified"`
	} `json:"accepted"`
}

type config struct {
	env     string
	serve   string
	count   int
	connect string
	message string
	tlsMode string
	timeout time.Duration
	out     string
	exit    int
	files   []string
	stderr  io.Writer
}

// run is main with its process context made explicit.
func run(args, environ []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testapp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := config{stderr: stderr}
	fs.StringVar(&c.env, "env", "", "comma-separated variables to report (NAME* for a prefix)")
	fs.StringVar(&c.serve, "serve", "", "server mode: listen on this address with TLS")
	fs.IntVar(&c.count, "count", 1, "connections to answer in server mode")
	fs.StringVar(&c.connect, "connect", "", "client mode: connect to this address with TLS")
	fs.StringVar(&c.message, "message", "hello", "what the client sends")
	fs.StringVar(&c.tlsMode, "tls", "predefined", "credentials: predefined or ttls")
	fs.DurationVar(&c.timeout, "timeout", time.Minute, "bound on the whole run")
	fs.StringVar(&c.out, "out", "", "write the report to this file instead of stdout")
	fs.IntVar(&c.exit, "exit", 0, "exit status after a successful run")
	if len(args) == 0 {
		args = []string{"testapp"}
	}
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	c.files = fs.Args()
	if c.tlsMode != "predefined" && c.tlsMode != "ttls" {
		fmt.Fprintf(stderr, "testapp: -tls %q: want predefined or ttls\n", c.tlsMode)
		return 2
	}
	if c.serve != "" && c.connect != "" {
		fmt.Fprintln(stderr, "testapp: -serve and -connect exclude each other")
		return 2
	}

	out := stdout
	if c.out != "" {
		f, err := os.OpenFile(c.out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			fmt.Fprintf(stderr, "testapp: %v\n", err)
			return 1
		}
		defer f.Close()
		out = f
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := c.do(ctx, args, environ, out); err != nil {
		fmt.Fprintf(stderr, "testapp: %v\n", err)
		return 1
	}
	return c.exit
}

func (c *config) do(ctx context.Context, args, environ []string, out io.Writer) error {
	env := envMap(environ)
	r := report{Argv: args, Env: selectEnv(c.env, environ, env), Files: readFiles(c.files)}
	r.Cwd, _ = os.Getwd()
	enc := json.NewEncoder(out)

	switch {
	case c.serve != "":
		cfg, ln, err := c.listen(env)
		if err != nil {
			return err
		}
		defer ln.Close()
		r.Listen = ln.Addr().String()
		if err := enc.Encode(r); err != nil {
			return err
		}
		return c.serveConns(ctx, ln, cfg, enc)
	case c.connect != "":
		res, err := c.dial(ctx, env)
		if err != nil {
			return err
		}
		r.Connect = res
	}
	return enc.Encode(r)
}

func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// selectEnv returns the variables named in list (NAME* for a prefix); an
// unset one maps to nil.
func selectEnv(list string, environ []string, env map[string]string) map[string]*string {
	sel := map[string]*string{}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if prefix, ok := strings.CutSuffix(name, "*"); ok {
			for k, v := range env {
				if strings.HasPrefix(k, prefix) {
					sel[k] = &v
				}
			}
			continue
		}
		if name == "" {
			continue
		}
		if v, ok := env[name]; ok {
			sel[name] = &v
		} else {
			sel[name] = nil
		}
	}
	return sel
}

func readFiles(names []string) map[string]file {
	files := map[string]file{}
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			files[name] = file{Error: err.Error()}
			continue
		}
		f := file{Data: base64.StdEncoding.EncodeToString(data)}
		if fi, err := os.Stat(name); err == nil {
			f.Mode = fmt.Sprintf("%04o", fi.Mode().Perm())
		}
		files[name] = f
	}
	return files
}

// ttlsEntry is one entry of MARBLE_TTLS_CONFIG.
type ttlsEntry struct {
	CACrt      string `json:"cacrt"`
	CliCrt     string `json:"clicrt"`
	CliKey     string `json:"clikey"`
	ClientAuth bool   `json:"clientAuth"`
}

type ttlsConfig struct {
	TLS struct {
		Incoming map[string]ttlsEntry `json:"Incoming"`
		Outgoing map[string]ttlsEntry `json:"Outgoing"`
	} `json:"tls"`
}

// credentials returns the certificate and roots for mode: MARBLE_PREDEFINED_*
// or the TTLS entry key of the incoming or outgoing map; clientAuth says
// whether a server verifies client certificates.
func credentials(env map[string]string, mode string, incoming bool, key string) (cert tls.Certificate, roots *x509.CertPool, clientAuth bool, err error) {
	certPEM, keyPEM, caPEM := env[envChain], env[envKey], env[envRootCA]
	clientAuth = true
	if mode == "ttls" {
		raw, ok := env[envTTLS]
		if !ok {
			return cert, nil, false, errors.New(envTTLS + " is not set")
		}
		var tc ttlsConfig
		if err := json.Unmarshal([]byte(raw), &tc); err != nil {
			return cert, nil, false, fmt.Errorf("%s: %w", envTTLS, err)
		}
		m, dir := tc.TLS.Outgoing, "Outgoing"
		if incoming {
			m, dir = tc.TLS.Incoming, "Incoming"
		}
		e, ok := m[key]
		if !ok {
			return cert, nil, false, fmt.Errorf("%s has no %s entry %q", envTTLS, dir, key)
		}
		certPEM, keyPEM, caPEM = e.CliCrt, e.CliKey, e.CACrt
		if incoming {
			clientAuth = e.ClientAuth
		}
	}
	cert, err = tls.X509KeyPair([]byte(certPEM), []byte(keyPEM))
	if err != nil {
		return cert, nil, false, fmt.Errorf("the Marble's certificate and key (%s): %w", mode, err)
	}
	roots = x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(caPEM)) {
		return cert, nil, false, fmt.Errorf("no root certificate (%s)", mode)
	}
	return cert, roots, clientAuth, nil
}

// listen opens the server's TLS listener.
func (c *config) listen(env map[string]string) (*tls.Config, net.Listener, error) {
	_, port, err := net.SplitHostPort(c.serve)
	if err != nil {
		return nil, nil, fmt.Errorf("-serve: %w", err)
	}
	cert, roots, clientAuth, err := credentials(env, c.tlsMode, true, "*:"+port)
	if err != nil {
		return nil, nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientAuth {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = roots
	}
	ln, err := net.Listen("tcp", c.serve)
	if err != nil {
		return nil, nil, err
	}
	return cfg, ln, nil
}

// serveConns answers c.count connections.
func (c *config) serveConns(ctx context.Context, ln net.Listener, cfg *tls.Config, enc *json.Encoder) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	serverCN := ""
	if leaf, err := x509.ParseCertificate(cfg.Certificates[0].Certificate[0]); err == nil {
		serverCN = leaf.Subject.CommonName
	}
	for answered := 0; answered < c.count; {
		raw, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for connections: %w", ctx.Err())
			}
			return err
		}
		a, err := answer(ctx, tls.Server(raw, cfg), serverCN)
		if err != nil {
			// A failed handshake is the client's problem; report and go on.
			fmt.Fprintf(c.stderr, "testapp: connection from %s: %v\n", raw.RemoteAddr(), err)
			continue
		}
		if err := enc.Encode(a); err != nil {
			return err
		}
		answered++
	}
	return nil
}

func answer(ctx context.Context, conn *tls.Conn, serverCN string) (accepted, error) {
	defer conn.Close()
	var a accepted
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if err := conn.HandshakeContext(ctx); err != nil {
		return a, err
	}
	st := conn.ConnectionState()
	if len(st.PeerCertificates) > 0 {
		a.Accepted.ClientCN = st.PeerCertificates[0].Subject.CommonName
	}
	a.Accepted.ClientVerified = len(st.VerifiedChains) > 0
	line, err := bufio.NewReader(io.LimitReader(conn, maxLineBytes)).ReadString('\n')
	if err != nil {
		return a, fmt.Errorf("reading the message: %w", err)
	}
	a.Accepted.Message = strings.TrimSuffix(line, "\n")
	return a, json.NewEncoder(conn).Encode(reply{Message: a.Accepted.Message, ServerCN: serverCN, ClientCN: a.Accepted.ClientCN})
}

// dial connects to the server, retrying until ctx ends, and exchanges one
// message.
func (c *config) dial(ctx context.Context, env map[string]string) (*connectResult, error) {
	cert, roots, _, err := credentials(env, c.tlsMode, false, c.connect)
	if err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(c.connect)
	if err != nil {
		return nil, fmt.Errorf("-connect: %w", err)
	}
	d := tls.Dialer{Config: &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      roots,
		ServerName:   host,
		MinVersion:   tls.VersionTLS12,
	}}
	var conn net.Conn
	for {
		conn, err = d.DialContext(ctx, "tcp", c.connect)
		if err == nil {
			break
		}
		var opErr *net.OpError
		if ctx.Err() != nil || !errors.As(err, &opErr) || opErr.Op != "dial" {
			return nil, fmt.Errorf("connecting to %s: %w", c.connect, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to %s: %w", c.connect, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	res := &connectResult{Addr: c.connect}
	if st := conn.(*tls.Conn).ConnectionState(); len(st.PeerCertificates) > 0 {
		res.ServerCN = st.PeerCertificates[0].Subject.CommonName
	}
	if _, err := io.WriteString(conn, c.message+"\n"); err != nil {
		return nil, err
	}
	if err := json.NewDecoder(io.LimitReader(conn, maxLineBytes)).Decode(&res.Reply); err != nil {
		return nil, fmt.Errorf("reading the reply: %w", err)
	}
	return res, nil
}
