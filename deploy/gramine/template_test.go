package gramine_test

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"

	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/core"
)

const (
	templateFile = "coordinator.manifest.template"
	makefile     = "Makefile"
	readmeFile   = "README.md"
	// libosPath stands in for gramine-manifest's gramine.libos (the path of
	// libsysdb.so on a Debian or Ubuntu install).
	libosPath = "/usr/lib/x86_64-linux-gnu/gramine/libsysdb.so"
)

// envKind is how the manifest hands a variable to the Coordinator.
type envKind int

const (
	// absent: the enclave never sees the variable, whatever the host sets.
	absent envKind = iota
	// fixed: the manifest sets the value; it is measured into MRENCLAVE.
	fixed
	// passthrough: the host's value if the host sets it, else unset.
	passthrough
)

type envRule struct {
	kind  envKind
	value string // for fixed
}

// envPolicy is the documented decision for every variable: each variable the
// Coordinator reads must be listed, and loader.env must hold nothing else.
// README.md's table says the same (TestREADMEDocumentsTheEnvironment).
var envPolicy = map[string]envRule{
	// What the Coordinator trusts, proves and where it keeps its state.
	"QUARRY_ATTESTATION":                {fixed, "gramine"},
	"QUARRY_GRAMINE_ATTESTATION_DIR":    {fixed, "/dev/attestation"},
	"QUARRY_INSECURE_SIMULATED_SEALING": {fixed, "0"},
	"EDG_COORDINATOR_SEAL_DIR":          {fixed, "/seal"},
	"EDG_COORDINATOR_DEV_MODE":          {fixed, "0"},
	"QUARRY_ENABLE_V1_RECOVER":          {fixed, "0"},
	"QUARRY_MIGRATE_MARBLERUN":          {fixed, "0"},
	// The Go runtime, sized to the enclave.
	"GOMAXPROCS": {fixed, "8"},
	"GOMEMLIMIT": {fixed, "1536MiB"},
	// Outgoing TLS (the PCCS) trusts the trusted CA file only.
	"SSL_CERT_FILE": {fixed, "/ssl/ca-certificates.crt"},
	"SSL_CERT_DIR":  {fixed, "/ssl"},
	// Network placement, resource bounds, logging, the collateral source.
	"EDG_COORDINATOR_CLIENT_ADDR":            {kind: passthrough},
	"EDG_COORDINATOR_MESH_ADDR":              {kind: passthrough},
	"EDG_COORDINATOR_PROMETHEUS_ADDR":        {kind: passthrough},
	"EDG_COORDINATOR_DNS_NAMES":              {kind: passthrough},
	"EDG_DEBUG_LOGGING":                      {kind: passthrough},
	"EDG_HTTP_ERROR_LOG_LEVEL":               {kind: passthrough},
	"QUARRY_PCCS_URL":                        {kind: passthrough},
	"QUARRY_COLLATERAL_FILE":                 {kind: passthrough},
	"QUARRY_MAX_MANIFEST_SIZE":               {kind: passthrough},
	"QUARRY_RECOVERY_TIMEOUT":                {kind: passthrough},
	"QUARRY_MAX_SECRETS":                     {kind: passthrough},
	"QUARRY_MAX_SECRET_GENERATION":           {kind: passthrough},
	"QUARRY_ACTIVATION_EVENTS":               {kind: passthrough},
	"QUARRY_MAX_COUNTERS_PER_MARBLE":         {kind: passthrough},
	"QUARRY_MAX_COUNTER_NAME":                {kind: passthrough},
	"QUARRY_MAX_COUNTERS":                    {kind: passthrough},
	"QUARRY_MAX_STATE_SIZE":                  {kind: passthrough},
	"QUARRY_CLIENT_MAX_CONNS":                {kind: passthrough},
	"QUARRY_CLIENT_MAX_PER_SOURCE":           {kind: passthrough},
	"QUARRY_CLIENT_MIN_BODY_RATE":            {kind: passthrough},
	"QUARRY_CLIENT_BODY_GRACE":               {kind: passthrough},
	"QUARRY_MESH_MAX_CONNECTIONS":            {kind: passthrough},
	"QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE": {kind: passthrough},
	"QUARRY_METRICS_MARBLE_UUID_LABEL":       {kind: passthrough},
	"QUARRY_READY_IN_RECOVERY":               {kind: passthrough},
	// The console shows only what the Client API shows without a client
	// certificate: the host may turn it off (or on) without harm.
	"QUARRY_CONSOLE": {kind: passthrough},
	// Never from the host.
	"QUARRY_SGX_ROOT_CA":    {kind: absent},
	"QUARRY_TSM_REPORT_DIR": {kind: absent},
	"OE_SIMULATION":         {kind: absent},
	"EDG_CWD":               {kind: absent},
	"EDG_STARTUP_MANIFEST":  {kind: absent},
	// The etcd store: this template builds a single-instance enclave on
	// the file store (an HA build passes these through; docs/ha.md).
	"QUARRY_STORE":                     {kind: absent},
	"QUARRY_ETCD_ENDPOINTS":            {kind: absent},
	"QUARRY_ETCD_PREFIX":               {kind: absent},
	"QUARRY_STORE_TIMEOUT":             {kind: absent},
	"QUARRY_ETCD_COMPACTION":           {kind: absent},
	"QUARRY_ETCD_COMPACTION_RETENTION": {kind: absent},
	"QUARRY_ETCD_CA":                   {kind: absent},
	"QUARRY_ETCD_CERT":                 {kind: absent},
	"QUARRY_ETCD_KEY":                  {kind: absent},
	"QUARRY_INSECURE_PEER_TRUST":       {kind: absent},
	"QUARRY_PEER_ADDR":                 {kind: absent},
	"QUARRY_PEER_ADVERTISE_ADDR":       {kind: absent},
}

// envValue is one loader.env entry: "value", { value = "value" } or
// { passthrough = true }; anything else is kept as Other.
type envValue struct {
	Value       string
	HasValue    bool
	Passthrough bool
	Other       any
}

func (e *envValue) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case string:
		e.Value, e.HasValue = v, true
		return nil
	case map[string]any:
		if s, ok := v["value"].(string); ok && len(v) == 1 {
			e.Value, e.HasValue = s, true
			return nil
		}
		if v["passthrough"] == true && len(v) == 1 {
			e.Passthrough = true
			return nil
		}
	}
	e.Other = v
	return nil
}

func (e envValue) String() string {
	switch {
	case e.HasValue:
		return strconv.Quote(e.Value)
	case e.Passthrough:
		return "{ passthrough = true }"
	}
	return fmt.Sprintf("%v", e.Other)
}

type mount struct {
	Type    string `toml:"type"`
	Path    string `toml:"path"`
	URI     string `toml:"uri"`
	KeyName string `toml:"key_name"`
}

// manifest is the part of Gramine's manifest syntax the template may use.
// Decoding is strict: a key not listed here (a typo, or a new option) fails
// the test until the test checks it too.
type manifest struct {
	Loader struct {
		Entrypoint struct {
			URI    string `toml:"uri"`
			SHA256 string `toml:"sha256"`
		} `toml:"entrypoint"`
		LogLevel               string              `toml:"log_level"`
		Env                    map[string]envValue `toml:"env"`
		EnvSrcFile             string              `toml:"env_src_file"`
		Argv                   []string            `toml:"argv"`
		ArgvSrcFile            string              `toml:"argv_src_file"`
		InsecureUseCmdlineArgv bool                `toml:"insecure__use_cmdline_argv"`
		InsecureUseHostEnv     bool                `toml:"insecure__use_host_env"`
		InsecureDisableASLR    bool                `toml:"insecure__disable_aslr"`
	} `toml:"loader"`
	LibOS struct {
		Entrypoint string `toml:"entrypoint"`
	} `toml:"libos"`
	FS struct {
		Mounts       []mount           `toml:"mounts"`
		Root         *mount            `toml:"root"`
		StartDir     string            `toml:"start_dir"`
		InsecureKeys map[string]string `toml:"insecure__keys"`
	} `toml:"fs"`
	Sys struct {
		InsecureAllowEventfd              bool `toml:"insecure__allow_eventfd"`
		EnableSigtermInjection            bool `toml:"enable_sigterm_injection"`
		ExperimentalEnableFlock           bool `toml:"experimental__enable_flock"`
		EnableExtraRuntimeDomainNamesConf bool `toml:"enable_extra_runtime_domain_names_conf"`
	} `toml:"sys"`
	SGX struct {
		Debug                *bool    `toml:"debug"`
		EDMMEnable           *bool    `toml:"edmm_enable"`
		EnclaveSize          string   `toml:"enclave_size"`
		MaxThreads           int      `toml:"max_threads"`
		RemoteAttestation    string   `toml:"remote_attestation"`
		ISVProdID            *int     `toml:"isvprodid"`
		ISVSVN               *int     `toml:"isvsvn"`
		TrustedFiles         []string `toml:"trusted_files"`
		AllowedFiles         []string `toml:"allowed_files"`
		FileCheckPolicy      string   `toml:"file_check_policy"`
		InsecureRPCThreadNum int      `toml:"insecure__rpc_thread_num"`
		EnableStats          bool     `toml:"enable_stats"`
	} `toml:"sgx"`
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	makeAssign  = regexp.MustCompile(`(?m)^([A-Z_]+)\s*(?::=|\?=|=)[ \t]*(.*?)[ \t]*$`)
	makeRef     = regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	makeDefine  = regexp.MustCompile(`-D([a-z_]+)=(\S+)`)
	jinjaExpr   = regexp.MustCompile(`\{\{-?\s*(.*?)\s*-?\}\}`)
	simpleJinja = regexp.MustCompile(`^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$`)
)

// makefileDefines returns the variables the Makefile hands to
// gramine-manifest (-Dname=value), with the Makefile's own variables in the
// values expanded to their defaults.
func makefileDefines(t *testing.T) map[string]string {
	t.Helper()
	src := readFile(t, makefile)
	vars := map[string]string{}
	for _, m := range makeAssign.FindAllStringSubmatch(src, -1) {
		vars[m[1]] = m[2]
	}
	expand := func(s string) string {
		for range 10 {
			s = makeRef.ReplaceAllStringFunc(s, func(ref string) string {
				if v, ok := vars[makeRef.FindStringSubmatch(ref)[1]]; ok {
					return v
				}
				return ref
			})
		}
		return s
	}
	defines := map[string]string{}
	for _, m := range makeDefine.FindAllStringSubmatch(src, -1) {
		v := expand(m[2])
		if strings.Contains(v, "$(") {
			t.Fatalf("Makefile: -D%s=%s does not expand to a plain value (%q)", m[1], m[2], v)
		}
		defines[m[1]] = v
	}
	if len(defines) == 0 {
		t.Fatal("Makefile: no -Dname=value for gramine-manifest found")
	}
	return defines
}

// templateVars returns the distinct expressions inside {{ }} in the template.
func templateVars(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range jinjaExpr.FindAllStringSubmatch(readFile(t, templateFile), -1) {
		seen[m[1]] = true
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// render does what gramine-manifest does with this template: it replaces
// each {{ name }} with the name's value. The template may use nothing else
// of Jinja (no statements, comments, filters or calls), so the substitution
// is faithful; anything else fails the test.
func render(t *testing.T, vars map[string]string) string {
	t.Helper()
	src := readFile(t, templateFile)
	for _, tok := range []string{"{%", "{#"} {
		if strings.Contains(src, tok) {
			t.Fatalf("%s uses %q: only {{ name }} substitutions are allowed, so that this test renders it faithfully", templateFile, tok)
		}
	}
	out := jinjaExpr.ReplaceAllStringFunc(src, func(expr string) string {
		name := jinjaExpr.FindStringSubmatch(expr)[1]
		if !simpleJinja.MatchString(name) {
			t.Errorf("%s: %q is not a plain variable name", templateFile, expr)
			return expr
		}
		v, ok := vars[name]
		if !ok {
			t.Errorf("%s: %q has no value: the Makefile does not define it with -D%s=", templateFile, expr, name)
			return expr
		}
		return v
	})
	for _, tok := range []string{"{{", "{%", "{#", "}}"} {
		if strings.Contains(out, tok) {
			t.Fatalf("rendered manifest still contains %q", tok)
		}
	}
	return out
}

// renderedManifest renders the template with the Makefile's defaults and
// decodes it strictly.
func renderedManifest(t *testing.T) manifest {
	t.Helper()
	vars := makefileDefines(t)
	vars["gramine.libos"] = libosPath
	var m manifest
	md, err := toml.Decode(render(t, vars), &m)
	if err != nil {
		t.Fatalf("the rendered manifest is not valid TOML (or not of the expected types): %v", err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Fatalf("the rendered manifest has keys this test does not know; add them to the test with a check: %v", u)
	}
	return m
}

// mountOf returns the mount that holds the in-enclave path p (the longest
// mount path that is p or a parent of it).
func mountOf(m manifest, p string) (mount, bool) {
	var best mount
	found := false
	for _, mt := range m.FS.Mounts {
		if (p == mt.Path || strings.HasPrefix(p, strings.TrimSuffix(mt.Path, "/")+"/")) && (!found || len(mt.Path) > len(best.Path)) {
			best, found = mt, true
		}
	}
	return best, found
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// fixedEnv returns the manifest's fixed variables.
func fixedEnv(t *testing.T, m manifest) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, v := range m.Loader.Env {
		if v.HasValue {
			out[name] = v.Value
		}
	}
	return out
}

// gramineSize parses a Gramine size such as "2G" or "512M" into bytes.
func gramineSize(t *testing.T, s string) int64 {
	t.Helper()
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "K"):
		mult = 1 << 10
	case strings.HasSuffix(s, "M"):
		mult = 1 << 20
	case strings.HasSuffix(s, "G"):
		mult = 1 << 30
	}
	if mult != 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil || n <= 0 {
		t.Fatalf("size %q: not a Gramine size", s)
	}
	return n * mult
}

// goMemLimit parses a GOMEMLIMIT value such as "1536MiB" into bytes.
func goMemLimit(t *testing.T, s string) int64 {
	t.Helper()
	units := []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			n, err := strconv.ParseInt(strings.TrimSuffix(s, u.suffix), 10, 64)
			if err == nil && n > 0 {
				return n * u.mult
			}
			break
		}
	}
	t.Fatalf("GOMEMLIMIT %q: not a byte count such as 1536MiB", s)
	return 0
}

func TestManifestAttestsWithDCAP(t *testing.T) {
	m := renderedManifest(t)
	if m.SGX.RemoteAttestation != "dcap" {
		t.Errorf("sgx.remote_attestation = %q, want \"dcap\" (the Coordinator's quotes come from /dev/attestation/quote)", m.SGX.RemoteAttestation)
	}
	if m.SGX.Debug == nil || *m.SGX.Debug {
		t.Error("sgx.debug must be set to false explicitly: a debug enclave can be inspected by the host")
	}
	if m.SGX.EnableStats {
		t.Error("sgx.enable_stats is a debug-only option")
	}
	if m.Loader.LogLevel != "error" {
		t.Errorf("loader.log_level = %q, want \"error\" (other levels may leak enclave data)", m.Loader.LogLevel)
	}
	if m.Loader.Entrypoint.URI != "file:"+libosPath {
		t.Errorf("loader.entrypoint.uri = %q, want \"file:{{ gramine.libos }}\"", m.Loader.Entrypoint.URI)
	}
	if m.Loader.Entrypoint.SHA256 != "" {
		t.Error("loader.entrypoint.sha256 is filled in by gramine-sgx-sign, not by the template")
	}
	if m.SGX.ISVProdID == nil || m.SGX.ISVSVN == nil {
		t.Error("sgx.isvprodid and sgx.isvsvn must be set: clients check them against the era config (ProductID, SecurityVersion)")
	}
}

func TestNothingComesFromTheHostImplicitly(t *testing.T) {
	m := renderedManifest(t)
	l := m.Loader
	if l.InsecureUseHostEnv {
		t.Error("loader.insecure__use_host_env is set: the host would choose every variable")
	}
	if l.InsecureUseCmdlineArgv || l.ArgvSrcFile != "" || l.Argv != nil {
		t.Error("command-line arguments must not be configurable: the Coordinator's flags win over the fixed variables")
	}
	if l.EnvSrcFile != "" {
		t.Error("loader.env_src_file would add variables outside the checked loader.env")
	}
	if l.InsecureDisableASLR {
		t.Error("loader.insecure__disable_aslr is set")
	}
	if m.Sys.InsecureAllowEventfd {
		t.Error("sys.insecure__allow_eventfd hands eventfd to the host; Gramine's in-enclave eventfd serves Go's netpoller")
	}
	if p := m.SGX.FileCheckPolicy; p != "" && p != "strict" {
		t.Errorf("sgx.file_check_policy = %q: only trusted and allowed files may be opened", p)
	}
	if m.SGX.InsecureRPCThreadNum != 0 {
		t.Error("sgx.insecure__rpc_thread_num is set")
	}
	if len(m.FS.InsecureKeys) > 0 {
		t.Error("fs.insecure__keys puts keys in the manifest")
	}
	if m.FS.Root != nil || m.FS.StartDir != "" {
		t.Error("fs.root and fs.start_dir are not expected; the test's mount checks assume Gramine's defaults")
	}
}

func TestMounts(t *testing.T) {
	m := renderedManifest(t)
	var tmpfs bool
	for _, mt := range m.FS.Mounts {
		switch mt.Type {
		case "", "chroot":
		case "tmpfs":
			tmpfs = tmpfs || mt.Path == "/tmp"
		case "encrypted":
			t.Errorf("mount %s is an encrypted mount: the Coordinator seals its state itself (no key may be used twice)", mt.Path)
		default:
			t.Errorf("mount %s has type %q", mt.Path, mt.Type)
		}
		if !path.IsAbs(mt.Path) {
			t.Errorf("mount path %q is not absolute", mt.Path)
		}
	}
	if !tmpfs {
		t.Error("no tmpfs mount at /tmp")
	}

	// The binary: mounted at libos.entrypoint, and a trusted file.
	bin, ok := mountOf(m, m.LibOS.Entrypoint)
	if !ok || bin.Path != m.LibOS.Entrypoint {
		t.Fatalf("libos.entrypoint %q is not a mount of its own", m.LibOS.Entrypoint)
	}
	if !contains(m.SGX.TrustedFiles, bin.URI) {
		t.Errorf("the Coordinator binary %s is not in sgx.trusted_files", bin.URI)
	}

	// Every trusted file is mounted.
	for _, tf := range m.SGX.TrustedFiles {
		var mounted bool
		for _, mt := range m.FS.Mounts {
			mounted = mounted || mt.URI == tf
		}
		if !mounted {
			t.Errorf("trusted file %s is not mounted", tf)
		}
	}

	// Writable host paths: only chroot mounts, as whole directories.
	for _, af := range m.SGX.AllowedFiles {
		var ok bool
		for _, mt := range m.FS.Mounts {
			ok = ok || ((mt.Type == "" || mt.Type == "chroot") && mt.URI+"/" == af)
		}
		if !ok {
			t.Errorf("allowed file %s is not the directory of a chroot mount", af)
		}
		if contains(m.SGX.TrustedFiles, strings.TrimSuffix(af, "/")) {
			t.Errorf("%s is both trusted and allowed", af)
		}
	}
}

func TestSealDirectory(t *testing.T) {
	m := renderedManifest(t)
	dir := fixedEnv(t, m)["EDG_COORDINATOR_SEAL_DIR"]
	if dir == "" {
		t.Fatal("EDG_COORDINATOR_SEAL_DIR is not fixed in loader.env")
	}
	mt, ok := mountOf(m, dir)
	if !ok {
		t.Fatalf("EDG_COORDINATOR_SEAL_DIR %s is not inside a mount: the state would not reach the host's disk", dir)
	}
	if mt.Type != "" && mt.Type != "chroot" {
		t.Errorf("the seal directory's mount %s has type %q, want a plain host directory (chroot)", mt.Path, mt.Type)
	}
	if !contains(m.SGX.AllowedFiles, mt.URI+"/") {
		t.Errorf("the seal directory's host directory %s is not in sgx.allowed_files: the Coordinator could not write its state", mt.URI)
	}
	if !m.Sys.ExperimentalEnableFlock {
		t.Error("sys.experimental__enable_flock is off: the seal directory's lock (flock) would fail and the Coordinator would not start")
	}
}

func TestCollateralAndTLS(t *testing.T) {
	m := renderedManifest(t)
	env := fixedEnv(t, m)
	certFile := env["SSL_CERT_FILE"]
	mt, ok := mountOf(m, certFile)
	if !ok || mt.Path != certFile || !contains(m.SGX.TrustedFiles, mt.URI) {
		t.Errorf("SSL_CERT_FILE %q is not a mounted trusted file", certFile)
	}
	if certDir := env["SSL_CERT_DIR"]; certDir != path.Dir(certFile) {
		t.Errorf("SSL_CERT_DIR = %q, want %q (the directory holding only the trusted CA file)", certDir, path.Dir(certFile))
	} else {
		for _, other := range m.FS.Mounts {
			if strings.HasPrefix(other.Path, certDir+"/") && other.Path != certFile {
				t.Errorf("mount %s lies in SSL_CERT_DIR next to the trusted CA file", other.Path)
			}
		}
	}
	if _, ok := mountOf(m, "/collateral/collateral.json"); !ok {
		t.Error("no mount at /collateral for QUARRY_COLLATERAL_FILE")
	}
}

func TestEnclaveSizeAndThreads(t *testing.T) {
	m := renderedManifest(t)
	env := fixedEnv(t, m)
	if m.SGX.EDMMEnable == nil || *m.SGX.EDMMEnable {
		t.Error("sgx.edmm_enable must be set to false explicitly (README: enclave size)")
	}
	if m.SGX.EnclaveSize == "" {
		t.Fatal("sgx.enclave_size is not set (Gramine's default, 256M, is too small for the Coordinator)")
	}
	size := gramineSize(t, m.SGX.EnclaveSize)
	if size < 1<<30 {
		t.Errorf("sgx.enclave_size %s is below 1G", m.SGX.EnclaveSize)
	}
	if limit := goMemLimit(t, env["GOMEMLIMIT"]); limit > size/4*3 {
		t.Errorf("GOMEMLIMIT %s leaves less than a quarter of the %s enclave to Gramine and the binary", env["GOMEMLIMIT"], m.SGX.EnclaveSize)
	}
	procs, err := strconv.Atoi(env["GOMAXPROCS"])
	if err != nil || procs < 1 {
		t.Fatalf("GOMAXPROCS %q is not fixed to a positive number", env["GOMAXPROCS"])
	}
	// Go runs GOMAXPROCS threads of Go code plus one per goroutine blocked in
	// a system call (up to about as many again when sysmon hands their Ps
	// on), sysmon and a few more; Gramine adds up to three helper threads. A
	// failed clone aborts the Go runtime, so the budget has a wide margin.
	if want := 2*procs + 16; m.SGX.MaxThreads < want {
		t.Errorf("sgx.max_threads = %d, want at least 2×GOMAXPROCS+16 = %d", m.SGX.MaxThreads, want)
	}
}

func TestEnvironmentFollowsThePolicy(t *testing.T) {
	m := renderedManifest(t)
	for name, v := range m.Loader.Env {
		rule, ok := envPolicy[name]
		if !ok {
			t.Errorf("loader.env.%s is not in the documented policy (envPolicy, README.md)", name)
			continue
		}
		switch rule.kind {
		case absent:
			t.Errorf("loader.env.%s must not be set at all", name)
		case fixed:
			if !v.HasValue || v.Value != rule.value {
				t.Errorf("loader.env.%s = %v, want the fixed value %q", name, v, rule.value)
			}
		case passthrough:
			if !v.Passthrough {
				t.Errorf("loader.env.%s = %v, want { passthrough = true }", name, v)
			}
		}
	}
	for name, rule := range envPolicy {
		if _, ok := m.Loader.Env[name]; rule.kind != absent && !ok {
			t.Errorf("loader.env.%s is missing (policy: %s)", name, kindName(rule.kind))
		}
	}
}

func kindName(k envKind) string {
	switch k {
	case fixed:
		return "fixed"
	case passthrough:
		return "passthrough"
	}
	return "not passed"
}

// coordinatorVariables returns every environment variable the Coordinator's
// configuration reads.
func coordinatorVariables(t *testing.T) map[string]bool {
	t.Helper()
	read := map[string]bool{}
	// The error is irrelevant: only the names asked for matter.
	_, _ = config.Load(func(name string) string {
		read[name] = true
		return ""
	}, nil, io.Discard)
	if len(read) == 0 {
		t.Fatal("config.Load read no environment variable")
	}
	return read
}

func TestEveryCoordinatorSettingHasADecision(t *testing.T) {
	read := coordinatorVariables(t)
	for name := range read {
		if _, ok := envPolicy[name]; !ok {
			t.Errorf("the Coordinator reads %s, but the Gramine manifest's policy has no decision for it: fix it, pass it through or leave it out (template, envPolicy, README.md)", name)
		}
	}
	for name := range envPolicy {
		coordinatorVar := strings.HasPrefix(name, "EDG_") || strings.HasPrefix(name, "QUARRY_") || strings.HasPrefix(name, "OE_")
		if coordinatorVar && !read[name] {
			t.Errorf("the policy lists %s, which the Coordinator no longer reads", name)
		}
	}
}

// TestFixedEnvironmentConfiguresGramine feeds the manifest's fixed variables,
// and a PCCS URL as an operator would pass through, to the Coordinator's
// configuration: it must be valid and mean Gramine attestation and sealing.
func TestFixedEnvironmentConfiguresGramine(t *testing.T) {
	m := renderedManifest(t)
	env := fixedEnv(t, m)
	env["QUARRY_PCCS_URL"] = "https://pccs.example:8081/sgx/certification/v4/"
	env["EDG_COORDINATOR_DNS_NAMES"] = "coordinator.example"
	cfg, err := config.Load(func(name string) string { return env[name] }, nil, io.Discard)
	if err != nil {
		t.Fatalf("the manifest's environment is not a valid configuration: %v", err)
	}
	if cfg.Attestation != config.AttestationGramine {
		t.Errorf("attestation %q, want gramine", cfg.Attestation)
	}
	if cfg.GramineDir != "/dev/attestation" {
		t.Errorf("gramine dir %q, want /dev/attestation", cfg.GramineDir)
	}
	if cfg.InsecureSimulatedSealing || cfg.DevMode || cfg.EnableV1Recover || cfg.OESimulation {
		t.Errorf("insecure setting on: simulated sealing %v, dev mode %v, v1 recover %v, OE_SIMULATION %v",
			cfg.InsecureSimulatedSealing, cfg.DevMode, cfg.EnableV1Recover, cfg.OESimulation)
	}
	if cfg.SGXRootCA != "" {
		t.Error("the pinned Intel root is replaced")
	}
	if cfg.MigrateMarbleRun != core.MigrateMarbleRunOff {
		t.Errorf("migrate-marblerun %v, want 0: a MarbleRun state in the host's seal directory may be planted", cfg.MigrateMarbleRun)
	}
	if cfg.SealDir != env["EDG_COORDINATOR_SEAL_DIR"] {
		t.Errorf("seal dir %q, want %q", cfg.SealDir, env["EDG_COORDINATOR_SEAL_DIR"])
	}
}

var readmeRow = regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]*)` \\| (fixed: `([^`]*)`|passthrough|not passed) \\|")

func TestREADMEDocumentsTheEnvironment(t *testing.T) {
	documented := map[string]envRule{}
	for _, m := range readmeRow.FindAllStringSubmatch(readFile(t, readmeFile), -1) {
		r := envRule{kind: absent}
		switch {
		case m[2] == "passthrough":
			r.kind = passthrough
		case strings.HasPrefix(m[2], "fixed"):
			r = envRule{fixed, m[3]}
		}
		documented[m[1]] = r
	}
	for name, want := range envPolicy {
		got, ok := documented[name]
		if !ok {
			t.Errorf("%s: %s has no row in the environment table", readmeFile, name)
		} else if got != want {
			t.Errorf("%s: %s is documented as %s %q, the manifest has %s %q", readmeFile, name, kindName(got.kind), got.value, kindName(want.kind), want.value)
		}
	}
	for name := range documented {
		if _, ok := envPolicy[name]; !ok {
			t.Errorf("%s documents %s, which the policy does not have", readmeFile, name)
		}
	}
}

func TestMakefileDefinesExactlyTheTemplateVariables(t *testing.T) {
	defines := makefileDefines(t)
	for _, name := range templateVars(t) {
		if strings.HasPrefix(name, "gramine.") {
			continue // provided by gramine-manifest itself
		}
		if _, ok := defines[name]; !ok {
			t.Errorf("the template uses {{ %s }}, but the Makefile passes no -D%s=", name, name)
		}
		delete(defines, name)
	}
	for name := range defines {
		t.Errorf("the Makefile passes -D%s=, which the template does not use", name)
	}
}

// TestMakefileCommands checks with make -n (nothing is run) that the
// Makefile builds a static binary from ./cmd/coordinator under the name the
// template mounts, renders this template, signs the manifest gramine-sgx
// looks for, and runs it.
func TestMakefileCommands(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("make is not installed")
		}
		t.Skip("make is not installed")
	}
	entrypoint := makefileDefines(t)["entrypoint"]
	key := t.TempDir() + "/enclave-key.pem"
	out, err := exec.Command("make", "-n", "all", "info", "run", "SGX_SIGNER_KEY="+key, "GO=go").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n: %v\n%s", err, out)
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(strings.ReplaceAll(string(out), "\\\n", " ")), " ")
	for _, want := range []string{
		"CGO_ENABLED=0 go build -trimpath -o " + dir + "/" + entrypoint + " ./cmd/coordinator",
		"gramine-manifest ",
		" " + templateFile + " " + entrypoint + ".manifest",
		"gramine-sgx-gen-private-key " + key,
		"gramine-sgx-sign --key " + key + " --manifest " + entrypoint + ".manifest --output " + entrypoint + ".manifest.sgx",
		"gramine-sgx-sigstruct-view " + entrypoint + ".sig",
		"gramine-sgx " + entrypoint,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("make -n does not run %q; it prints:\n%s", want, out)
		}
	}
}
