package secrets

import (
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/quarry-cc/quarry/manifest"
)

func benchmarkGenerate(b *testing.B, defs map[string]manifest.Secret) {
	issuer := testIssuer(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Generate(rand.Reader, defs, issuer, testNow); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGenerate50Mixed: 10 RSA-2048, 20 ECDSA, 10 Ed25519 and 10
// symmetric keys, all shared.
func BenchmarkGenerate50Mixed(b *testing.B) {
	defs := map[string]manifest.Secret{}
	curves := []uint{224, 256, 384, 521}
	for i := range 10 {
		defs[fmt.Sprintf("rsa-%d", i)] = manifest.Secret{Type: manifest.SecretTypeCertRSA, Size: 2048, Shared: true}
		defs[fmt.Sprintf("ed25519-%d", i)] = manifest.Secret{Type: manifest.SecretTypeCertED25519, Shared: true}
		defs[fmt.Sprintf("symmetric-%d", i)] = manifest.Secret{Type: manifest.SecretTypeSymmetric, Size: 256, Shared: true}
	}
	for i := range 20 {
		defs[fmt.Sprintf("ecdsa-%d", i)] = manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: curves[i%len(curves)], Shared: true}
	}
	benchmarkGenerate(b, defs)
}

func BenchmarkGenerateOne(b *testing.B) {
	for _, def := range []manifest.Secret{
		{Type: manifest.SecretTypeSymmetric, Size: 256},
		{Type: manifest.SecretTypeCertED25519},
		{Type: manifest.SecretTypeCertECDSA, Size: 224},
		{Type: manifest.SecretTypeCertECDSA, Size: 256},
		{Type: manifest.SecretTypeCertECDSA, Size: 384},
		{Type: manifest.SecretTypeCertECDSA, Size: 521},
		{Type: manifest.SecretTypeCertRSA, Size: 2048},
		{Type: manifest.SecretTypeCertRSA, Size: 3072},
		{Type: manifest.SecretTypeCertRSA, Size: 4096},
	} {
		def.Shared = true
		b.Run(fmt.Sprintf("%s-%d", def.Type, def.Size), func(b *testing.B) {
			benchmarkGenerate(b, map[string]manifest.Secret{"s": def})
		})
	}
}
