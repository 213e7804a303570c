package cli

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
)

// coordinatorAttestEnv are the variables of a script that `coordinator
// start` passes to the coordinator.
var coordinatorAttestEnv = []string{
	"QUARRY_ATTESTATION", "QUARRY_GRAMINE_ATTESTATION_DIR", "QUARRY_COLLATERAL_FILE", "QUARRY_PCCS_URL", "QUARRY_SGX_ROOT_CA",
}

// TestAttestScripts runs the scenarios in testdata/attest against a
// coordinator that issues SGX quotes through a fake Gramine attestation
// directory, served by this test acting as the quoting enclave with a
// synthetic DCAP PKI. Each script gets its own device (a device serves one
// coordinator process at a time). Script environment:
//
//	GRAMINE_DIR      the fake /dev/attestation
//	SGX_COLLATERAL   collateral JSON (Phala shape) for the synthetic platform,
//	                 TCB status SWHardeningNeeded with advisory INTEL-SA-00615
//	SGX_ROOT_CA      the synthetic SGX root certificate (PEM)
//	MRENCLAVE        hex MRENCLAVE of the coordinator "enclave"; MRSIGNER likewise
//	                 (ISVPRODID 3, ISVSVN 2, production)
func TestAttestScripts(t *testing.T) {
	p := scriptParams(filepath.Join("testdata", "attest"))
	setup := p.Setup
	p.Setup = func(env *testscript.Env) error {
		if err := setup(env); err != nil {
			return err
		}
		s := newSGXEnv(scriptTB{TB: t, env: env}, env.WorkDir)
		for k, v := range s {
			env.Setenv(k, v)
		}
		return nil
	}
	testscript.Run(t, p)
}

// newSGXEnv creates the synthetic platform, its collateral and root files in
// dir, and a fake Gramine device that quotes the coordinator enclave until
// the test ends.
func newSGXEnv(t testing.TB, dir string) map[string]string {
	pki := dcaptest.NewPKI(t)
	pl := pki.NewPlatform(t, dcaptest.DefaultExtension())
	now := time.Now()
	col := pl.Collateral(t, dcaptest.CollateralOptions{
		IssueDate: now.Add(-24 * time.Hour), NextUpdate: now.Add(30 * 24 * time.Hour),
		TCBLevels: []dcaptest.TCBLevel{{CompSVN: pl.Ext.CompSVN, PCESVN: pl.Ext.PCESVN, Status: "SWHardeningNeeded", Advisories: []string{"INTEL-SA-00615"}}},
	})
	sgxDir := filepath.Join(dir, "sgx")
	if err := os.Mkdir(sgxDir, 0o700); err != nil {
		t.Fatal(err)
	}
	colFile, rootFile := filepath.Join(sgxDir, "collateral.json"), filepath.Join(sgxDir, "root.pem")
	if err := os.WriteFile(colFile, dcaptest.QVLJSON(t, col), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rootFile, dcaptest.PEM(pki.Root), 0o600); err != nil {
		t.Fatal(err)
	}
	enclave := dcaptest.Enclave{ISVProdID: 3, ISVSVN: 2}
	copy(enclave.MRENCLAVE[:], "quarry coordinator enclave (CLI)")
	copy(enclave.MRSIGNER[:], "quarry coordinator signer  (CLI)")
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte {
		e := enclave
		e.ReportData = rd
		return pl.Quote(t, dcaptest.QuoteOptions{Enclave: e})
	})
	return map[string]string{
		"GRAMINE_DIR":    dev.Dir,
		"SGX_COLLATERAL": colFile,
		"SGX_ROOT_CA":    rootFile,
		"MRENCLAVE":      hex.EncodeToString(enclave.MRENCLAVE[:]),
		"MRSIGNER":       hex.EncodeToString(enclave.MRSIGNER[:]),
	}
}

// scriptTB lets the test helpers (dcaptest, graminetest) run in a script's
// Setup: failures go to the script's test, temporary directories live in
// its work directory and cleanups run when the script ends. The embedded
// parent test only supplies the methods not overridden.
type scriptTB struct {
	testing.TB
	env *testscript.Env
}

func (s scriptTB) Helper()                           {}
func (s scriptTB) Fatal(args ...any)                 { s.env.T().Fatal(args...) }
func (s scriptTB) Fatalf(format string, args ...any) { s.env.T().Fatal(fmt.Sprintf(format, args...)) }
func (s scriptTB) Skipf(format string, args ...any)  { s.env.T().Skip(fmt.Sprintf(format, args...)) }
func (s scriptTB) Cleanup(f func())                  { s.env.Defer(f) }
func (s scriptTB) TempDir() string {
	d, err := os.MkdirTemp(s.env.WorkDir, "tmp")
	if err != nil {
		s.Fatal(err)
	}
	return d
}
