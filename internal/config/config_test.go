package config

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaults(t *testing.T) {
	c, err := Load(envOf(nil), nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		ClientAddr:        ":4433",
		MeshAddr:          ":2001",
		DNSNames:          []string{"localhost"},
		SealDir:           filepath.Join(".", "marblerun-coordinator-data"),
		HTTPErrorLogLevel: slog.LevelError,
		MaxManifestBytes:  8 << 20,
		MaxStateBytes:     64 << 20,
		RecoveryTimeout:   30 * time.Minute,
		Attestation:       "simulation",
		GramineDir:        "/dev/attestation",
		TSMReportDir:      DefaultTSMReportDir,

		MaxSecrets:          10_000,
		MaxSecretGeneration: 60 * time.Second,
		ActivationEvents:    10_000,
		Console:             true,

		MaxCountersPerMarble: 64,
		MaxCounterName:       128,
		MaxCounters:          2048,

		Store:  StoreConfig{Kind: "file", EtcdPrefix: "/quarry/", Timeout: DefaultStoreTimeout, Compaction: true, CompactionRetention: DefaultCompactionRetention},
		Client: ClientLimits{MinBodyRate: 4096, BodyGrace: 10 * time.Second},
		Mesh:   MeshConfig{MaxConnections: 256, MaxConnectionsPerSource: 32},
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults = %+v\nwant %+v", c, want)
	}
}

func TestEnvironmentAndFlags(t *testing.T) {
	env := envOf(map[string]string{
		"EDG_COORDINATOR_CLIENT_ADDR": "127.0.0.1:9000",
		"EDG_COORDINATOR_MESH_ADDR":   "127.0.0.1:9001",
		"EDG_COORDINATOR_DNS_NAMES":   "coordinator.example, 10.0.0.1",
		"EDG_CWD":                     "/srv",
		"EDG_DEBUG_LOGGING":           "1",
		"EDG_HTTP_ERROR_LOG_LEVEL":    "warn",
		"EDG_STARTUP_MANIFEST":        "/m.json",
		"QUARRY_MAX_MANIFEST_SIZE":    "4096",
		"QUARRY_MAX_STATE_SIZE":       "2097152",
	})
	c, err := Load(env, []string{"--mesh-addr", "127.0.0.1:9999"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.ClientAddr != "127.0.0.1:9000" || c.MeshAddr != "127.0.0.1:9999" {
		t.Errorf("addresses = %q %q (flag must win over env)", c.ClientAddr, c.MeshAddr)
	}
	if c.SealDir != "/srv/marblerun-coordinator-data" {
		t.Errorf("seal dir under EDG_CWD = %q", c.SealDir)
	}
	if !c.DebugLogging || c.HTTPErrorLogLevel != slog.LevelWarn || c.StartupManifest != "/m.json" || c.MaxManifestBytes != 4096 || c.MaxStateBytes != 2<<20 {
		t.Errorf("config = %+v", c)
	}
	dns, ips := c.SplitNames()
	if !reflect.DeepEqual(dns, []string{"coordinator.example"}) || len(ips) != 1 || ips[0].String() != "10.0.0.1" {
		t.Errorf("SplitNames = %v %v", dns, ips)
	}
}

func TestInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"bad client addr", map[string]string{"EDG_COORDINATOR_CLIENT_ADDR": "4433"}, nil, "client-addr [EDG_COORDINATOR_CLIENT_ADDR]"},
		{"bad port", nil, []string{"--mesh-addr", ":99999"}, "mesh-addr"},
		{"bad prometheus", map[string]string{"EDG_COORDINATOR_PROMETHEUS_ADDR": "x"}, nil, "prometheus-addr"},
		{"bad dns name", map[string]string{"EDG_COORDINATOR_DNS_NAMES": "ok,bad name"}, nil, `"bad name" is neither`},
		{"empty dns entry", map[string]string{"EDG_COORDINATOR_DNS_NAMES": "a,,b"}, nil, `"" is neither`},
		{"bad bool", map[string]string{"EDG_DEBUG_LOGGING": "yes"}, nil, "debug [EDG_DEBUG_LOGGING]"},
		{"bad level", map[string]string{"EDG_HTTP_ERROR_LOG_LEVEL": "loud"}, nil, "http-error-log-level"},
		{"bad timeout", map[string]string{"QUARRY_RECOVERY_TIMEOUT": "soon"}, nil, "recovery-timeout"},
		{"bad size", nil, []string{"--max-manifest-size", "12"}, "max-manifest-size"},
		{"state size too small", nil, []string{"--max-state-size", "1000"}, "max-state-size [QUARRY_MAX_STATE_SIZE]: \"1000\" is not a byte count between 65536"},
		{"state size not a number", map[string]string{"QUARRY_MAX_STATE_SIZE": "64MiB"}, nil, "max-state-size [QUARRY_MAX_STATE_SIZE]"},
		{"bad attestation", map[string]string{"QUARRY_ATTESTATION": "sgx"}, nil, `attestation [QUARRY_ATTESTATION]: "sgx" is not one of`},
		{"gramine with OE_SIMULATION", map[string]string{"OE_SIMULATION": "1"}, []string{"--attestation", "gramine"}, "contradicts OE_SIMULATION=1"},
		{"bad OE_SIMULATION", map[string]string{"OE_SIMULATION": "yes"}, nil, "OE_SIMULATION"},
		{"empty gramine dir", nil, []string{"--attestation", "auto", "--gramine-dir", ""}, "gramine-dir [QUARRY_GRAMINE_ATTESTATION_DIR]"},
		{"missing collateral file", map[string]string{"QUARRY_COLLATERAL_FILE": "/nonexistent/collateral.json"}, nil, "collateral-file [QUARRY_COLLATERAL_FILE]"},
		{"two collateral sources", nil, []string{"--collateral-file", ".", "--pccs-url", "https://pccs.example/sgx/certification/v4/"}, "exclude each other"},
		{"bad pccs url", map[string]string{"QUARRY_PCCS_URL": "pccs.example"}, nil, "pccs-url [QUARRY_PCCS_URL]"},
		{"pccs url with query", nil, []string{"--pccs-url", "https://pccs.example/?x=1"}, "pccs-url"},
		{"missing root", nil, []string{"--sgx-root-ca", "/nonexistent/root.pem"}, "sgx-root-ca [QUARRY_SGX_ROOT_CA]"},
		{"root is a directory", nil, []string{"--sgx-root-ca", "."}, "is a directory"},
		{"bad v1 recover switch", map[string]string{"QUARRY_ENABLE_V1_RECOVER": "on"}, nil, "enable-v1-recover [QUARRY_ENABLE_V1_RECOVER]"},
		{"bad max secrets", map[string]string{"QUARRY_MAX_SECRETS": "many"}, nil, "max-secrets [QUARRY_MAX_SECRETS]"},
		{"negative max secrets", nil, []string{"--max-secrets", "-1"}, "max-secrets [QUARRY_MAX_SECRETS]"},
		{"huge max secrets", nil, []string{"--max-secrets", "1000001"}, "max-secrets [QUARRY_MAX_SECRETS]"},
		{"bad max secret generation", map[string]string{"QUARRY_MAX_SECRET_GENERATION": "60"}, nil, "max-secret-generation [QUARRY_MAX_SECRET_GENERATION]"},
		{"negative max secret generation", nil, []string{"--max-secret-generation", "-1s"}, "max-secret-generation"},
		{"huge max secret generation", nil, []string{"--max-secret-generation", "2h"}, "max-secret-generation"},
		{"bad activation events", map[string]string{"QUARRY_ACTIVATION_EVENTS": "lots"}, nil, "activation-events [QUARRY_ACTIVATION_EVENTS]"},
		{"bad console switch", map[string]string{"QUARRY_CONSOLE": "maybe"}, nil, "console [QUARRY_CONSOLE]"},
		{"negative activation events", nil, []string{"--activation-events", "-1"}, "activation-events [QUARRY_ACTIVATION_EVENTS]"},
		{"huge activation events", nil, []string{"--activation-events", "100001"}, "activation-events [QUARRY_ACTIVATION_EVENTS]"},
		{"bad max counters per marble", map[string]string{"QUARRY_MAX_COUNTERS_PER_MARBLE": "some"}, nil, "max-counters-per-marble [QUARRY_MAX_COUNTERS_PER_MARBLE]"},
		{"negative max counters per marble", nil, []string{"--max-counters-per-marble", "-1"}, "max-counters-per-marble [QUARRY_MAX_COUNTERS_PER_MARBLE]"},
		{"huge max counters per marble", nil, []string{"--max-counters-per-marble", "1000001"}, "max-counters-per-marble"},
		{"bad max counter name", map[string]string{"QUARRY_MAX_COUNTER_NAME": "1k"}, nil, "max-counter-name [QUARRY_MAX_COUNTER_NAME]"},
		{"max counter name past the body limit", nil, []string{"--max-counter-name", "4097"}, "between 0 (no limit) and 4096"},
		{"bad max counters", map[string]string{"QUARRY_MAX_COUNTERS": "-5"}, nil, "max-counters [QUARRY_MAX_COUNTERS]"},
		{"huge max counters", nil, []string{"--max-counters", "1000001"}, "max-counters [QUARRY_MAX_COUNTERS]"},
		{"unknown flag", nil, []string{"--nope"}, "flag provided but not defined"},
		{"argument", nil, []string{"extra"}, "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestAttestationSettings(t *testing.T) {
	dir := t.TempDir()
	col := filepath.Join(dir, "collateral.json")
	root := filepath.Join(dir, "root.pem")
	for _, f := range []string{col, root} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want func(Config) bool
	}{
		{"environment", map[string]string{
			"QUARRY_ATTESTATION":             "Gramine",
			"QUARRY_GRAMINE_ATTESTATION_DIR": "/fake/attestation",
			"QUARRY_COLLATERAL_FILE":         col,
			"QUARRY_SGX_ROOT_CA":             root,
		}, nil, func(c Config) bool {
			return c.Attestation == "gramine" && c.GramineDir == "/fake/attestation" && c.CollateralFile == col && c.SGXRootCA == root && c.PCCSURL == ""
		}},
		{"flags win", map[string]string{"QUARRY_ATTESTATION": "gramine", "QUARRY_COLLATERAL_FILE": col},
			[]string{"--attestation", "auto", "--collateral-file", "", "--pccs-url", "https://pccs.example:8081/sgx/certification/v4/"},
			func(c Config) bool {
				return c.Attestation == "auto" && c.CollateralFile == "" && c.PCCSURL == "https://pccs.example:8081/sgx/certification/v4/"
			}},
		{"collateral directory", nil, []string{"--collateral-file", dir}, func(c Config) bool { return c.CollateralFile == dir }},
		{"OE_SIMULATION turns auto into simulation", map[string]string{"OE_SIMULATION": "1", "QUARRY_ATTESTATION": "auto"}, nil,
			func(c Config) bool { return c.Attestation == "simulation" && c.OESimulation }},
		{"OE_SIMULATION=0", map[string]string{"OE_SIMULATION": "0", "QUARRY_ATTESTATION": "auto"}, nil,
			func(c Config) bool { return c.Attestation == "auto" && !c.OESimulation }},
		{"simulation with OE_SIMULATION", map[string]string{"OE_SIMULATION": "1"}, nil,
			func(c Config) bool { return c.Attestation == "simulation" && c.OESimulation }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(c) {
				t.Fatalf("config = %+v", c)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := Load(envOf(nil), []string{"--help"}, &out)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("err = %v, want ErrHelp", err)
	}
	for _, want := range []string{"EDG_COORDINATOR_CLIENT_ADDR", "EDG_COORDINATOR_MESH_ADDR", "EDG_COORDINATOR_DNS_NAMES",
		"EDG_COORDINATOR_SEAL_DIR", "EDG_DEBUG_LOGGING", "EDG_STARTUP_MANIFEST", "-client-addr", "-seal-dir",
		"QUARRY_ATTESTATION", "QUARRY_GRAMINE_ATTESTATION_DIR", "QUARRY_COLLATERAL_FILE", "QUARRY_PCCS_URL", "QUARRY_SGX_ROOT_CA",
		"-collateral-file", "-pccs-url", "-sgx-root-ca", "-attestation", "-gramine-dir",
		"-enable-v1-recover", "QUARRY_ENABLE_V1_RECOVER", "carries no signature",
		"-max-secrets", "QUARRY_MAX_SECRETS", "-max-secret-generation", "QUARRY_MAX_SECRET_GENERATION",
		"-activation-events", "QUARRY_ACTIVATION_EVENTS", "where Marbles are activated",
		"-max-counters-per-marble", "QUARRY_MAX_COUNTERS_PER_MARBLE", "-max-counter-name", "QUARRY_MAX_COUNTER_NAME",
		"-max-counters", "QUARRY_MAX_COUNTERS", "never deleted", "-console", "QUARRY_CONSOLE"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help does not mention %s", want)
		}
	}
}

func TestHardeningSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want func(Config) bool
	}{
		{"v1 recover off by default", nil, nil, func(c Config) bool { return !c.EnableV1Recover }},
		{"console on by default", nil, nil, func(c Config) bool { return c.Console }},
		{"console off from the environment", map[string]string{"QUARRY_CONSOLE": "0"}, nil, func(c Config) bool { return !c.Console }},
		{"console flag wins", map[string]string{"QUARRY_CONSOLE": "0"}, []string{"--console"}, func(c Config) bool { return c.Console }},
		{"console flag off", nil, []string{"--console=false"}, func(c Config) bool { return !c.Console }},
		{"v1 recover from the environment", map[string]string{"QUARRY_ENABLE_V1_RECOVER": "1"}, nil, func(c Config) bool { return c.EnableV1Recover }},
		{"v1 recover flag wins", map[string]string{"QUARRY_ENABLE_V1_RECOVER": "1"}, []string{"--enable-v1-recover=0"}, func(c Config) bool { return !c.EnableV1Recover }},
		{"v1 recover flag alone", nil, []string{"--enable-v1-recover"}, func(c Config) bool { return c.EnableV1Recover }},
		{"secret limits", map[string]string{"QUARRY_MAX_SECRETS": "50", "QUARRY_MAX_SECRET_GENERATION": "90s"}, nil,
			func(c Config) bool { return c.MaxSecrets == 50 && c.MaxSecretGeneration == 90*time.Second }},
		{"no secret limits", nil, []string{"--max-secrets", "0", "--max-secret-generation", "0"},
			func(c Config) bool { return c.MaxSecrets == 0 && c.MaxSecretGeneration == 0 }},
		{"activation events from the environment", map[string]string{"QUARRY_ACTIVATION_EVENTS": "500"}, nil,
			func(c Config) bool { return c.ActivationEvents == 500 }},
		{"activation events flag wins", map[string]string{"QUARRY_ACTIVATION_EVENTS": "500"}, []string{"--activation-events", "0"},
			func(c Config) bool { return c.ActivationEvents == 0 }},
		{"largest activation events", nil, []string{"--activation-events", "100000"},
			func(c Config) bool { return c.ActivationEvents == 100_000 }},
		{"counter limits from the environment", map[string]string{"QUARRY_MAX_COUNTERS_PER_MARBLE": "5", "QUARRY_MAX_COUNTER_NAME": "16", "QUARRY_MAX_COUNTERS": "50"}, nil,
			func(c Config) bool {
				return c.MaxCountersPerMarble == 5 && c.MaxCounterName == 16 && c.MaxCounters == 50
			}},
		{"counter limit flags win, 0 is no limit", map[string]string{"QUARRY_MAX_COUNTERS_PER_MARBLE": "5", "QUARRY_MAX_COUNTER_NAME": "16", "QUARRY_MAX_COUNTERS": "50"},
			[]string{"--max-counters-per-marble", "0", "--max-counter-name", "4096", "--max-counters", "0"},
			func(c Config) bool {
				return c.MaxCountersPerMarble == 0 && c.MaxCounterName == 4096 && c.MaxCounters == 0
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.want(c) {
				t.Fatalf("config = %+v", c)
			}
		})
	}
}

func TestMigrateMarbleRunSetting(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want core.MarbleRunMigration
	}{
		{"auto by default", nil, nil, core.MigrateMarbleRunAuto},
		{"auto named", map[string]string{"QUARRY_MIGRATE_MARBLERUN": "auto"}, nil, core.MigrateMarbleRunAuto},
		{"on from the environment", map[string]string{"QUARRY_MIGRATE_MARBLERUN": "1"}, nil, core.MigrateMarbleRunOn},
		{"off from the environment", map[string]string{"QUARRY_MIGRATE_MARBLERUN": "0"}, nil, core.MigrateMarbleRunOff},
		{"true and false", map[string]string{"QUARRY_MIGRATE_MARBLERUN": "false"}, nil, core.MigrateMarbleRunOff},
		{"flag alone", nil, []string{"--migrate-marblerun"}, core.MigrateMarbleRunOn},
		{"flag wins", map[string]string{"QUARRY_MIGRATE_MARBLERUN": "1"}, []string{"--migrate-marblerun=0"}, core.MigrateMarbleRunOff},
		{"flag back to auto", map[string]string{"QUARRY_MIGRATE_MARBLERUN": "0"}, []string{"--migrate-marblerun=auto"}, core.MigrateMarbleRunAuto},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if c.MigrateMarbleRun != tc.want {
				t.Fatalf("migrate-marblerun = %v, want %v", c.MigrateMarbleRun, tc.want)
			}
		})
	}
	_, err := Load(envOf(map[string]string{"QUARRY_MIGRATE_MARBLERUN": "yes"}), nil, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "migrate-marblerun [QUARRY_MIGRATE_MARBLERUN]") || !strings.Contains(err.Error(), `"yes"`) {
		t.Fatalf("a bad value: %v", err)
	}
	var help bytes.Buffer
	Load(envOf(nil), []string{"--help"}, &help)
	for _, want := range []string{"-migrate-marblerun", "QUARRY_MIGRATE_MARBLERUN", "signed recovery", "never in one"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("help does not mention %q", want)
		}
	}
}

// TestDebugAndDevModeAreSwitches: --debug and --dev-mode are switches like
// the others: alone they mean 1 and do not take the next argument as their
// value; =0 and =1 work; the variables still set them; a value after a
// space is refused, saying how to write it.
func TestDebugAndDevModeAreSwitches(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		env        map[string]string
		debug, dev bool
	}{
		{[]string{"--dev-mode"}, nil, false, true},
		{[]string{"--debug", "--client-addr", "127.0.0.1:9000"}, nil, true, false},
		{[]string{"--debug", "--dev-mode", "--mesh-addr", "127.0.0.1:9001"}, nil, true, true},
		{[]string{"--debug=1", "--dev-mode=true"}, nil, true, true},
		{[]string{"--debug=0"}, map[string]string{"EDG_DEBUG_LOGGING": "1"}, false, false},
		{nil, map[string]string{"EDG_DEBUG_LOGGING": "1", "EDG_COORDINATOR_DEV_MODE": "1"}, true, true},
		{[]string{"-debug"}, nil, true, false},
	} {
		c, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if c.DebugLogging != tc.debug || c.DevMode != tc.dev {
			t.Errorf("%q %v: debug %v dev %v, want %v %v", tc.args, tc.env, c.DebugLogging, c.DevMode, tc.debug, tc.dev)
		}
		if len(tc.args) > 1 && tc.args[1] == "--client-addr" && c.ClientAddr != "127.0.0.1:9000" {
			t.Errorf("%q: the flag after --debug was swallowed: client addr %q", tc.args, c.ClientAddr)
		}
		if len(tc.args) > 2 && tc.args[2] == "--mesh-addr" && c.MeshAddr != "127.0.0.1:9001" {
			t.Errorf("%q: mesh addr %q", tc.args, c.MeshAddr)
		}
	}
	for _, args := range [][]string{{"--dev-mode", "1"}, {"--debug", "0"}} {
		_, err := Load(envOf(nil), args, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "takes its value with '='") || !strings.Contains(err.Error(), args[0]+"="+args[1]) {
			t.Errorf("%q: %v, want an error showing %s=%s", args, err, args[0], args[1])
		}
	}
	if _, err := Load(envOf(nil), []string{"--debug=yes"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "debug [EDG_DEBUG_LOGGING]") {
		t.Errorf("--debug=yes: %v", err)
	}
}
