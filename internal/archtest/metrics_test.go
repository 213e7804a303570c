package archtest

import (
	"strings"
	"testing"
)

// TestPrometheusStaysInMetrics checks that only internal/metrics (and the
// composition root) know Prometheus: the core and the servers expose small
// hooks and interfaces, and the leaves know nothing of metrics.
func TestPrometheusStaysInMetrics(t *testing.T) {
	pkgs := []string{"internal/core", "internal/server/rest", "internal/server/marbleapi", "client", "marble"}
	for _, pattern := range []string{"manifest", "internal/ca", "internal/seal", "internal/store/...", "internal/recovery",
		"internal/updatelog", "internal/user", "internal/secrets", "internal/attest/...", "api/..."} {
		pkgs = append(pkgs, packages(t, pattern)...)
	}
	for _, pkg := range pkgs {
		// etcd's client and embedded server instrument themselves with
		// Prometheus and serve grpc-gateway: the etcd store depends on them
		// through etcd, never on its own (it exposes no metrics).
		if strings.HasPrefix(pkg, "internal/store/etcdstore") {
			continue
		}
		forbid(t, pkg, "github.com/prometheus", "github.com/grpc-ecosystem")
	}
	forbid(t, "internal/metrics", module+"/internal/server", module+"/internal/app", module+"/internal/config",
		module+"/internal/store/filestore", module+"/internal/store/memstore")
}
