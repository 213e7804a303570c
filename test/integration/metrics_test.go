package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const envMetrics = "EDG_COORDINATOR_PROMETHEUS_ADDR=127.0.0.1:0"

// metricsAddr returns the address the latest start of c reported for its
// metrics listener.
func metricsAddr(t *testing.T, c *coordinator) string {
	t.Helper()
	addr := ""
	for line := range strings.SplitSeq(c.Logs(), "\n") {
		var e struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == "metrics listening" {
			addr = e.Addr
		}
	}
	if addr == "" {
		t.Fatalf("the coordinator did not report a metrics listener\n%s", c.Logs())
	}
	return addr
}

// plainGet sends one plain-HTTP request to the metrics listener.
func plainGet(t *testing.T, method, url string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body, resp.Header
}

// families is one scrape of /metrics, parsed by Prometheus' text parser.
type families map[string]*dto.MetricFamily

func scrape(t *testing.T, c *coordinator) families {
	t.Helper()
	code, body, _ := plainGet(t, http.MethodGet, "http://"+metricsAddr(t, c)+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing /metrics: %v\n%s", err, body)
	}
	return fams
}

// value returns the value of the series of name whose labels include
// labels (every one given must match; others may exist).
func (f families) value(name string, labels ...string) (float64, bool) {
	fam, ok := f[name]
	if !ok {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range fam.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// expectValue checks one series' value.
func (f families) expectValue(t *testing.T, want float64, name string, labels ...string) {
	t.Helper()
	got, ok := f.value(name, labels...)
	if !ok {
		t.Errorf("%s%v: missing", name, labels)
		return
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// labelValues returns the distinct values of label across name's series.
func (f families) labelValues(name, label string) map[string]bool {
	out := map[string]bool{}
	for _, m := range f[name].GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				out[lp.GetValue()] = true
			}
		}
	}
	return out
}

// series counts every series of the scrape.
func (f families) series() int {
	n := 0
	for _, fam := range f {
		n += len(fam.GetMetric())
	}
	return n
}

func fileSize(t *testing.T, path string) float64 {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return float64(info.Size())
}

// TestMetricsAfterScriptedSequence drives the real Coordinator through a
// manifest, a secret upload, a refused request and activations, and checks
// each named metric.
func TestMetricsAfterScriptedSequence(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", envMetrics)
	m := scrape(t, c)
	m.expectValue(t, 2, "coordinator_state")
	m.expectValue(t, 0, "coordinator_version_info")
	if v := m.labelValues("coordinator_version_info", "version"); len(v) != 1 || v[""] {
		t.Errorf("coordinator_version_info version labels %v", v)
	}
	m.expectValue(t, 0, "quarry_sealed_state_bytes")
	m.expectValue(t, 0, "quarry_state_commits_total", "result", "success")
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if _, ok := m[name]; !ok {
			t.Errorf("%s missing (Go and process collectors)", name)
		}
	}

	hc := c.client(nil, nil)
	root := fetchRoot(t, c, hc)
	admin, adminPEM := newUserCert(t, "admin")
	expect(t, setManifest(t, c, hc, marbleManifest(t, adminPEM)), http.StatusOK, "success")
	adminClient := c.client(root, &admin)
	dataFile := filepath.Join(c.sealDir, "sealed_data")

	m = scrape(t, c)
	m.expectValue(t, 3, "coordinator_state")
	m.expectValue(t, 1, "quarry_state_commits_total", "result", "success")
	m.expectValue(t, 0, "quarry_state_commits_total", "result", "failure")
	m.expectValue(t, 1, "quarry_state_commit_duration_seconds")
	m.expectValue(t, fileSize(t, dataFile), "quarry_sealed_state_bytes")
	m.expectValue(t, 0, "quarry_update_pending")
	m.expectValue(t, 0, "quarry_update_missing_acknowledgements")
	m.expectValue(t, 0, "quarry_recovery_shares_accepted")
	m.expectValue(t, 1, "server_client_api_http_request_total", "path", "/api/v2/manifest", "method", "post", "code", "200")
	m.expectValue(t, 1, "server_client_api_http_request_duration_histogram_seconds", "path", "/api/v2/manifest", "method", "post")
	m.expectValue(t, 1, "server_client_api_http_request_size_histogram_bytes", "path", "/api/v2/manifest")
	m.expectValue(t, 1, "server_client_api_http_response_size_histogram_bytes", "path", "/api/v2/manifest")
	m.expectValue(t, 0, "server_client_api_http_in_flight_requests", "path", "/api/v2/manifest")

	// A secret upload is a second commit.
	expect(t, postSecrets(t, c, adminClient, map[string]any{"token": map[string]any{"key": []byte("tok")}}), http.StatusOK, "success")
	// A failing request: reading secrets without a client certificate.
	expect(t, do(t, c.client(root, nil), http.MethodGet, c.url("/api/v2/secrets?s=token"), nil), http.StatusUnauthorized, "fail")

	// Activations: a success, a success that is counted in the state
	// (MaxActivations), and a refused unknown type.
	tm := newTestMarble(t)
	tm.mustActivate(t, c, "backend", marbleUUIDA)
	tm.mustActivate(t, c, "limited", marbleUUIDB)
	_, err := tm.activate(t, c, "no-such-type", marbleUUIDA)
	if err == nil {
		t.Fatal("an unknown Marble type was activated")
	}

	m = scrape(t, c)
	m.expectValue(t, 3, "quarry_state_commits_total", "result", "success")
	m.expectValue(t, fileSize(t, dataFile), "quarry_sealed_state_bytes")
	m.expectValue(t, 1, "server_client_api_http_request_total", "path", "/api/v2/secrets", "method", "post", "code", "200")
	m.expectValue(t, 1, "server_client_api_http_request_total", "path", "/api/v2/secrets", "method", "get", "code", "401")
	m.expectValue(t, 1, "coordinator_marble_activations_total", "type", "backend")
	m.expectValue(t, 1, "coordinator_marble_activations_success_total", "type", "backend")
	m.expectValue(t, 1, "coordinator_marble_activations_total", "type", "limited")
	m.expectValue(t, 1, "coordinator_marble_activations_total", "type", "<unknown>")
	if _, ok := m.value("coordinator_marble_activations_success_total", "type", "<unknown>"); ok {
		t.Error("a refused activation counted as a success")
	}
	m.expectValue(t, 1, "quarry_activation_failures_total", "type", "<unknown>", "reason", "unknown_marble_type")
	if got := m.labelValues("coordinator_marble_activations_total", "uuid"); len(got) != 0 {
		t.Errorf("uuid label without the option: %v", got)
	}
	m.expectValue(t, 3, "grpc_server_started_total", "grpc_method", "Activate")
	m.expectValue(t, 2, "grpc_server_handled_total", "grpc_method", "Activate", "grpc_code", "OK")
	m.expectValue(t, 1, "grpc_server_handled_total", "grpc_method", "Activate", "grpc_code", "PermissionDenied")

	// /events: MarbleRun's shape, one entry per successful activation.
	code, body, hdr := plainGet(t, http.MethodGet, "http://"+metricsAddr(t, c)+"/events")
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("/events: %d %q", code, hdr.Get("Content-Type"))
	}
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("/events is not a JSON array: %v: %s", err, body)
	}
	if len(raw) != 2 {
		t.Fatalf("/events has %d entries, want 2: %s", len(raw), body)
	}
	for i, want := range []struct{ typ, uuid string }{{"backend", marbleUUIDA}, {"limited", marbleUUIDB}} {
		if len(raw[i]) != 2 {
			t.Errorf("event %d has keys other than time and activation: %s", i, body)
		}
		var ts string
		if err := json.Unmarshal(raw[i]["time"], &ts); err != nil {
			t.Fatal(err)
		}
		if when, err := time.Parse(time.RFC3339Nano, ts); err != nil || time.Since(when) > 10*time.Minute {
			t.Errorf("event %d time %q: %v", i, ts, err)
		}
		var act map[string]json.RawMessage
		if err := json.Unmarshal(raw[i]["activation"], &act); err != nil {
			t.Fatal(err)
		}
		if string(act["marbleType"]) != `"`+want.typ+`"` || string(act["uuid"]) != `"`+want.uuid+`"` || string(act["quote"]) != "null" || len(act) != 3 {
			t.Errorf("event %d activation = %s, want %s %s with quote null (simulation)", i, raw[i]["activation"], want.typ, want.uuid)
		}
	}
}

// TestMetricsUUIDLabelOption checks MarbleRun's per-instance label behind
// its switch, and that an unparsable UUID gets a fixed value.
func TestMetricsUUIDLabelOption(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", envMetrics, "QUARRY_METRICS_MARBLE_UUID_LABEL=1")
	hc := c.client(nil, nil)
	_, adminPEM := newUserCert(t, "admin")
	expect(t, setManifest(t, c, hc, marbleManifest(t, adminPEM)), http.StatusOK, "success")
	tm := newTestMarble(t)
	tm.mustActivate(t, c, "backend", strings.ToUpper(marbleUUIDA))
	if _, err := tm.activate(t, c, "backend", "not-a-uuid"); err == nil {
		t.Fatal("an unparsable UUID was activated")
	}
	m := scrape(t, c)
	m.expectValue(t, 1, "coordinator_marble_activations_success_total", "type", "backend", "uuid", marbleUUIDA)
	m.expectValue(t, 1, "coordinator_marble_activations_total", "type", "backend", "uuid", "invalid")
}

// TestMetricsCardinalityBounded sends 10,000 requests to random unknown
// paths with random methods and activations with random UUIDs and types:
// the series stay bounded, and nothing crashes.
func TestMetricsCardinalityBounded(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", envMetrics)
	hc := c.client(nil, nil)
	_, adminPEM := newUserCert(t, "admin")
	expect(t, setManifest(t, c, hc, marbleManifest(t, adminPEM)), http.StatusOK, "success")
	tm := newTestMarble(t)
	tm.mustActivate(t, c, "backend", marbleUUIDA)
	// Warm up every label combination the loop below can reach once.
	send := func(method, path string) {
		req, err := http.NewRequest(method, c.url(path), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	methods := []string{http.MethodGet, http.MethodPost, "BREW", "X-RANDOM"}
	for _, meth := range methods {
		send(meth, "/warm-up")
	}
	if _, err := tm.activate(t, c, "warm-up", uuid.NewString()); err == nil {
		t.Fatal("unknown type activated")
	}
	before := scrape(t, c)

	const requests = 10_000
	sent := map[string]bool{}
	for i := range requests {
		p := fmt.Sprintf("/%x/%d", rand.Uint64(), i)
		sent[p] = true
		send(methods[i%len(methods)], p)
	}
	const activations = 100
	for i := range activations {
		typ := "backend"
		if i%2 == 1 {
			typ = fmt.Sprintf("random-%x", rand.Uint64())
		}
		tm.activate(t, c, typ, uuid.NewString()) // the unknown types are refused
	}
	// The metrics listener answers unknown paths with 404, never a crash.
	maddr := metricsAddr(t, c)
	for i := range 200 {
		if code, _, _ := plainGet(t, methods[i%len(methods)], fmt.Sprintf("http://%s/%x", maddr, rand.Uint64())); code != http.StatusNotFound {
			t.Fatalf("metrics listener: unknown path answered %d", code)
		}
	}

	after := scrape(t, c)
	per := requests / len(methods)
	after.expectValue(t, float64(per+1), "server_client_api_http_request_total", "path", "unknown", "method", "get", "code", "404")
	after.expectValue(t, float64(2*per+2), "server_client_api_http_request_total", "path", "unknown", "method", "other", "code", "404")
	paths := after.labelValues("server_client_api_http_request_total", "path")
	if len(paths) > 10 || !paths["unknown"] {
		t.Errorf("path label values: %v", paths)
	}
	for p := range paths {
		if sent[p] || p == "/warm-up" {
			t.Errorf("the raw path %q became a label value", p)
		}
	}
	if ms := after.labelValues("server_client_api_http_request_total", "method"); len(ms) > 10 || ms["brew"] || ms["x-random"] {
		t.Errorf("method label values: %v", ms)
	}
	types := after.labelValues("coordinator_marble_activations_total", "type")
	if len(types) != 2 || !types["backend"] || !types["<unknown>"] {
		t.Errorf("type label values: %v", types)
	}
	after.expectValue(t, activations/2+1, "coordinator_marble_activations_success_total", "type", "backend")
	after.expectValue(t, activations/2+1, "quarry_activation_failures_total", "type", "<unknown>", "reason", "unknown_marble_type")
	// Only histogram buckets and values moved: the series count is the
	// same as after the warm-up.
	if b, a := before.series(), after.series(); a != b {
		t.Errorf("%d series before, %d after %d random requests and %d activations", b, a, requests, activations)
	}
}

// checkProbes asks the health and readiness endpoints of both listeners:
// healthz is 200, readyz readyCode with reason in its answer.
func checkProbes(t *testing.T, c *coordinator, readyCode int, reason string) {
	t.Helper()
	maddr := metricsAddr(t, c)
	if code, body, _ := plainGet(t, http.MethodGet, "http://"+maddr+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %s", code, body)
	}
	code, body, _ := plainGet(t, http.MethodGet, "http://"+maddr+"/readyz")
	if code != readyCode || !strings.Contains(string(body), reason) {
		t.Errorf("/readyz: %d %q, want %d with %q", code, body, readyCode, reason)
	}
	hc := c.client(nil, nil)
	expect(t, do(t, hc, http.MethodGet, c.url("/api/v2/healthz"), nil), http.StatusOK, "success")
	r := do(t, hc, http.MethodGet, c.url("/api/v2/readyz"), nil)
	if readyCode == http.StatusOK {
		expect(t, r, http.StatusOK, "success")
	} else {
		expect(t, r, http.StatusServiceUnavailable, "error")
		if !strings.Contains(r.Message, reason) {
			t.Errorf("/api/v2/readyz message %q, want one with %q", r.Message, reason)
		}
	}
}

// TestHealthProbesInEveryState checks /healthz and /readyz on both
// listeners in states 2 and 3 and with the store gone.
func TestHealthProbesInEveryState(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", envMetrics)
	checkProbes(t, c, http.StatusOK, "ok")
	expect(t, setManifest(t, c, c.client(nil, nil), marbleManifest(t, func() string { _, p := newUserCert(t, "admin"); return p }())), http.StatusOK, "success")
	checkProbes(t, c, http.StatusOK, "ok")

	// The store fails: the seal directory is moved away while running.
	moved := c.sealDir + ".moved"
	if err := os.Rename(c.sealDir, moved); err != nil {
		t.Fatal(err)
	}
	checkProbes(t, c, http.StatusServiceUnavailable, "cannot be read back")
	if err := os.Rename(moved, c.sealDir); err != nil {
		t.Fatal(err)
	}
	checkProbes(t, c, http.StatusOK, "ok")
	// Only the sealed state is gone: not ready either.
	data := filepath.Join(c.sealDir, "sealed_data")
	if err := os.Rename(data, data+".moved"); err != nil {
		t.Fatal(err)
	}
	checkProbes(t, c, http.StatusServiceUnavailable, "cannot be read back")
	if err := os.Rename(data+".moved", data); err != nil {
		t.Fatal(err)
	}
	checkProbes(t, c, http.StatusOK, "ok")

	// Other methods and paths of the metrics listener are 404.
	maddr := metricsAddr(t, c)
	for _, req := range [][2]string{{http.MethodPost, "/metrics"}, {http.MethodDelete, "/readyz"}, {http.MethodGet, "/metrics/"}, {http.MethodGet, "/api/v2/status"}} {
		if code, _, _ := plainGet(t, req[0], "http://"+maddr+req[1]); code != http.StatusNotFound {
			t.Errorf("%s %s: %d, want 404", req[0], req[1], code)
		}
	}
}

// TestHealthProbesInRecoveryMode checks state 1: not ready by default,
// ready with QUARRY_READY_IN_RECOVERY; the accepted shares are counted.
func TestHealthProbesInRecoveryMode(t *testing.T) {
	t.Parallel()
	s := newRecoverySetupIn(t, 2, []string{envMetrics}, func(*fixture) {})
	s.breakKey(t)
	checkProbes(t, s.c, http.StatusServiceUnavailable, "recovery mode")
	m := scrape(t, s.c)
	m.expectValue(t, 1, "coordinator_state")
	m.expectValue(t, 0, "quarry_recovery_shares_accepted")
	s.upload(t, "key1", 1)
	scrape(t, s.c).expectValue(t, 1, "quarry_recovery_shares_accepted")

	s.c.env = append(s.c.env, "QUARRY_READY_IN_RECOVERY=1")
	s.c.restart()
	checkProbes(t, s.c, http.StatusOK, "ok")
	scrape(t, s.c).expectValue(t, 0, "quarry_recovery_shares_accepted") // shares live in memory only
	s.upload(t, "key1", 1)
	s.upload(t, "key2", 0)
	m = scrape(t, s.c)
	m.expectValue(t, 3, "coordinator_state")
	m.expectValue(t, 0, "quarry_recovery_shares_accepted")
	m.expectValue(t, 1, "quarry_state_commits_total", "result", "success")
	checkProbes(t, s.c, http.StatusOK, "ok")
}

// TestEventsBounded checks that /events keeps the latest
// QUARRY_ACTIVATION_EVENTS activations and counts the dropped ones, and
// that events do not survive a restart.
func TestEventsBounded(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", envMetrics, "QUARRY_ACTIVATION_EVENTS=3")
	_, adminPEM := newUserCert(t, "admin")
	expect(t, setManifest(t, c, c.client(nil, nil), marbleManifest(t, adminPEM)), http.StatusOK, "success")
	tm := newTestMarble(t)
	var ids []string
	for range 5 {
		id := uuid.NewString()
		ids = append(ids, id)
		tm.mustActivate(t, c, "backend", id)
	}
	events := func() ([]string, string) {
		code, body, hdr := plainGet(t, http.MethodGet, "http://"+metricsAddr(t, c)+"/events")
		if code != http.StatusOK {
			t.Fatalf("/events: %d %s", code, body)
		}
		var evs []struct {
			Activation struct {
				UUID string `json:"uuid"`
			} `json:"activation"`
		}
		if err := json.Unmarshal(body, &evs); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range evs {
			got = append(got, e.Activation.UUID)
		}
		return got, hdr.Get("X-Quarry-Events-Dropped")
	}
	got, dropped := events()
	if strings.Join(got, ",") != strings.Join(ids[2:], ",") || dropped != "2" {
		t.Errorf("events %v (dropped %s), want the latest three %v (dropped 2)", got, dropped, ids[2:])
	}
	c.restart()
	if got, dropped := events(); len(got) != 0 || dropped != "0" {
		t.Errorf("after a restart: events %v, dropped %s", got, dropped)
	}
}
