package loadgen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBenchRejectsOptions(t *testing.T) {
	ok := DefaultOptions()
	ok.CoordinatorBin = "/nonexistent/coordinator"
	tests := map[string]func(*Options){
		"no coordinator":   func(o *Options) { o.CoordinatorBin = "" },
		"both":             func(o *Options) { o.Addr = "127.0.0.1:1" },
		"addr without tls": func(o *Options) { o.CoordinatorBin, o.Addr = "", "127.0.0.1:1" },
		"cert without key": func(o *Options) { o.CoordinatorBin, o.Addr, o.Insecure, o.CertFile = "", "127.0.0.1:1", true, "c.pem" },
		"insecure started": func(o *Options) { o.Insecure = true },
		"cert started":     func(o *Options) { o.CertFile, o.KeyFile = "c.pem", "k.pem" },
		"no connections":   func(o *Options) { o.Connections = 0 },
		"no duration":      func(o *Options) { o.Duration = 0 },
		"negative warm-up": func(o *Options) { o.Warmup = -time.Second },
		"no runs":          func(o *Options) { o.Runs = 0 },
		"negative secrets": func(o *Options) { o.Secrets = -1 },
		"negative size":    func(o *Options) { o.ManifestKB = -1 },
		"unknown scenario": func(o *Options) { o.Scenarios = []string{"status", "stauts"} },
		"no scenario":      func(o *Options) { o.Scenarios = []string{} },
		"resume kept":      func(o *Options) { o.ActivateResume = true },
	}
	for name, mutate := range tests {
		o := ok
		mutate(&o)
		_, err := Bench(context.Background(), o)
		if !errors.Is(err, ErrUsage) {
			t.Errorf("%s: err = %v, want ErrUsage", name, err)
		}
	}
	// Valid options with a binary that does not exist: not a usage error.
	if _, err := Bench(context.Background(), ok); err == nil || errors.Is(err, ErrUsage) {
		t.Errorf("missing binary: err = %v", err)
	}
}

// TestBenchRemote runs the read scenarios against a stand-in server with
// -cacert, -cert, -key and -secret.
func TestBenchRemote(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}     // path and query
	withCert := map[string]int{} // of those, with the user's certificate
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen[r.URL.RequestURI()]++
		if len(r.TLS.PeerCertificates) > 0 && r.TLS.PeerCertificates[0].Subject.CommonName == "remote-user" {
			withCert[r.URL.RequestURI()]++
		}
		w.Write([]byte(`{"status":"success","data":{}}`))
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	defer srv.Close()

	dir := t.TempDir()
	write := func(name string, blocks ...*pem.Block) string {
		var text []byte
		for _, b := range blocks {
			text = append(text, pem.EncodeToMemory(b)...)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, text, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cert, _, err := NewUserCertificate("remote-user")
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.Addr = srv.Listener.Addr().String()
	o.CACert = write("ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	o.CertFile = write("cert.pem", &pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	o.KeyFile = write("key.pem", &pem.Block{Type: "PRIVATE KEY", Bytes: key})
	o.Secret = "db key"
	o.Connections, o.Duration, o.Warmup = 2, 150*time.Millisecond, 0
	var progress strings.Builder
	o.Progress = &progress

	// Every read scenario must count some requests; a loaded machine may
	// count none in a short window, so the run is repeated with a longer
	// one until each has (tests never assert speed).
	var rep *Report
	eventually(t, o.Duration, func(window time.Duration) bool {
		o.Duration = window
		var err error
		if rep, err = Bench(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		return allCounted(t, rep, window)
	})
	if rep.Target.Started || rep.Target.Addr != o.Addr || rep.Memory != nil || !strings.HasPrefix(rep.MemoryNote, "n/a") || rep.Manifest != nil {
		t.Errorf("report %+v", rep)
	}
	want := map[string]string{
		ScenarioStatus:      "/api/v2/status",
		ScenarioManifest:    "/api/v2/manifest",
		ScenarioQuote:       "/api/v2/quote",
		ScenarioSecrets:     "/api/v2/secrets?s=db+key",
		ScenarioSetManifest: "",
	}
	if len(rep.Scenarios) != len(want) {
		t.Fatalf("%d scenarios", len(rep.Scenarios))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, s := range rep.Scenarios {
		path, ok := want[s.Name]
		switch {
		case !ok:
			t.Errorf("unexpected scenario %s", s.Name)
		case path == "":
			if !strings.Contains(s.Skipped, "in state 0, not 2") || s.Requests != 0 {
				t.Errorf("%s: skipped %q", s.Name, s.Skipped)
			}
		case s.Skipped != "" || s.Requests == 0 || s.Requests > int64(seen[path]) || s.Errors+s.Non2xx != 0 || s.Request != "GET "+path:
			t.Errorf("%s: %+v; server saw %d of %s", s.Name, s, seen[path], path)
		}
	}
	if withCert[want[ScenarioSecrets]] != seen[want[ScenarioSecrets]] || withCert["/api/v2/status"] != 0 {
		t.Errorf("client certificate on %v of %v", withCert, seen)
	}
	if !strings.Contains(progress.String(), "set-manifest: skipped") {
		t.Errorf("progress:\n%s", progress.String())
	}

	// Without the user's certificate or the secret's name, secrets is skipped.
	o.CertFile, o.KeyFile = "", ""
	o.Scenarios = []string{ScenarioSecrets}
	if rep, err = Bench(context.Background(), o); err != nil || len(rep.Scenarios) != 1 || !strings.Contains(rep.Scenarios[0].Skipped, "-cert and -key") {
		t.Errorf("no certificate: %v, %+v", err, rep)
	}
	o.CertFile, o.KeyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	o.Secret = ""
	if rep, err = Bench(context.Background(), o); err != nil || !strings.Contains(rep.Scenarios[0].Skipped, "-secret NAME") {
		t.Errorf("no secret: %v, %+v", err, rep)
	}
	// Unreadable files are usage errors.
	o.Secret, o.KeyFile = "x", filepath.Join(dir, "missing.pem")
	if _, err := Bench(context.Background(), o); !errors.Is(err, ErrUsage) {
		t.Errorf("missing key: %v", err)
	}
	o.KeyFile, o.CACert = filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pem")
	if _, err := Bench(context.Background(), o); !errors.Is(err, ErrUsage) {
		t.Errorf("-cacert without a certificate: %v", err)
	}
}

// TestBenchRemoteSetManifest: with -addr, set-manifest sets a generated manifest once on a Coordinator
// waiting for its first one and reports the POST's time; an answer other
// than 200 counts as non-2xx.
func TestBenchRemoteSetManifest(t *testing.T) {
	for _, answer := range []int{http.StatusOK, http.StatusBadRequest} {
		t.Run(http.StatusText(answer), func(t *testing.T) {
			var mu sync.Mutex
			var posted []byte
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				switch r.Method + " " + r.URL.Path {
				case "GET /api/v2/status":
					w.Write([]byte(`{"status":"success","data":{"code":2,"message":"ready"}}`))
				case "POST /api/v2/manifest":
					posted, _ = io.ReadAll(r.Body)
					w.WriteHeader(answer)
					w.Write([]byte(`{"status":"success","data":null}`))
				default:
					t.Errorf("unexpected %s %s", r.Method, r.URL)
				}
			}))
			defer srv.Close()
			o := DefaultOptions()
			o.Addr, o.Insecure = srv.Listener.Addr().String(), true
			o.Scenarios = []string{ScenarioSetManifest}
			o.Secrets, o.Mix = 10, Mix{Symmetric: 1}
			o.Progress = io.Discard
			rep, err := Bench(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Scenarios) != 1 {
				t.Fatalf("scenarios %+v", rep.Scenarios)
			}
			r := rep.Scenarios[0]
			if answer == http.StatusOK && (r.Requests != 1 || r.Non2xx != 0 || len(r.RunsSeconds) != 1 || r.MedianSeconds <= 0) {
				t.Errorf("result %+v", r)
			}
			if answer != http.StatusOK && (r.Requests != 1 || r.Non2xx != 1 || len(r.RunsSeconds) != 0 || !strings.Contains(r.FirstError, "HTTP 400")) {
				t.Errorf("result %+v", r)
			}
			var body struct{ Manifest []byte }
			if err := json.Unmarshal(posted, &body); err != nil {
				t.Fatalf("posted %q: %v", posted, err)
			}
			var m struct {
				Secrets map[string]struct{ Type string }
			}
			if err := json.Unmarshal(body.Manifest, &m); err != nil || len(m.Secrets) != 10 || rep.Manifest == nil || rep.Manifest.Secrets != 10 {
				t.Errorf("manifest with %d secrets (%v), report %+v", len(m.Secrets), err, rep.Manifest)
			}
			for name, sec := range m.Secrets {
				if sec.Type != "symmetric-key" {
					t.Errorf("secret %s of type %q, the mix has only symmetric keys", name, sec.Type)
				}
			}
		})
	}
}

// TestBenchStarted runs the started-Coordinator flow with a stand-in: a
// script that announces the address of a test server and sleeps.
func TestBenchStarted(t *testing.T) {
	var mu sync.Mutex
	var posted []byte
	reject := false
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method == http.MethodPost {
			posted, _ = io.ReadAll(r.Body)
			if reject {
				w.WriteHeader(http.StatusBadRequest)
				w.Write([]byte(`{"status":"fail","message":"invalid manifest"}`))
				return
			}
		}
		if r.URL.Path == "/api/v2/secrets" && (len(r.TLS.PeerCertificates) == 0 || r.URL.Query().Get("s") != "sym_000") {
			w.WriteHeader(http.StatusUnauthorized)
		}
		w.Write([]byte(`{"status":"success","data":{}}`))
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	defer srv.Close()
	bin := fakeCoordinator(t, `echo '{"msg":"client API listening","addr":"`+srv.Listener.Addr().String()+`"}' >&2
exec sleep 60
`)
	o := DefaultOptions()
	o.CoordinatorBin = bin
	o.Connections, o.Duration, o.Warmup, o.Runs = 2, 100*time.Millisecond, 0, 3
	o.Secrets, o.ManifestKB = 4, 4

	var rep *Report
	eventually(t, o.Duration, func(window time.Duration) bool {
		o.Duration = window
		var err error
		if rep, err = Bench(context.Background(), o); err != nil {
			t.Fatal(err)
		}
		return allCounted(t, rep, window)
	})
	if !rep.Target.Started || rep.Target.PID == 0 || rep.Manifest == nil || rep.Manifest.Bytes != 4096 {
		t.Errorf("report %+v", rep)
	}
	if runtime.GOOS == "linux" && (rep.Memory == nil || rep.Memory.RSS <= 0) {
		t.Errorf("memory %+v, %s", rep.Memory, rep.MemoryNote)
	}
	if len(rep.Scenarios) != 5 {
		t.Fatalf("%d scenarios", len(rep.Scenarios))
	}
	for _, s := range rep.Scenarios {
		if s.Requests == 0 || s.Errors+s.Non2xx != 0 {
			t.Errorf("%s: %+v", s.Name, s)
		}
	}
	if set := rep.Scenarios[4]; set.Requests != 3 || len(set.RunsSeconds) != 3 || set.MedianSeconds <= 0 {
		t.Errorf("set-manifest %+v", set)
	}
	// What was posted is the generated manifest in a ManifestSetRequest.
	var req struct{ Manifest []byte }
	mu.Lock()
	err := json.Unmarshal(posted, &req)
	mu.Unlock()
	if err != nil || len(req.Manifest) != 4096 || CheckManifest(req.Manifest) != nil {
		t.Errorf("posted %d bytes (%v)", len(req.Manifest), err)
	}

	// The manifest rejected: the read scenarios cannot run (an error);
	// set-manifest runs count as failed (in the report).
	mu.Lock()
	reject = true
	mu.Unlock()
	if _, err := Bench(context.Background(), o); err == nil || !strings.Contains(err.Error(), `HTTP 400: {"status":"fail","message":"invalid manifest"}`) {
		t.Errorf("rejected manifest: %v", err)
	}
	o.Scenarios = []string{ScenarioSetManifest}
	rep, err = Bench(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if set := rep.Scenarios[0]; set.Requests != 3 || set.Non2xx != 3 || len(set.RunsSeconds) != 0 || !strings.Contains(set.FirstError, "invalid manifest") {
		t.Errorf("rejected set-manifest: %+v", set)
	}
	if len(rep.Failures(0.5)) != 1 || rep.Memory != nil || !strings.HasPrefix(rep.MemoryNote, "n/a") {
		t.Errorf("failures %q, memory %+v %q", rep.Failures(0.5), rep.Memory, rep.MemoryNote)
	}
	// No secrets: nothing for the secrets scenario to read.
	o.Scenarios, o.Secrets = []string{ScenarioSecrets}, 0
	mu.Lock()
	reject = false
	mu.Unlock()
	if rep, err = Bench(context.Background(), o); err != nil || !strings.Contains(rep.Scenarios[0].Skipped, "no secret") {
		t.Errorf("no secrets: %v, %+v", err, rep)
	}
}

// allCounted says whether every read scenario of rep counted a request; a
// scenario that did not is logged.
func allCounted(t *testing.T, rep *Report, window time.Duration) bool {
	t.Helper()
	all := true
	for _, s := range rep.Scenarios {
		if s.Name != ScenarioSetManifest && s.Skipped == "" && s.Requests == 0 {
			t.Logf("%s: no request counted in %v; again with a longer window", s.Name, window)
			all = false
		}
	}
	return all
}

// TestBenchRemoteSetManifestStatusFails: when GET /api/v2/status fails,
// set-manifest posts nothing and reports the failure as an error.
func TestBenchRemoteSetManifestStatusFails(t *testing.T) {
	var posts atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"status":"error","message":"starting"}`))
	}))
	defer srv.Close()
	o := DefaultOptions()
	o.Addr, o.Insecure = srv.Listener.Addr().String(), true
	o.Scenarios = []string{ScenarioSetManifest}
	o.Progress = io.Discard
	rep, err := Bench(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Scenarios[0]; r.Requests != 1 || r.Errors != 1 || !strings.Contains(r.FirstError, "HTTP 503") || posts.Load() != 0 {
		t.Errorf("result %+v, %d POSTs", r, posts.Load())
	}
}
