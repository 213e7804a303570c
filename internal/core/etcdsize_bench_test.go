package core

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// manyManifest is the fault-suite manifest with n more generated
// symmetric keys (a state whose size grows with n).
func (w *faultWorld) manyManifest(n int) []byte {
	var doc map[string]any
	if err := json.Unmarshal(w.manifest(manifestOpts{}), &doc); err != nil {
		panic(err)
	}
	sec := doc["Secrets"].(map[string]any)
	for i := range n {
		sec[fmt.Sprintf("generated-%05d", i)] = map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b
}

// proxiedInstance starts a Coordinator whose etcd traffic goes through a
// counting proxy to the first member of cluster.
func proxiedInstance(tb testing.TB, cluster *etcdtest.Cluster, prefix string) (*Core, *etcdtest.Proxy) {
	tb.Helper()
	u, err := url.Parse(cluster.Endpoints()[0])
	if err != nil {
		tb.Fatal(err)
	}
	p := etcdtest.NewProxy(tb, u.Host)
	cli, err := etcdstore.Connect(tb.Context(), etcdstore.Options{Endpoints: []string{"http://" + p.Addr()}, Prefix: prefix})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cli.Close() })
	data, _ := cli.Store("sealed_data")
	key, _ := cli.Store("sealed_key")
	c, err := New(tb.Context(), Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		tb.Fatal(err)
	}
	return c, p
}

// BenchmarkSharedWriteLarge: one 1 KiB secret upload into a state with
// 1,000 generated secrets, on one embedded etcd member; reports the bytes
// sent to etcd per upload.
func BenchmarkSharedWriteLarge(b *testing.B) {
	cluster := etcdtest.Start(b, 1)
	w := &faultWorld{admin: newFaultUser(&testing.T{}, "admin"), second: newFaultUser(&testing.T{}, "second")}
	c, p := proxiedInstance(b, cluster, fmt.Sprintf("/bench/%d/", sharedPrefixes.Add(1)))
	if _, err := c.SetManifest(b.Context(), w.manyManifest(1000)); err != nil {
		b.Fatal(err)
	}
	value := make([]byte, 1024)
	before, _ := p.Bytes()
	b.ResetTimer()
	n := 0
	for i := 0; b.Loop(); i++ {
		value[0], value[1] = byte(i), byte(i>>8)
		if err := c.SetSecrets(b.Context(), w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: value}}); err != nil {
			b.Fatal(err)
		}
		n++
	}
	after, _ := p.Bytes()
	b.ReportMetric(float64(after-before)/float64(n), "etcd-bytes/op")
	b.ReportMetric(float64(c.SealedStateSize()), "sealed-bytes")
}
