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
	// att is the attestation made to obtain root; nil when a pinned root
	// (--root, --coordinator-cert) gave it.
	att *client.Attestation
	// cachedIntermediate is the intermediate of --coordinator-cert when
	// that file gave the root.
	cachedIntermediate *x509.Certificate
}

// needs tells connect what a command requires (flags, or-ed).
type needs int

const (
	needNothing    needs = 0
	needClientCert needs = 1 << iota // a manifest user's certificate (--cert, --key)
	// attesting marks the commands that marblerun verifies by the quote
	// (certificates, manifest set, get and verify, recovery): with the
	// address as the last argument, ./era-config.json comes before the
	// cached certificate for them, and -i prints marblerun's warning.
	attesting
)

// connect establishes trust in the Coordinator as the global flags say and
// returns a client pinned to its root. With several addresses, the first
// that answers is attested (or its root checked), and the client fails over
// between all of them with that one root pinned.
//
// Trust comes from, in this order: --root; --insecure; --era-config; and
// then, with marblerun's command line (the address as the last argument),
// ./era-config.json and the cached chain of --coordinator-cert (its default
// location), the era config first for attesting commands; with quarry's,
// an explicit --coordinator-cert. Without any, the Coordinator's quote is
// requested and, with no verifier, refused (exit 3 with a hint).
func (a *app) connect(ctx context.Context, n needs) (*session, error) {
	if a.certFile != "" && !fileExists(a.certFile) && looksLikeAddress(a.certFile) {
		return nil, usagef("-c is --cert, the user's certificate file, as in marblerun; is %q the Coordinator's address? Give it with --coordinator or as the last argument", a.certFile)
	}
	if strings.TrimSpace(a.coordinator) == "" {
		return nil, usagef("no Coordinator address: pass --coordinator host:port (or several, comma-separated), set %s, or give it as the last argument", EnvCoordinator)
	}
	if _, err := client.ParseEndpoints(a.coordinator); err != nil {
		return nil, usagef("Coordinator address: %w", err)
	}
	if a.rootFile != "" && a.insecure {
		return nil, usagef("--root and --insecure exclude each other")
	}
	if a.rootFile != "" && a.cmd.Flags().Changed("coordinator-cert") {
		return nil, usagef("--root and --coordinator-cert exclude each other: both name the root to trust")
	}
	eraConfig, reused, err := a.eraConfigFile(n)
	if err != nil {
		return nil, err
	}
	verifier, err := a.quoteVerifier(eraConfig)
	if err != nil {
		return nil, err
	}
	if (a.certFile == "") != (a.keyFile == "") {
		return nil, usagef("--cert and --key must be given together")
	}
	if n&needClientCert != 0 && a.certFile == "" {
		return nil, usagef("this command needs the certificate of a manifest user: pass --cert and --key (-c, -k)")
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
	switch {
	case a.rootFile != "":
		pemText, err := readFile(a.rootFile)
		if err != nil {
			return nil, err
		}
		root, err := client.ParseRootPEM(pemText)
		if err != nil {
			return nil, usagef("--root %s: %w", a.rootFile, err)
		}
		s.root = root
	case !a.insecure && verifier == nil && a.useCertCache(n, eraConfig):
		if s.root, s.cachedIntermediate, err = a.loadCertCache(); err != nil {
			return nil, err
		}
	default:
		if a.insecure {
			a.warn(insecureWarning)
			if a.mr && n&attesting != 0 {
				a.printf("Warning: skipping quote verification\n") // marblerun's line, on standard output
			}
		}
		if reused && a.mr {
			a.printf("Reusing existing config file\n") // marblerun's line, on standard output
		}
		vo := client.VerifyOptions{Verifier: verifier, InsecureSkipVerify: a.insecure}
		if a.nonce != "" {
			vo.Nonce = []byte(a.nonce)
		}
		att, err := client.VerifyCoordinator(ctx, a.coordinator, vo)
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
	if a.saveQuote != "" {
		if err := a.saveCoordinatorQuote(ctx, s); err != nil {
			return nil, err
		}
	}
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

// quoteVerifier builds the quote verifier for the era config file
// (--era-config, or ./era-config.json with marblerun's command line); nil
// without one. The collateral comes from --collateral-file or --pccs-url
// (or their variables), else from the pccs_url of Intel's QCNL
// configuration, which marblerun's verification reads.
func (a *app) quoteVerifier(eraConfig string) (client.QuoteVerifier, error) {
	if eraConfig == "" {
		var set []string
		for _, name := range []string{"accepted-tcb-statuses", "accepted-advisories", "collateral-file", "pccs-url", "sgx-root-ca"} {
			if a.cmd.Flags().Changed(name) {
				set = append(set, "--"+name)
			}
		}
		switch {
		case len(set) == 0:
		case a.mr:
			// marblerun takes these on every command and ignores them
			// where no quote is verified.
			a.warn(strings.Join(set, ", ") + " configure quote verification, which this command does not do here: ignored")
		default:
			return nil, usagef("%s configures quote verification: it needs --era-config with the expected properties of the Coordinator's enclave", set[0])
		}
		return nil, nil
	}
	switch {
	case a.rootFile != "":
		return nil, usagef("--root and --era-config exclude each other: trust a pinned root, or verify the Coordinator's quote")
	case a.insecure && a.mr:
		// marblerun skips the verification with -i whatever else is given.
		a.warn("--era-config is not used: -i/--insecure skips quote verification")
		return nil, nil
	case a.insecure:
		return nil, usagef("--insecure and --era-config exclude each other: skip verification, or verify the Coordinator's quote")
	case a.collateralFile != "" && a.pccsURL != "":
		return nil, usagef("--collateral-file and --pccs-url exclude each other")
	}
	pccsURL := a.pccsURL
	if a.collateralFile == "" && pccsURL == "" {
		pccsURL = qcnlPCCSURL(qcnlConfPath)
		if pccsURL == "" {
			return nil, usagef("--era-config: verifying the quote needs Intel's collateral: pass --collateral-file or --pccs-url (or set %s or %s, or a pccs_url in %s)",
				EnvCollateralFile, EnvPCCSURL, qcnlConfPath)
		}
	}
	era, err := client.ReadEraConfig(eraConfig)
	if err != nil {
		return nil, usagef("--era-config: %w", err)
	}
	if a.acceptedTCB != nil {
		era.AcceptedTCBStatuses = a.acceptedTCB
	}
	if a.acceptedAdvisories != nil {
		era.AcceptedAdvisories = a.acceptedAdvisories
	}
	o := client.DCAPOptions{Expected: era, CollateralFile: a.collateralFile, PCCSURL: pccsURL}
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
