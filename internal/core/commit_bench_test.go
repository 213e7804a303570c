package core

import (
	"context"
	"fmt"
	"testing"

	"github.com/quarry-cc/quarry/internal/loadgen"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// benchStores returns the two stores of a benchmark: in memory, or files
// in a fresh directory (each Save: temp file, fsync, rename, directory
// fsync).
func benchStores(b *testing.B, durable bool) (data, key store.Store) {
	b.Helper()
	if !durable {
		return memstore.New(), memstore.New()
	}
	dir := b.TempDir()
	d, err := filestore.New(dir, "sealed_data")
	if err != nil {
		b.Fatal(err)
	}
	k, err := filestore.New(dir, "sealed_key")
	if err != nil {
		b.Fatal(err)
	}
	return d, k
}

// BenchmarkSetManifestSmall measures setting the manifest quarry-bench
// sets (its default mix: with 10 secrets 2 RSA-2048, 4 ECDSA P-256, 2
// Ed25519 certificates and 2 symmetric keys; 8 KiB), on a fresh
// Coordinator, in memory and durably on files.
func BenchmarkSetManifestSmall(b *testing.B) {
	for _, n := range []int{10, 100} {
		raw, _, err := loadgen.GenerateManifest(loadgen.ManifestOptions{TargetBytes: 8 << 10, Secrets: n, Mix: loadgen.DefaultMix})
		if err != nil {
			b.Fatal(err)
		}
		for _, durable := range []bool{false, true} {
			b.Run(fmt.Sprintf("secrets=%d/durable=%v", n, durable), func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					data, key := benchStores(b, durable)
					c, err := New(context.Background(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if _, err := c.SetManifest(context.Background(), raw); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkConcurrentUploads measures secret uploads by 32 concurrent
// users (goroutines) against a state of 100 secrets, in memory and
// durably on files: what a commit costs when commits queue.
func BenchmarkConcurrentUploads(b *testing.B) {
	for _, durable := range []bool{false, true} {
		b.Run(fmt.Sprintf("durable=%v", durable), func(b *testing.B) {
			data, key := benchStores(b, durable)
			c, peer := stateWithSecretsIn(b, 100, data, key)
			upload := map[string]secrets.Upload{"upload": {Key: make([]byte, 32)}}
			b.SetParallelism(16) // 2 × GOMAXPROCS(2) … 32 goroutines on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := c.SetSecrets(context.Background(), peer, upload); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
