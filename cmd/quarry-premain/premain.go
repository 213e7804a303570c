package main

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/gramine"
	"github.com/quarry-cc/quarry/internal/attest/tsm"
	"github.com/quarry-cc/quarry/marble"
)

// Environment variables (package doc).
const (
	envType        = "EDG_MARBLE_TYPE"
	envCoordinator = "EDG_MARBLE_COORDINATOR_ADDR"
	envDNSNames    = "EDG_MARBLE_DNS_NAMES"
	envUUIDFile    = "EDG_MARBLE_UUID_FILE"
	envAttestation = "QUARRY_ATTESTATION"
	envGramineDir  = "QUARRY_GRAMINE_ATTESTATION_DIR"
	envTSMDir      = "QUARRY_TSM_REPORT_DIR" // configfs-tsm report directory; tests only
	envOESim       = "OE_SIMULATION"
	envAttempts    = "QUARRY_ACTIVATION_ATTEMPTS"
	envRetryDelay  = "QUARRY_ACTIVATION_RETRY_DELAY"
	envRoot        = "QUARRY_COORDINATOR_ROOT"
	envRootSHA256  = "QUARRY_COORDINATOR_ROOT_SHA256"
	envFileRoots   = "QUARRY_FILE_ROOTS"
)

// maxRootFile bounds the PEM file read for QUARRY_COORDINATOR_ROOT; a
// P-384 root certificate in PEM is under 1 KiB.
const maxRootFile = 64 << 10

// Attestation modes, as the Coordinator's.
const (
	attestAuto       = "auto"
	attestGramine    = "gramine"
	attestTDX        = "tdx"
	attestSimulation = "simulation"
)

// Exit statuses.
const (
	exitFailure = 1 // activation failed or refused, program not started
	exitConfig  = 2 // bad configuration
)

// premain is one run of the premain with its process context made
// explicit, so that tests can run it in-process.
type premain struct {
	environ []string // the environment, KEY=VALUE
	args    []string // the premain's own argv
	stderr  io.Writer
	// exec replaces the process (syscall.Exec); it returns only on failure.
	exec func(path string, argv, env []string) error
	// self is the premain's executable, "" if unknown.
	self string
}

// configError is a bad setting; Var names the variable.
type configError struct {
	Var string
	Msg string
}

func (e *configError) Error() string { return e.Var + ": " + e.Msg }

// run activates, applies and execs; it returns the exit status if it does
// not exec (or exec returned without error, as a test's fake does).
func (p premain) run(ctx context.Context) int {
	getenv := lookup(p.environ)
	opts, err := options(getenv)
	if err != nil {
		return p.fail(exitConfig, err)
	}
	issuer, err := p.issuer(getenv)
	if err != nil {
		return p.fail(exitConfig, err)
	}
	opts.Issuer = issuer
	p.warnIgnored()
	if opts.CoordinatorRoot == nil && opts.CoordinatorRootSHA256 == nil {
		fmt.Fprintf(p.stderr, "quarry-premain: the Coordinator is not pinned: whoever answers at %s chooses this Marble's files, environment and program; set %s or %s (docs/trust.md)\n",
			cmp.Or(opts.CoordinatorAddr, marble.DefaultCoordinatorAddr), envRoot, envRootSHA256)
	}

	params, err := marble.Activate(ctx, opts)
	if err != nil {
		return p.fail(exitFailure, err)
	}
	if err := params.WriteFiles(); err != nil {
		return p.fail(exitFailure, err)
	}
	env, err := params.Environ(p.environ)
	if err != nil {
		return p.fail(exitFailure, err)
	}
	argv := params.Args()
	prog, err := p.program(argv[0], lookup(env)("PATH"))
	if err != nil {
		return p.fail(exitFailure, err)
	}
	if err := p.exec(prog, argv, env); err != nil {
		return p.fail(exitFailure, fmt.Errorf("starting %s: %w", prog, err))
	}
	return 0
}

func (p premain) fail(code int, err error) int {
	fmt.Fprintf(p.stderr, "quarry-premain: %v\n", err)
	return code
}

// lookup returns a getenv over environ; the last entry of a name wins, as
// in os.Getenv.
func lookup(environ []string) func(string) string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(k string) string { return m[k] }
}

// options reads the Marble's settings.
func options(getenv func(string) string) (marble.Options, error) {
	o := marble.Options{
		MarbleType:      getenv(envType),
		CoordinatorAddr: getenv(envCoordinator),
		UUIDFile:        getenv(envUUIDFile),
	}
	if o.MarbleType == "" {
		return o, &configError{envType, "not set; it names the Marble in the manifest"}
	}
	for _, n := range strings.Split(getenv(envDNSNames), ",") {
		if n = strings.TrimSpace(n); n != "" {
			o.DNSNames = append(o.DNSNames, n)
		}
	}
	if s := getenv(envAttempts); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return o, &configError{envAttempts, fmt.Sprintf("%q is not a positive number", s)}
		}
		o.Attempts = n
	}
	if s := getenv(envRetryDelay); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return o, &configError{envRetryDelay, fmt.Sprintf("%q is not a positive duration such as 500ms or 2s", s)}
		}
		o.RetryDelay = d
	}
	if err := pinOptions(getenv, &o); err != nil {
		return o, err
	}
	for _, r := range filepath.SplitList(getenv(envFileRoots)) {
		if r == "" {
			continue
		}
		if !filepath.IsAbs(r) {
			return o, &configError{envFileRoots, fmt.Sprintf("%q is not an absolute path; list absolute directories separated by %q", r, string(filepath.ListSeparator))}
		}
		o.FileRoots = append(o.FileRoots, r)
	}
	return o, nil
}

// pinOptions reads the Coordinator's pin: the root certificate from a PEM
// file, or its SHA-256 fingerprint.
func pinOptions(getenv func(string) string, o *marble.Options) error {
	file, sum := getenv(envRoot), getenv(envRootSHA256)
	switch {
	case file != "" && sum != "":
		return &configError{envRoot, fmt.Sprintf("both it and %s are set; set one", envRootSHA256)}
	case sum != "":
		b, err := marble.ParseFingerprint(sum)
		if err != nil {
			return &configError{envRootSHA256, err.Error()}
		}
		o.CoordinatorRootSHA256 = b
	case file != "":
		c, err := readRoot(file)
		if err != nil {
			return &configError{envRoot, err.Error()}
		}
		o.CoordinatorRoot = c
	}
	return nil
}

// readRoot reads the Coordinator root certificate: the one CERTIFICATE PEM
// block of the file.
func readRoot(file string) (*x509.Certificate, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRootFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxRootFile {
		return nil, fmt.Errorf("%s is larger than %d bytes; it must hold the Coordinator root certificate (PEM) alone", file, maxRootFile)
	}
	var certs []*pem.Block
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		if blk.Type == "CERTIFICATE" {
			certs = append(certs, blk)
		}
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("%s holds %d PEM certificates; it must hold the Coordinator root alone (MARBLE_PREDEFINED_COORDINATOR_ROOT_CA, or the last certificate of GET /api/v2/quote)", file, len(certs))
	}
	c, err := x509.ParseCertificate(certs[0].Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := marble.CheckCoordinatorRoot(c); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return c, nil
}

// issuer chooses how the Marble obtains its quote, as the Coordinator
// does: nil means simulation (an empty quote).
func (p premain) issuer(getenv func(string) string) (marble.Issuer, error) {
	mode := getenv(envAttestation)
	if mode == "" {
		mode = attestAuto
	}
	dir := getenv(envGramineDir)
	if dir == "" {
		dir = gramine.DefaultDir
	}
	tsmDir := getenv(envTSMDir)
	if tsmDir == "" {
		tsmDir = tsm.DefaultDir
	}
	var oeSim bool
	switch s := getenv(envOESim); s {
	case "", "0":
	case "1":
		oeSim = true
	default:
		return nil, &configError{envOESim, fmt.Sprintf("%q is not 1 or 0", s)}
	}
	switch mode {
	case attestSimulation:
		return nil, nil
	case attestGramine:
		if oeSim {
			return nil, &configError{envAttestation, "gramine contradicts OE_SIMULATION=1; unset one of them"}
		}
		typ, err := gramine.Detect(dir)
		if err != nil {
			return nil, &configError{envAttestation, fmt.Sprintf("gramine: %v (is the Marble running in Gramine with sgx.remote_attestation = \"dcap\"? %s)", err, envGramineDir)}
		}
		if typ != gramine.TypeDCAP {
			return nil, &configError{envAttestation, fmt.Sprintf("gramine: Gramine's attestation type is %q; DCAP is needed (sgx.remote_attestation = \"dcap\")", typ)}
		}
		return &gramine.Issuer{Dir: dir}, nil
	case attestTDX:
		if oeSim {
			return nil, &configError{envAttestation, "tdx contradicts OE_SIMULATION=1; unset one of them"}
		}
		provider, err := tsm.Detect(tsmDir)
		if err != nil {
			return nil, &configError{envAttestation, fmt.Sprintf("tdx: %v (is the Marble running in a TDX guest with configfs-tsm, Linux 6.7 or later?)", err)}
		}
		if provider != tsm.ProviderTDX {
			return nil, &configError{envAttestation, fmt.Sprintf("tdx: the configfs-tsm provider is %q, not %s", provider, tsm.ProviderTDX)}
		}
		return &tsm.Issuer{Dir: tsmDir}, nil
	case attestAuto:
		if oeSim {
			return nil, nil
		}
		typ, err := gramine.Detect(dir)
		if errors.Is(err, fs.ErrNotExist) {
			if provider, terr := tsm.Detect(tsmDir); terr == nil && provider == tsm.ProviderTDX {
				return &tsm.Issuer{Dir: tsmDir}, nil
			}
		}
		switch {
		case err == nil && typ == gramine.TypeDCAP:
			return &gramine.Issuer{Dir: dir}, nil
		case err == nil:
			fmt.Fprintf(p.stderr, "quarry-premain: Gramine's attestation type is %q, not dcap; activating without a quote (simulation)\n", typ)
			return nil, nil
		case errors.Is(err, fs.ErrNotExist):
			return nil, nil
		default:
			return nil, &configError{envGramineDir, err.Error()}
		}
	default:
		return nil, &configError{envAttestation, fmt.Sprintf("%q is not auto, gramine, tdx or simulation", mode)}
	}
}

// program returns the path to exec (package doc): the premain's own
// argv[0] if it names an existing file other than the premain, else arg0
// (the Marble's Argv[0]), looked up in path if it contains no slash.
func (p premain) program(arg0, path string) (string, error) {
	if len(p.args) > 0 && p.args[0] != "" && executable(p.args[0]) == nil && !p.isSelf(p.args[0]) {
		return p.args[0], nil
	}
	prog, err := lookPath(arg0, path)
	if err != nil {
		return "", err
	}
	if p.isSelf(prog) {
		return "", fmt.Errorf("the Marble's program %s is quarry-premain itself; set Argv in the manifest", prog)
	}
	return prog, nil
}

// isSelf reports whether name is the premain's own executable.
func (p premain) isSelf(name string) bool {
	if p.self == "" {
		return filepath.Base(name) == "quarry-premain"
	}
	a, err := os.Stat(name)
	if err != nil {
		return false
	}
	b, err := os.Stat(p.self)
	return err == nil && os.SameFile(a, b)
}

// lookPath finds name as execvp does: a name with a slash is a path
// (relative to the working directory), any other is searched in the
// directories of path. Empty entries of path are skipped rather than
// meaning the working directory.
func lookPath(name, path string) (string, error) {
	if name == "" {
		return "", errors.New("the Marble's Argv[0] is empty")
	}
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", fmt.Errorf("the Marble's program: %w", err)
		}
		return name, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		if p := filepath.Join(dir, name); executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("the Marble's program %q is not in PATH (%s)", name, path)
}

// executable checks that name is an executable regular file.
func executable(name string) error {
	fi, err := os.Stat(name)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", name)
	}
	return nil
}

// knownMarbleVars are the EDG_MARBLE_* variables the premain reads.
var knownMarbleVars = []string{envType, envCoordinator, envDNSNames, envUUIDFile}

// warnIgnored says on stderr what the premain does not use: its own
// arguments after argv[0] (the program gets the manifest's Argv, as with
// MarbleRun's premain) and EDG_MARBLE_* variables it does not know
// (misspelt ones would otherwise silently fall back to the defaults).
func (p premain) warnIgnored() {
	if len(p.args) > 1 {
		fmt.Fprintf(p.stderr, "quarry-premain: ignoring %d command-line argument(s) %q: the program gets the manifest's Argv (attested), or [%s] if it has none; set Argv in the manifest\n",
			len(p.args)-1, p.args[1:], marble.DefaultArg0)
	}
	for _, kv := range p.environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "EDG_MARBLE_") && !slices.Contains(knownMarbleVars, name) {
			fmt.Fprintf(p.stderr, "quarry-premain: ignoring %s: not one of %s\n", name, strings.Join(knownMarbleVars, ", "))
		}
	}
}
