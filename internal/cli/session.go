package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"

	"github.com/quarry-cc/quarry/client"
)

// session is a client pinned to the Coordinator's root for one command.
type session struct {
	c    *client.Client
	root *x509.Certificate
	// att is the attestation made to obtain root; nil when --root gave it.
	att *client.Attestation
}

// needs tells connect what a command requires.
type needs int

const (
	needNothing    needs = iota
	needClientCert       // a manifest user's certificate (--cert, --key)
)

// connect establishes trust in the Coordinator as the global flags say and
// returns a client pinned to its root.
func (a *app) connect(ctx context.Context, n needs) (*session, error) {
	if a.coordinator == "" {
		return nil, usagef("no Coordinator address: pass --coordinator host:port or set %s", EnvCoordinator)
	}
	if a.rootFile != "" && a.insecure {
		return nil, usagef("--root and --insecure exclude each other")
	}
	if (a.certFile == "") != (a.keyFile == "") {
		return nil, usagef("--cert and --key must be given together")
	}
	if n == needClientCert && a.certFile == "" {
		return nil, usagef("this command needs the certificate of a manifest user: pass --cert and --key")
	}
	var opts []client.Option
	if a.certFile != "" {
		cert, err := tls.LoadX509KeyPair(a.certFile, a.keyFile)
		if err != nil {
			return nil, usagef("loading the client certificate: %w", err)
		}
		opts = append(opts, client.WithClientCertificate(cert))
	}
	s := &session{}
	if a.rootFile != "" {
		pemText, err := readFile(a.rootFile)
		if err != nil {
			return nil, err
		}
		root, err := client.ParseRootPEM(pemText)
		if err != nil {
			return nil, usagef("--root %s: %w", a.rootFile, err)
		}
		s.root = root
	} else {
		att, err := client.VerifyCoordinator(ctx, a.coordinator, client.VerifyOptions{InsecureSkipVerify: a.insecure})
		if err != nil {
			return nil, fmt.Errorf("verifying the Coordinator: %w", err)
		}
		s.root, s.att = att.Root, att
	}
	c, err := client.New(a.coordinator, append(opts, client.WithRootCertificate(s.root))...)
	if err != nil {
		return nil, usageError{err}
	}
	s.c = c
	return s, nil
}

// chain returns the Coordinator's current intermediate and root, checked
// against the pinned root.
func (s *session) chain(ctx context.Context) (intermediate, root *x509.Certificate, pemText []byte, err error) {
	if s.att != nil {
		return s.att.Intermediate, s.att.Root, s.att.ChainPEM, nil
	}
	q, err := s.c.Quote(ctx, nil)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("fetching the certificate chain: %w", err)
	}
	inter, root, err := client.ParseCertificateChain([]byte(q.Cert))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%w: %w", client.ErrVerification, err)
	}
	if !root.Equal(s.root) {
		return nil, nil, nil, fmt.Errorf("%w: the Coordinator's chain has another root than the trusted one", client.ErrVerification)
	}
	return inter, root, []byte(q.Cert), nil
}
