// Package cli implements the quarry command-line tool: one cobra command per
// Client API operation, built only on the public SDK (client), the manifest
// model and the wire types. cmd/quarry calls Main.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quarry-cc/quarry/client"
)

// Exit codes. Scripts may rely on them.
const (
	ExitOK           = 0 // success
	ExitFailure      = 1 // network or local I/O error, Coordinator failure (HTTP 5xx), unexpected answer
	ExitUsage        = 2 // invalid command, flags or arguments; unreadable or invalid input file
	ExitVerification = 3 // the Coordinator or its data could not be verified (attestation, pinned root, manifest fingerprint or signature)
	ExitNotFound     = 4 // HTTP 404: nothing pending, unknown resource, or endpoint not supported
	ExitRejected     = 5 // HTTP 400, 401, 403, 405, 413: the Coordinator rejected the request
	ExitConflict     = 6 // HTTP 409: wrong Coordinator state, or an update is pending
)

// defaultTimeout bounds a whole command unless --timeout says otherwise.
const defaultTimeout = 2 * time.Minute

// Environment variables that set flags.
const (
	EnvCoordinator    = "QUARRY_COORDINATOR"     // --coordinator
	EnvCollateralFile = "QUARRY_COLLATERAL_FILE" // --collateral-file
	EnvPCCSURL        = "QUARRY_PCCS_URL"        // --pccs-url
	EnvSGXRootCA      = "QUARRY_SGX_ROOT_CA"     // --sgx-root-ca
)

const exitCodeHelp = `Exit codes:
  0  success
  1  network or local I/O error, Coordinator failure (HTTP 5xx)
  2  usage error: invalid command, flags or arguments, unreadable or invalid input file
  3  verification failed: attestation, pinned root certificate, manifest fingerprint or signature
  4  not found (HTTP 404): nothing pending, unknown resource, endpoint not supported
  5  rejected by the Coordinator (HTTP 400, 401, 403, 405, 413)
  6  conflict (HTTP 409): wrong Coordinator state, or an update is pending`

// Params are the process's inputs for Run.
type Params struct {
	Args           []string // without the program name
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// StderrTerminal says that Stderr is a terminal: quarry then shows
	// progress while it waits long for the Coordinator.
	StderrTerminal bool
}

// Main runs quarry with the process environment and returns the exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return Run(ctx, Params{Args: args, Stdin: stdin, Stdout: stdout, Stderr: stderr, Getenv: os.Getenv, StderrTerminal: isTerminal(stderr)})
}

// Run runs quarry and returns the exit code.
func Run(ctx context.Context, p Params) int {
	if p.Getenv == nil {
		p.Getenv = func(string) string { return "" }
	}
	if p.Stdin == nil {
		p.Stdin = strings.NewReader("")
	}
	app := &app{in: p.Stdin, out: p.Stdout, errw: p.Stderr, getenv: p.Getenv, errTerminal: p.StderrTerminal}
	root := app.rootCommand()
	root.SetArgs(p.Args)
	root.SetIn(p.Stdin)
	root.SetOut(p.Stdout)
	root.SetErr(p.Stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	code := exitCode(err)
	app.printError(cmd, err, code)
	return code
}

// app holds the global flags and the process's streams.
type app struct {
	in     io.Reader
	out    io.Writer
	errw   io.Writer
	getenv func(string) string
	// errTerminal: errw is a terminal (progress.go).
	errTerminal bool

	coordinator string
	rootFile    string
	insecure    bool
	certFile    string
	keyFile     string
	output      string // --format: text or json
	outputFlag  string // the root's --output: only a hint that --format replaced it
	timeout     time.Duration

	// MarbleRun's command line (compat.go).
	coordinatorCert string // --coordinator-cert: the cached chain (intermediate, root)
	nonce           string
	saveQuote       string
	namespace       string
	pkcs11          map[string]*string
	// mr is set when the Coordinator address came as the last argument:
	// the command then prints and writes what marblerun does.
	mr bool
	// cmd is the command that runs.
	cmd *cobra.Command

	// Attestation of the Coordinator (when neither --root nor --insecure).
	eraConfig          string
	acceptedTCB        []string
	acceptedAdvisories []string
	collateralFile     string
	pccsURL            string
	sgxRootCA          string
}

// jsonOutput reports whether --format json was given.
func (a *app) jsonOutput() bool { return a.output == "json" }

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "quarry",
		Short: "Command-line client of the Quarry Coordinator",
		Long: `quarry talks to a Quarry (or MarbleRun-compatible) Coordinator over its Client API:
set and verify the manifest, fetch the Coordinator's certificates, read and
upload secrets, update the manifest with several users, and recover a
Coordinator whose sealed state cannot be unsealed.

Address: --coordinator (or QUARRY_COORDINATOR) is host:port, or several
comma-separated addresses of instances of one deployment
(a:4433,b:4433,c:4433). A request that cannot connect to one instance goes
to the next; an answer of an instance (also an error) is final, and a
change (set, apply, acknowledge, cancel, upload) whose connection broke
after it was sent is never sent again: check the state before repeating it.
All instances must present the same root certificate.

MarbleRun's command line: the address may instead be the last argument, as
marblerun takes it ('quarry manifest set manifest.json host:4433 -r rec.json').
quarry then prints and writes what marblerun does (its messages, default files
and the cached certificate of --coordinator-cert) and takes its defaults for
trust; docs/cli.md lists where quarry deliberately differs.

Trust: every command that talks to the Coordinator needs one of
  --root FILE        a root certificate you trust (e.g. saved with 'quarry certificate root'
                     after verifying the Coordinator); the Coordinator must present exactly it;
  --coordinator-cert FILE
                     the same from marblerun's cached chain (intermediate, root); with the
                     address as the last argument its default location is used
                     (` + displayCertCache + `);
  --era-config FILE  verify the Coordinator's SGX or TDX quote (pure-Go DCAP verification)
                     against the expected properties in FILE (MarbleRun's era config: UniqueID,
                     or SignerID with ProductID and SecurityVersion; for a TDX guest MRTD,
                     RTMR0-RTMR3, MRSEAM, MRSIGNERSEAM, TDAttributes, XFAM, MinTEETCBSVN as in
                     a manifest package, MRTD, RTMR1 and RTMR2 required even with Debug
                     (InsecureAllowUnsetRTMR1RTMR2: true lifts RTMR1/RTMR2); Debug;
                     AcceptedTCBStatuses; AcceptedAdvisories), with
                     Intel's collateral from --collateral-file or
                     --pccs-url (default: the pccs_url of ` + qcnlConfPath + `);
                     the quote must be bound to the root and a fresh nonce; with the address
                     as the last argument ./era-config.json is used when it exists;
  -i, --insecure     verify nothing: only for a Coordinator in simulation mode (it has no quote)
                     on a network you trust. Whoever answers at the address is trusted and gets
                     everything sent, a man in the middle included; quarry warns on every use,
                     and 'quarry recover' also needs --expose-recovery-secret.
If --root fails or no quote comes back, do not fall back to --insecure: verify the
Coordinator with --era-config (a Coordinator in recovery mode serves a temporary root,
which its quote covers).

Manifests may be JSON or YAML. YAML is converted once to compact JSON (duplicate
keys are an error); those JSON bytes are what is uploaded and fingerprinted.

` + exitCodeHelp,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.coordinator, "coordinator", a.getenv(EnvCoordinator), "Coordinator Client API address, host:port, or several comma-separated for instances of one deployment (env "+EnvCoordinator+"); or give it as the last argument, as marblerun does")
	pf.StringVar(&a.rootFile, "root", "", "PEM file with the trusted Coordinator root certificate")
	pf.BoolVarP(&a.insecure, "insecure", "i", false, "trust the Coordinator without any verification (simulation mode only): a man in the middle gets everything sent")
	pf.StringVarP(&a.certFile, "cert", "c", "", "PEM file with a manifest user's client certificate")
	pf.StringVarP(&a.keyFile, "key", "k", "", "PEM file with the private key of --cert")
	pf.StringVar(&a.output, "format", "text", "output format: text or json")
	pf.StringVarP(&a.outputFlag, "output", "o", "", "the file to write, on the commands that write one (as in marblerun); for JSON output use --format json")
	_ = pf.MarkHidden("output")
	pf.DurationVar(&a.timeout, "timeout", defaultTimeout, "time limit for the whole command (0: none)")
	pf.StringVar(&a.eraConfig, "era-config", "", "JSON file with the expected properties of the Coordinator's enclave or TDX guest (MarbleRun era config, plus the TD measurements); verifies its SGX or TDX quote")
	pf.StringSliceVar(&a.acceptedTCB, "accepted-tcb-statuses", nil, "TCB statuses accepted besides UpToDate (default: the era config's, else SWHardeningNeeded)")
	pf.StringSliceVar(&a.acceptedAdvisories, "accepted-advisories", nil, "Intel security advisories accepted with SWHardeningNeeded (default: the era config's, else all)")
	pf.StringVar(&a.collateralFile, "collateral-file", a.getenv(EnvCollateralFile), "DCAP collateral for quote verification: a JSON file (dcap-qvl QuoteCollateralV3 shape) or a directory of PCS/PCCS responses (env "+EnvCollateralFile+")")
	pf.StringVar(&a.pccsURL, "pccs-url", a.getenv(EnvPCCSURL), "DCAP collateral for quote verification from a PCCS or Intel PCS, e.g. https://pccs.example:8081/sgx/certification/v4/ (env "+EnvPCCSURL+"; default: the pccs_url of "+qcnlConfPath+")")
	pf.StringVar(&a.sgxRootCA, "sgx-root-ca", a.getenv(EnvSGXRootCA), "PEM file with a root CA that replaces the pinned Intel SGX Root CA (tests and private PKIs only; env "+EnvSGXRootCA+")")
	pf.StringVar(&a.coordinatorCert, "coordinator-cert", "", "PEM file with the Coordinator's chain (intermediate, root) to trust, as marblerun caches it (with the address as the last argument the default is "+displayCertCache+", which 'manifest set' and 'manifest verify' write)")
	pf.StringVar(&a.nonce, "nonce", "", "nonce for the Coordinator's quote, which then covers SHA-256(root ‖ nonce) (default: 32 random bytes)")
	pf.StringVar(&a.saveQuote, "save-sgx-quote", "", "write the Coordinator's quote to this file")
	pf.StringVarP(&a.namespace, "namespace", "n", "", "Kubernetes namespace (marblerun's; quarry ignores it)")
	_ = pf.MarkHidden("namespace")
	a.pkcs11 = map[string]*string{}
	for _, name := range pkcs11Flags {
		a.pkcs11[name] = pf.String(name, "", "not supported: quarry loads keys from PEM files only")
		_ = pf.MarkHidden(name)
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{err}
	})

	root.AddCommand(
		a.statusCommand(),
		a.manifestCommand(),
		a.certificateCommand(),
		a.secretCommand(),
		a.recoverCommand(),
		a.recoverWithSignatureCommand(),
		a.packageInfoCommand(),
		a.versionCommand(),
	)
	a.markRunErrors(root)
	return root
}

// groupCommand returns a command that only holds subcommands.
func groupCommand(use, short string, subs ...*cobra.Command) *cobra.Command {
	g := &cobra.Command{
		Use:   use,
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
			}
			return cmd.Help()
		},
	}
	g.AddCommand(subs...)
	return g
}

// markRunErrors wraps every command's RunE so that errors of the command
// itself can be told from cobra's usage errors, and checks --output and the
// timeout first.
func (a *app) markRunErrors(c *cobra.Command) {
	for _, sub := range c.Commands() {
		a.markRunErrors(sub)
	}
	if c.RunE == nil {
		return
	}
	run := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		a.cmd = cmd
		if a.output != "text" && a.output != "json" {
			return usageError{fmt.Errorf("invalid --format %q: use text or json", a.output)}
		}
		if err := a.checkCompatFlags(cmd); err != nil {
			return err
		}
		ctx := cmd.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		if a.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, a.timeout)
			defer cancel()
			cmd.SetContext(ctx)
		}
		if err := run(cmd, args); err != nil {
			var ue usageError
			if errors.As(err, &ue) {
				return err
			}
			return runError{err}
		}
		return nil
	}
}

// usageError is a mistake in the command line or the input files (exit 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef returns a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// runError is an error returned by a command's own code.
type runError struct{ err error }

func (e runError) Error() string { return e.err.Error() }
func (e runError) Unwrap() error { return e.err }

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	var ue usageError
	var re runError
	switch {
	case errors.As(err, &ue):
		return ExitUsage
	case !errors.As(err, &re):
		return ExitUsage // cobra's own: unknown command, bad flag, wrong number of arguments
	case errors.Is(err, client.ErrVerification):
		return ExitVerification
	}
	if e, ok := client.AsError(err); ok {
		switch {
		case e.HTTPStatus == http.StatusNotFound:
			return ExitNotFound
		case e.HTTPStatus == http.StatusConflict:
			return ExitConflict
		case e.HTTPStatus >= 400 && e.HTTPStatus < 500:
			return ExitRejected
		}
	}
	return ExitFailure
}

// errorJSON is the --format json form of an error, on stderr.
type errorJSON struct {
	Error      string          `json:"error"`
	ExitCode   int             `json:"exitCode"`
	HTTPStatus int             `json:"httpStatus,omitempty"`
	Status     string          `json:"status,omitempty"`
	Message    string          `json:"message,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	Hint       string          `json:"hint,omitempty"`
}

func (a *app) printError(cmd *cobra.Command, err error, code int) {
	hint := hintFor(err)
	if a.jsonOutput() {
		ej := errorJSON{Error: describe(err), ExitCode: code, Hint: hint}
		if e, ok := client.AsError(err); ok {
			ej.HTTPStatus, ej.Status, ej.Message, ej.Data = e.HTTPStatus, e.Status, e.Message, e.Data
		}
		enc := json.NewEncoder(a.errw)
		enc.SetIndent("", "  ")
		_ = enc.Encode(ej)
		return
	}
	fmt.Fprintf(a.errw, "quarry: %s\n", describe(err))
	if hint != "" {
		fmt.Fprintf(a.errw, "hint: %s\n", hint)
	}
	if code == ExitUsage && cmd != nil {
		fmt.Fprintf(a.errw, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
}

// describe renders err; a Coordinator answer is shown with its message and
// HTTP status.
func describe(err error) string {
	e, ok := client.AsError(err)
	if !ok {
		return err.Error()
	}
	text := err.Error()
	// Replace the SDK's rendering of the answer with a friendlier one.
	prefix, _, _ := strings.Cut(text, e.Error())
	status := fmt.Sprintf("HTTP %d %s", e.HTTPStatus, http.StatusText(e.HTTPStatus))
	return fmt.Sprintf("%s%s (%s; %s %s)", prefix, e.Message, status, e.Method, e.Path)
}

// hintFor returns advice for well-known failures.
func hintFor(err error) string {
	switch {
	case errors.Is(err, client.ErrNoQuote):
		return "a Coordinator in an enclave always sends a quote: this one runs in simulation mode, or something between you and it removed the quote; " +
			"verify the Coordinator with --era-config (and --collateral-file or --pccs-url), or pin a root certificate you verified before with --root"
	case errors.Is(err, client.ErrNoQuoteVerifier):
		return "the Coordinator sends an SGX quote: pass --era-config with the expected properties of its enclave and --collateral-file or --pccs-url to verify it, or --root with a root certificate you trust"
	case errors.Is(err, client.ErrTCBNotAccepted):
		return "to accept the platform's TCB status or advisories anyway, list them with --accepted-tcb-statuses / --accepted-advisories (or AcceptedTCBStatuses / AcceptedAdvisories in the era config)"
	case errors.Is(err, client.ErrEnclaveMismatch):
		return "the Coordinator is not the enclave the era config describes; check that the era config matches the Coordinator's version"
	case errors.Is(err, client.ErrRootMismatch):
		return "the server is not the Coordinator whose root you trust, or that Coordinator is in recovery mode and serves a temporary root until it is recovered; " +
			"verify it with --era-config (its quote covers the root it serves) instead of --root"
	case errors.Is(err, client.ErrOutcomeUnknown):
		return "the Coordinator may have applied the change: check its state (quarry status, quarry manifest get, quarry manifest log) before repeating the command"
	case errors.Is(err, client.ErrUnreachable):
		return "check the --coordinator address(es) and that a Coordinator runs there"
	case client.IsUnauthorized(err):
		return "pass --cert and --key with the certificate of a user of the manifest"
	}
	return ""
}
