// Package config loads the Coordinator's configuration once, from MarbleRun's
// environment variables and matching command-line flags (flags win), applies
// defaults and validates it.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/secrets"
)

// Defaults (docs/design/behaviour.md#configuration).
const (
	DefaultClientAddr       = ":4433"
	DefaultMeshAddr         = ":2001"
	DefaultDNSNames         = "localhost"
	DefaultSealDirName      = "marblerun-coordinator-data"
	DefaultMaxManifestBytes = 8 << 20
	// DefaultMaxStateBytes bounds the sealed state's JSON.
	DefaultMaxStateBytes   = core.DefaultMaxStateBytes
	DefaultRecoveryTimeout = 30 * time.Minute
	DefaultGramineDir      = "/dev/attestation"
	// DefaultMaxSecrets and DefaultMaxSecretGeneration bound the secrets
	// one manifest set or update generates (secrets.DefaultLimits).
	DefaultMaxSecrets          = secrets.DefaultMaxSecrets
	DefaultMaxSecretGeneration = secrets.DefaultMaxWork
	// DefaultActivationEvents is how many Marble activation events are
	// kept in memory.
	DefaultActivationEvents = core.DefaultActivationEvents
	// DefaultMaxCountersPerMarble, DefaultMaxCounterName and
	// DefaultMaxCounters bound the monotonic counters Marbles create
	// (core.DefaultCounterLimits).
	DefaultMaxCountersPerMarble = core.DefaultMaxCountersPerMarble
	DefaultMaxCounterName       = core.DefaultMaxCounterName
	DefaultMaxCounters          = core.DefaultMaxCounters
)

// Upper bounds of the secret generation limits: larger values are surely
// typing mistakes (and no request runs longer than the Client API's request
// deadline anyway).
const (
	maxMaxSecrets          = 1_000_000
	maxMaxSecretGeneration = time.Hour
	// maxActivationEvents bounds the kept activation events: each holds
	// the Marble's quote (about 5 KiB outside simulation), so this is
	// about 500 MiB.
	maxActivationEvents = 100_000
	// maxMaxCounters bounds the counter count limits; maxMaxCounterName is
	// the monotonic counter's request body limit (4 KiB), which no name
	// can pass anyway.
	maxMaxCounters    = 1_000_000
	maxMaxCounterName = 4096
)

// Attestation modes: how the Coordinator obtains its quotes.
const (
	// AttestationSimulation: no quotes (quote null); clients must opt in to
	// trusting the Coordinator.
	AttestationSimulation = "simulation"
	// AttestationGramine: quotes from Gramine's /dev/attestation files.
	AttestationGramine = "gramine"
	// AttestationAuto: Gramine if its attestation type is dcap, else TDX
	// if configfs-tsm has the tdx_guest provider, else simulation.
	AttestationAuto = "auto"
	// AttestationTDX: TDX quotes from the kernel's configfs-tsm report
	// interface inside a TDX guest.
	AttestationTDX = "tdx"
)

// DefaultTSMReportDir is the kernel's configfs-tsm report directory;
// QUARRY_TSM_REPORT_DIR overrides it for tests only.
const DefaultTSMReportDir = "/sys/kernel/config/tsm/report"

// ErrHelp is returned by Load when help was requested; the usage text has
// been written to the output already.
var ErrHelp = flag.ErrHelp

// Config is the whole Coordinator configuration.
type Config struct {
	// ClientAddr is the listen address of the Client API (HTTPS).
	ClientAddr string
	// MeshAddr is the listen address of the Marble API (gRPC over TLS).
	MeshAddr string
	// PrometheusAddr is the plain-HTTP metrics address; empty disables it.
	PrometheusAddr string
	// DNSNames are the names for the certificates' SANs: entries that parse
	// as IP addresses become IP SANs, the rest DNS SANs.
	DNSNames []string
	// SealDir is the directory holding sealed_data and sealed_key.
	SealDir string
	// StartupManifest is a manifest file set at start when no state exists.
	StartupManifest string
	// DebugLogging enables debug-level logs.
	DebugLogging bool
	// DevMode enables human-readable logs.
	DevMode bool
	// HTTPErrorLogLevel is the level of net/http's internal error log.
	HTTPErrorLogLevel slog.Level
	// MaxManifestBytes bounds the body of manifest and update requests.
	MaxManifestBytes int64
	// MaxStateBytes bounds the state (its JSON before sealing): a change
	// beyond it is refused (413 / ResourceExhausted).
	MaxStateBytes int64
	// RecoveryTimeout is how long uploaded recovery shares wait for the
	// rest of their round (0: no expiry).
	RecoveryTimeout time.Duration
	// InsecureSimulatedSealing keeps the simulation sealer (the data key in
	// clear in sealed_key) when the Coordinator runs under Gramine (its
	// attestation directory exists), where it otherwise seals with the
	// enclave's sealing key and refuses to start without Gramine DCAP
	// attestation.
	InsecureSimulatedSealing bool
	// EnableV1Recover serves the unprefixed POST /recover, which carries
	// no signature over the recovery secret (docs/design/decisions.md#d11); off by default.
	EnableV1Recover bool
	// MigrateMarbleRun says whether a MarbleRun sealed_data is migrated:
	// auto (the default: without an enclave only), on (under an enclave
	// too, there only through MarbleRun's signed recovery) or off.
	MigrateMarbleRun core.MarbleRunMigration
	// CheckMigration (flag only) makes the coordinator report what a start
	// would migrate from a MarbleRun seal directory, write nothing, and
	// exit (docs/migration.md).
	CheckMigration bool
	// MaxSecrets is the most secrets a manifest may define (0: no limit).
	MaxSecrets int
	// MaxSecretGeneration is the most estimated single-core time the
	// secrets of one manifest set or update may take to generate (0: no
	// limit).
	MaxSecretGeneration time.Duration
	// ActivationEvents is how many Marble activation events (the latest)
	// are kept in memory; 0 keeps none.
	ActivationEvents int
	// MaxCountersPerMarble, MaxCounterName (bytes) and MaxCounters bound
	// the new monotonic counters of one Marble, their names, and the
	// counters of all Marbles (0: no limit).
	MaxCountersPerMarble int
	MaxCounterName       int
	MaxCounters          int
	// MetricsMarbleUUIDLabel adds MarbleRun's uuid label to the activation
	// counters (one series per Marble instance, without bound).
	MetricsMarbleUUIDLabel bool
	// ReadyInRecovery makes the readiness probes answer 200 in recovery
	// mode (state 1), so that a load balancer keeps routing the recovery
	// requests to the Coordinator.
	ReadyInRecovery bool
	// Console serves the read-only operator console at /console/ on the
	// Client API (docs/console.md).
	Console bool

	// Attestation is AttestationSimulation, AttestationGramine or
	// AttestationAuto. OE_SIMULATION=1 turns auto into simulation.
	Attestation string
	// OESimulation records that OE_SIMULATION=1 was set.
	OESimulation bool
	// GramineDir is Gramine's attestation directory (attestation_type,
	// user_report_data, quote).
	GramineDir string
	// TSMReportDir is the configfs-tsm report directory (TDX); set from
	// QUARRY_TSM_REPORT_DIR for tests only, no flag.
	TSMReportDir string
	// CollateralFile is a DCAP collateral source: a JSON file in dcap-qvl's
	// QuoteCollateralV3 shape, or a directory of PCS/PCCS responses. Empty
	// means none.
	CollateralFile string
	// PCCSURL is a DCAP collateral source: the base URL of a PCCS or of
	// Intel's PCS (API v4). Empty means none.
	PCCSURL string
	// SGXRootCA is a PEM file whose certificate replaces the pinned Intel
	// SGX Root CA in quote verification (tests, private PKIs). Empty means
	// the pinned Intel root.
	SGXRootCA string

	// Store says where the sealed state is kept (store.go).
	Store StoreConfig
	// Client bounds what clients can take of the Client API (client.go).
	Client ClientLimits
	// Mesh are the Marble API's connection limits (mesh.go).
	Mesh MeshConfig
}

// Load reads the configuration: defaults, then the environment (through
// getenv), then the flags in args (without the program name). Help goes to
// out. The result is validated; any error says which setting is wrong.
func Load(getenv func(string) string, args []string, out io.Writer) (Config, error) {
	cwd := getenv("EDG_CWD")
	if cwd == "" {
		cwd = "."
	}
	env := func(name, def string) string {
		if v, ok := lookup(getenv, name); ok {
			return v
		}
		return def
	}

	fs := flag.NewFlagSet("coordinator", flag.ContinueOnError)
	fs.SetOutput(out)
	var (
		c                           Config
		dnsNames, errLevel, maxMan  string
		debug, dev, recTimeout      string
		v1Recover, maxSecrets       string
		maxSecretGen, actEvents     string
		maxState                    string
		maxCtrPerMarble, maxCtrName string
		maxCtrs                     string
		oeSimulation                = getenv("OE_SIMULATION")
	)
	fs.StringVar(&c.ClientAddr, "client-addr", env("EDG_COORDINATOR_CLIENT_ADDR", DefaultClientAddr),
		"listen address of the Client API (HTTPS) [EDG_COORDINATOR_CLIENT_ADDR]")
	fs.StringVar(&c.MeshAddr, "mesh-addr", env("EDG_COORDINATOR_MESH_ADDR", DefaultMeshAddr),
		"listen address of the Marble API (gRPC over TLS), where Marbles are activated [EDG_COORDINATOR_MESH_ADDR]")
	fs.StringVar(&c.PrometheusAddr, "prometheus-addr", env("EDG_COORDINATOR_PROMETHEUS_ADDR", ""),
		"plain-HTTP address for metrics; empty disables them [EDG_COORDINATOR_PROMETHEUS_ADDR]")
	fs.StringVar(&dnsNames, "dns-names", env("EDG_COORDINATOR_DNS_NAMES", DefaultDNSNames),
		"comma-separated DNS names and IP addresses for the Coordinator's certificates [EDG_COORDINATOR_DNS_NAMES]")
	fs.StringVar(&c.SealDir, "seal-dir", env("EDG_COORDINATOR_SEAL_DIR", filepath.Join(cwd, DefaultSealDirName)),
		"directory for the sealed state (sealed_data, sealed_key) [EDG_COORDINATOR_SEAL_DIR; default under EDG_CWD or the working directory]")
	fs.StringVar(&c.StartupManifest, "startup-manifest", env("EDG_STARTUP_MANIFEST", ""),
		"manifest file (JSON) to set at start when no state exists [EDG_STARTUP_MANIFEST]")
	debug = env("EDG_DEBUG_LOGGING", "0")
	fs.Var((*switchFlag)(&debug), "debug",
		"debug logging (--debug, or =1 / =0) [EDG_DEBUG_LOGGING]")
	dev = env("EDG_COORDINATOR_DEV_MODE", "0")
	fs.Var((*switchFlag)(&dev), "dev-mode",
		"development mode: human-readable logs, and a quote failure at start is not fatal (--dev-mode, or =1 / =0) [EDG_COORDINATOR_DEV_MODE]")
	fs.StringVar(&errLevel, "http-error-log-level", env("EDG_HTTP_ERROR_LOG_LEVEL", "error"),
		"level of net/http's internal errors (TLS handshake failures, ...): debug, info, warn or error [EDG_HTTP_ERROR_LOG_LEVEL]")
	fs.StringVar(&maxMan, "max-manifest-size", env("QUARRY_MAX_MANIFEST_SIZE", strconv.Itoa(DefaultMaxManifestBytes)),
		"largest accepted manifest (set, update, acknowledge), in bytes [QUARRY_MAX_MANIFEST_SIZE]")
	fs.StringVar(&maxState, "max-state-size", env("QUARRY_MAX_STATE_SIZE", strconv.Itoa(DefaultMaxStateBytes)),
		"largest state (secrets, manifest, counters, … before sealing), in bytes: a change beyond it is refused with 413 (Marble API: ResourceExhausted) naming this limit (docs/ha.md, \"Limits\") [QUARRY_MAX_STATE_SIZE]")
	fs.StringVar(&recTimeout, "recovery-timeout", env("QUARRY_RECOVERY_TIMEOUT", DefaultRecoveryTimeout.String()),
		"how long uploaded recovery shares wait for the rest of their round, e.g. 30m; 0 disables expiry [QUARRY_RECOVERY_TIMEOUT]")
	simSealing := env("QUARRY_INSECURE_SIMULATED_SEALING", "0")
	fs.Var((*switchFlag)(&simSealing), "insecure-simulated-sealing",
		"under Gramine (wherever --gramine-dir exists), keep the data key in clear in sealed_key instead of sealing it with the enclave's sealing key, and start without Gramine DCAP attestation (simulation, auto with another attestation type, tdx), which otherwise refuses to start (--insecure-simulated-sealing, or =1 / =0). Anyone with the disk then has every secret; for tests only; a warning is logged at every start [QUARRY_INSECURE_SIMULATED_SEALING]")
	fs.BoolVar(&c.CheckMigration, "check-migration", false,
		"dry run: report what a start would migrate from a MarbleRun seal directory (counts of secrets, users, update log entries; whether a recovery is needed), write nothing, and exit: 0 migratable or nothing to migrate, 1 not migratable")
	migrate := env("QUARRY_MIGRATE_MARBLERUN", "auto")
	fs.Var((*switchFlag)(&migrate), "migrate-marblerun",
		"migrate a MarbleRun sealed_data found in the seal directory: auto (the default) migrates without an enclave and never in one; 1 (or the flag alone) migrates in an enclave too, there only after MarbleRun's signed recovery (a raw data key in sealed_key is never taken); 0 never migrates (the state is then unreadable: recovery mode, files untouched) [QUARRY_MIGRATE_MARBLERUN]")
	v1Recover = env("QUARRY_ENABLE_V1_RECOVER", "0")
	fs.Var((*switchFlag)(&v1Recover), "enable-v1-recover",
		"serve the unprefixed v1 POST /recover (--enable-v1-recover, or =1 / =0). Off by default because it carries no signature over the recovery secret, so it does not prove that the uploader holds the recovery key as /api/v2/recover does; enable it only for old clients [QUARRY_ENABLE_V1_RECOVER]")
	fs.StringVar(&maxSecrets, "max-secrets", env("QUARRY_MAX_SECRETS", strconv.Itoa(DefaultMaxSecrets)),
		"most secrets a manifest may define; 0 for no limit [QUARRY_MAX_SECRETS]")
	fs.StringVar(&maxSecretGen, "max-secret-generation", env("QUARRY_MAX_SECRET_GENERATION", DefaultMaxSecretGeneration.String()),
		"most estimated CPU time (one core) that generating the secrets of one manifest set or update may take, e.g. 60s; 0 for no limit [QUARRY_MAX_SECRET_GENERATION]")
	fs.StringVar(&actEvents, "activation-events", env("QUARRY_ACTIVATION_EVENTS", strconv.Itoa(DefaultActivationEvents)),
		"how many Marble activation events (the latest) are kept in memory; each holds the Marble's quote, about 5 KiB outside simulation; 0 keeps none [QUARRY_ACTIVATION_EVENTS]")
	fs.StringVar(&maxCtrPerMarble, "max-counters-per-marble", env("QUARRY_MAX_COUNTERS_PER_MARBLE", strconv.Itoa(DefaultMaxCountersPerMarble)),
		"most monotonic counters one Marble (one Marble type and UUID) may create; counters are never deleted, existing ones can always be raised; 0 for no limit [QUARRY_MAX_COUNTERS_PER_MARBLE]")
	fs.StringVar(&maxCtrName, "max-counter-name", env("QUARRY_MAX_COUNTER_NAME", strconv.Itoa(DefaultMaxCounterName)),
		"longest name of a new monotonic counter, in bytes; 0 for no limit (the request body is at most 4 KiB anyway) [QUARRY_MAX_COUNTER_NAME]")
	fs.StringVar(&maxCtrs, "max-counters", env("QUARRY_MAX_COUNTERS", strconv.Itoa(DefaultMaxCounters)),
		"most monotonic counters of all Marbles together, all kept in the sealed state; 0 for no limit [QUARRY_MAX_COUNTERS]")
	uuidLabel := env("QUARRY_METRICS_MARBLE_UUID_LABEL", "0")
	fs.Var((*switchFlag)(&uuidLabel), "metrics-marble-uuid-label",
		"add MarbleRun's uuid label to coordinator_marble_activations_total and ..._success_total (--metrics-marble-uuid-label, or =1 / =0). Every Marble instance then makes new series without bound; off by default [QUARRY_METRICS_MARBLE_UUID_LABEL]")
	readyInRecovery := env("QUARRY_READY_IN_RECOVERY", "0")
	fs.Var((*switchFlag)(&readyInRecovery), "ready-in-recovery",
		"answer the readiness probes (/readyz, /api/v2/readyz) with 200 in recovery mode too, so that a load balancer keeps sending the recovery requests (--ready-in-recovery, or =1 / =0); off: 503 in recovery mode [QUARRY_READY_IN_RECOVERY]")
	console := env("QUARRY_CONSOLE", "1")
	fs.Var((*switchFlag)(&console), "console",
		"serve the read-only operator console at https://ADDRESS/console/ on the Client API: state, manifest, certificates, update log and activation counts, what the API shows without a client certificate and never a secret value (--console=0 turns it off; then /console/ answers 404) [QUARRY_CONSOLE]")
	fs.StringVar(&c.Attestation, "attestation", env("QUARRY_ATTESTATION", AttestationSimulation),
		"how the Coordinator obtains its quotes: simulation (none: quote null), gramine (/dev/attestation), tdx (configfs-tsm in a TDX guest), or auto (gramine when its attestation type is dcap, else tdx when configfs-tsm has the tdx_guest provider, else simulation); OE_SIMULATION=1 means simulation [QUARRY_ATTESTATION]")
	c.TSMReportDir = env("QUARRY_TSM_REPORT_DIR", DefaultTSMReportDir)
	fs.StringVar(&c.GramineDir, "gramine-dir", env("QUARRY_GRAMINE_ATTESTATION_DIR", DefaultGramineDir),
		"Gramine's attestation directory; where it exists the Coordinator runs in a Gramine enclave and starts only with gramine (DCAP) attestation and sealing, whatever --attestation says (see --insecure-simulated-sealing) [QUARRY_GRAMINE_ATTESTATION_DIR]")
	fs.StringVar(&c.CollateralFile, "collateral-file", env("QUARRY_COLLATERAL_FILE", ""),
		"DCAP collateral for quote verification (sign-quote, Marble activation): a JSON file (dcap-qvl QuoteCollateralV3 shape) or a directory of PCS/PCCS responses [QUARRY_COLLATERAL_FILE]")
	fs.StringVar(&c.PCCSURL, "pccs-url", env("QUARRY_PCCS_URL", ""),
		"DCAP collateral for quote verification (sign-quote, Marble activation) from a PCCS or Intel PCS, e.g. https://pccs.example:8081/sgx/certification/v4/; empty: none [QUARRY_PCCS_URL]")
	fs.StringVar(&c.SGXRootCA, "sgx-root-ca", env("QUARRY_SGX_ROOT_CA", ""),
		"PEM file with a root CA that replaces the pinned Intel SGX Root CA in quote verification (tests, private PKIs) [QUARRY_SGX_ROOT_CA]")
	storeSettings := registerStore(fs, env)
	clientSettings := registerClient(fs, env)
	meshSettings := registerMesh(fs, env)
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: coordinator [flags]\n"+
			"       coordinator backup --seal-dir DIR --out FILE\n"+
			"       coordinator restore --seal-dir DIR --in FILE [--force]\n\n"+
			"Runs the Quarry Coordinator. Every flag can also be set by the environment\n"+
			"variable named in brackets; a flag wins over its variable. 'coordinator backup\n"+
			"--help' and 'coordinator restore --help' describe the two commands.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		if i := len(args) - fs.NArg(); i > 0 && isSwitchValue(fs.Arg(0)) && isSwitch(fs, args[i-1]) {
			return Config{}, fmt.Errorf("unexpected argument %q: %s is a switch, which takes its value with '=' (%s=%s), or alone for 1", fs.Arg(0), args[i-1], args[i-1], fs.Arg(0))
		}
		return Config{}, fmt.Errorf("unexpected argument %q (the coordinator takes flags only)", fs.Arg(0))
	}

	var errs []error
	var err error
	if c.DebugLogging, err = parseBool("debug", "EDG_DEBUG_LOGGING", debug); err != nil {
		errs = append(errs, err)
	}
	if c.DevMode, err = parseBool("dev-mode", "EDG_COORDINATOR_DEV_MODE", dev); err != nil {
		errs = append(errs, err)
	}
	if err := c.HTTPErrorLogLevel.UnmarshalText([]byte(errLevel)); err != nil || !knownLevel(errLevel) {
		errs = append(errs, fmt.Errorf("http-error-log-level [EDG_HTTP_ERROR_LOG_LEVEL]: %q is not one of debug, info, warn, error", errLevel))
	}
	if n, err := strconv.ParseInt(maxMan, 10, 64); err != nil || n < 1024 || n > 1<<30 {
		errs = append(errs, fmt.Errorf("max-manifest-size [QUARRY_MAX_MANIFEST_SIZE]: %q is not a byte count between 1024 and 1073741824", maxMan))
	} else {
		c.MaxManifestBytes = n
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(maxState), 10, 64); err != nil || n < 64<<10 || n > 1<<30 {
		errs = append(errs, fmt.Errorf("max-state-size [QUARRY_MAX_STATE_SIZE]: %q is not a byte count between 65536 and 1073741824", maxState))
	} else {
		c.MaxStateBytes = n
	}
	if d, err := time.ParseDuration(recTimeout); err != nil || d < 0 {
		errs = append(errs, fmt.Errorf("recovery-timeout [QUARRY_RECOVERY_TIMEOUT]: %q is not a duration such as 30m or 0", recTimeout))
	} else {
		c.RecoveryTimeout = d
	}
	if c.EnableV1Recover, err = parseBool("enable-v1-recover", "QUARRY_ENABLE_V1_RECOVER", v1Recover); err != nil {
		errs = append(errs, err)
	}
	if c.MigrateMarbleRun, err = parseMigration(migrate); err != nil {
		errs = append(errs, err)
	}
	if c.InsecureSimulatedSealing, err = parseBool("insecure-simulated-sealing", "QUARRY_INSECURE_SIMULATED_SEALING", simSealing); err != nil {
		errs = append(errs, err)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(maxSecrets)); err != nil || n < 0 || n > maxMaxSecrets {
		errs = append(errs, fmt.Errorf("max-secrets [QUARRY_MAX_SECRETS]: %q is not a count between 0 (no limit) and %d", maxSecrets, maxMaxSecrets))
	} else {
		c.MaxSecrets = n
	}
	if d, err := time.ParseDuration(strings.TrimSpace(maxSecretGen)); err != nil || d < 0 || d > maxMaxSecretGeneration {
		errs = append(errs, fmt.Errorf("max-secret-generation [QUARRY_MAX_SECRET_GENERATION]: %q is not a duration between 0 (no limit) and 1h, such as 60s", maxSecretGen))
	} else {
		c.MaxSecretGeneration = d
	}
	if n, err := strconv.Atoi(strings.TrimSpace(actEvents)); err != nil || n < 0 || n > maxActivationEvents {
		errs = append(errs, fmt.Errorf("activation-events [QUARRY_ACTIVATION_EVENTS]: %q is not a count between 0 (none kept) and %d", actEvents, maxActivationEvents))
	} else {
		c.ActivationEvents = n
	}
	for _, l := range []struct {
		flag, env, v string
		max          int
		dst          *int
	}{
		{"max-counters-per-marble", "QUARRY_MAX_COUNTERS_PER_MARBLE", maxCtrPerMarble, maxMaxCounters, &c.MaxCountersPerMarble},
		{"max-counter-name", "QUARRY_MAX_COUNTER_NAME", maxCtrName, maxMaxCounterName, &c.MaxCounterName},
		{"max-counters", "QUARRY_MAX_COUNTERS", maxCtrs, maxMaxCounters, &c.MaxCounters},
	} {
		if n, err := strconv.Atoi(strings.TrimSpace(l.v)); err != nil || n < 0 || n > l.max {
			errs = append(errs, fmt.Errorf("%s [%s]: %q is not a number between 0 (no limit) and %d", l.flag, l.env, l.v, l.max))
		} else {
			*l.dst = n
		}
	}
	if c.MetricsMarbleUUIDLabel, err = parseBool("metrics-marble-uuid-label", "QUARRY_METRICS_MARBLE_UUID_LABEL", uuidLabel); err != nil {
		errs = append(errs, err)
	}
	if c.ReadyInRecovery, err = parseBool("ready-in-recovery", "QUARRY_READY_IN_RECOVERY", readyInRecovery); err != nil {
		errs = append(errs, err)
	}
	if c.Console, err = parseBool("console", "QUARRY_CONSOLE", console); err != nil {
		errs = append(errs, err)
	}
	if c.OESimulation, err = parseBool("OE_SIMULATION", "OE_SIMULATION", oeSimulation); err != nil {
		errs = append(errs, errors.New(`OE_SIMULATION: `+strconv.Quote(oeSimulation)+` is not 1 or 0`))
	}
	c.Attestation = strings.ToLower(strings.TrimSpace(c.Attestation))
	if c.OESimulation && c.Attestation == AttestationAuto {
		c.Attestation = AttestationSimulation
	}
	for _, n := range strings.Split(dnsNames, ",") {
		c.DNSNames = append(c.DNSNames, strings.TrimSpace(n))
	}
	errs = append(errs, storeSettings.apply(&c)...)
	errs = append(errs, clientSettings.apply(&c)...)
	errs = append(errs, meshSettings.apply(&c)...)
	if err := c.Validate(); err != nil {
		errs = append(errs, err)
	}
	return c, errors.Join(errs...)
}

// Validate checks every setting and reports all problems at once.
func (c Config) Validate() error {
	var errs []error
	check := func(flagName, env, addr string, optional bool) {
		if addr == "" && optional {
			return
		}
		if err := validateAddr(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s [%s]: %w", flagName, env, err))
		}
	}
	check("client-addr", "EDG_COORDINATOR_CLIENT_ADDR", c.ClientAddr, false)
	check("mesh-addr", "EDG_COORDINATOR_MESH_ADDR", c.MeshAddr, false)
	check("prometheus-addr", "EDG_COORDINATOR_PROMETHEUS_ADDR", c.PrometheusAddr, true)
	if len(c.DNSNames) == 0 {
		errs = append(errs, errors.New("dns-names [EDG_COORDINATOR_DNS_NAMES]: at least one name is needed"))
	}
	for _, n := range c.DNSNames {
		if net.ParseIP(n) == nil && !validDNSName(n) {
			errs = append(errs, fmt.Errorf("dns-names [EDG_COORDINATOR_DNS_NAMES]: %q is neither a DNS name nor an IP address", n))
		}
	}
	if c.SealDir == "" {
		errs = append(errs, errors.New("seal-dir [EDG_COORDINATOR_SEAL_DIR]: must not be empty"))
	}
	errs = append(errs, c.validateAttestation()...)
	return errors.Join(errs...)
}

// validateAttestation checks the attestation and quote-verification
// settings; the files named must exist.
func (c Config) validateAttestation() []error {
	var errs []error
	switch c.Attestation {
	case AttestationSimulation, AttestationAuto:
	case AttestationGramine, AttestationTDX:
		if c.OESimulation {
			errs = append(errs, fmt.Errorf("attestation [QUARRY_ATTESTATION]: %s contradicts OE_SIMULATION=1; unset one of them", c.Attestation))
		}
	default:
		errs = append(errs, fmt.Errorf("attestation [QUARRY_ATTESTATION]: %q is not one of simulation, gramine, tdx, auto", c.Attestation))
	}
	if c.Attestation != AttestationSimulation && c.GramineDir == "" {
		errs = append(errs, errors.New("gramine-dir [QUARRY_GRAMINE_ATTESTATION_DIR]: must not be empty"))
	}
	if c.CollateralFile != "" && c.PCCSURL != "" {
		errs = append(errs, errors.New("collateral-file [QUARRY_COLLATERAL_FILE] and pccs-url [QUARRY_PCCS_URL] exclude each other: choose one collateral source"))
	}
	if c.CollateralFile != "" {
		if _, err := os.Stat(c.CollateralFile); err != nil {
			errs = append(errs, fmt.Errorf("collateral-file [QUARRY_COLLATERAL_FILE]: %w", err))
		}
	}
	if c.PCCSURL != "" {
		if u, err := url.Parse(c.PCCSURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			errs = append(errs, fmt.Errorf("pccs-url [QUARRY_PCCS_URL]: %q is not an http(s) base URL such as https://pccs.example:8081/sgx/certification/v4/", c.PCCSURL))
		}
	}
	if c.SGXRootCA != "" {
		if info, err := os.Stat(c.SGXRootCA); err != nil {
			errs = append(errs, fmt.Errorf("sgx-root-ca [QUARRY_SGX_ROOT_CA]: %w", err))
		} else if info.IsDir() {
			errs = append(errs, fmt.Errorf("sgx-root-ca [QUARRY_SGX_ROOT_CA]: %s is a directory, not a PEM file", c.SGXRootCA))
		}
	}
	return errs
}

// SplitNames splits DNSNames into DNS names and IP addresses.
func (c Config) SplitNames() (dns []string, ips []net.IP) {
	for _, n := range c.DNSNames {
		if ip := net.ParseIP(n); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, n)
		}
	}
	return dns, ips
}

func lookup(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

func parseBool(flagName, env, v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true":
		return true, nil
	case "0", "false", "":
		return false, nil
	}
	return false, fmt.Errorf("%s [%s]: %q is not 1 or 0", flagName, env, v)
}

// parseMigration reads --migrate-marblerun: auto (or empty), 1/true, 0/false.
func parseMigration(v string) (core.MarbleRunMigration, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "auto", "":
		return core.MigrateMarbleRunAuto, nil
	case "1", "true":
		return core.MigrateMarbleRunOn, nil
	case "0", "false":
		return core.MigrateMarbleRunOff, nil
	}
	return core.MigrateMarbleRunAuto, fmt.Errorf("migrate-marblerun [QUARRY_MIGRATE_MARBLERUN]: %q is not auto, 1 or 0", v)
}

// switchFlag is an on/off flag that may be given alone (--flag, meaning 1)
// or with a value (--flag=0); the value is checked by parseBool.
type switchFlag string

// isSwitch reports whether arg (-name or --name, without a value) is a
// switch (or boolean flag) of fs.
func isSwitch(fs *flag.FlagSet, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if name == arg || strings.Contains(name, "=") {
		return false
	}
	f := fs.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// isSwitchValue reports whether s looks like the value of a switch.
func isSwitchValue(s string) bool {
	switch strings.ToLower(s) {
	case "0", "1", "true", "false":
		return true
	}
	return false
}

func (f *switchFlag) String() string     { return string(*f) }
func (f *switchFlag) Set(v string) error { *f = switchFlag(v); return nil }
func (f *switchFlag) IsBoolFlag() bool   { return true }

func knownLevel(s string) bool {
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

func validateAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not a host:port address: %w", addr, err)
	}
	if host != "" && net.ParseIP(host) == nil && !validDNSName(host) {
		return fmt.Errorf("%q: bad host %q", addr, host)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || (port != "0" && p == 0) {
		return fmt.Errorf("%q: port %q is not a number between 0 and 65535", addr, port)
	}
	return nil
}

// validDNSName accepts host names made of letters, digits, '-', '_', '.'
// and a leading "*." wildcard label.
func validDNSName(n string) bool {
	n = strings.TrimPrefix(n, "*.")
	if n == "" || len(n) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(n, "."), ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}
