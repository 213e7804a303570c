package core

import (
	"fmt"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// BenchmarkSharedWrite: one secret upload (sync, seal, CAS in etcd)
// through 1 or 3 instances in turn, on one embedded etcd member.
func BenchmarkSharedWrite(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			inst, w := sharedBenchInstances(b, n)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if err := inst[i%n].SetSecrets(b.Context(), w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: fmt.Appendf(nil, "v%d", i)}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSharedRead: a linearizable read (Sync: one etcd read of the
// revisions, then the in-memory snapshot) through 1 or 3 instances, in
// parallel.
func BenchmarkSharedRead(b *testing.B) {
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			inst, w := sharedBenchInstances(b, n)
			if err := inst[0].SetSecrets(b.Context(), w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: []byte("v")}}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			var next int64
			b.RunParallel(func(pb *testing.PB) {
				for i := 0; pb.Next(); i++ {
					c := inst[int(next+int64(i))%n]
					if err := c.Sync(b.Context()); err != nil {
						b.Fatal(err)
					}
					if _, err := c.Secrets(b.Context(), w.admin.peer(), []string{"uploaded"}); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

func sharedBenchInstances(b *testing.B, n int) ([]*Core, *faultWorld) {
	b.Helper()
	cluster := etcdtest.Start(b, 1)
	w := &faultWorld{admin: newFaultUser(&testing.T{}, "admin"), second: newFaultUser(&testing.T{}, "second")}
	prefix := fmt.Sprintf("/bench/%d/", sharedPrefixes.Add(1))
	var inst []*Core
	for range n {
		cli, err := etcdstore.Connect(b.Context(), etcdstore.Options{Endpoints: cluster.Endpoints(), Prefix: prefix})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cli.Close() })
		data, _ := cli.Store("sealed_data")
		key, _ := cli.Store("sealed_key")
		c, err := New(b.Context(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
		if err != nil {
			b.Fatal(err)
		}
		inst = append(inst, c)
	}
	if _, err := inst[0].SetManifest(b.Context(), w.manifest(manifestOpts{})); err != nil {
		b.Fatal(err)
	}
	return inst, w
}
