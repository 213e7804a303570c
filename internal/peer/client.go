package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/seal"
)

// Client asks running instances for the data key. Certificate is its TLS
// certificate (NewCertificate), whose key the quotes bind; Issuer makes
// the quotes (attest.SimulationIssuer: none, sent without one).
type Client struct {
	Certificate tls.Certificate
	Issuer      attest.Issuer
	// Timeout bounds one exchange (DefaultTimeout when 0).
	Timeout time.Duration
}

// Fetch asks the instance at addr for the data key with ID keyID. The
// server is not authenticated: it learns nothing secret, and the caller
// checks the key it returns against the key record (seal.KeyRecord). A
// refusal is a *RefusedError.
func (c *Client) Fetch(ctx context.Context, addr string, keyID [32]byte) ([]byte, error) {
	timeout := c.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{
		Certificates:       []tls.Certificate{c.Certificate},
		InsecureSkipVerify: true, // see above: the key is checked, not the server
		MinVersion:         tls.VersionTLS13,
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	var h hello
	if err := readMsg(conn, &h, ErrBadResponse); err != nil {
		return nil, fmt.Errorf("peer %s: %w", addr, err)
	}
	if h.Version != ProtocolVersion || len(h.Nonce) != 32 {
		return nil, fmt.Errorf("peer %s: %w: protocol version %d, nonce of %d bytes", addr, ErrBadResponse, h.Version, len(h.Nonce))
	}
	leaf := c.Certificate.Leaf
	if leaf == nil {
		return nil, errors.New("peer: the client certificate has no parsed leaf")
	}
	quote, err := c.Issuer.Issue(ctx, ReportData(leaf, h.Nonce, keyID))
	if errors.Is(err, attest.ErrUnsupported) {
		quote = nil // simulation: the server decides (--insecure-peer-trust)
	} else if err != nil {
		return nil, fmt.Errorf("peer: quoting the TLS key: %w", err)
	}
	if err := writeMsg(conn, request{KeyID: keyID[:], Quote: quote}); err != nil {
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
	return resp.Key, nil
}
