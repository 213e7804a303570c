package peer

import (
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
)

// BenchmarkTransfer: one whole exchange on loopback: TLS 1.3 handshake
// with client certificates, two synthetic DCAP quotes (the joiner's and
// the peer's) made and verified, the key sent.
func BenchmarkTransfer(b *testing.B) {
	w := newWorld(b)
	addr, _ := serve(b, w.genuine(b, ""))
	c := w.client(b, w.issuer(b, w.self))
	id := seal.KeyID(dek)
	for b.Loop() {
		if _, err := c.Fetch(b.Context(), addr, id); err != nil {
			b.Fatal(err)
		}
	}
}
