package loadgen

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/server/marbleapi"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/manifest"
)

// marbleAPI is a Coordinator started by the test in this process: a core
// in simulation with an activation manifest, served by the Marble API.
type marbleAPI struct {
	addr string
	core *core.Core

	mu        sync.Mutex
	succeeded map[string]int // per Marble type
	refused   map[core.ActivationRefusal]int
}

func startMarbleAPI(t *testing.T, perMarble bool) *marbleAPI {
	t.Helper()
	m := &marbleAPI{succeeded: map[string]int{}, refused: map[core.ActivationRefusal]int{}}
	c, err := core.New(context.Background(), core.Options{
		Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{},
		OnActivation: func(a core.ActivationAttempt) {
			m.mu.Lock()
			defer m.mu.Unlock()
			if a.Refused == "" {
				m.succeeded[a.MarbleType]++
			} else {
				m.refused[a.Refused]++
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ActivateManifest(perMarble)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetManifest(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := marbleapi.New(c, c.MarbleTLSCertificate, marbleapi.Options{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	m.addr, m.core = ln.Addr().String(), c
	return m
}

func (m *marbleAPI) counts() (map[string]int, map[core.ActivationRefusal]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, r := map[string]int{}, map[core.ActivationRefusal]int{}
	for k, v := range m.succeeded {
		s[k] = v
	}
	for k, v := range m.refused {
		r[k] = v
	}
	return s, r
}

// uuids returns the distinct UUIDs of the activations the core recorded.
func (m *marbleAPI) uuids() map[string]int {
	events, _ := m.core.ActivationEvents()
	out := map[string]int{}
	for _, e := range events {
		out[e.UUID]++
	}
	return out
}

// untilCounted runs run with a growing window until it counts at least one
// answer or error: a loaded machine may count none in a short one (tests
// never assert speed).
func untilCounted(t *testing.T, window time.Duration, run func(time.Duration) RunResult) RunResult {
	t.Helper()
	for {
		res := run(window)
		if res.Requests+res.Errors > 0 {
			return res
		}
		if window > 20*time.Second {
			t.Fatalf("nothing counted in %v", window)
		}
		t.Logf("nothing counted in %v; again with a longer window", window)
		window *= 4
	}
}

func TestActivateManifests(t *testing.T) {
	for _, perMarble := range []bool{false, true} {
		raw, err := ActivateManifest(perMarble)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckManifest(raw); err != nil {
			t.Fatalf("perMarble %v: %v", perMarble, err)
		}
		m, err := manifest.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{false: ActivateMarbleShared, true: ActivateMarbleCert}[perMarble]
		if _, ok := m.Marbles[want]; !ok || len(m.Marbles) != 1 {
			t.Errorf("perMarble %v: Marbles %v, want only %s", perMarble, m.Marbles, want)
		}
		var shared, own int
		for _, s := range m.Secrets {
			if s.Shared {
				shared++
			} else {
				own++
			}
		}
		if shared != 2 || own != map[bool]int{false: 0, true: 2}[perMarble] {
			t.Errorf("perMarble %v: %d shared and %d per-Marble secrets", perMarble, shared, own)
		}
	}
}

func TestRunActivate(t *testing.T) {
	for _, perMarble := range []bool{false, true} {
		m := startMarbleAPI(t, perMarble)
		typ := map[bool]string{false: ActivateMarbleShared, true: ActivateMarbleCert}[perMarble]
		const marbles = 3
		res := untilCounted(t, 200*time.Millisecond, func(window time.Duration) RunResult {
			res, err := RunActivate(context.Background(), ActivateConfig{
				Addr: m.addr, MarbleType: typ, Marbles: marbles, Duration: window, Timeout: time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			return res
		})
		succeeded, refused := m.counts()
		if res.Requests == 0 || res.Non2xx != 0 || res.Errors != 0 || res.FirstError != "" {
			t.Errorf("%s: %+v", typ, res)
		}
		// Every counted activation succeeded at the server, which may have
		// answered more (cut off at the end of a window, or earlier runs).
		if int(res.Requests) > succeeded[typ] || len(refused) != 0 {
			t.Errorf("%s: counted %d, server activated %v, refused %v", typ, res.Requests, succeeded, refused)
		}
		// One connection per Marble, kept; each Marble keeps its UUID.
		if res.Connections < marbles || !strings.HasPrefix(res.Protocol, "gRPC, TLS 1.") {
			t.Errorf("%s: %d connections, protocol %q", typ, res.Connections, res.Protocol)
		}
		if res.Latency.P50 <= 0 || res.Latency.Max < res.Latency.P99 || res.Bytes <= 0 {
			t.Errorf("%s: latency %+v, %d bytes", typ, res.Latency, res.Bytes)
		}
		// Each Marble keeps its UUID across its activations, so the runs
		// (at most five windows) record at most marbles*5 UUIDs. A loaded
		// machine may end a window before every Marble's first activation
		// completed, so fewer than marbles is possible, never none.
		if ids := m.uuids(); len(ids) > marbles*5 || len(ids) == 0 {
			t.Errorf("%s: %d distinct UUIDs for %d Marbles per run", typ, len(ids), marbles)
		}
	}
}

func TestRunActivateOneMarbleKeepsItsIdentity(t *testing.T) {
	m := startMarbleAPI(t, false)
	runs := 0
	res := untilCounted(t, 200*time.Millisecond, func(window time.Duration) RunResult {
		runs++
		res, err := RunActivate(context.Background(), ActivateConfig{Addr: m.addr, MarbleType: ActivateMarbleShared, Marbles: 1, Duration: window})
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	if res.Requests == 0 || res.Errors+res.Non2xx != 0 || res.Connections != 1 {
		t.Errorf("%+v", res)
	}
	// A run is one Marble: one UUID, activated again and again.
	events, _ := m.core.ActivationEvents()
	last := events[len(events)-1].UUID
	n := 0
	for _, e := range events {
		if e.UUID == last {
			n++
		}
	}
	if ids := m.uuids(); len(ids) > runs || n < int(res.Requests) {
		t.Errorf("%d UUIDs in %d runs; the last one activated %d times, %d counted", len(ids), runs, n, res.Requests)
	}
}

func TestRunActivateReconnect(t *testing.T) {
	m := startMarbleAPI(t, false)
	res := untilCounted(t, 300*time.Millisecond, func(window time.Duration) RunResult {
		res, err := RunActivate(context.Background(), ActivateConfig{
			Addr: m.addr, MarbleType: ActivateMarbleShared, Marbles: 2, Duration: window, Reconnect: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	// A connection for every activation (plus those cut off at the end).
	if res.Requests == 0 || res.Errors+res.Non2xx != 0 || res.Connections < res.Requests {
		t.Errorf("%+v", res)
	}
}

func TestRunActivateFailures(t *testing.T) {
	m := startMarbleAPI(t, false)
	// A Marble type the manifest does not have: refused, counted as
	// answers in Non2xx with the Coordinator's message.
	res := untilCounted(t, 200*time.Millisecond, func(window time.Duration) RunResult {
		res, err := RunActivate(context.Background(), ActivateConfig{Addr: m.addr, MarbleType: "nope", Marbles: 2, Duration: window})
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	if res.Requests == 0 || res.Non2xx != res.Requests || res.Errors != 0 ||
		!strings.Contains(res.FirstError, "gRPC PermissionDenied: marble verification failed: unknown marble type requested") {
		t.Errorf("unknown type: %+v", res)
	}
	if _, refused := m.counts(); refused[core.RefusedUnknownType] < int(res.Requests) {
		t.Errorf("refusals %v", refused)
	}

	// Nothing listens: transport errors, no answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	res = untilCounted(t, 200*time.Millisecond, func(window time.Duration) RunResult {
		res, err := RunActivate(context.Background(), ActivateConfig{Addr: closed, MarbleType: "x", Marbles: 1, Duration: window})
		if err != nil {
			t.Fatal(err)
		}
		return res
	})
	if res.Requests != 0 || res.Errors == 0 || !strings.Contains(res.FirstError, "gRPC Unavailable") {
		t.Errorf("closed port: %+v", res)
	}

	// A cancelled context ends the run with its error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RunActivate(ctx, ActivateConfig{Addr: m.addr, MarbleType: ActivateMarbleShared, Marbles: 1, Duration: time.Minute}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	for _, bad := range []ActivateConfig{
		{Addr: m.addr, MarbleType: "x", Marbles: 0, Duration: time.Second},
		{Addr: m.addr, MarbleType: "x", Marbles: 1},
		{Addr: m.addr, Marbles: 1, Duration: time.Second},
		{MarbleType: "x", Marbles: 1, Duration: time.Second},
	} {
		if _, err := RunActivate(context.Background(), bad); err == nil {
			t.Errorf("accepted %+v", bad)
		}
	}
}

func TestMeshAddrFromLog(t *testing.T) {
	log := `{"level":"WARN","msg":"sealing in simulation mode"}` + "\nnot json\n" +
		`{"time":"x","level":"INFO","msg":"marble API listening","addr":"127.0.0.1:2001"}` + "\n" +
		`{"time":"x","level":"INFO","msg":"client API listening","addr":"127.0.0.1:4433","state":2}` + "\n"
	if addr, err := meshAddrFromLog(log); err != nil || addr != "127.0.0.1:2001" {
		t.Errorf("got %q, %v", addr, err)
	}
	if _, err := meshAddrFromLog(`{"msg":"client API listening","addr":"127.0.0.1:4433"}` + "\n"); err == nil || !strings.Contains(err.Error(), "marble API listening") {
		t.Errorf("no Marble API line: %v", err)
	}
}

func TestBenchActivateOptions(t *testing.T) {
	tests := map[string]Options{
		"mesh without type":  {MeshAddr: "127.0.0.1:1"},
		"type without mesh":  {CoordinatorBin: "x", MarbleType: "m"},
		"mesh and binary":    {CoordinatorBin: "x", MeshAddr: "127.0.0.1:1", MarbleType: "m"},
		"unknown scenario":   {MeshAddr: "127.0.0.1:1", MarbleType: "m", Scenarios: []string{"activat"}},
		"nothing to drive":   {},
		"mesh with insecure": {MeshAddr: "127.0.0.1:1", MarbleType: "m", Insecure: true},
	}
	for name, o := range tests {
		d := DefaultOptions()
		d.CoordinatorBin, d.Addr, d.MeshAddr, d.MarbleType, d.Insecure, d.Scenarios = o.CoordinatorBin, o.Addr, o.MeshAddr, o.MarbleType, o.Insecure, o.Scenarios
		_, err := Bench(context.Background(), d)
		if !errors.Is(err, ErrUsage) {
			t.Errorf("%s: err = %v, want ErrUsage", name, err)
		}
	}
	d := DefaultOptions()
	_, err := Bench(context.Background(), d)
	if err == nil || !strings.Contains(err.Error(), "-coordinator-bin is required unless -addr is given (or -mesh-addr") {
		t.Errorf("no target: %v", err)
	}
}

// TestBenchActivateRemote runs the scenario through Bench against the
// Marble API of a running Coordinator (-mesh-addr, -marble-type), alone and
// next to -addr.
func TestBenchActivateRemote(t *testing.T) {
	m := startMarbleAPI(t, true)
	o := DefaultOptions()
	o.MeshAddr, o.MarbleType = m.addr, ActivateMarbleCert
	o.Connections, o.Warmup = 2, 0
	var progress bytes.Buffer
	o.Progress = &progress
	var rep *Report
	for window := 200 * time.Millisecond; ; window *= 4 {
		o.Duration = window
		var err error
		if rep, err = Bench(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		if len(rep.Scenarios) == 1 && rep.Scenarios[0].Requests > 0 || window > 20*time.Second {
			break
		}
	}
	// Only -mesh-addr: activate alone, by default.
	if len(rep.Scenarios) != 1 {
		t.Fatalf("scenarios %+v", rep.Scenarios)
	}
	s := rep.Scenarios[0]
	if s.Name != ScenarioActivate || s.Requests == 0 || s.Errors+s.Non2xx != 0 || s.Connections != 2 ||
		s.LatencyMs == nil || s.RequestsPerSecond <= 0 || !strings.Contains(s.Request, `Marble type "bench-cert"`) {
		t.Errorf("activate: %+v", s)
	}
	if rep.Target.MeshAddr != m.addr || rep.Target.Addr != "" || rep.Target.Started || rep.Settings.Protocol != "gRPC" || rep.Manifest != nil {
		t.Errorf("target %+v, settings %+v", rep.Target, rep.Settings)
	}
	if len(rep.Failures(0)) != 0 {
		t.Errorf("failures %v", rep.Failures(0))
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "Coordinator  Marble API "+m.addr) || !strings.Contains(table.String(), "activate ") {
		t.Errorf("table:\n%s", table.String())
	}
	if !strings.Contains(progress.String(), "activate: gRPC Activate at "+m.addr) {
		t.Errorf("progress:\n%s", progress.String())
	}

	// A read scenario without -addr is skipped.
	o.Scenarios, o.Duration = []string{ScenarioStatus, ScenarioActivate}, 200*time.Millisecond
	rep, err := Bench(context.Background(), o)
	if err != nil || len(rep.Scenarios) != 2 || !strings.Contains(rep.Scenarios[0].Skipped, "needs -addr") || rep.Scenarios[1].Name != ScenarioActivate {
		t.Errorf("status without -addr: %v, %+v", err, rep)
	}

	// With -addr too (a stand-in Client API): both, in order; activate is
	// in the default list with -mesh-addr. Without -mesh-addr, it is
	// skipped.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"status":"success","data":{}}`))
	}))
	defer srv.Close()
	o.Addr, o.Insecure = srv.Listener.Addr().String(), true
	o.Scenarios = nil
	rep, err = Bench(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range rep.Scenarios {
		names = append(names, s.Name)
	}
	if got := strings.Join(names, ","); got != strings.Join(AllScenarios, ",") {
		t.Errorf("scenarios %s", got)
	}
	table.Reset()
	rep.WriteTable(&table)
	if !strings.Contains(table.String(), "Coordinator  https://"+o.Addr+"\nMarble API   "+m.addr+"\n") {
		t.Errorf("table:\n%s", table.String())
	}
	o.MeshAddr, o.MarbleType, o.Scenarios = "", "", []string{ScenarioActivate}
	rep, err = Bench(context.Background(), o)
	if err != nil || len(rep.Scenarios) != 1 || !strings.Contains(rep.Scenarios[0].Skipped, "needs -mesh-addr") {
		t.Errorf("activate without -mesh-addr: %v, %+v", err, rep)
	}
}

// TestBenchActivateStarted builds the real Coordinator and runs both
// variants of the scenario on Coordinators that Bench starts.
func TestBenchActivateStarted(t *testing.T) {
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
	o := DefaultOptions()
	o.CoordinatorBin = bin
	o.Scenarios = []string{ScenarioActivate}
	o.Connections, o.Warmup = 2, 100*time.Millisecond
	var progress bytes.Buffer
	o.Progress = &progress
	var rep *Report
	for window := 300 * time.Millisecond; ; window *= 4 {
		o.Duration = window
		var err error
		if rep, err = Bench(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		if len(rep.Scenarios) != 2 {
			t.Fatalf("scenarios %+v", rep.Scenarios)
		}
		if rep.Scenarios[0].Requests > 0 && rep.Scenarios[1].Requests > 0 || window > 20*time.Second {
			break
		}
		t.Logf("a variant counted nothing in %v; again with a longer window", window)
	}
	for i, want := range []string{"activate-shared", "activate-cert"} {
		s := rep.Scenarios[i]
		if s.Name != want || s.Requests == 0 || s.Errors+s.Non2xx != 0 || s.Connections != 2 || s.LatencyMs == nil || s.LatencyMs.P50 <= 0 {
			t.Errorf("%s: %+v", want, s)
		}
	}
	if !rep.Target.Started || rep.Manifest != nil || rep.Memory != nil {
		t.Errorf("report %+v", rep)
	}
	for _, want := range []string{"activate-shared: coordinator " + bin + " started", "Marble API 127.0.0.1:", "activate-cert: gRPC Activate at"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
}
