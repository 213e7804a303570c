package core

import "crypto/tls"

// MarbleTLSCertificate returns the Marble API's current server certificate:
// the Marble Root with the intermediate key. It changes with package and
// full updates and with recovery, so a server asks for it at every
// handshake.
func (c *Core) MarbleTLSCertificate() *tls.Certificate {
	return c.snap.Load().ca.MarbleTLSCertificate()
}
