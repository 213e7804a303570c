// Command quarry-bench measures a Coordinator's Client API: requests per
// second, latency percentiles and errors of GET status, manifest, quote and
// secrets under N concurrent keep-alive HTTPS clients, the wall time of
// setting a manifest with N generated secrets, and the Coordinator's resident
// memory after the load. The activate scenario measures its Marble API:
// activations per second of N concurrent simulated Marbles over gRPC.
//
// By default it starts the Coordinator binary given with -coordinator-bin on
// a free loopback port, sets a generated manifest and runs every default
// scenario; with -addr it runs the read scenarios against a running
// Coordinator, with -mesh-addr and -marble-type the activate scenario.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/quarry-cc/quarry/internal/loadgen"
)

// Exit codes.
const (
	exitOK     = 0
	exitErrors = 1 // a scenario's error rate exceeded -max-error-rate
	exitFailed = 2 // bad usage or the benchmark could not run
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o := loadgen.DefaultOptions()
	for _, k := range []string{"PATH", "HOME", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			o.Env = append(o.Env, k+"="+v)
		}
	}
	fs := flag.NewFlagSet("quarry-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: quarry-bench -coordinator-bin PATH [flags]
       quarry-bench -addr HOST:PORT -insecure [-cert FILE -key FILE -secret NAME] [flags]
       quarry-bench -mesh-addr HOST:PORT -marble-type NAME [flags]

Drives a Coordinator's Client API over HTTPS keep-alive with -c concurrent
clients (one connection each) for -d per scenario and reports requests/s,
latency percentiles and errors; set-manifest is the wall time of
POST /api/v2/manifest on -runs fresh Coordinators (with -addr: once, if
the Coordinator there waits for its first manifest). Scenarios:
  status        GET /api/v2/status
  manifest      GET /api/v2/manifest
  quote         GET /api/v2/quote
  secrets       GET /api/v2/secrets?s=NAME with a user's client certificate
  set-manifest  POST /api/v2/manifest with a generated manifest (-secrets, -mix)
  activate      gRPC /rpc.Marble/Activate from -c simulated Marbles (empty
                quotes), each with its key, certificate and CSR made once,
                activating again and again; not run by default (select it
                with -scenarios, or give -mesh-addr). A started Coordinator
                runs it twice, each on a fresh Coordinator: activate-shared
                (shared secrets only) and activate-cert (per-Marble
                certificate and key)
  upload-concurrent
                POST /api/v2/secrets from -c users at once, each with its
                own client certificate, connection and user-defined secret,
                a new key every time; not run by default. A started
                Coordinator gets the generated manifest; with -addr it must
                be a fresh Coordinator without a manifest (Quarry or
                MarbleRun), and quarry-bench sets it

Exit status: 0 ok, 1 a scenario's error rate exceeded -max-error-rate,
2 bad usage or the benchmark could not run.

Flags:
`)
		fs.PrintDefaults()
	}
	var (
		scenarios     string
		mix           string
		jsonOut       bool
		maxErrorRate  float64
		printManifest string
	)
	fs.StringVar(&o.CoordinatorBin, "coordinator-bin", "", "Coordinator `binary` to start (required unless -addr or -mesh-addr)")
	fs.StringVar(&o.Addr, "addr", "", "use the running Coordinator at `host:port` (read scenarios only)")
	fs.StringVar(&o.MeshAddr, "mesh-addr", "", "activate at the Marble API of a running Coordinator (or MarbleRun) at `host:port`; it must be in simulation mode (the quotes are empty)")
	fs.StringVar(&o.MarbleType, "marble-type", "", "with -mesh-addr: the Marble `type` to activate as")
	fs.BoolVar(&o.ActivateReconnect, "activate-reconnect", false, "activate: a new connection (TLS handshake) for every activation, as real Marbles do, instead of one per Marble")
	fs.StringVar(&o.ActivateKey, "activate-key", "p384", "activate: the curve of each Marble's TLS key: p384 (as MarbleRun's premain makes it) or p256 (as Quarry's runtime, package marble and quarry-premain, makes it)")
	fs.BoolVar(&o.ActivateResume, "activate-resume", false, "with -activate-reconnect: each Marble resumes its TLS session (a returning Marble) instead of a full handshake (a newly started one)")
	fs.BoolVar(&o.Insecure, "insecure", false, "with -addr: do not verify the Coordinator's certificate")
	fs.StringVar(&o.CACert, "cacert", "", "with -addr: trust this PEM root `file` (instead of -insecure)")
	fs.StringVar(&o.CertFile, "cert", "", "with -addr: client certificate PEM `file` of a user for the secrets scenario")
	fs.StringVar(&o.KeyFile, "key", "", "with -addr: its private key PEM `file`")
	fs.StringVar(&o.Secret, "secret", "", "`name` of the secret the secrets scenario reads (default: one of the generated manifest)")
	fs.StringVar(&scenarios, "scenarios", strings.Join(loadgen.Scenarios, ","), "comma-separated `list` of scenarios (also: "+loadgen.ScenarioActivate+"; with only -mesh-addr the default is "+loadgen.ScenarioActivate+")")
	fs.IntVar(&o.Connections, "c", o.Connections, "concurrent clients, one keep-alive connection each (activate: concurrent Marbles)")
	fs.DurationVar(&o.Duration, "d", o.Duration, "measured `duration` of each read scenario and activate run")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "warm-up before each read scenario and activate run, not counted")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "give up on a request after this long (with -http2: on its response headers); 0: no limit")
	fs.BoolVar(&o.HTTP2, "http2", false, "use HTTP/2 instead of HTTP/1.1 (still one connection per client)")
	fs.Float64Var(&o.ManifestKB, "manifest-kb", o.ManifestKB, "size of the generated manifest in KiB (more if the secrets need it)")
	fs.IntVar(&o.Secrets, "secrets", o.Secrets, "shared secrets in the generated manifest")
	fs.StringVar(&mix, "mix", loadgen.DefaultMix.String(), "relative `weights` of the secret types: rsa (cert-rsa 2048), ecdsa (cert-ecdsa P-256), ed25519 (cert-ed25519), symmetric (256-bit key)")
	fs.IntVar(&o.Runs, "runs", o.Runs, "set-manifest runs, each on a fresh Coordinator")
	fs.BoolVar(&jsonOut, "json", false, "write the report as JSON")
	fs.StringVar(&printManifest, "print-manifest", "", "write the activate scenario's manifest of Marble type `TYPE` ("+loadgen.ActivateMarbleShared+" or "+loadgen.ActivateMarbleCert+") to standard output and exit, to set it on a Coordinator that -mesh-addr then drives")
	fs.Float64Var(&maxErrorRate, "max-error-rate", 0, "exit 1 if a scenario's share of failed requests (non-2xx and transport errors) exceeds this `fraction`")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitFailed
	}
	if printManifest != "" {
		if printManifest != loadgen.ActivateMarbleShared && printManifest != loadgen.ActivateMarbleCert {
			fmt.Fprintf(stderr, "quarry-bench: -print-manifest: unknown Marble type %q (%s or %s)\n", printManifest, loadgen.ActivateMarbleShared, loadgen.ActivateMarbleCert)
			return exitFailed
		}
		raw, err := loadgen.ActivateManifest(printManifest == loadgen.ActivateMarbleCert)
		if err == nil {
			_, err = fmt.Fprintf(stdout, "%s\n", raw)
		}
		if err != nil {
			fmt.Fprintf(stderr, "quarry-bench: %v\n", err)
			return exitFailed
		}
		return exitOK
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "quarry-bench: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return exitFailed
	}
	var err error
	if o.Mix, err = loadgen.ParseMix(mix); err != nil {
		fmt.Fprintf(stderr, "quarry-bench: -mix: %v\n", err)
		return exitFailed
	}
	if maxErrorRate < 0 || maxErrorRate > 1 {
		fmt.Fprintln(stderr, "quarry-bench: -max-error-rate must be between 0 and 1")
		return exitFailed
	}
	// Without -scenarios, the default depends on -mesh-addr (loadgen).
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "scenarios" {
			return
		}
		o.Scenarios = []string{}
		for s := range strings.SplitSeq(scenarios, ",") {
			if s = strings.TrimSpace(s); s != "" {
				o.Scenarios = append(o.Scenarios, s)
			}
		}
	})
	o.Progress = stderr

	rep, err := loadgen.Bench(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "quarry-bench: %v\n", err)
		if errors.Is(err, loadgen.ErrUsage) {
			fmt.Fprintln(stderr, "Run 'quarry-bench -h' for the flags.")
		}
		return exitFailed
	}
	if jsonOut {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "quarry-bench: %v\n", err)
		return exitFailed
	}
	if failures := rep.Failures(maxErrorRate); len(failures) > 0 {
		for _, f := range failures {
			fmt.Fprintf(stderr, "quarry-bench: %s\n", f)
		}
		return exitErrors
	}
	return exitOK
}
