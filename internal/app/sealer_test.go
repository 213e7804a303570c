package app

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/gramine"
	"github.com/quarry-cc/quarry/internal/attest/tsm"
	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/seal"
)

// gramineWithKeys is a fake Gramine attestation directory of the given
// type with both sealing keys.
func gramineWithKeys(t *testing.T, typ string) string {
	t.Helper()
	dir := gramineDir(t, typ)
	if err := os.Mkdir(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{seal.GramineMRSignerKey, seal.GramineMREnclaveKey} {
		if err := os.WriteFile(filepath.Join(dir, name), bytes.Repeat([]byte{1}, 16), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestKeySealerFailsClosedUnderGramine: wherever Gramine's attestation
// directory exists, only Gramine DCAP attestation with the enclave's
// sealing keys starts; simulation, auto with another attestation type and
// tdx are refused naming what to set, unless the insecure override is set
// (then a warning). Without the directory: simulation, as before.
func TestKeySealerFailsClosedUnderGramine(t *testing.T) {
	absent := filepath.Join(t.TempDir(), "absent")
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		cfg      config.Config
		override bool
		issuer   func(dir string) attest.Issuer
		// want: "gramine", "simulation", or a refusal's words.
		want []string
		warn string
	}{
		{name: "no directory, simulation", cfg: config.Config{Attestation: config.AttestationSimulation, GramineDir: absent},
			want: []string{"simulation"}, warn: "sealing in simulation mode"},
		{name: "no directory, auto", cfg: config.Config{Attestation: config.AttestationAuto, GramineDir: absent},
			want: []string{"simulation"}, warn: "sealing in simulation mode"},
		{name: "no directory, tdx", cfg: config.Config{Attestation: config.AttestationTDX, GramineDir: absent},
			issuer: func(string) attest.Issuer { return &tsm.Issuer{} }, want: []string{"simulation"}},
		{name: "directory unknowable", cfg: config.Config{Attestation: config.AttestationSimulation, GramineDir: filepath.Join(file, "attestation")},
			want: []string{"cannot tell whether the Coordinator runs under Gramine", "QUARRY_INSECURE_SIMULATED_SEALING=1"}},
		{name: "gramine dcap", cfg: config.Config{Attestation: config.AttestationGramine},
			issuer: func(dir string) attest.Issuer { return &gramine.Issuer{Dir: dir} }, want: []string{"gramine"}, warn: "sealing with Gramine's SGX sealing keys"},
		{name: "directory, simulation", cfg: config.Config{Attestation: config.AttestationSimulation},
			want: []string{"exists", "the attestation is simulation (QUARRY_ATTESTATION)", "QUARRY_ATTESTATION=gramine", `sgx.remote_attestation = "dcap"`, "QUARRY_INSECURE_SIMULATED_SEALING=1"}},
		{name: "directory, attestation unset", cfg: config.Config{},
			want: []string{"the attestation is simulation", "QUARRY_ATTESTATION=gramine"}},
		{name: "directory, OE_SIMULATION", cfg: config.Config{Attestation: config.AttestationSimulation, OESimulation: true},
			want: []string{"OE_SIMULATION=1", "QUARRY_ATTESTATION=gramine"}},
		{name: "directory, auto with epid", cfg: config.Config{Attestation: config.AttestationAuto},
			want: []string{`attestation type is "epid", not dcap`, "QUARRY_ATTESTATION=gramine"}},
		{name: "directory, tdx", cfg: config.Config{Attestation: config.AttestationTDX},
			issuer: func(string) attest.Issuer { return &tsm.Issuer{} }, want: []string{"tdx, which has no sealing key", "QUARRY_INSECURE_SIMULATED_SEALING"}},
		{name: "directory, simulation, override", cfg: config.Config{Attestation: config.AttestationSimulation}, override: true,
			want: []string{"simulation"}, warn: "INSECURE: running under Gramine with simulated sealing"},
		{name: "directory, auto with epid, override", cfg: config.Config{Attestation: config.AttestationAuto}, override: true,
			want: []string{"simulation"}, warn: "INSECURE"},
		{name: "gramine dcap, override", cfg: config.Config{Attestation: config.AttestationGramine}, override: true,
			issuer: func(dir string) attest.Issuer { return &gramine.Issuer{Dir: dir} }, want: []string{"simulation"}, warn: "INSECURE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.GramineDir == "" {
				typ := "dcap"
				if cfg.Attestation == config.AttestationAuto {
					typ = "epid"
				}
				cfg.GramineDir = gramineWithKeys(t, typ)
			}
			cfg.InsecureSimulatedSealing = tc.override
			var logs bytes.Buffer
			a := &App{cfg: cfg, log: slog.New(slog.NewTextHandler(&logs, nil))}
			var is attest.Issuer = attest.SimulationIssuer{}
			if tc.issuer != nil {
				is = tc.issuer(cfg.GramineDir)
			}
			s, err := a.keySealer(is)
			switch tc.want[0] {
			case "gramine", "simulation":
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				_, isGramine := s.(seal.GramineKeySealer)
				_, isSim := s.(seal.SimulationKeySealer)
				if (tc.want[0] == "gramine") != isGramine || (tc.want[0] == "simulation") != isSim {
					t.Fatalf("sealer %T, want %s", s, tc.want[0])
				}
				if !strings.Contains(logs.String(), tc.warn) {
					t.Errorf("log does not say %q:\n%s", tc.warn, logs.String())
				}
			default:
				if err == nil {
					t.Fatalf("started with sealer %T", s)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal %q does not say %q", err, w)
					}
				}
			}
		})
	}
}
