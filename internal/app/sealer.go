package app

import (
	"fmt"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/gramine"
	"github.com/quarry-cc/quarry/internal/seal"
)

// keySealer chooses how the data key is sealed: with the enclave's sealing
// key under Gramine (the attestation issuer is Gramine's), else the
// simulation sealer (the data key in clear). Under Gramine the simulation
// sealer is refused unless --insecure-simulated-sealing is set; the
// sealing keys must be readable at start.
func (a *App) keySealer(issuer attest.Issuer) (seal.KeySealer, error) {
	if _, underGramine := issuer.(*gramine.Issuer); !underGramine {
		a.log.Warn("sealing in simulation mode: the data key is stored unprotected in sealed_key; do not use this for production secrets")
		return seal.SimulationKeySealer{}, nil
	}
	if a.cfg.InsecureSimulatedSealing {
		a.log.Warn("INSECURE: running under Gramine with simulated sealing (--insecure-simulated-sealing): the data key is stored in clear in sealed_key on the host's disk; anyone with the disk has every secret")
		return seal.SimulationKeySealer{}, nil
	}
	g := seal.GramineKeySealer{Dir: a.cfg.GramineDir}
	for _, mode := range []string{seal.ModeProductKey, seal.ModeUniqueKey} {
		if _, err := g.SealingKey(mode); err != nil {
			return nil, fmt.Errorf("sealing under Gramine: %w; the Coordinator refuses to keep the data key in clear inside an enclave (set --insecure-simulated-sealing / QUARRY_INSECURE_SIMULATED_SEALING=1 only for tests)", err)
		}
	}
	a.log.Info("sealing with Gramine's SGX sealing keys (SealMode ProductKey: MRSIGNER, UniqueKey: MRENCLAVE)", "dir", a.cfg.GramineDir)
	return g, nil
}
