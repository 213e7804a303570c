package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"strings"

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
// returns a client pinned to its root. With several addresses, the first
// that answers is attested (or its root checked), and the client fails over
// between all of them with that one root pinned.
func (a *app) connect(ctx context.Context, n needs) (*session, error) {
	if strings.TrimSpace(a.coordinator) == "" {
		return nil, usagef("no Coordinator address: pass --coordinator host:port (or several, comma-separated) or set %s", EnvCoordinator)
	}
	if _, err := client.ParseEndpoints(a.coordinator); err != nil {
		return nil, usagef("--coordinator: %w", err)
	}
	if a.rootFile != "" && a.insecure {
		return nil, usagef("--root and --insecure exclude each other")
	}
	verifier, err := a.quoteVerifier()
	if err != nil {
		return nil, err
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
		if a.insecure {
			a.warn(insecureWarning)
		}
		att, err := client.VerifyCoordinator(ctx, a.coordinator, client.VerifyOptions{Verifier: verifier, InsecureSkipVerify: a.insecure})
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

// insecureWarning is written to standard error on every use of --insecure.
const insecureWarning = "--insecure: the Coordinator is not verified; whoever answers at this address " +
	"(a man in the middle included) is trusted and gets everything this command sends"

// warn writes a warning to standard error: a line of text, or with
// --output json a JSON object {"warning": ...}.
func (a *app) warn(msg string) {
	if a.jsonOutput() {
		_ = json.NewEncoder(a.errw).Encode(map[string]string{"warning": msg})
		return
	}
	fmt.Fprintf(a.errw, "quarry: warning: %s\n", msg)
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

// quoteVerifier builds the SGX quote verifier from the attestation flags;
// nil when --era-config is not given.
func (a *app) quoteVerifier() (client.QuoteVerifier, error) {
	if a.eraConfig == "" {
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"--accepted-tcb-statuses", a.acceptedTCB != nil}, {"--accepted-advisories", a.acceptedAdvisories != nil},
			{"--collateral-file", a.collateralFile != ""}, {"--pccs-url", a.pccsURL != ""}, {"--sgx-root-ca", a.sgxRootCA != ""},
		} {
			if f.set {
				return nil, usagef("%s configures quote verification: it needs --era-config with the expected properties of the Coordinator's enclave", f.name)
			}
		}
		return nil, nil
	}
	switch {
	case a.rootFile != "":
		return nil, usagef("--root and --era-config exclude each other: trust a pinned root, or verify the Coordinator's quote")
	case a.insecure:
		return nil, usagef("--insecure and --era-config exclude each other: skip verification, or verify the Coordinator's quote")
	case a.collateralFile == "" && a.pccsURL == "":
		return nil, usagef("--era-config: verifying the quote needs Intel's collateral: pass --collateral-file or --pccs-url")
	case a.collateralFile != "" && a.pccsURL != "":
		return nil, usagef("--collateral-file and --pccs-url exclude each other")
	}
	era, err := client.ReadEraConfig(a.eraConfig)
	if err != nil {
		return nil, usagef("--era-config: %w", err)
	}
	if a.acceptedTCB != nil {
		era.AcceptedTCBStatuses = a.acceptedTCB
	}
	if a.acceptedAdvisories != nil {
		era.AcceptedAdvisories = a.acceptedAdvisories
	}
	o := client.DCAPOptions{Expected: era, CollateralFile: a.collateralFile, PCCSURL: a.pccsURL}
	if a.sgxRootCA != "" {
		pemText, err := readFile(a.sgxRootCA)
		if err != nil {
			return nil, err
		}
		if o.RootCA, err = client.ParseRootPEM(pemText); err != nil {
			return nil, usagef("--sgx-root-ca %s: %w", a.sgxRootCA, err)
		}
	}
	v, err := client.NewDCAPVerifier(o)
	if err != nil {
		return nil, usageError{err}
	}
	return v, nil
}
