package app

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/gramine"
	"github.com/quarry-cc/quarry/internal/config"
)

func gramineDir(t *testing.T, typ string) string {
	t.Helper()
	dir := t.TempDir()
	if typ != "" {
		if err := os.WriteFile(filepath.Join(dir, gramine.FileAttestationType), []byte(typ+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestIssuerChoice(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     config.Config
		gramine bool
		err     string
	}{
		{"simulation", config.Config{Attestation: config.AttestationSimulation, GramineDir: gramineDir(t, "dcap")}, false, ""},
		{"gramine dcap", config.Config{Attestation: config.AttestationGramine, GramineDir: gramineDir(t, "dcap")}, true, ""},
		{"gramine epid", config.Config{Attestation: config.AttestationGramine, GramineDir: gramineDir(t, "epid")}, false, `attestation type is "epid"`},
		{"gramine absent", config.Config{Attestation: config.AttestationGramine, GramineDir: gramineDir(t, "")}, false, "is the Coordinator running in Gramine"},
		{"auto dcap", config.Config{Attestation: config.AttestationAuto, GramineDir: gramineDir(t, "dcap")}, true, ""},
		{"auto none", config.Config{Attestation: config.AttestationAuto, GramineDir: gramineDir(t, "none")}, false, ""},
		{"auto absent", config.Config{Attestation: config.AttestationAuto, GramineDir: filepath.Join(t.TempDir(), "absent")}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &App{cfg: tc.cfg, log: slog.New(slog.DiscardHandler)}
			is, err := a.issuer()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := is.(*gramine.Issuer); ok != tc.gramine {
				t.Fatalf("issuer %T", is)
			}
			if _, ok := is.(attest.SimulationIssuer); ok == tc.gramine {
				t.Fatalf("issuer %T", is)
			}
		})
	}
}

func TestQuoteVerifier(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	a := &App{cfg: config.Config{}, log: log}
	if v, err := a.quoteVerifier(); err != nil || v != nil {
		t.Fatalf("no collateral source: %v, %v; want no verifier", v, err)
	}

	p := dcaptest.NewPKI(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "root.pem")
	os.WriteFile(root, dcaptest.PEM(p.Root), 0o600)
	a.cfg = config.Config{CollateralFile: dir, SGXRootCA: root}
	v, err := a.quoteVerifier()
	if err != nil {
		t.Fatal(err)
	}
	if dv, ok := v.(*dcap.Verifier); !ok || !dv.RootCA.Equal(p.Root) {
		t.Fatalf("verifier %#v", v)
	}
	a.cfg = config.Config{PCCSURL: "https://pccs.example/sgx/certification/v4/"}
	if v, err := a.quoteVerifier(); err != nil || v.(*dcap.Verifier).RootCA != nil {
		t.Fatalf("PCCS: %v, %v", v, err)
	}

	for name, content := range map[string][]byte{
		"not PEM":    []byte("hello"),
		"two certs":  dcaptest.PEM(p.Root, p.PCKCA),
		"not a root": dcaptest.PEM(p.PCKCA),
		"not a CA":   dcaptest.PEM(p.TCBSigning),
		"bad DER":    []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
	} {
		f := filepath.Join(dir, "bad.pem")
		os.WriteFile(f, content, 0o600)
		a.cfg = config.Config{CollateralFile: dir, SGXRootCA: f}
		if _, err := a.quoteVerifier(); err == nil || !strings.Contains(err.Error(), "sgx-root-ca") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}
