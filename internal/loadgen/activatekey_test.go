package loadgen

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"sync/atomic"
	"testing"
)

// TestActivateMarbleKey: a simulated Marble's key is P-384 as MarbleRun's
// premain makes it, P-256 with KeyP256 as Quarry's runtime makes it (the
// CSR is signed with the same key as the TLS certificate).
func TestActivateMarbleKey(t *testing.T) {
	for _, tc := range []struct {
		p256 bool
		want elliptic.Curve
	}{{false, elliptic.P384()}, {true, elliptic.P256()}} {
		var dials atomic.Int64
		m, err := newActivateMarble(ActivateConfig{Addr: "127.0.0.1:1", MarbleType: "m", Reconnect: true, KeyP256: tc.p256}, &dials)
		if err != nil {
			t.Fatal(err)
		}
		csr, err := x509.ParseCertificateRequest(m.req.CSR)
		if err != nil {
			t.Fatal(err)
		}
		if pub, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != tc.want {
			t.Errorf("KeyP256 %v: key %T %v, want %s", tc.p256, csr.PublicKey, csr.PublicKey, tc.want.Params().Name)
		}
		m.close()
	}
}
