package core

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// mixedManifest returns a manifest with 10 RSA-2048, 20 ECDSA, 10 Ed25519
// and 10 symmetric shared secrets.
func mixedManifest(b testing.TB) []byte {
	secrets := map[string]any{}
	for i := 0; i < 10; i++ {
		secrets[fmt.Sprintf("rsa%d", i)] = map[string]any{"Type": "cert-rsa", "Size": 2048, "Shared": true}
		secrets[fmt.Sprintf("ed%d", i)] = map[string]any{"Type": "cert-ed25519", "Shared": true}
		secrets[fmt.Sprintf("sym%d", i)] = map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true}
	}
	for i := 0; i < 20; i++ {
		secrets[fmt.Sprintf("ec%d", i)] = map[string]any{"Type": "cert-ecdsa", "Size": []int{256, 384}[i%2], "Shared": true}
	}
	raw, err := json.Marshal(map[string]any{
		"Packages": map[string]any{"p": map[string]any{"Debug": true}},
		"Marbles":  map[string]any{"m": map[string]any{"Package": "p"}},
		"Secrets":  secrets,
	})
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// BenchmarkSetManifest50Mixed measures POST manifest's use case end to end
// (parse, validate, generate 50 mixed secrets, seal, store in memory).
func BenchmarkSetManifest50Mixed(b *testing.B) {
	raw := mixedManifest(b)
	for b.Loop() {
		c, err := New(context.Background(), Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.SetManifest(context.Background(), raw); err != nil {
			b.Fatal(err)
		}
	}
}
