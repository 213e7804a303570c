package kubernetes_test

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/quarry-cc/quarry/internal/config"
)

var update = flag.Bool("update", false, "regenerate plain/ from the chart")

const chartDir = "chart"

// The probe paths on the metrics listener (fixed names, docs/operations.md).
var (
	livenessPath  = "/healthz"
	readinessPath = "/readyz"
)

// plainArgs are the helm template arguments plain/coordinator.yaml is
// generated with.
var plainArgs = []string{"template", "quarry-coordinator", chartDir, "--namespace", "quarry"}

// waitForHelm waits, once, for the helm that .ci/run builds in the
// background while the tests build: QUARRY_HELM_BUILDING names the file it
// writes when done ("ok" or "failed").
var waitForHelm = sync.OnceFunc(func() {
	done := os.Getenv("QUARRY_HELM_BUILDING")
	if done == "" {
		return
	}
	for deadline := time.Now().Add(15 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if _, err := os.Stat(done); err == nil {
			return
		}
	}
})

func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	path, err := exec.LookPath("helm")
	if err != nil {
		waitForHelm()
		path, err = exec.LookPath("helm")
	}
	if err != nil {
		if os.Getenv("QUARRY_REQUIRE_HELM") == "1" {
			t.Fatal("helm is not installed (.ci/run installs it)")
		}
		t.Skip("helm is not installed; `go install helm.sh/helm/v3/cmd/helm@v3.22.0` (.ci/run does)")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(path, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out, nil
}

type obj = map[string]any

// objects renders the chart and parses every document.
func objects(t *testing.T, sets ...string) []obj {
	t.Helper()
	args := []string{"template", "quarry-coordinator", chartDir, "--namespace", "quarry"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, out)
}

func parse(t *testing.T, out []byte) []obj {
	t.Helper()
	var objs []obj
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var o obj
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("rendered YAML: %v\n%s", err, doc)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
	return objs
}

// get walks o along the path of map keys and list indexes.
func get(o any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := o.(obj)
			if !ok {
				return nil
			}
			o = m[k]
		case int:
			l, ok := o.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			o = l[k]
		}
	}
	return o
}

func str(o any, path ...any) string {
	v := get(o, path...)
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func list(o any, path ...any) []any {
	l, _ := get(o, path...).([]any)
	return l
}

func byKind(objs []obj, kind string) []obj {
	var out []obj
	for _, o := range objs {
		if o["kind"] == kind {
			out = append(out, o)
		}
	}
	return out
}

func TestChartLint(t *testing.T) {
	for _, sets := range [][]string{nil, haSets, {"serviceMonitor.enabled=true"}, {"prometheusRule.enabled=true"}} {
		args := []string{"lint", "--strict", chartDir}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		if out, err := helm(t, args...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
}

var haSets = []string{"ha.enabled=true", "ha.insecurePeerTrust=true", "ha.etcd.endpoints={https://etcd-0.etcd:2379,https://etcd-1.etcd:2379}", "ha.etcd.tlsSecret=etcd-client"}

// rendered is the chart's Coordinator as config.Load sees it.
type rendered struct {
	sts       obj
	container obj
	env       map[string]string
	ports     map[string]float64 // container port name → number
	mounts    map[string]string  // volume name → mount path
	cfg       config.Config
	looked    map[string]bool   // names config.Load looked up
	fieldRefs map[string]string // env filled in by Kubernetes → a sample value
}

func render(t *testing.T, objs []obj) rendered {
	t.Helper()
	sts := byKind(objs, "StatefulSet")
	if len(sts) != 1 {
		t.Fatalf("%d StatefulSets", len(sts))
	}
	r := rendered{sts: sts[0], env: map[string]string{}, ports: map[string]float64{}, mounts: map[string]string{}, looked: map[string]bool{}, fieldRefs: map[string]string{}}
	containers := list(r.sts, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("%d containers", len(containers))
	}
	r.container = containers[0].(obj)
	for _, e := range list(r.container, "env") {
		name := str(e, "name")
		if _, dup := r.env[name]; dup {
			t.Errorf("env %s set twice", name)
		}
		if ref := str(e, "valueFrom", "fieldRef", "fieldPath"); ref != "" {
			// Filled in by Kubernetes; $(NAME) in later values refers to it.
			if ref != "status.podIP" {
				t.Errorf("env %s from %s", name, ref)
			}
			r.fieldRefs[name] = "10.1.2.3"
			continue
		}
		r.env[name] = str(e, "value")
	}
	for _, p := range list(r.container, "ports") {
		r.ports[str(p, "name")] = get(p, "containerPort").(float64)
	}
	for _, m := range list(r.container, "volumeMounts") {
		r.mounts[str(m, "name")] = str(m, "mountPath")
	}
	// File settings point into mounted Secrets; give config.Load files.
	env := map[string]string{}
	for k, v := range r.env {
		for ref, sample := range r.fieldRefs { // Kubernetes' $(NAME) expansion
			v = strings.ReplaceAll(v, "$("+ref+")", sample)
		}
		env[k] = v
		if strings.HasPrefix(v, "/etc/") {
			p := filepath.Join(t.TempDir(), filepath.Base(v))
			os.WriteFile(p, nil, 0o600)
			env[k] = p
		}
	}
	cfg, err := config.Load(func(k string) string { r.looked[k] = true; return env[k] }, nil, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("the chart's environment is not a valid configuration: %v", err)
	}
	r.cfg = cfg
	for name := range r.env {
		switch {
		case r.looked[name]:
		default:
			t.Errorf("env %s is not a setting the Coordinator reads", name)
		}
	}
	return r
}

func port(t *testing.T, addr string) float64 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(p)
	if err != nil || perr != nil || n == 0 {
		t.Fatalf("address %q has no fixed port", addr)
	}
	return float64(n)
}

func TestChartDefault(t *testing.T) {
	objs := objects(t)
	r := render(t, objs)
	checkCoordinator(t, objs, r)
	if got := get(r.sts, "spec", "replicas"); got != 1.0 {
		t.Errorf("replicas %v, want 1", got)
	}
	// The seal directory is the PersistentVolume of the claim template.
	vct := list(r.sts, "spec", "volumeClaimTemplates")
	if len(vct) != 1 || str(vct[0], "metadata", "name") != "seal" || str(vct[0], "spec", "resources", "requests", "storage") == "" {
		t.Fatalf("volumeClaimTemplates %v", vct)
	}
	if r.mounts["seal"] != r.cfg.SealDir {
		t.Errorf("the seal volume is mounted at %q, the seal directory is %q", r.mounts["seal"], r.cfg.SealDir)
	}
	if len(byKind(objs, "ServiceMonitor")) != 0 {
		t.Error("a ServiceMonitor without serviceMonitor.enabled")
	}
	for _, k := range []string{"QUARRY_STORE", "QUARRY_ETCD_ENDPOINTS", "QUARRY_ETCD_PREFIX", "QUARRY_ETCD_CA",
		"QUARRY_ETCD_CERT", "QUARRY_ETCD_KEY", "QUARRY_INSECURE_PEER_TRUST", "QUARRY_PEER_ADDR", "QUARRY_PEER_ADVERTISE_ADDR", "POD_IP"} {
		if _, ok := r.env[k]; ok {
			t.Errorf("%s set without ha.enabled", k)
		}
	}
	// The image tag defaults to the chart's appVersion.
	chart, _ := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	yaml.Unmarshal(chart, &meta)
	if img := str(r.container, "image"); meta.AppVersion == "" || !strings.HasSuffix(img, ":"+meta.AppVersion) {
		t.Errorf("image %s, appVersion %s", img, meta.AppVersion)
	}
}

func TestChartHA(t *testing.T) {
	objs := objects(t, haSets...)
	r := render(t, objs)
	checkCoordinator(t, objs, r)
	if got := get(r.sts, "spec", "replicas"); got != 3.0 {
		t.Errorf("replicas %v, want 3", got)
	}
	want := map[string]string{"QUARRY_STORE": "etcd", "QUARRY_ETCD_ENDPOINTS": "https://etcd-0.etcd:2379,https://etcd-1.etcd:2379",
		"QUARRY_ETCD_PREFIX": "/quarry/", "QUARRY_INSECURE_PEER_TRUST": "1",
		"QUARRY_ETCD_COMPACTION": "1", "QUARRY_ETCD_COMPACTION_RETENTION": "30s",
		"QUARRY_PEER_ADDR": ":2003", "QUARRY_PEER_ADVERTISE_ADDR": "$(POD_IP):2003"}
	if r.ports["peer"] != port(t, r.cfg.Store.PeerAddr) {
		t.Errorf("peer port %v, QUARRY_PEER_ADDR %q", r.ports["peer"], r.cfg.Store.PeerAddr)
	}
	if !r.cfg.Store.InsecurePeerTrust {
		t.Error("ha.insecurePeerTrust=true does not reach the configuration")
	}
	if !r.cfg.Store.Compaction || r.cfg.Store.CompactionRetention.String() != "30s" {
		t.Errorf("compaction %v, retention %v: the chart's defaults do not reach the configuration", r.cfg.Store.Compaction, r.cfg.Store.CompactionRetention)
	}
	off := render(t, objects(t, append(haSets, "ha.etcd.compaction=false", "ha.etcd.compactionRetention=1h")...))
	if off.cfg.Store.Compaction || off.cfg.Store.CompactionRetention.String() != "1h0m0s" {
		t.Errorf("ha.etcd.compaction=false, compactionRetention=1h: %v, %v", off.cfg.Store.Compaction, off.cfg.Store.CompactionRetention)
	}
	for k, v := range want {
		if r.env[k] != v {
			t.Errorf("%s = %q, want %q", k, r.env[k], v)
		}
	}
	// The TLS files are in the mounted Secret.
	vols := map[string]any{}
	for _, v := range list(r.sts, "spec", "template", "spec", "volumes") {
		vols[str(v, "name")] = v
	}
	if str(vols["etcd-tls"], "secret", "secretName") != "etcd-client" {
		t.Fatalf("volumes %v", vols)
	}
	for _, k := range []string{"QUARRY_ETCD_CA", "QUARRY_ETCD_CERT", "QUARRY_ETCD_KEY"} {
		if filepath.Dir(r.env[k]) != r.mounts["etcd-tls"] {
			t.Errorf("%s = %s is not in the Secret mounted at %s", k, r.env[k], r.mounts["etcd-tls"])
		}
	}
	// Without endpoints: a clear refusal.
	if _, err := helm(t, "template", "x", chartDir, "--set", "ha.enabled=true"); err == nil || !strings.Contains(err.Error(), "/ha/etcd/endpoints") {
		t.Errorf("ha.enabled without endpoints: %v", err)
	}
	// In simulation without ha.insecurePeerTrust: refused, since the
	// Coordinator would refuse to start (the data key would lie in etcd).
	_, err := helm(t, "template", "x", chartDir, "--set", "ha.enabled=true", "--set", "ha.etcd.endpoints={https://etcd-0.etcd:2379}")
	if err == nil || !strings.Contains(err.Error(), "/ha/insecurePeerTrust") {
		t.Errorf("ha.enabled in simulation without insecurePeerTrust: %v", err)
	}
	// In an enclave the setting is not needed.
	if _, err := helm(t, "template", "x", chartDir, "--set", "ha.enabled=true", "--set", "ha.etcd.endpoints={https://etcd-0.etcd:2379}",
		"--set", "coordinator.attestation=gramine", "--set", "image.variant=gramine"); err != nil {
		t.Errorf("ha.enabled under gramine: %v", err)
	}
}

func TestChartServiceMonitor(t *testing.T) {
	objs := objects(t, "serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom")
	r := render(t, objs)
	sm := byKind(objs, "ServiceMonitor")
	if len(sm) != 1 {
		t.Fatalf("%d ServiceMonitors", len(sm))
	}
	ep := list(sm[0], "spec", "endpoints")
	if len(ep) != 1 || str(ep[0], "path") != "/metrics" || str(ep[0], "port") != "metrics" {
		t.Fatalf("endpoints %v", ep)
	}
	if str(sm[0], "metadata", "labels", "release") != "prom" {
		t.Error("serviceMonitor.labels not applied")
	}
	// It selects exactly the Service whose port "metrics" leads to the
	// metrics listener.
	sel := get(sm[0], "spec", "selector", "matchLabels").(obj)
	var matched []obj
	for _, svc := range byKind(objs, "Service") {
		if matches(sel, get(svc, "metadata", "labels")) {
			matched = append(matched, svc)
		}
	}
	if len(matched) != 1 || str(matched[0], "spec", "ports", 0, "name") != "metrics" ||
		r.ports[str(matched[0], "spec", "ports", 0, "targetPort")] != port(t, r.cfg.PrometheusAddr) {
		t.Fatalf("the ServiceMonitor selects %d Services: %v", len(matched), matched)
	}
}

// TestChartPrometheusRule: the alert rules name the Coordinator's etcd
// metrics (docs/operations.md) and the configured ratio.
func TestChartPrometheusRule(t *testing.T) {
	if n := len(byKind(objects(t), "PrometheusRule")); n != 0 {
		t.Fatalf("%d PrometheusRules by default", n)
	}
	objs := objects(t, "prometheusRule.enabled=true", "prometheusRule.labels.release=prom", "prometheusRule.etcdQuotaRatio=0.7")
	pr := byKind(objs, "PrometheusRule")
	if len(pr) != 1 || str(pr[0], "metadata", "labels", "release") != "prom" {
		t.Fatalf("PrometheusRules %v", pr)
	}
	exprs := map[string]string{}
	for _, g := range list(pr[0], "spec", "groups") {
		for _, r := range list(g, "rules") {
			exprs[str(r, "alert")] = str(r, "expr")
		}
	}
	near := exprs["QuarryEtcdDatabaseNearQuota"]
	if !strings.Contains(near, "quarry_etcd_db_size_bytes / quarry_etcd_db_quota_bytes") || !strings.HasSuffix(near, "> 0.7") {
		t.Errorf("QuarryEtcdDatabaseNearQuota: %q", near)
	}
	ops, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"quarry_etcd_db_size_bytes", "quarry_etcd_db_quota_bytes", "quarry_etcd_compactions_total", "quarry_etcd_up"} {
		if !strings.Contains(strings.Join(slices.Collect(maps.Values(exprs)), " "), name) {
			t.Errorf("no rule uses %s", name)
		}
		if !strings.Contains(string(ops), "`"+name+"`") {
			t.Errorf("docs/operations.md does not describe %s", name)
		}
	}
}

func TestChartRefusesManagedEnv(t *testing.T) {
	_, err := helm(t, "template", "x", chartDir, "--set", "coordinator.env.EDG_COORDINATOR_SEAL_DIR=/x")
	if err == nil || !strings.Contains(err.Error(), "the chart sets EDG_COORDINATOR_SEAL_DIR itself") {
		t.Fatalf("a managed setting in coordinator.env: %v", err)
	}
	// Another setting passes through and must be one config.Load reads.
	r := render(t, objects(t, "coordinator.env.QUARRY_RECOVERY_TIMEOUT=1h"))
	if r.cfg.RecoveryTimeout.String() != "1h0m0s" {
		t.Fatalf("QUARRY_RECOVERY_TIMEOUT via coordinator.env: %v", r.cfg.RecoveryTimeout)
	}
}

func matches(sel obj, labels any) bool {
	l, _ := labels.(obj)
	for k, v := range sel {
		if l[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// checkCoordinator checks what every rendering shares: ports, probes,
// Services, resources and the security context.
func checkCoordinator(t *testing.T, objs []obj, r rendered) {
	t.Helper()
	for name, addr := range map[string]string{"client-api": r.cfg.ClientAddr, "mesh": r.cfg.MeshAddr, "metrics": r.cfg.PrometheusAddr} {
		if r.ports[name] != port(t, addr) {
			t.Errorf("container port %s = %v, the setting listens on %s", name, r.ports[name], addr)
		}
	}
	// Probes: the fixed paths, plain HTTP, on the metrics listener.
	for probe, path := range map[string]string{"startupProbe": livenessPath, "livenessProbe": livenessPath, "readinessProbe": readinessPath} {
		p := get(r.container, probe, "httpGet")
		if p == nil {
			t.Errorf("no %s", probe)
			continue
		}
		if str(p, "path") != path {
			t.Errorf("%s path %s, want %s", probe, str(p, "path"), path)
		}
		if s := str(p, "scheme"); s != "" && s != "HTTP" {
			t.Errorf("%s scheme %s: the metrics listener is plain HTTP", probe, s)
		}
		pt := str(p, "port")
		n, ok := r.ports[pt]
		if !ok {
			n, _ = get(p, "port").(float64)
		}
		if n != port(t, r.cfg.PrometheusAddr) {
			t.Errorf("%s port %s is not the metrics listener %s", probe, pt, r.cfg.PrometheusAddr)
		}
	}
	// Services: each port leads to a container port; selectors match the
	// pod's labels.
	podLabels := get(r.sts, "spec", "template", "metadata", "labels")
	var names []string
	for _, svc := range byKind(objs, "Service") {
		names = append(names, str(svc, "metadata", "name"))
		if !matches(get(svc, "spec", "selector").(obj), podLabels) {
			t.Errorf("Service %s does not select the Coordinator's pods", str(svc, "metadata", "name"))
		}
		for _, p := range list(svc, "spec", "ports") {
			if _, ok := r.ports[str(p, "targetPort")]; !ok {
				t.Errorf("Service %s targets port %s, which the container does not have", str(svc, "metadata", "name"), str(p, "targetPort"))
			}
		}
	}
	for _, want := range []string{"quarry-coordinator", "quarry-coordinator-mesh", "quarry-coordinator-metrics"} {
		if !slices.Contains(names, want) {
			t.Errorf("no Service %s (have %v)", want, names)
		}
	}
	if str(r.sts, "spec", "serviceName") == "" || !slices.Contains(names, str(r.sts, "spec", "serviceName")) {
		t.Errorf("the StatefulSet's serviceName %q is not rendered", str(r.sts, "spec", "serviceName"))
	}
	// The certificates name the client Service.
	if !slices.Contains(r.cfg.DNSNames, "quarry-coordinator.quarry.svc") {
		t.Errorf("DNS names %v lack the client Service", r.cfg.DNSNames)
	}
	for _, res := range []string{"cpu", "memory"} {
		if str(r.container, "resources", "requests", res) == "" {
			t.Errorf("no %s request", res)
		}
	}
	sc := get(r.container, "securityContext")
	psc := get(r.sts, "spec", "template", "spec", "securityContext")
	if get(sc, "readOnlyRootFilesystem") != true || get(sc, "allowPrivilegeEscalation") != false || get(psc, "runAsNonRoot") != true {
		t.Errorf("security context %v, pod %v", sc, psc)
	}
	if uid, _ := get(psc, "runAsUser").(float64); uid == 0 {
		t.Error("the pod runs as root")
	}
}

// plain/coordinator.yaml is helm template's output with plainArgs.
func TestPlainManifestsUpToDate(t *testing.T) {
	out, err := helm(t, plainArgs...)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte("# Generated from deploy/kubernetes/chart by: helm "+strings.Join(plainArgs, " ")+
		"\n# Regenerate with: go test ./deploy/kubernetes -run TestPlainManifestsUpToDate -update\n"), out...)
	path := filepath.Join("plain", "coordinator.yaml")
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: go test ./deploy/kubernetes -run TestPlainManifestsUpToDate -update", path)
	}
	// It is the default rendering, checked like it.
	objs := parse(t, got)
	checkCoordinator(t, objs, render(t, objs))
}

// TestChartPeerNetworkPolicy: with ha.enabled the chart adds a
// NetworkPolicy on the Coordinator pods under which only those pods reach
// the peer port, and every other port of the container stays reachable
// from anywhere; ha.networkPolicy.enabled=false leaves it out, and a
// single instance (no peer port) has none.
func TestChartPeerNetworkPolicy(t *testing.T) {
	objs := objects(t, haSets...)
	r := render(t, objs)
	nps := byKind(objs, "NetworkPolicy")
	if len(nps) != 1 {
		t.Fatalf("%d NetworkPolicies with ha.enabled, want 1", len(nps))
	}
	np := nps[0]
	pods := get(r.sts, "spec", "template", "metadata", "labels")
	if !matches(get(np, "spec", "podSelector", "matchLabels").(obj), pods) {
		t.Fatal("the NetworkPolicy does not select the Coordinator pods")
	}
	if types := list(np, "spec", "policyTypes"); len(types) != 1 || types[0] != "Ingress" {
		t.Fatalf("policyTypes %v, want [Ingress]", types)
	}
	// portNumber resolves a rule's port (a number or a container port's
	// name) to the container port.
	portNumber := func(p any) float64 {
		switch v := get(p, "port").(type) {
		case float64:
			return v
		case string:
			n, ok := r.ports[v]
			if !ok {
				t.Fatalf("the NetworkPolicy names port %q, which the container does not have", v)
			}
			return n
		}
		t.Fatalf("rule port %v", p)
		return 0
	}
	peerPort := r.ports["peer"]
	if peerPort == 0 || peerPort != port(t, r.cfg.Store.PeerAddr) {
		t.Fatalf("peer port %v, QUARRY_PEER_ADDR %q", peerPort, r.cfg.Store.PeerAddr)
	}
	open := map[float64]bool{} // reachable from anywhere
	peerFromPods := false
	for _, rule := range list(np, "spec", "ingress") {
		from := list(rule, "from")
		for _, p := range list(rule, "ports") {
			n := portNumber(p)
			if len(from) == 0 {
				open[n] = true
				continue
			}
			if n != peerPort {
				continue
			}
			for _, f := range from {
				if get(f, "namespaceSelector") != nil || get(f, "ipBlock") != nil {
					t.Errorf("the peer port is open to %v", f)
				}
				sel, _ := get(f, "podSelector", "matchLabels").(obj)
				if !matches(sel, pods) {
					t.Errorf("the peer port is open to pods %v, not only the Coordinator's", sel)
				}
			}
			peerFromPods = true
		}
		if len(list(rule, "ports")) == 0 {
			t.Errorf("a rule without ports opens every port: %v", rule)
		}
	}
	if open[peerPort] {
		t.Fatal("the peer port is reachable from anywhere")
	}
	if !peerFromPods {
		t.Fatal("the other Coordinator pods cannot reach the peer port")
	}
	for name, n := range r.ports {
		if name != "peer" && !open[n] {
			t.Errorf("port %s (%v) is no longer reachable", name, n)
		}
	}

	if nps := byKind(objects(t, append(slices.Clone(haSets), "ha.networkPolicy.enabled=false")...), "NetworkPolicy"); len(nps) != 0 {
		t.Errorf("ha.networkPolicy.enabled=false: %d NetworkPolicies", len(nps))
	}
	if nps := byKind(objects(t), "NetworkPolicy"); len(nps) != 0 {
		t.Errorf("without ha: %d NetworkPolicies", len(nps))
	}
}
