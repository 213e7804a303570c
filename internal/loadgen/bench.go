// Package loadgen drives a Quarry (or MarbleRun) Coordinator's Client API
// with concurrent keep-alive HTTPS clients and its Marble API with
// concurrent simulated Marbles (activate.go), and measures throughput,
// latency, errors, the wall time of setting a manifest and the
// Coordinator's resident memory. cmd/quarry-bench is its command line.
package loadgen

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

// Scenario names.
const (
	ScenarioStatus      = "status"
	ScenarioManifest    = "manifest"
	ScenarioQuote       = "quote"
	ScenarioSecrets     = "secrets"
	ScenarioSetManifest = "set-manifest"
	ScenarioActivate    = "activate"
)

// Scenarios lists the scenarios that run by default, in the order they run.
var Scenarios = []string{ScenarioStatus, ScenarioManifest, ScenarioQuote, ScenarioSecrets, ScenarioSetManifest}

// AllScenarios lists every scenario in the order they run: the default ones,
// activate, which runs when selected (or, with MeshAddr, by default), and
// upload-concurrent (upload.go), which runs when selected.
var AllScenarios = []string{ScenarioStatus, ScenarioManifest, ScenarioQuote, ScenarioSecrets, ScenarioActivate, ScenarioUploadConcurrent, ScenarioSetManifest}

// Options configure a benchmark. Either CoordinatorBin (start
// Coordinators) is set, or Addr and MeshAddr (use a running one), or both.
type Options struct {
	CoordinatorBin string
	// Env is passed (KEY=value) to the Coordinators the tool starts.
	Env  []string
	Addr string
	// MeshAddr is a running Coordinator's Marble API for the activate
	// scenario, whose Marbles ask for MarbleType.
	MeshAddr, MarbleType string
	// ActivateReconnect makes each activation open a connection of its own
	// (ActivateConfig.Reconnect).
	ActivateReconnect bool
	// ActivateResume, with ActivateReconnect, resumes each Marble's TLS
	// session (ActivateConfig.Resume).
	ActivateResume bool
	// ActivateKey is the curve of the Marbles' TLS keys: "p384" (the
	// default, as MarbleRun's premain) or "p256" (as Quarry's runtime).
	ActivateKey string

	// For Addr: Insecure skips server verification, else CACert (a PEM
	// file) is the trusted root. CertFile and KeyFile are the client
	// certificate of the secrets scenario. A started Coordinator is a
	// process of ours on loopback and is not verified.
	Insecure          bool
	CACert            string
	CertFile, KeyFile string
	// Secret is the secret the secrets scenario reads; with a started
	// Coordinator it defaults to one the generated manifest lets the
	// user read.
	Secret string

	Scenarios   []string // nil: Scenarios (with MeshAddr: and activate)
	Connections int
	Duration    time.Duration
	Warmup      time.Duration
	Timeout     time.Duration // response headers, per request
	HTTP2       bool

	ManifestKB float64 // size of the generated manifest
	Secrets    int     // its shared secrets
	Mix        Mix
	Runs       int // set-manifest runs, each on a fresh Coordinator

	// StartTimeout bounds the wait for a started Coordinator to listen.
	StartTimeout time.Duration
	// Progress receives a line per step; nil discards them.
	Progress io.Writer
}

// DefaultOptions returns the command's defaults (no Coordinator chosen).
func DefaultOptions() Options {
	return Options{
		Connections:  32,
		Duration:     10 * time.Second,
		Warmup:       time.Second,
		Timeout:      10 * time.Second,
		ManifestKB:   12.5,
		Secrets:      50,
		Mix:          DefaultMix,
		Runs:         5,
		StartTimeout: 30 * time.Second,
	}
}

// check validates o and returns the selected scenarios in run order.
func (o *Options) check() ([]string, error) {
	var errs []error
	switch {
	case o.Addr == "" && o.CoordinatorBin == "" && o.MeshAddr == "":
		errs = append(errs, errors.New("-coordinator-bin is required unless -addr is given (or -mesh-addr for the activate scenario)"))
	case o.Addr != "" && o.CoordinatorBin != "":
		errs = append(errs, errors.New("-coordinator-bin and -addr exclude each other"))
	case o.MeshAddr != "" && o.CoordinatorBin != "":
		errs = append(errs, errors.New("-coordinator-bin and -mesh-addr exclude each other"))
	case o.Addr != "" && !o.Insecure && o.CACert == "":
		errs = append(errs, errors.New("-addr needs -insecure or -cacert: a Coordinator's certificate is its own, not from a public CA"))
	}
	if o.Addr == "" && (o.Insecure || o.CACert != "" || o.CertFile != "" || o.KeyFile != "") {
		errs = append(errs, errors.New("-insecure, -cacert, -cert and -key only apply with -addr (a started Coordinator gets a generated user)"))
	}
	if (o.MeshAddr == "") != (o.MarbleType == "") {
		errs = append(errs, errors.New("-mesh-addr and -marble-type go together (a started Coordinator gets generated Marble types)"))
	}
	if o.ActivateResume && !o.ActivateReconnect {
		errs = append(errs, errors.New("-activate-resume needs -activate-reconnect (a kept connection has nothing to resume)"))
	}
	if o.ActivateKey != "" && o.ActivateKey != "p384" && o.ActivateKey != "p256" {
		errs = append(errs, fmt.Errorf("-activate-key %q: want p384 (MarbleRun's premain) or p256 (Quarry's runtime)", o.ActivateKey))
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		errs = append(errs, errors.New("-cert and -key go together"))
	}
	if o.Connections < 1 {
		errs = append(errs, errors.New("-c must be at least 1"))
	}
	if o.Duration <= 0 || o.Warmup < 0 || o.Timeout < 0 {
		errs = append(errs, errors.New("-d must be positive, -warmup and -timeout not negative"))
	}
	if o.Runs < 1 {
		errs = append(errs, errors.New("-runs must be at least 1"))
	}
	if o.Secrets < 0 || o.ManifestKB < 0 || o.ManifestKB > 1<<20 {
		errs = append(errs, errors.New("-secrets and -manifest-kb must not be negative (and -manifest-kb at most 1 GiB)"))
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 30 * time.Second
	}
	selected := Scenarios
	switch {
	case o.Scenarios != nil:
	case o.MeshAddr != "" && o.Addr == "":
		selected = []string{ScenarioActivate}
	case o.MeshAddr != "":
		selected = AllScenarios
	}
	if o.Scenarios != nil {
		selected = nil
		for _, s := range o.Scenarios {
			if !slices.Contains(AllScenarios, s) {
				errs = append(errs, fmt.Errorf("unknown scenario %q (known: %s)", s, strings.Join(AllScenarios, ", ")))
			}
		}
		for _, s := range AllScenarios {
			if slices.Contains(o.Scenarios, s) {
				selected = append(selected, s)
			}
		}
		if len(selected) == 0 && len(errs) == 0 {
			errs = append(errs, errors.New("no scenario selected"))
		}
	}
	return selected, errors.Join(errs...)
}

// ErrUsage wraps errors in the options.
var ErrUsage = errors.New("usage")

// Bench runs the selected scenarios and returns the report. An error means
// the benchmark could not be carried out (bad options, a Coordinator that
// does not start or rejects the manifest); errors of the measured requests
// are in the report.
func Bench(ctx context.Context, o Options) (*Report, error) {
	selected, err := o.check()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	b := &bench{o: o, rep: &Report{
		Settings: Settings{
			Connections:     o.Connections,
			DurationSeconds: o.Duration.Seconds(),
			WarmupSeconds:   o.Warmup.Seconds(),
			Protocol:        "HTTP/1.1",
			Runs:            o.Runs,
			Machine:         machine(),
		},
	}}
	if o.HTTP2 {
		b.rep.Settings.Protocol = "HTTP/2"
	}
	if slices.Equal(selected, []string{ScenarioActivate}) {
		b.rep.Settings.Protocol = "gRPC"
	}
	if o.Addr != "" || o.MeshAddr != "" {
		err = b.remote(ctx, selected)
	} else {
		err = b.started(ctx, selected)
	}
	if err != nil {
		return nil, err
	}
	return b.rep, nil
}

type bench struct {
	o   Options
	rep *Report
}

func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.o.Progress, "quarry-bench: "+format+"\n", args...)
}

// skip reports a scenario that cannot run, and why.
func (b *bench) skip(name, why string) {
	b.progress("%s: skipped: %s", name, why)
	b.rep.Scenarios = append(b.rep.Scenarios, ScenarioResult{Name: name, Skipped: why})
}

// remote runs the read scenarios against o.Addr and activate against
// o.MeshAddr.
func (b *bench) remote(ctx context.Context, selected []string) error {
	o := b.o
	b.rep.Target = Target{Addr: o.Addr, MeshAddr: o.MeshAddr}
	b.rep.MemoryNote = "n/a: the Coordinator was not started by quarry-bench"
	base := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: o.Insecure}
	if o.CACert != "" && !o.Insecure {
		pemText, err := os.ReadFile(o.CACert)
		if err != nil {
			return fmt.Errorf("%w: -cacert: %w", ErrUsage, err)
		}
		base.RootCAs = x509.NewCertPool()
		if !base.RootCAs.AppendCertsFromPEM(pemText) {
			return fmt.Errorf("%w: -cacert %s holds no PEM certificate", ErrUsage, o.CACert)
		}
	}
	var userTLS *tls.Config
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return fmt.Errorf("%w: -cert/-key: %w", ErrUsage, err)
		}
		userTLS = base.Clone()
		userTLS.Certificates = []tls.Certificate{cert}
	}
	for _, s := range selected {
		var skip string
		switch {
		case s == ScenarioActivate && o.MeshAddr == "":
			skip = "needs -mesh-addr and -marble-type (the Marble API) with -addr"
		case s == ScenarioActivate:
			if err := b.activate(ctx, s, o.MeshAddr, o.MarbleType, ""); err != nil {
				return err
			}
			continue
		case o.Addr == "":
			skip = "needs -addr (the Client API); -mesh-addr is the Marble API"
		case s == ScenarioUploadConcurrent:
			if err := b.uploadOn(ctx, o.Addr, base); err != nil {
				return err
			}
			continue
		case s == ScenarioSetManifest:
			var err error
			if skip, err = b.setManifestRemote(ctx, o.Addr, base); err != nil {
				return err
			}
			if skip == "" {
				continue
			}
		case s == ScenarioSecrets && userTLS == nil:
			skip = "needs -cert and -key of a user with ReadSecret with -addr"
		case s == ScenarioSecrets && o.Secret == "":
			skip = "needs -secret NAME (a secret the -cert user may read) with -addr"
		}
		if skip != "" {
			b.skip(s, skip)
			continue
		}
		cfg := base
		if s == ScenarioSecrets {
			cfg = userTLS
		}
		if err := b.load(ctx, s, o.Addr, cfg, o.Secret); err != nil {
			return err
		}
	}
	return nil
}

// started starts a Coordinator, sets a generated manifest, runs the read
// scenarios, reads its memory, and times set-manifest on fresh Coordinators.
func (b *bench) started(ctx context.Context, selected []string) error {
	o := b.o
	if !slices.ContainsFunc(selected, func(s string) bool { return s != ScenarioActivate && s != ScenarioUploadConcurrent }) {
		// Only activate and upload, each on Coordinators of their own:
		// no generated manifest.
		b.rep.Target = Target{Started: true, Binary: o.CoordinatorBin}
		b.rep.MemoryNote = "n/a: no read scenario ran"
		if slices.Contains(selected, ScenarioActivate) {
			if err := b.activateStarted(ctx); err != nil {
				return err
			}
		}
		if slices.Contains(selected, ScenarioUploadConcurrent) {
			return b.uploadStarted(ctx)
		}
		return nil
	}
	cert, raw, setBody, info, err := b.generatedManifest()
	if err != nil {
		return err
	}
	b.rep.Manifest = &info
	b.rep.Target = Target{Started: true, Binary: o.CoordinatorBin}
	b.rep.MemoryNote = "n/a: no read scenario ran"
	reads := slices.DeleteFunc(slices.Clone(selected), func(s string) bool {
		return s == ScenarioSetManifest || s == ScenarioActivate || s == ScenarioUploadConcurrent
	})

	if len(reads) > 0 {
		c, err := StartCoordinator(ctx, o.CoordinatorBin, o.Env, o.StartTimeout)
		if err != nil {
			return err
		}
		defer c.Stop()
		b.rep.Target.Addr, b.rep.Target.PID = c.Addr, c.PID()
		b.progress("coordinator %s started: pid %d, https://%s", o.CoordinatorBin, c.PID(), c.Addr)
		if x, _ := b.setManifest(ctx, c.Addr, insecureTLS, setBody, false); x.err != nil || x.status != http.StatusOK {
			return fmt.Errorf("setting the generated manifest (%d bytes): %s", len(raw), describe(x.status, x.msg, x.err))
		}
		b.progress("manifest set: %d bytes, %d shared secrets", info.Bytes, info.Secrets)
		base := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true}
		user := base.Clone()
		user.Certificates = []tls.Certificate{cert}
		secret := cmp.Or(o.Secret, info.ReadableSecret)
		for _, s := range reads {
			if s == ScenarioSecrets && secret == "" {
				b.skip(s, "the generated manifest has no secret (-secrets 0)")
				continue
			}
			cfg := base
			if s == ScenarioSecrets {
				cfg = user
			}
			if err := b.load(ctx, s, c.Addr, cfg, secret); err != nil {
				return err
			}
		}
		if mem, err := c.ResidentMemory(); err != nil {
			b.rep.MemoryNote = "n/a: " + err.Error()
		} else {
			b.rep.Memory, b.rep.MemoryNote = &mem, ""
		}
		c.Stop()
	}

	if slices.Contains(selected, ScenarioActivate) {
		if err := b.activateStarted(ctx); err != nil {
			return err
		}
	}
	if slices.Contains(selected, ScenarioUploadConcurrent) {
		if err := b.uploadStarted(ctx); err != nil {
			return err
		}
	}
	if slices.Contains(selected, ScenarioSetManifest) {
		return b.setManifestRuns(ctx, setBody, info)
	}
	return nil
}

// load runs one read scenario and appends its result.
func (b *bench) load(ctx context.Context, name, addr string, cfg *tls.Config, secret string) error {
	path := map[string]string{
		ScenarioStatus:   v2.PathStatus,
		ScenarioManifest: v2.PathManifest,
		ScenarioQuote:    v2.PathQuote,
		ScenarioSecrets:  v2.PathSecrets + "?s=" + url.QueryEscape(secret),
	}[name]
	b.progress("%s: GET %s, %d connections, %v after %v warm-up", name, path, b.o.Connections, b.o.Duration, b.o.Warmup)
	res, err := Run(ctx, RunConfig{
		Connections: b.o.Connections,
		Duration:    b.o.Duration,
		Warmup:      b.o.Warmup,
		HTTP2:       b.o.HTTP2,
		TLS:         cfg,
		Timeout:     b.o.Timeout,
	}, Request{Method: http.MethodGet, URL: "https://" + addr + path})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	b.rep.Scenarios = append(b.rep.Scenarios, loadResult(name, "GET "+path, res))
	return nil
}

// generatedManifest makes quarry-bench's user and the manifest of the
// options (-secrets, -mix, -manifest-kb) naming it, with the body of
// POST /api/v2/manifest.
func (b *bench) generatedManifest() (user tls.Certificate, raw, body []byte, info ManifestInfo, err error) {
	user, userPEM, err := NewUserCertificate("quarry-bench")
	if err != nil {
		return tls.Certificate{}, nil, nil, ManifestInfo{}, err
	}
	raw, info, err = GenerateManifest(ManifestOptions{
		TargetBytes: int(b.o.ManifestKB * 1024),
		Secrets:     b.o.Secrets,
		Mix:         b.o.Mix,
		UserCertPEM: userPEM,
	})
	if err != nil {
		return tls.Certificate{}, nil, nil, ManifestInfo{}, err
	}
	body, err = SetRequest(raw)
	return user, raw, body, info, err
}

// insecureTLS is the client configuration of the Coordinators quarry-bench
// starts itself (their certificates are new with every start).
var insecureTLS = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true}

// setManifestRuns times POST /api/v2/manifest on o.Runs fresh Coordinators.
func (b *bench) setManifestRuns(ctx context.Context, body []byte, info ManifestInfo) error {
	o := b.o
	return b.timeSetManifest(ctx, o.Runs, info, func(i int) (setOutcome, error) {
		c, err := StartCoordinator(ctx, o.CoordinatorBin, o.Env, o.StartTimeout)
		if err != nil {
			return setOutcome{}, fmt.Errorf("set-manifest run %d: %w", i+1, err)
		}
		defer c.Stop()
		x, _ := b.setManifest(ctx, c.Addr, insecureTLS, body, false)
		return x, nil
	})
}

// setManifestRemote times POST /api/v2/manifest once on the running
// Coordinator at addr: a generated manifest set on a Coordinator waiting
// for its first one, so that scripts can time Coordinators quarry-bench
// does not start (MarbleRun's too), each fresh. A Coordinator in any other
// state is left alone: the scenario is skipped, and the reason returned.
func (b *bench) setManifestRemote(ctx context.Context, addr string, cfg *tls.Config) (skip string, err error) {
	_, _, body, info, err := b.generatedManifest()
	if err != nil {
		return "", err
	}
	x, skip := b.setManifest(ctx, addr, cfg, body, true)
	if skip != "" {
		return skip, nil
	}
	b.rep.Manifest = &info
	return "", b.timeSetManifest(ctx, 1, info, func(int) (setOutcome, error) { return x, nil })
}

// stateAcceptingManifest is the status code of a Coordinator waiting for its
// first manifest (GET /api/v2/status).
const stateAcceptingManifest = 2

// setOutcome is one POST of set-manifest: its wall time, the HTTP status
// and answer, or the transport error.
type setOutcome struct {
	d      time.Duration
	status int
	msg    string
	err    error
}

// timeSetManifest runs set n times and adds the set-manifest result; an
// error of set (not of its POST) ends the scenario.
func (b *bench) timeSetManifest(ctx context.Context, n int, info ManifestInfo, set func(i int) (setOutcome, error)) error {
	r := ScenarioResult{Name: ScenarioSetManifest, Request: "POST " + v2.PathManifest}
	var times []time.Duration
	for i := range n {
		x, err := set(i)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.Requests++
		switch {
		case x.err != nil:
			r.Errors++
		case x.status != http.StatusOK:
			r.Non2xx++
		default:
			times = append(times, x.d)
			r.RunsSeconds = append(r.RunsSeconds, x.d.Seconds())
			b.progress("set-manifest run %d/%d: %d bytes, %d secrets: %v", i+1, n, info.Bytes, info.Secrets, x.d.Round(time.Microsecond))
			continue
		}
		why := describe(x.status, x.msg, x.err)
		if r.FirstError == "" {
			r.FirstError = why
		}
		b.progress("set-manifest run %d/%d: failed: %s", i+1, n, why)
	}
	r.MedianSeconds = Median(times).Seconds()
	r.ErrorRate = errorRate(r.Requests, r.Non2xx, r.Errors)
	b.rep.Scenarios = append(b.rep.Scenarios, r)
	return nil
}

func describe(status int, msg string, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("HTTP %d: %s", status, msg)
}

// setManifest posts body to the Coordinator at addr and returns the wall
// time of the POST alone, from sending to the end of the answer: the
// connection is opened (and checked) before, with GET status. With
// onlyFresh, a Coordinator whose status names another state than one
// waiting for its first manifest gets no POST: skip says why.
func (b *bench) setManifest(ctx context.Context, addr string, cfg *tls.Config, body []byte, onlyFresh bool) (x setOutcome, skip string) {
	t := newTransport(RunConfig{HTTP2: b.o.HTTP2, TLS: cfg}, nil)
	defer t.CloseIdleConnections()
	hc := &http.Client{Transport: t, Timeout: 5 * time.Minute}
	get, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+v2.PathStatus, nil)
	if err != nil {
		return setOutcome{err: err}, ""
	}
	resp, err := hc.Do(get)
	if err != nil {
		return setOutcome{err: err}, ""
	}
	var status struct {
		Data struct {
			Code int `json:"code"`
		} `json:"data"`
	}
	decodeErr := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&status)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || (onlyFresh && decodeErr != nil) {
		return setOutcome{err: fmt.Errorf("GET %s: HTTP %d (%v)", v2.PathStatus, resp.StatusCode, decodeErr)}, ""
	}
	if code := status.Data.Code; onlyFresh && code != stateAcceptingManifest {
		return setOutcome{}, fmt.Sprintf("the Coordinator at -addr is in state %d, not %d (waiting for its first manifest): set-manifest needs a fresh one", code, stateAcceptingManifest)
	}

	post, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+v2.PathManifest, bytes.NewReader(body))
	if err != nil {
		return setOutcome{err: err}, ""
	}
	post.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err = hc.Do(post)
	if err != nil {
		return setOutcome{err: err}, ""
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		return setOutcome{err: err}, ""
	}
	return setOutcome{d: d, status: resp.StatusCode, msg: strings.TrimSpace(string(answer))}, ""
}

// machine describes the CPU the benchmark runs on.
func machine() string {
	desc := fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(info)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				return desc + ", " + strings.TrimSpace(v)
			}
		}
	}
	return desc
}
