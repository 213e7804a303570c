package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// limitsFixture is the fixture manifest at the Coordinator's default
// limits: 10,000 secrets (--max-secrets) and, with a Marble's file of
// random text, just under the largest manifest (8 MiB); plus two plain
// secrets alice may write.
func limitsFixture(t *testing.T) (*fixture, []byte) {
	t.Helper()
	f := newFixture(t)
	f.set("Secrets.blob1", map[string]any{"Type": "plain", "UserDefined": true})
	f.set("Secrets.blob2", map[string]any{"Type": "plain", "UserDefined": true})
	f.set("Roles.writer.ResourceNames", []string{"userkey", "blob1", "blob2"})
	f.set("Roles.reader.ResourceNames", []string{"symkey", "cert", "userkey", "blob1", "blob2"})
	for i := len(f.tree["Secrets"].(map[string]any)); i < 10_000; i++ {
		f.set(fmt.Sprintf("Secrets.generated-%05d", i), map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true})
	}
	pad := make([]byte, (8<<20-len(f.bytes(t))-8<<10)/2)
	if _, err := rand.Read(pad); err != nil {
		t.Fatal(err)
	}
	f.set("Marbles.frontend.Parameters", map[string]any{"Files": map[string]any{"/big": map[string]any{"Data": hex.EncodeToString(pad), "NoTemplates": true}}})
	return f, f.bytes(t)
}

// TestHAStateAtLimitsOnDefaultEtcd: the real binary, on an etcd with its
// default request limit (1.5 MiB), takes a manifest at its own limits (a
// state of about 10 MB, refused by etcd as one request before), serves it
// from another instance, takes a change on top; and /metrics shows etcd's
// database size and quota.
func TestHAStateAtLimitsOnDefaultEtcd(t *testing.T) {
	// Not parallel: it fills etcd to its default limits, memory and time that parallel tests would compete for.
	if testing.Short() {
		t.Skip("builds a state of about 10 MB")
	}
	cluster := etcdtest.StartDefaults(t, 1)
	env := append(haEnv(cluster.Endpoints(), newPrefix()), envMetrics)
	a, b := startCoordinator(t, "", env...), startCoordinator(t, "", env...)
	f, raw := limitsFixture(t)
	if len(raw) < 8<<20-16<<10 || len(raw) > 8<<20 {
		t.Fatalf("the manifest has %d bytes, want just under 8 MiB", len(raw))
	}
	expect(t, setManifest(t, a, a.client(nil, nil), raw), http.StatusOK, "success")
	_, root := getChain(t, a, a.client(nil, nil))
	// b reloads a state of about 10 MB: on a loaded machine that can take
	// longer than a handshake waits for it (then it presents the
	// certificate it had, docs/ha.md); a request waits for the reload.
	if got := getStatus(t, b, b.client(nil, nil)); got.Code != 3 {
		t.Fatalf("the other instance is in state %d, want 3", got.Code)
	}
	alice := f.users["alice"].cert
	ha, hb := a.client(root, &alice), b.client(root, &alice)
	value := bytes.Repeat([]byte("v"), 1024)
	expect(t, postSecrets(t, b, hb, map[string]any{"blob1": map[string]any{"key": value}}), http.StatusOK, "success")
	if got := getSecrets(t, a, ha, "blob1")["blob1"]; !bytes.Equal(got.Private, value) {
		t.Fatal("the other instance does not read the upload")
	}
	// Scraped metrics: etcd's database and its quota (etcd's default,
	// 2 GiB), per endpoint.
	m := scrape(t, a)
	ep := cluster.Endpoints()[0]
	m.expectValue(t, 1, "quarry_etcd_up", "endpoint", ep)
	m.expectValue(t, 2<<30, "quarry_etcd_db_quota_bytes", "endpoint", ep)
	size, ok := m.value("quarry_etcd_db_size_bytes", "endpoint", ep)
	if !ok || size < 10<<20 || size > 2<<30 {
		t.Errorf("quarry_etcd_db_size_bytes = %v (%v), want the database holding a state of about 10 MB", size, ok)
	}
	if inUse, ok := m.value("quarry_etcd_db_size_in_use_bytes", "endpoint", ep); !ok || inUse <= 0 || inUse > size {
		t.Errorf("quarry_etcd_db_size_in_use_bytes = %v (%v)", inUse, ok)
	}
	if _, ok := m.value("quarry_etcd_compactions_total", "result", "failure"); !ok {
		t.Error("quarry_etcd_compactions_total is missing")
	}
}

// TestHAStateLimitRefused: a change that would take the state beyond
// --max-state-size is refused with 413 naming the limit, and nothing is
// stored; the file store refuses it the same way.
func TestHAStateLimitRefused(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.StartDefaults(t, 1)
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"etcd", haEnv(cluster.Endpoints(), newPrefix())},
		{"file", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCoordinator(t, "", append(tc.env, "QUARRY_MAX_STATE_SIZE=2097152")...)
			f := newFixture(t)
			f.set("Secrets.blob1", map[string]any{"Type": "plain", "UserDefined": true})
			f.set("Secrets.blob2", map[string]any{"Type": "plain", "UserDefined": true})
			f.set("Roles.writer.ResourceNames", []string{"userkey", "blob1", "blob2"})
			f.set("Roles.reader.ResourceNames", []string{"symkey", "cert", "userkey", "blob1", "blob2"})
			expect(t, setManifest(t, c, c.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
			_, root := getChain(t, c, c.client(nil, nil))
			alice := f.users["alice"].cert
			hc := c.client(root, &alice)
			first := bytes.Repeat([]byte("1"), 500<<10)
			expect(t, postSecrets(t, c, hc, map[string]any{"blob1": map[string]any{"key": first}}), http.StatusOK, "success")
			r := postSecrets(t, c, hc, map[string]any{"blob2": map[string]any{"key": bytes.Repeat([]byte("2"), 500<<10)}})
			expect(t, r, http.StatusRequestEntityTooLarge, "fail")
			if !strings.Contains(r.Message, "QUARRY_MAX_STATE_SIZE") || !strings.Contains(r.Message, "2097152") {
				t.Errorf("the refusal does not name the limit: %s", r.Message)
			}
			c.restart()
			hc = c.client(root, &alice)
			got := getSecrets(t, c, hc, "blob1", "blob2")
			if !bytes.Equal(got["blob1"].Private, first) || len(got["blob2"].Private) != 0 {
				t.Fatal("after the refusal the stored state changed")
			}
		})
	}
}
