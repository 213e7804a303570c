package app

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/gramine"
	"github.com/quarry-cc/quarry/internal/attest/tsm"
	"github.com/quarry-cc/quarry/internal/config"
	"github.com/quarry-cc/quarry/internal/seal"
)

// msgSealingOverride names the override in every refusal below.
const msgSealingOverride = "set --insecure-simulated-sealing / QUARRY_INSECURE_SIMULATED_SEALING=1 only for tests"

// keySealer chooses how the data key is sealed (docs/sealing.md,
// docs/threat-model.md). The rule fails closed: wherever Gramine's
// attestation directory exists, the Coordinator runs in a Gramine enclave
// and must seal the data key with the enclave's sealing keys, which needs
// Gramine DCAP attestation (the issuer is Gramine's) and readable sealing
// keys. Anything else there — simulation attestation, auto with another
// attestation type, tdx — would keep the data key in clear on the host's
// disk, and is refused unless --insecure-simulated-sealing is set. Without
// the directory the simulation sealer is used (the data key in clear, with
// a warning), as outside an enclave there is nothing to seal with.
func (a *App) keySealer(issuer attest.Issuer) (seal.KeySealer, error) {
	_, gramineIssuer := issuer.(*gramine.Issuer)
	dir := cmp.Or(a.cfg.GramineDir, config.DefaultGramineDir)
	underGramine, err := gramineDirExists(dir)
	if err != nil {
		return nil, fmt.Errorf("sealing: cannot tell whether the Coordinator runs under Gramine: %w; the Coordinator refuses to risk keeping the data key in clear inside an enclave (fix the path or its permissions, or %s)", err, msgSealingOverride)
	}
	switch {
	case !gramineIssuer && !underGramine:
		a.log.Warn("sealing in simulation mode: the data key is stored unprotected in sealed_key; do not use this for production secrets")
		return seal.SimulationKeySealer{}, nil
	case !gramineIssuer && !a.cfg.InsecureSimulatedSealing:
		return nil, fmt.Errorf("sealing: Gramine's attestation directory %s exists, so the Coordinator runs in a Gramine enclave, but %s: it would keep the data key in clear in sealed_key on the host's disk. "+
			"Set QUARRY_ATTESTATION=gramine (--attestation gramine) with sgx.remote_attestation = \"dcap\" in the Gramine manifest, so that the data key is sealed with the enclave's sealing key (%s)",
			dir, a.whyNotGramine(issuer, dir), msgSealingOverride)
	case a.cfg.InsecureSimulatedSealing && (gramineIssuer || underGramine):
		a.log.Warn("INSECURE: running under Gramine with simulated sealing (--insecure-simulated-sealing): the data key is stored in clear in sealed_key on the host's disk; anyone with the disk has every secret",
			"dir", dir, "attestation", a.cfg.Attestation)
		return seal.SimulationKeySealer{}, nil
	}
	g := seal.GramineKeySealer{Dir: a.cfg.GramineDir}
	for _, mode := range []string{seal.ModeProductKey, seal.ModeUniqueKey} {
		if _, err := g.SealingKey(mode); err != nil {
			return nil, fmt.Errorf("sealing under Gramine: %w; the Coordinator refuses to keep the data key in clear inside an enclave (%s)", err, msgSealingOverride)
		}
	}
	a.log.Info("sealing with Gramine's SGX sealing keys (SealMode ProductKey: MRSIGNER, UniqueKey: MRENCLAVE)", "dir", a.cfg.GramineDir)
	return g, nil
}

// gramineDirExists reports whether Gramine's attestation directory exists.
// Only a path that certainly does not exist is false; an error that leaves
// it open (permissions, say) is returned.
func gramineDirExists(dir string) (bool, error) {
	_, err := os.Stat(dir)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, err
}

// whyNotGramine says why the issuer is not Gramine's although its
// attestation directory exists.
func (a *App) whyNotGramine(issuer attest.Issuer, dir string) string {
	if _, ok := issuer.(*tsm.Issuer); ok {
		return "the attestation is tdx, which has no sealing key"
	}
	if a.cfg.Attestation == config.AttestationAuto {
		typ, err := gramine.Detect(dir)
		if err != nil {
			return fmt.Sprintf("the attestation is auto and Gramine's attestation type cannot be read (%v)", err)
		}
		return fmt.Sprintf("the attestation is auto and Gramine's attestation type is %q, not dcap, so auto chose simulation", typ)
	}
	if a.cfg.OESimulation {
		return "the attestation is simulation (OE_SIMULATION=1)"
	}
	return fmt.Sprintf("the attestation is %s (QUARRY_ATTESTATION)", cmp.Or(a.cfg.Attestation, config.AttestationSimulation))
}
