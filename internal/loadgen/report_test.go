package loadgen

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func sampleReport() *Report {
	return &Report{
		Target:   Target{Addr: "127.0.0.1:4433", Started: true, Binary: "/tmp/coordinator", PID: 42},
		Settings: Settings{Connections: 32, DurationSeconds: 10, WarmupSeconds: 1, Protocol: "HTTP/1.1", Runs: 5, Machine: "linux/amd64, 2 CPUs"},
		Manifest: &ManifestInfo{Bytes: 12800, Secrets: 50, Mix: Mix{10, 20, 10, 10}, Packages: 4, Marbles: 4, ReadableSecret: "sym_000"},
		Scenarios: []ScenarioResult{
			loadResult(ScenarioStatus, "GET /api/v2/status", RunResult{
				Requests: 350000, Bytes: 350000 * 100, Elapsed: 10 * time.Second, Connections: 32, Protocol: "HTTP/1.1",
				Latency: Latency{Mean: 900 * time.Microsecond, P50: 810 * time.Microsecond, P90: 1500 * time.Microsecond, P99: 3200 * time.Microsecond, Max: 20 * time.Millisecond},
			}),
			loadResult(ScenarioManifest, "GET /api/v2/manifest", RunResult{
				Requests: 1000, Non2xx: 10, Errors: 5, Elapsed: 10 * time.Second, Connections: 33, FirstError: "HTTP 500: boom",
			}),
			{Name: ScenarioSecrets, Skipped: "needs -cert and -key"},
			{Name: ScenarioSetManifest, Request: "POST /api/v2/manifest", Requests: 3, RunsSeconds: []float64{0.41, 0.39, 0.4}, MedianSeconds: 0.4},
		},
		Memory: &Memory{RSS: 38 << 20, Peak: 45 << 20},
	}
}

func TestReportJSONShape(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Target struct {
			Addr    string `json:"addr"`
			Started bool   `json:"started"`
			PID     int    `json:"pid"`
		} `json:"target"`
		Settings struct {
			Connections     int     `json:"connections"`
			DurationSeconds float64 `json:"durationSeconds"`
			Protocol        string  `json:"protocol"`
		} `json:"settings"`
		Manifest struct {
			Bytes int `json:"bytes"`
			Mix   struct {
				RSA int `json:"rsa"`
			} `json:"mix"`
		} `json:"manifest"`
		Scenarios []map[string]json.RawMessage `json:"scenarios"`
		Memory    *struct {
			RSS  int64 `json:"vmRSSBytes"`
			Peak int64 `json:"vmHWMBytes"`
		} `json:"coordinatorMemory"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Target.Addr != "127.0.0.1:4433" || !doc.Target.Started || doc.Target.PID != 42 ||
		doc.Settings.Connections != 32 || doc.Settings.DurationSeconds != 10 || doc.Settings.Protocol != "HTTP/1.1" ||
		doc.Manifest.Bytes != 12800 || doc.Manifest.Mix.RSA != 10 || doc.Memory == nil || doc.Memory.RSS != 38<<20 || doc.Memory.Peak != 45<<20 {
		t.Errorf("decoded %+v from\n%s", doc, buf.Bytes())
	}
	if len(doc.Scenarios) != 4 {
		t.Fatalf("%d scenarios", len(doc.Scenarios))
	}
	status := doc.Scenarios[0]
	for key, want := range map[string]string{
		"name": `"status"`, "request": `"GET /api/v2/status"`, "requests": "350000", "non2xx": "0", "errors": "0",
		"errorRate": "0", "requestsPerSecond": "35000", "bytesPerSecond": "3500000", "connections": "32",
		"protocol": `"HTTP/1.1"`, "latencyMs": `{"mean":0.9,"p50":0.81,"p90":1.5,"p99":3.2,"max":20}`,
	} {
		if got := compact(status[key]); got != want {
			t.Errorf("status.%s = %s, want %s", key, got, want)
		}
	}
	if _, ok := status["skipped"]; ok {
		t.Error("a scenario that ran has skipped")
	}
	var rate float64
	if err := json.Unmarshal(doc.Scenarios[1]["errorRate"], &rate); err != nil || rate != 15.0/1005 {
		t.Errorf("manifest errorRate = %v (%v), want 15/1005", rate, err)
	}
	if got := string(doc.Scenarios[2]["skipped"]); got != `"needs -cert and -key"` {
		t.Errorf("secrets.skipped = %s", got)
	}
	set := doc.Scenarios[3]
	if compact(set["runsSeconds"]) != "[0.41,0.39,0.4]" || compact(set["medianSeconds"]) != "0.4" {
		t.Errorf("set-manifest = %v", set)
	}
	if _, ok := set["latencyMs"]; ok {
		t.Error("set-manifest has latencyMs")
	}

	// Memory not available: null plus a note.
	r := sampleReport()
	r.Memory, r.MemoryNote = nil, "n/a: not started"
	buf.Reset()
	r.WriteJSON(&buf)
	if !strings.Contains(buf.String(), `"coordinatorMemory": null`) || !strings.Contains(buf.String(), `"coordinatorMemoryNote": "n/a: not started"`) {
		t.Errorf("no null memory:\n%s", buf.String())
	}
}

func compact(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return "invalid: " + string(raw)
	}
	return buf.String()
}

func TestReportTable(t *testing.T) {
	var buf bytes.Buffer
	if err := sampleReport().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"pid 42, https://127.0.0.1:4433 (started by quarry-bench)",
		"32 connections, HTTP/1.1, 10s per scenario after 1s warm-up",
		"12800 bytes, 4 packages, 4 Marbles, 50 shared secrets (10 cert-rsa 2048, 20 cert-ecdsa P-256, 10 cert-ed25519, 10 symmetric-key 256)",
		"status",
		"35000  0.81ms  1.50ms  3.20ms  20.0ms",
		"set-manifest  POST /api/v2/manifest: 3 runs on fresh Coordinators: 0.410s 0.390s 0.400s; median 0.400s",
		"secrets: skipped: needs -cert and -key",
		"manifest: first error: HTTP 500: boom",
		"resident memory after load: 38.0 MiB (VmRSS; peak VmHWM 45.0 MiB)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	r := sampleReport()
	r.Memory, r.MemoryNote = nil, "n/a: the Coordinator was not started by quarry-bench"
	buf.Reset()
	r.WriteTable(&buf)
	if !strings.Contains(buf.String(), "resident memory after load: n/a: the Coordinator was not started") {
		t.Errorf("no n/a:\n%s", buf.String())
	}
}

func TestReportFailures(t *testing.T) {
	r := sampleReport()
	if f := r.Failures(0); len(f) != 1 || !strings.HasPrefix(f[0], "manifest: error rate 1.493% (10 non-2xx, 5 transport errors) exceeds 0%") {
		t.Errorf("Failures(0) = %q", f)
	}
	if f := r.Failures(0.02); len(f) != 0 {
		t.Errorf("Failures(0.02) = %q", f)
	}
	r.Scenarios = append(r.Scenarios, ScenarioResult{Name: ScenarioQuote})
	if f := r.Failures(1); len(f) != 1 || f[0] != "quote: no request completed" {
		t.Errorf("empty scenario: %q", f)
	}
	r.Scenarios = []ScenarioResult{{Name: ScenarioSetManifest, Requests: 2, Non2xx: 2, ErrorRate: 1, FirstError: "HTTP 400: invalid"}}
	if f := r.Failures(0.5); len(f) != 1 || !strings.Contains(f[0], "HTTP 400: invalid") {
		t.Errorf("failed set-manifest: %q", f)
	}
}
