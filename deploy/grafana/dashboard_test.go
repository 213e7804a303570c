package grafana_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
)

const (
	repoRoot  = "../.."
	dashboard = "../kubernetes/chart/files/dashboard.json"
)

// Grafana's variables in the expressions, replaced by values Prometheus
// reads before parsing.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "${instance}", ".*", "$instance", ".*")

// conditional are metrics a Coordinator exports only in a setup the
// scripted run below does not have; docs/operations.md must describe them.
var conditional = map[string]string{
	"quarry_etcd_db_size_bytes":                       "store etcd",
	"quarry_etcd_db_size_in_use_bytes":                "store etcd",
	"quarry_etcd_db_quota_bytes":                      "store etcd",
	"quarry_etcd_up":                                  "store etcd",
	"quarry_etcd_compactions_total":                   "store etcd",
	"quarry_collateral_next_update_timestamp_seconds": "a collateral source",
}

type target struct{ Expr string }

type panel struct {
	Title   string
	Targets []target
	Panels  []panel
}

// expressions returns each panel's PromQL by panel title.
func expressions(t *testing.T) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile(dashboard)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string
		Panels     []panel
		Templating struct {
			List []struct {
				Name  string
				Query any
			}
		}
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboard, err)
	}
	if d.UID == "" {
		t.Error("the dashboard has no uid")
	}
	out := map[string][]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				out[p.Title] = append(out[p.Title], tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// metricsOf parses expr with Prometheus' parser and returns the metric
// names its selectors use (a histogram's _bucket, _sum, _count as written).
func metricsOf(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
			names = append(names, name)
		}
		return nil
	})
	if len(names) == 0 {
		return nil, fmt.Errorf("selects no metric")
	}
	return names, nil
}

// TestDashboardExpressionsParse: every expression parses, and the panels
// the dashboard promises are there.
func TestDashboardExpressionsParse(t *testing.T) {
	exprs := expressions(t)
	for title, es := range exprs {
		for _, e := range es {
			if _, err := metricsOf(e); err != nil {
				t.Errorf("panel %q: %q: %v", title, e, err)
			}
		}
	}
	for _, want := range []string{"State", "Client API requests by route and code", "Client API latency", "Marble activations by type",
		"Activation refusals by reason", "State commits", "State commit duration", "Sealed state and store size",
		"Pending manifest update", "Collateral expires in"} {
		if len(exprs[want]) == 0 {
			t.Errorf("no panel %q", want)
		}
	}
	// The parser is the real one: it refuses what Prometheus refuses.
	for _, bad := range []string{"sum by (path (rate(x[5m]))", "rate(x[$__rate_interval)"} {
		if _, err := metricsOf(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func build(t *testing.T, dir, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, filepath.Base(pkg))
	// Static and -trimpath, as the Dockerfile builds: the configuration
	// of the main module's other builds of the binaries.
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// TestDashboardMetricsExported runs a Coordinator (simulation, file store)
// through a manifest, one Marble activation and one refused activation,
// with the quarry CLI and quarry-premain, and checks that its /metrics
// has every metric the dashboard uses.
func TestDashboardMetricsExported(t *testing.T) {
	var used []string
	for _, es := range expressions(t) {
		for _, e := range es {
			names, err := metricsOf(e)
			if err != nil {
				t.Fatal(err)
			}
			used = append(used, names...)
		}
	}
	slices.Sort(used)
	used = slices.Compact(used)

	bin := t.TempDir()
	coordinator := build(t, bin, "./cmd/coordinator")
	quarry := build(t, bin, "./cmd/quarry")
	premain := build(t, bin, "./cmd/quarry-premain")

	clientAddr, meshAddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	coord := exec.CommandContext(ctx, coordinator)
	var logs bytes.Buffer
	coord.Stdout, coord.Stderr = &logs, &logs
	coord.Env = append(os.Environ(), "EDG_COORDINATOR_SEAL_DIR="+t.TempDir(), "EDG_COORDINATOR_CLIENT_ADDR="+clientAddr,
		"EDG_COORDINATOR_MESH_ADDR="+meshAddr, "EDG_COORDINATOR_PROMETHEUS_ADDR="+metricsAddr, "QUARRY_ATTESTATION=simulation",
		"EDG_COORDINATOR_DNS_NAMES=localhost")
	if err := coord.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		coord.Wait()
		if t.Failed() {
			t.Logf("coordinator log:\n%s", logs.String())
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Coordinator is not ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	work := t.TempDir()
	manifest := filepath.Join(work, "manifest.json")
	os.WriteFile(manifest, []byte(`{"Packages":{"pkg":{"SignerID":"`+strings.Repeat("ab", 32)+`","ProductID":1,"SecurityVersion":1}},
		"Marbles":{"backend":{"Package":"pkg","Parameters":{"Argv":["true"]}}}}`), 0o600)
	if out, err := exec.Command(quarry, "manifest", "set", manifest, "--coordinator", clientAddr, "--insecure").CombinedOutput(); err != nil {
		t.Fatalf("quarry manifest set: %v\n%s", err, out)
	}
	activate := func(mtype string) error {
		cmd := exec.Command(premain)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "EDG_MARBLE_TYPE="+mtype, "EDG_MARBLE_COORDINATOR_ADDR="+meshAddr,
			"EDG_MARBLE_UUID_FILE="+filepath.Join(work, mtype+".uuid"), "EDG_MARBLE_DNS_NAMES=localhost",
			"QUARRY_ATTESTATION=simulation", "QUARRY_ACTIVATION_ATTEMPTS=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v\n%s", err, out)
		}
		return nil
	}
	if err := activate("backend"); err != nil {
		t.Fatalf("activating backend: %v", err)
	}
	if err := activate("nosuchtype"); err == nil {
		t.Fatal("an unknown Marble type was activated")
	}
	// A request with a client certificate-free GET, for the request metrics.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} // simulation: nothing to verify
	if resp, err := hc.Get("https://" + clientAddr + "/api/v2/status"); err == nil {
		resp.Body.Close()
	}

	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	families, err := tp.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	exported := map[string]bool{}
	for name, f := range families {
		exported[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[name+s] = true
			}
		}
	}
	ops, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range used {
		if why, ok := conditional[name]; ok {
			if exported[name] {
				t.Errorf("%s is exported without %s: drop it from the conditional list", name, why)
			}
			if !regexp.MustCompile("`" + name + "`").Match(ops) {
				t.Errorf("%s (only with %s) is not described in docs/operations.md", name, why)
			}
			continue
		}
		if !exported[name] {
			t.Errorf("the dashboard uses %s, which the Coordinator does not export", name)
		}
	}
	if len(used) < 15 {
		t.Errorf("the dashboard uses only %d metrics: %v", len(used), used)
	}
}
