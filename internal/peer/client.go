package peer

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/policy"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/seal"
)

// Client asks running instances for the data key. Certificate is its TLS
// certificate (NewCertificate), whose key its quotes bind; Issuer makes
// the quotes (attest.SimulationIssuer: none, sent without one). Self is
// this instance's own enclave (nil without one) and Verifier checks the
// peers' quotes (nil: no collateral source, and then an instance in an
// enclave accepts no key).
type Client struct {
	Certificate tls.Certificate
	Issuer      attest.Issuer
	Self        *sgxquote.ReportBody
	Verifier    Verifier
	// InsecureTrust accepts a key without a quote when this instance runs
	// without an enclave (simulation, --insecure-peer-trust).
	InsecureTrust bool
	// Timeout bounds one exchange (DefaultTimeout when 0).
	Timeout time.Duration
}

// Key is a data key a peer gave after it proved to be the same enclave.
type Key struct {
	DEK []byte
	// Mode is the seal mode the peer stated for the state the key opens
	// (bound into its quote): ProductKey or UniqueKey.
	Mode string
	// Peer is the peer's verified quote; nil when the key was accepted
	// without attestation (simulation, InsecureTrust).
	Peer *dcap.Result

	self *sgxquote.ReportBody
}

// Allows reports whether the peer that gave k may hold the key of a state
// with seal mode mode: its quote satisfies that mode's rules. The caller
// checks it once the key opened the state, with the state's own SealMode,
// before it uses the key for anything else. A key accepted without
// attestation (simulation) allows every mode.
func (k *Key) Allows(mode string) error {
	if k.Peer == nil {
		return nil
	}
	if err := policy.Check(k.Peer, samePackage(k.self, mode)); err != nil {
		return fmt.Errorf("%w for the state's seal mode %s (it stated %s): %v", ErrPeerIdentity, PolicyMode(mode), k.Mode, err)
	}
	return nil
}

// Fetch asks the instance at addr for the data key with ID keyID and
// returns it only if the peer proved with a quote bound to this session
// that it is the same enclave (see the package comment); else the error
// says why. A refusal by the peer is a *RefusedError; the caller still
// checks the key against the key record (seal.KeyRecord).
func (c *Client) Fetch(ctx context.Context, addr string, keyID [32]byte) (*Key, error) {
	// Decide before dialling whether any answer could be accepted.
	switch {
	case c.Self != nil && c.Verifier == nil:
		return nil, fmt.Errorf("%w: this instance runs in an enclave and has no collateral source (--collateral-file or --pccs-url) to verify a peer's quote; it accepts no data key from a peer without", ErrPeerUnverified)
	case c.Self == nil && !c.InsecureTrust:
		return nil, fmt.Errorf("%w: this instance runs without an enclave and cannot tell a peer's identity", ErrSimulation)
	}
	leaf := c.Certificate.Leaf
	if leaf == nil {
		return nil, errors.New("peer: the client certificate has no parsed leaf")
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{
		Certificates: []tls.Certificate{c.Certificate},
		// No CA vouches for a peer: its quote, bound to this session and
		// to the certificate's key, does (checked below).
		InsecureSkipVerify: true,
		MinVersion:         tls.VersionTLS13,
	}}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	conn := nc.(*tls.Conn)
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	cs := conn.ConnectionState()
	exporter, err := Exporter(cs)
	if err != nil {
		return nil, fmt.Errorf("peer %s: TLS exporter: %w", addr, err)
	}
	var h hello
	if err := readMsg(conn, &h, ErrBadResponse); err != nil {
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	if h.Version != ProtocolVersion {
		return nil, fmt.Errorf("%w: the peer speaks protocol version %d, this instance %d (mutual attestation); run one Coordinator version on all instances", ErrVersion, h.Version, ProtocolVersion)
	}
	if len(h.Nonce) != nonceSize {
		return nil, fmt.Errorf("peer %s: %w: a nonce of %d bytes", addr, ErrBadResponse, len(h.Nonce))
	}
	quote, err := c.Issuer.Issue(ctx, JoinerReportData(leaf, exporter, h.Nonce, keyID))
	if errors.Is(err, attest.ErrUnsupported) && c.Self == nil {
		quote = nil // simulation: the peer decides (--insecure-peer-trust)
	} else if err != nil {
		return nil, fmt.Errorf("peer: quoting the TLS key: %w", err)
	}
	nonce := make([]byte, nonceSize)
	rand.Read(nonce)
	if err := writeMsg(conn, request{Version: ProtocolVersion, KeyID: keyID[:], Nonce: nonce, Quote: quote}); err != nil {
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	var resp response
	if err := readMsg(conn, &resp, ErrBadResponse); err != nil {
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	if resp.Refused != "" {
		return nil, &RefusedError{Code: resp.Refused, Reason: resp.Reason}
	}
	if len(resp.Key) != seal.KeySize {
		return nil, fmt.Errorf("peer %s: %w: a key of %d bytes", addr, ErrBadResponse, len(resp.Key))
	}
	if resp.Mode != seal.ModeProductKey && resp.Mode != seal.ModeUniqueKey {
		return nil, fmt.Errorf("peer %s: %w: seal mode %q", addr, ErrBadResponse, resp.Mode)
	}
	k := &Key{DEK: resp.Key, Mode: resp.Mode, self: c.Self}
	if c.Self == nil {
		return k, nil // simulation, explicitly trusted (checked above)
	}
	// An enclave accepts the key only from a verified peer.
	if len(resp.Quote) == 0 {
		return nil, fmt.Errorf("%w; this instance runs in an enclave and accepts a key only from an attested peer", ErrPeerUnattested)
	}
	vr, err := c.Verifier.Verify(ctx, resp.Quote)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPeerUnverified, err)
	}
	if err := checkBinding(vr, PeerReportData(cs.PeerCertificates[0], exporter, nonce, keyID, resp.Mode), ErrPeerBinding, ErrPeerStale); err != nil {
		return nil, err
	}
	if err := policy.Check(vr, samePackage(c.Self, resp.Mode)); err != nil {
		return nil, fmt.Errorf("%w (seal mode %s): %v", ErrPeerIdentity, resp.Mode, err)
	}
	k.Peer = vr
	return k, nil
}
