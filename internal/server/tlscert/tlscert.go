// Package tlscert serves a certificate that changes with the Coordinator's
// state over TLS: one tls.Config per certificate, made once and kept until
// the certificate changes, with session ticket keys of its own, so that a
// returning client resumes its TLS session (RFC 8446 §2.2, RFC 5077) only
// while the certificate it was made under is still the current one.
//
// The certificate function is asked at every ClientHello, also one that
// resumes a session (tls.Config.GetConfigForClient runs before the server
// decides on resumption). With a shared store that function first brings
// the instance up to the stored state (docs/ha.md), so a handshake that
// starts after a change was acknowledged anywhere presents that state's
// certificate or a newer one, or, resuming, continues a session made under
// exactly that certificate: a session made under an older certificate was
// sealed with ticket keys that the new certificate's configuration does not
// hold, and the client falls back to a full handshake.
package tlscert

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"slices"
	"sync/atomic"
	"time"
)

// TicketKeyLifetime is how long one certificate's session ticket key is
// used before a new one replaces it (as crypto/tls rotates its own keys):
// a session made before then no longer resumes.
const TicketKeyLifetime = 24 * time.Hour

// ErrNoCertificate refuses a handshake while there is no certificate to
// present.
var ErrNoCertificate = errors.New("tls: the Coordinator has no certificate to present yet; try again in a moment")

// Server returns a copy of base whose handshakes present cert's current
// certificate (cert must return the same pointer or the same bytes while
// the certificate stays; nil when there is none) and resume only sessions
// made under it.
func Server(base *tls.Config, cert func() *tls.Certificate) *tls.Config {
	s := &server{base: base.Clone(), cert: cert, now: time.Now}
	out := base.Clone()
	out.GetConfigForClient = s.configFor
	return out
}

type server struct {
	base *tls.Config
	cert func() *tls.Certificate
	now  func() time.Time
	cur  atomic.Pointer[perCert]
}

// perCert is the configuration of one certificate.
type perCert struct {
	cert *tls.Certificate
	cfg  *tls.Config
	made time.Time
}

func (s *server) configFor(*tls.ClientHelloInfo) (*tls.Config, error) {
	c := s.cert()
	if c == nil || len(c.Certificate) == 0 {
		return nil, ErrNoCertificate
	}
	now := s.now()
	if p := s.cur.Load(); p != nil && sameCertificate(p.cert, c) && now.Sub(p.made) < TicketKeyLifetime {
		return p.cfg, nil
	}
	p, err := s.newConfig(c, now)
	if err != nil {
		return nil, err
	}
	// Concurrent handshakes at a change may each make one; the last stays.
	s.cur.Store(p)
	return p.cfg, nil
}

// newConfig makes the configuration of certificate c with a fresh session
// ticket key (a configuration returned by GetConfigForClient would
// otherwise share the keys of the one it came from).
func (s *server) newConfig(c *tls.Certificate, now time.Time) (*perCert, error) {
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return nil, err
	}
	cfg := s.base.Clone()
	cfg.GetCertificate = nil
	cfg.Certificates = []tls.Certificate{*c}
	cfg.SetSessionTicketKeys([][32]byte{key})
	return &perCert{cert: c, cfg: cfg, made: now}, nil
}

// sameCertificate reports whether a and b present the same chain with the
// same key (a state reloaded from the store has the same certificate in a
// new value).
func sameCertificate(a, b *tls.Certificate) bool {
	if a == b {
		return true
	}
	return slices.EqualFunc(a.Certificate, b.Certificate, bytes.Equal) && sameKey(a, b)
}

func sameKey(a, b *tls.Certificate) bool {
	type equaler interface {
		Equal(crypto.PrivateKey) bool
	}
	k, ok := a.PrivateKey.(equaler)
	return ok && k.Equal(b.PrivateKey)
}
