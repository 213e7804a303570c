package peer

import (
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
)

// BenchmarkTransfer: one whole exchange on loopback: TLS 1.3 handshake
// with client certificates, a synthetic DCAP quote made and verified, the
// key sent.
func BenchmarkTransfer(b *testing.B) {
	w := newWorld(b)
	addr, _ := serve(b, &Server{Keys: keysWith(""), Verifier: w.verifier, Self: w.selfBody(b)})
	c := client(b, &issuer{t: b, pl: w.pl, e: w.self})
	id := seal.KeyID(dek)
	for b.Loop() {
		if _, err := c.Fetch(b.Context(), addr, id); err != nil {
			b.Fatal(err)
		}
	}
}
