package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/loadgen"
)

func runTool(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "-coordinator-bin is required unless -addr is given"},
		{[]string{"-addr", "127.0.0.1:1"}, "-addr needs -insecure or -cacert"},
		{[]string{"-coordinator-bin", "x", "-scenarios", "status,nope"}, `unknown scenario "nope"`},
		{[]string{"-coordinator-bin", "x", "-mix", "rsa=1,dsa=2"}, `-mix: mix "rsa=1,dsa=2": unknown type "dsa"`},
		{[]string{"-coordinator-bin", "x", "-max-error-rate", "2"}, "-max-error-rate must be between 0 and 1"},
		{[]string{"-coordinator-bin", "x", "-c", "0"}, "-c must be at least 1"},
		{[]string{"-coordinator-bin", "x", "extra"}, "unexpected arguments: extra"},
		{[]string{"-no-such-flag"}, "flag provided but not defined"},
		{[]string{"-coordinator-bin", "x", "-activate-resume"}, "-activate-resume needs -activate-reconnect"},
		{[]string{"-coordinator-bin", "x", "-activate-key", "p521"}, `-activate-key "p521": want p384 (MarbleRun's premain) or p256 (Quarry's runtime)`},
		{[]string{"-print-manifest", "nope"}, `-print-manifest: unknown Marble type "nope"`},
	}
	for _, tt := range tests {
		code, stdout, stderr := runTool(t, tt.args...)
		if code != exitFailed || stdout != "" || !strings.Contains(stderr, tt.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d with %q", tt.args, code, stdout, stderr, exitFailed, tt.want)
		}
	}
	code, _, stderr := runTool(t, "-h")
	if code != exitOK || !strings.Contains(stderr, "Usage: quarry-bench") || !strings.Contains(stderr, "-coordinator-bin") {
		t.Errorf("-h: exit %d, %q", code, stderr)
	}
}

// report is the part of the -json output the test checks.
type report struct {
	Target struct {
		Started bool   `json:"started"`
		Addr    string `json:"addr"`
	} `json:"target"`
	Manifest *struct {
		Bytes   int `json:"bytes"`
		Secrets int `json:"secrets"`
	} `json:"manifest"`
	Scenarios []struct {
		Name              string    `json:"name"`
		Skipped           string    `json:"skipped"`
		Requests          int64     `json:"requests"`
		Non2xx            int64     `json:"non2xx"`
		Errors            int64     `json:"errors"`
		FirstError        string    `json:"firstError"`
		RequestsPerSecond float64   `json:"requestsPerSecond"`
		Connections       int64     `json:"connections"`
		RunsSeconds       []float64 `json:"runsSeconds"`
		MedianSeconds     float64   `json:"medianSeconds"`
		LatencyMs         *struct {
			P50 float64 `json:"p50"`
			P99 float64 `json:"p99"`
		} `json:"latencyMs"`
	} `json:"scenarios"`
	Memory *struct {
		RSS int64 `json:"vmRSSBytes"`
	} `json:"coordinatorMemory"`
}

// TestAgainstCoordinator builds the real Coordinator and runs every scenario
// for 400 ms, then the read scenarios against it with -addr.
func TestAgainstCoordinator(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the Coordinator")
	}
	bin := filepath.Join(t.TempDir(), "coordinator")
	// Static and -trimpath, as the Dockerfile builds (deploy/container's
	// test builds the same packages that way): one build configuration
	// besides the race detector's, so the build cache serves both.
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "github.com/quarry-cc/quarry/cmd/coordinator")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the coordinator: %v\n%s", err, out)
	}

	code, stdout, stderr := runTool(t, "-coordinator-bin", bin, "-json", "-c", "4", "-d", "400ms", "-warmup", "100ms",
		"-secrets", "10", "-manifest-kb", "8", "-runs", "2")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	var rep report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("-json output: %v\n%s", err, stdout)
	}
	if !rep.Target.Started || rep.Manifest == nil || rep.Manifest.Bytes != 8192 || rep.Manifest.Secrets != 10 {
		t.Errorf("target %+v, manifest %+v", rep.Target, rep.Manifest)
	}
	if rep.Memory == nil || rep.Memory.RSS <= 0 {
		t.Errorf("no resident memory: %+v", rep.Memory)
	}
	var names []string
	for _, s := range rep.Scenarios {
		names = append(names, s.Name)
		if s.Skipped != "" || s.Non2xx != 0 || s.Errors != 0 || s.Requests == 0 {
			t.Errorf("%s: %+v", s.Name, s)
		}
		if s.Name == loadgen.ScenarioSetManifest {
			if len(s.RunsSeconds) != 2 || s.MedianSeconds <= 0 || s.Requests != 2 {
				t.Errorf("set-manifest: %+v", s)
			}
			continue
		}
		if s.LatencyMs == nil || s.LatencyMs.P50 <= 0 || s.RequestsPerSecond <= 0 || s.Connections != 4 {
			t.Errorf("%s: %+v", s.Name, s)
		}
	}
	if got := strings.Join(names, ","); got != strings.Join(loadgen.Scenarios, ",") {
		t.Errorf("scenarios %s", got)
	}
	if !strings.Contains(stderr, "set-manifest run 2/2") {
		t.Errorf("no progress on stderr:\n%s", stderr)
	}

	// -addr: a running Coordinator without a manifest. status works, secrets
	// is skipped, manifest answers non-2xx (exit 1), and set-manifest, last,
	// sets the generated manifest once.
	c, err := loadgen.StartCoordinator(context.Background(), bin, nil, loadgen.DefaultOptions().StartTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	code, stdout, stderr = runTool(t, "-addr", c.Addr, "-insecure", "-c", "2", "-d", "400ms", "-warmup", "100ms",
		"-scenarios", "status,manifest,secrets,set-manifest")
	if code != exitErrors {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, exitErrors, stdout, stderr)
	}
	for _, want := range []string{
		"secrets: skipped: needs -cert and -key",
		"resident memory after load: n/a",
		"manifest: first error: HTTP ",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "quarry-bench: manifest: error rate 100% (") || !strings.Contains(stderr, "set-manifest run 1/1: ") {
		t.Errorf("stderr:\n%s", stderr)
	}
	if got := stateCode(t, c.Addr); got != 3 {
		t.Errorf("after set-manifest the Coordinator is in state %d, want 3", got)
	}
	// Set again, on a Coordinator that has its manifest: skipped, the state
	// left alone.
	_, stdout, _ = runTool(t, "-addr", c.Addr, "-insecure", "-scenarios", "set-manifest")
	if !strings.Contains(stdout, "set-manifest: skipped: the Coordinator at -addr is in state 3, not 2") {
		t.Errorf("second set-manifest:\n%s", stdout)
	}
	for _, line := range strings.Split(stdout, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "status" && (len(f) < 10 || f[7] != "0" || f[8] != "0") {
			t.Errorf("status row %q: want no errors", line)
		}
	}
}

// TestPrintManifest: -print-manifest writes the activate scenario's
// manifest, valid for the Coordinator, with the Marble type asked for.
func TestPrintManifest(t *testing.T) {
	for _, typ := range []string{loadgen.ActivateMarbleShared, loadgen.ActivateMarbleCert} {
		code, stdout, stderr := runTool(t, "-print-manifest", typ)
		if code != exitOK || stderr != "" {
			t.Fatalf("%s: exit %d, %s", typ, code, stderr)
		}
		if err := loadgen.CheckManifest([]byte(stdout)); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		var m struct{ Marbles map[string]any }
		if err := json.Unmarshal([]byte(stdout), &m); err != nil || m.Marbles[typ] == nil || len(m.Marbles) != 1 {
			t.Fatalf("%s: Marbles %v, %v", typ, m.Marbles, err)
		}
	}
}

// stateCode returns the state code of the Coordinator's GET /api/v2/status.
func stateCode(t *testing.T, addr string) int {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: time.Minute}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + addr + "/api/v2/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var answer struct{ Data struct{ Code int } }
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatal(err)
	}
	return answer.Data.Code
}
