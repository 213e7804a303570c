package core

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
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

// stateWithSecrets returns a Coordinator whose state holds n symmetric
// secrets plus one user-defined secret that user alice may write, and
// alice's certificate.
func stateWithSecrets(b *testing.B, n int, data, key *memstore.Store) (*Core, []*x509.Certificate) {
	return stateWithSecretsIn(b, n, data, key)
}

func stateWithSecretsIn(b *testing.B, n int, data, key store.Store) (*Core, []*x509.Certificate) {
	return stateWithSecretsOpts(b, n, Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
}

// stateWithSecretsOpts is stateWithSecretsIn with the Coordinator's options.
func stateWithSecretsOpts(b testing.TB, n int, opts Options) (*Core, []*x509.Certificate) {
	b.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	cert, _ := x509.ParseCertificate(der)
	secrets := map[string]any{"upload": map[string]any{"Type": "symmetric-key", "Size": 256, "UserDefined": true}}
	for i := 0; i < n; i++ {
		secrets[fmt.Sprintf("s%d", i)] = map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true}
	}
	raw, _ := json.Marshal(map[string]any{
		"Packages": map[string]any{"p": map[string]any{"Debug": true}},
		"Marbles":  map[string]any{"m": map[string]any{"Package": "p"}},
		"Secrets":  secrets,
		"Users":    map[string]any{"alice": map[string]any{"Certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), "Roles": []string{"w"}}},
		"Roles":    map[string]any{"w": map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"upload"}, "Actions": []string{"WriteSecret"}}},
	})
	c, err := New(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.SetManifest(context.Background(), raw); err != nil {
		b.Fatal(err)
	}
	return c, []*x509.Certificate{cert}
}

// BenchmarkStateChange measures one state-changing use case end to end
// (authenticate, authorise, validate, template dry run, update log, seal
// the whole state, store) as the state grows.
func BenchmarkStateChange(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("secrets=%d", n), func(b *testing.B) {
			c, peer := stateWithSecrets(b, n, memstore.New(), memstore.New())
			upload := map[string]secrets.Upload{"upload": {Key: make([]byte, 32)}}
			b.ResetTimer()
			for b.Loop() {
				if err := c.SetSecrets(context.Background(), peer, upload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUnseal measures loading the sealed state at start (unseal,
// decrypt, decode, restore CAs, parse the manifest and users) as it grows.
func BenchmarkUnseal(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("secrets=%d", n), func(b *testing.B) {
			data, key := memstore.New(), memstore.New()
			stateWithSecrets(b, n, data, key)
			blob, _, _ := data.Load(context.Background())
			b.SetBytes(int64(len(blob)))
			b.ResetTimer()
			for b.Loop() {
				c, err := New(context.Background(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
				if err != nil || c.Status() != StateAcceptingMarbles {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStateChangeFileStore is BenchmarkStateChange with the state
// written durably to local files (temp file, fsync, rename, fsync dir).
func BenchmarkStateChangeFileStore(b *testing.B) {
	dir := b.TempDir()
	data, err := filestore.New(dir, "sealed_data")
	if err != nil {
		b.Fatal(err)
	}
	key, err := filestore.New(dir, "sealed_key")
	if err != nil {
		b.Fatal(err)
	}
	c, peer := stateWithSecretsIn(b, 100, data, key)
	upload := map[string]secrets.Upload{"upload": {Key: make([]byte, 32)}}
	b.ResetTimer()
	for b.Loop() {
		if err := c.SetSecrets(context.Background(), peer, upload); err != nil {
			b.Fatal(err)
		}
	}
}
