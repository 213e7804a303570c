package kubernetes_test

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestChartHADrain: in HA mode the chart renders what lets the Coordinator
// survive a node drain — a PodDisruptionBudget over its pods, anti-affinity
// across nodes, and each instance's seal directory (its instance id) on a
// claim of its own.
func TestChartHADrain(t *testing.T) {
	objs := objects(t, haSets...)
	r := render(t, objs)
	pods := get(r.sts, "spec", "template", "metadata", "labels")

	pdbs := byKind(objs, "PodDisruptionBudget")
	if len(pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets in HA mode", len(pdbs))
	}
	if !matches(get(pdbs[0], "spec", "selector", "matchLabels").(obj), pods) {
		t.Error("the PodDisruptionBudget does not select the Coordinator pods")
	}
	if str(pdbs[0], "apiVersion") != "policy/v1" || get(pdbs[0], "spec", "maxUnavailable") != 1.0 || get(pdbs[0], "spec", "minAvailable") != nil {
		t.Errorf("PodDisruptionBudget %v: want policy/v1 with maxUnavailable 1", pdbs[0])
	}

	// Soft anti-affinity by default: on nodes of their own where possible.
	term := get(r.sts, "spec", "template", "spec", "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution", 0, "podAffinityTerm")
	if str(term, "topologyKey") != "kubernetes.io/hostname" || !matches(get(term, "labelSelector", "matchLabels").(obj), pods) {
		t.Errorf("anti-affinity term %v", term)
	}
	hard := render(t, objects(t, append(slices.Clone(haSets), "ha.podAntiAffinity=hard")...))
	term = get(hard.sts, "spec", "template", "spec", "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution", 0)
	if str(term, "topologyKey") != "kubernetes.io/hostname" || !matches(get(term, "labelSelector", "matchLabels").(obj), pods) {
		t.Errorf("hard anti-affinity term %v", term)
	}
	// The operator's own affinity replaces it.
	own := render(t, objects(t, append(slices.Clone(haSets), "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=sgx",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists")...))
	if get(own.sts, "spec", "template", "spec", "affinity", "podAntiAffinity") != nil || get(own.sts, "spec", "template", "spec", "affinity", "nodeAffinity") == nil {
		t.Errorf("affinity with the value set: %v", get(own.sts, "spec", "template", "spec", "affinity"))
	}

	// Per-instance claims mounted at the seal directory; no emptyDir.
	vct := list(r.sts, "spec", "volumeClaimTemplates")
	if len(vct) != 1 || str(vct[0], "metadata", "name") != "seal" || r.mounts["seal"] != r.cfg.SealDir {
		t.Fatalf("volumeClaimTemplates %v, seal mounted at %q, seal directory %q", vct, r.mounts["seal"], r.cfg.SealDir)
	}
	for _, v := range list(r.sts, "spec", "template", "spec", "volumes") {
		if str(v, "name") == "seal" {
			t.Errorf("a pod volume %v shadows the claim template", v)
		}
	}

	// None of it for a single instance (a budget would block every drain).
	single := objects(t)
	if n := len(byKind(single, "PodDisruptionBudget")); n != 0 {
		t.Errorf("%d PodDisruptionBudgets for a single instance", n)
	}
	if a := get(render(t, single).sts, "spec", "template", "spec", "affinity"); a != nil {
		t.Errorf("affinity for a single instance: %v", a)
	}
	if n := len(byKind(objects(t, append(slices.Clone(haSets), "ha.podDisruptionBudget.enabled=false")...), "PodDisruptionBudget")); n != 0 {
		t.Errorf("ha.podDisruptionBudget.enabled=false: %d", n)
	}
}

// TestChartMetricsNetworkPolicy: with ha.networkPolicy.metricsFrom the
// metrics port admits only those peers; the peer port stays the
// Coordinator pods' alone.
func TestChartMetricsNetworkPolicy(t *testing.T) {
	objs := objects(t, append(slices.Clone(haSets), "ha.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring")...)
	r := render(t, objs)
	np := byKind(objs, "NetworkPolicy")[0]
	metricsFrom := map[string]bool{}
	for _, rule := range list(np, "spec", "ingress") {
		for _, p := range list(rule, "ports") {
			if str(p, "port") != "metrics" {
				continue
			}
			from := list(rule, "from")
			if len(from) == 0 {
				t.Fatal("the metrics port is open to all although metricsFrom is set")
			}
			for _, f := range from {
				metricsFrom[str(f, "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name")] = true
				if get(f, "podSelector") != nil && matches(get(f, "podSelector", "matchLabels").(obj), get(r.sts, "spec", "template", "metadata", "labels")) {
					t.Errorf("the metrics port rule is the peer rule: %v", rule)
				}
			}
		}
	}
	if !metricsFrom["monitoring"] || len(metricsFrom) != 1 {
		t.Errorf("metrics port admits %v, want the monitoring namespace", metricsFrom)
	}
}

// TestChartLintRefuses: helm lint (whose lint mode turns a template's
// fail into an INFO line) fails for the values the Coordinator cannot run
// with, through the values schema.
func TestChartLintRefuses(t *testing.T) {
	for _, c := range []struct {
		sets []string
		want string
	}{
		{[]string{"ha.enabled=true", "ha.insecurePeerTrust=true"}, "/ha/etcd/endpoints"},
		{[]string{"ha.enabled=true", "ha.etcd.endpoints={https://etcd:2379}"}, "/ha/insecurePeerTrust"},
		{[]string{"coordinator.attestation=gramine"}, "/coordinator/attestation"},
		{[]string{"coordinator.attestation=auto"}, "/coordinator/attestation"},
		{[]string{"image.variant=gramine"}, "/coordinator/attestation"},
		{[]string{"injector.tls.mode=acme"}, "/injector/tls/mode"},
	} {
		args := []string{"lint", "--strict", chartDir}
		for _, s := range c.sets {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("helm lint %v: %v\n%s; want a failure naming %s", c.sets, err, out, c.want)
		}
	}
	if out, err := helm(t, "lint", "--strict", chartDir, "--set", "image.variant=gramine", "--set", "coordinator.attestation=gramine",
		"--set", "ha.enabled=true", "--set", "ha.etcd.endpoints={https://etcd:2379}"); err != nil {
		t.Errorf("the SGX variant in HA mode: %v\n%s", err, out)
	}
}

// TestChartSGXVariant: image.variant gramine requests the SGX device
// plugin's resources and the AESM socket for Gramine's quotes.
func TestChartSGXVariant(t *testing.T) {
	r := render(t, objects(t, "image.variant=gramine", "coordinator.attestation=gramine"))
	if r.cfg.Attestation != "gramine" {
		t.Errorf("attestation %q", r.cfg.Attestation)
	}
	for res, want := range map[string]string{"sgx.intel.com/epc": "512Mi", "sgx.intel.com/enclave": "1", "sgx.intel.com/provision": "1", "memory": "1Gi"} {
		if got := str(r.container, "resources", "limits", res); got != want {
			t.Errorf("limit %s = %q, want %q", res, got, want)
		}
	}
	if str(r.sts, "spec", "template", "metadata", "annotations", "sgx.intel.com/quote-provider") != "aesmd" {
		t.Error("no sgx.intel.com/quote-provider annotation")
	}
	if plain := render(t, objects(t)); str(plain.container, "resources", "limits", "sgx.intel.com/epc") != "" {
		t.Error("the plain image requests SGX resources")
	}
}

// TestChartInjector: the Marble injector's webhook configuration admits
// only CREATE of pods labelled marblerun/marbletype, never in kube-system,
// reaches the injector's Service over TLS with a CA that signed the
// certificate the injector serves, and the injector is given the release's
// Marble API.
func TestChartInjector(t *testing.T) {
	if n := len(byKind(objects(t), "MutatingWebhookConfiguration")); n != 0 {
		t.Fatalf("%d webhook configurations by default", n)
	}
	objs := objects(t, "injector.enabled=true", "injector.namespaceSelector.matchLabels.team=shop")
	mwcs := byKind(objs, "MutatingWebhookConfiguration")
	if len(mwcs) != 1 || len(list(mwcs[0], "webhooks")) != 1 {
		t.Fatalf("webhook configurations %v", mwcs)
	}
	wh := list(mwcs[0], "webhooks")[0]
	if str(wh, "failurePolicy") != "Fail" || str(wh, "sideEffects") != "None" || !slices.Equal(list(wh, "admissionReviewVersions"), []any{"v1"}) {
		t.Errorf("webhook %v", wh)
	}
	rules := list(wh, "rules")
	if len(rules) != 1 || !slices.Equal(list(rules[0], "operations"), []any{"CREATE"}) || !slices.Equal(list(rules[0], "resources"), []any{"pods"}) ||
		!slices.Equal(list(rules[0], "apiGroups"), []any{""}) {
		t.Errorf("rules %v", rules)
	}
	if e := get(wh, "objectSelector", "matchExpressions", 0); str(e, "key") != "marblerun/marbletype" || str(e, "operator") != "Exists" {
		t.Errorf("objectSelector %v", get(wh, "objectSelector"))
	}
	// kube-system is excluded, and the operator's selector still applies.
	ns := get(wh, "namespaceSelector")
	if str(ns, "matchLabels", "team") != "shop" {
		t.Errorf("namespaceSelector %v lost the operator's labels", ns)
	}
	if !excludes(ns, "kube-system") {
		t.Errorf("namespaceSelector %v admits kube-system", ns)
	}
	// An operator selector that would match everything still leaves
	// kube-system out.
	other := list(byKind(objects(t, "injector.enabled=true", "injector.namespaceSelector.matchExpressions[0].key=x", "injector.namespaceSelector.matchExpressions[0].operator=DoesNotExist"),
		"MutatingWebhookConfiguration")[0], "webhooks")[0]
	if !excludes(get(other, "namespaceSelector"), "kube-system") || len(list(other, "namespaceSelector", "matchExpressions")) != 2 {
		t.Errorf("namespaceSelector %v", get(other, "namespaceSelector"))
	}

	// The Service the webhook calls leads to the injector's HTTPS port.
	svcName := str(wh, "clientConfig", "service", "name")
	var svc, deploy obj
	for _, o := range byKind(objs, "Service") {
		if str(o, "metadata", "name") == svcName {
			svc = o
		}
	}
	for _, o := range byKind(objs, "Deployment") {
		deploy = o
	}
	if svc == nil || deploy == nil {
		t.Fatalf("no Service %s or no Deployment", svcName)
	}
	podLabels := get(deploy, "spec", "template", "metadata", "labels")
	if !matches(get(svc, "spec", "selector").(obj), podLabels) {
		t.Error("the injector Service does not select the injector pods")
	}
	if matches(get(byKind(objs, "StatefulSet")[0], "spec", "selector", "matchLabels").(obj), podLabels) {
		t.Error("the Coordinator's selector selects the injector pods")
	}
	c := list(deploy, "spec", "template", "spec", "containers")[0]
	if str(svc, "spec", "ports", 0, "port") != str(wh, "clientConfig", "service", "port") || str(svc, "spec", "ports", 0, "targetPort") != str(c, "ports", 0, "name") {
		t.Errorf("Service ports %v, webhook port %v, container ports %v", get(svc, "spec", "ports"), get(wh, "clientConfig", "service", "port"), get(c, "ports"))
	}
	args := map[string]string{}
	for _, a := range list(c, "args") {
		k, v, _ := strings.Cut(strings.TrimPrefix(a.(string), "-"), "=")
		args[k] = v
	}
	if args["coordAddr"] != "quarry-coordinator-mesh.quarry:2001" || args["sgxResource"] != "sgx.intel.com/epc" || args["addr"] != ":"+str(c, "ports", 0, "containerPort") {
		t.Errorf("injector args %v", args)
	}
	checkInjectorFlags(t, args)

	// The caBundle verifies the certificate in the mounted Secret for the
	// Service's DNS name.
	var secretName string
	for _, v := range list(deploy, "spec", "template", "spec", "volumes") {
		secretName = str(v, "secret", "secretName")
	}
	var crt []byte
	for _, o := range byKind(objs, "Secret") {
		if str(o, "metadata", "name") == secretName {
			crt, _ = base64.StdEncoding.DecodeString(str(o, "data", "tls.crt"))
		}
	}
	ca, _ := base64.StdEncoding.DecodeString(str(wh, "clientConfig", "caBundle"))
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("caBundle holds no certificate")
	}
	b, _ := pem.Decode(crt)
	if b == nil {
		t.Fatalf("Secret %s holds no certificate", secretName)
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: svcName + ".quarry.svc", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the served certificate does not verify for the API server: %v", err)
	}

	// cert-manager: a Certificate for the Service and the CA injected.
	cm := objects(t, "injector.enabled=true", "injector.tls.mode=certManager")
	mwc := byKind(cm, "MutatingWebhookConfiguration")[0]
	certs := byKind(cm, "Certificate")
	if len(certs) != 1 || str(mwc, "metadata", "annotations", "cert-manager.io/inject-ca-from") != "quarry/"+str(certs[0], "metadata", "name") ||
		!slices.Contains(list(certs[0], "spec", "dnsNames"), any(svcName+".quarry.svc")) {
		t.Errorf("cert-manager: %v, %v", mwc, certs)
	}
	// Own Secret without its CA: refused.
	if _, err := helm(t, "template", "x", chartDir, "--set", "injector.enabled=true", "--set", "injector.tls.mode=secret", "--set", "injector.tls.secretName=s"); err == nil ||
		!strings.Contains(err.Error(), "injector.tls.caBundle") {
		t.Errorf("secret mode without caBundle: %v", err)
	}
}

// excludes: the selector's expressions keep namespace name out.
func excludes(sel any, name string) bool {
	for _, e := range list(sel, "matchExpressions") {
		if str(e, "key") == "kubernetes.io/metadata.name" && str(e, "operator") == "NotIn" && slices.Contains(list(e, "values"), any(name)) {
			return true
		}
	}
	return false
}

// checkInjectorFlags: the chart passes only flags cmd/marble-injector
// has (its -help lists them).
func checkInjectorFlags(t *testing.T, args map[string]string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "marble-injector")
	// Built as the Dockerfile builds it, so that the build cache of
	// deploy/container's test serves both.
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/quarry-cc/quarry/cmd/marble-injector")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the injector: %v\n%s", err, out)
	}
	help, _ := exec.Command(bin, "-help").CombinedOutput()
	for k := range args {
		if !regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(k) + `\b`).Match(help) {
			t.Errorf("the chart passes -%s, which marble-injector does not have:\n%s", k, help)
		}
	}
}

// TestChartDashboard: the ConfigMap carries the dashboard file unchanged.
func TestChartDashboard(t *testing.T) {
	if n := len(byKind(objects(t), "ConfigMap")); n != 0 {
		t.Fatalf("%d ConfigMaps by default", n)
	}
	cms := byKind(objects(t, "grafanaDashboard.enabled=true"), "ConfigMap")
	want, err := os.ReadFile(filepath.Join(chartDir, "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cms) != 1 || str(cms[0], "metadata", "labels", "grafana_dashboard") != "1" ||
		strings.TrimSpace(str(cms[0], "data", "quarry-coordinator.json")) != strings.TrimSpace(string(want)) {
		t.Fatalf("ConfigMaps %v", cms)
	}
}

// TestChartPrometheusRuleMatchesDocs: the chart's alert rules are the
// example rules of docs/operations.md, expression for expression.
func TestChartPrometheusRuleMatchesDocs(t *testing.T) {
	ops, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(ops), "## Example alert rules")
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("docs/operations.md has no YAML block under \"Example alert rules\"")
	}
	var doc struct {
		Groups []struct {
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
			}
		}
	}
	if err := yaml.Unmarshal([]byte(m[1]), &doc); err != nil {
		t.Fatal(err)
	}
	chart := map[string]any{}
	for _, g := range list(byKind(objects(t, "prometheusRule.enabled=true"), "PrometheusRule")[0], "spec", "groups") {
		for _, r := range list(g, "rules") {
			chart[str(r, "alert")] = r
		}
	}
	n := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			n++
			c, ok := chart[r.Alert]
			if !ok {
				t.Errorf("the chart lacks %s", r.Alert)
				continue
			}
			if str(c, "expr") != r.Expr || str(c, "for") != r.For || str(c, "labels", "severity") != r.Labels["severity"] {
				t.Errorf("%s: chart %q for %q %q, docs %q for %q %q", r.Alert, str(c, "expr"), str(c, "for"), str(c, "labels", "severity"), r.Expr, r.For, r.Labels["severity"])
			}
		}
	}
	if n < 8 || n != len(chart) {
		t.Errorf("docs have %d rules, the chart %d", n, len(chart))
	}
}

// TestChartNotes: the notes tell how to reach the Coordinator and how to
// trust it with the quarry CLI's own flags. helm template does not render
// NOTES.txt, so a copy of the chart renders it as a value of a manifest.
func TestChartNotes(t *testing.T) {
	tmp := filepath.Join(t.TempDir(), "chart")
	if out, err := exec.Command("cp", "-r", chartDir, tmp).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	notes, err := os.ReadFile(filepath.Join(tmp, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	wrapped := "notes: |\n  " + strings.ReplaceAll(string(notes), "\n", "\n  ") + "\n"
	os.WriteFile(filepath.Join(tmp, "templates", "notes-test.yaml"), []byte(wrapped), 0o644)
	for sets, want := range map[string][]string{
		"": {"port-forward svc/quarry-coordinator 4433:4433", "quarry certificate root --insecure -f coordinator-root.pem", "quarry status --root coordinator-root.pem"},
		"image.variant=gramine,coordinator.attestation=gramine": {"quarry certificate root --era-config era-config.json", "quarry status --root coordinator-root.pem"},
	} {
		args := []string{"template", "quarry-coordinator", tmp, "--namespace", "quarry", "--show-only", "templates/notes-test.yaml"}
		for _, s := range strings.Split(sets, ",") {
			if s != "" {
				args = append(args, "--set", s)
			}
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("%s: notes lack %q:\n%s", sets, w, out)
			}
		}
		if sets != "" && strings.Contains(string(out), "--insecure") {
			t.Errorf("the SGX notes tell to use --insecure:\n%s", out)
		}
	}
}
