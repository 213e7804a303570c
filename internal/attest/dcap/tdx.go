package dcap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// Collateral ids of TDX quotes.
const (
	idTCBInfoTDX     = "TDX"
	idQEIdentityTDQE = "TD_QE"
)

// TDX-specific verification steps.
const (
	StepTDXModule    Step = "TDX module identity"
	StepTDXModuleTCB Step = "TDX module TCB level"
)

// ErrTDXModule: the TD report's SEAM module does not match the TDX module
// identity of the TCB info (Intel's TDX_MODULE_MISMATCH).
var ErrTDXModule = errors.New("TDX module does not match the TCB info's module identity")

// TDXResult holds what only a TDX quote has. Result.TDX is nil for SGX.
type TDXResult struct {
	// BodyType is tdxquote.BodyTypeTD10 or BodyTypeTD15.
	BodyType uint16
	// Report is the verified TD report.
	Report tdxquote.TDReport
	// ModuleID is the id of the module identity used ("TDX_01"), empty
	// when the module's major version is 0 (tdxModule applies).
	ModuleID string
	// ModuleStatus is the module's TCB status (UpToDate when the major
	// version is 0: the TDX components grade it).
	ModuleStatus tcbstatus.Status
	// ModuleAdvisories are the advisory IDs of the module's TCB level.
	ModuleAdvisories []string
	// SGXStatus is the status of the first TCB level the SGX components
	// of the PCK certificate reach.
	SGXStatus tcbstatus.Status
}

// tdxSource adapts a Provider to TDX collateral.
type tdxSource struct{ p collateral.Provider }

func (s tdxSource) Get(ctx context.Context, fmspc [6]byte, ca collateral.CA) (*collateral.Collateral, error) {
	tp, ok := s.p.(collateral.TDXProvider)
	if !ok {
		return nil, errors.New("the collateral provider serves no TDX collateral")
	}
	return tp.GetTDX(ctx, fmspc, ca)
}

// verifyTDX verifies a TDX quote (v4 or v5, TEE type 0x81) by Intel's QVL
// rules: the shared chain, signature and CRL checks, then TDX TCB info and
// TD QE identity, the TDX module identity, the platform TCB level over SGX
// and TDX components, the module's TCB level, the TD 1.5 relaunch check and
// the QE's status.
func (v *Verifier) verifyTDX(ctx context.Context, quote []byte, now time.Time) (*Result, error) {
	q, err := tdxquote.Parse(quote)
	if err != nil {
		if errors.Is(err, tdxquote.ErrUnsupported) {
			return nil, fail(StepParse, ErrUnsupported, err)
		}
		return nil, fail(StepParse, ErrFormat, err)
	}
	var src collateralSource
	if v.Collateral != nil {
		src = tdxSource{v.Collateral}
	}
	c, err := v.verifyCommon(ctx, keyTDX, evidence{
		vendor: q.Header.QEVendorID, chain: q.PCKChain, qeReport: &q.QEReport, qeReportSig: q.QEReportSignature[:],
		attKey: q.AttestationKey[:], authData: q.QEAuthData, signed: q.SignedData(), sig: q.Signature[:],
	}, now, src)
	if err != nil {
		return nil, err
	}
	ext, td := c.ext, &q.Body

	// TDX TCB info.
	info, err := c.tdxTCBInfo(now)
	if err != nil {
		return nil, err
	}
	switch {
	case info.FMSPC != ext.FMSPC: // decoded bytes: the hex's case does not matter
		return nil, fail(StepTCBInfo, ErrCollateral, fmt.Errorf("FMSPC %X, but the PCK certificate's is %X", info.FMSPC, ext.FMSPC))
	case info.PCEID != ext.PCEID:
		return nil, fail(StepTCBInfo, ErrCollateral, fmt.Errorf("PCE-ID %X, but the PCK certificate's is %X", info.PCEID, ext.PCEID))
	}
	c.validity.add("TCB info", info.IssueDate, info.NextUpdate, now)

	// TD QE identity.
	qeID, err := c.qeIdentity(now, idQEIdentityTDQE, true)
	if err != nil {
		return nil, err
	}
	c.remember() // every check of the collateral alone passed
	c.validity.add("QE identity", qeID.IssueDate, qeID.NextUpdate, now)

	// TDX module identity (QVL 4.1.2.4.11).
	_, moduleID, err := tdxModule(info, td)
	if err != nil {
		return nil, err
	}

	// The TD QE matches its identity.
	qeLevel, err := matchQE(&q.QEReport, qeID)
	if err != nil {
		return nil, err
	}
	qeStatus, err := levelStatus(qeLevel.Status, StepQEMatch, "QE")
	if err != nil {
		return nil, err
	}

	// Platform TCB level: SGX side, then TDX components.
	sgxLevel, tdxLevel, err := matchTDXLevel(info.Levels, ext.PCESVN, ext.CompSVN, td)
	if err != nil {
		return nil, err
	}
	sgxStatus, err := tcbstatus.Parse(sgxLevel.Status)
	if err != nil {
		return nil, fail(StepTCBLevel, ErrCollateral, err)
	}
	tdxStatus, err := tcbstatus.Parse(tdxLevel.Status)
	if err != nil {
		return nil, fail(StepTCBLevel, ErrCollateral, err)
	}

	// Module TCB status, merged into the TDX level's.
	status := tdxStatus
	moduleStatus := tcbstatus.UpToDate
	var moduleAdvisories []string
	if moduleID != nil {
		ml, ok := firstLevelAtOrBelow(moduleID.Levels, uint16(td.ModuleSVN()))
		if !ok {
			return nil, fail(StepTDXModuleTCB, ErrTCBNotSupported, fmt.Errorf("module %s SVN %d is below every TCB level", moduleID.ID, td.ModuleSVN()))
		}
		if moduleStatus, err = levelStatus(ml.Status, StepTDXModuleTCB, "TDX module"); err != nil {
			return nil, err
		}
		moduleAdvisories = slices.Clone(ml.Advisories)
		status = tcbstatus.ConvergeModule(status, moduleStatus)
	}

	// TD 1.5 relaunch check.
	if q.BodyType == tdxquote.BodyTypeTD15 && relaunchAdvised(info, td, qeStatus, sgxStatus, status, moduleStatus, moduleID != nil) {
		if sgxStatus.NeedsConfiguration() || tdxStatus.NeedsConfiguration() || status.NeedsConfiguration() {
			status = tcbstatus.TDRelaunchAdvisedConfigurationNeeded
		} else {
			status = tcbstatus.TDRelaunchAdvised
		}
	}

	var advisories []string
	for _, a := range append(slices.Clone(tdxLevel.Advisories), moduleAdvisories...) {
		if !slices.Contains(advisories, a) {
			advisories = append(advisories, a)
		}
	}
	res := &Result{
		Status:                  tcbstatus.Converge(status, qeStatus),
		PlatformStatus:          tdxStatus,
		QEStatus:                qeStatus,
		Advisories:              advisories,
		QEAdvisories:            slices.Clone(qeLevel.Advisories),
		TCBDate:                 tdxLevel.Date,
		TCBEvaluationDataNumber: info.TCBEvaluationDataNumber,
		Version:                 q.Header.Version,
		QEReport:                q.QEReport,
		PCK:                     *ext,
		CA:                      c.ca,
		CollateralExpiry:        c.validity.until,
		CollateralExpired:       len(c.validity.problems) > 0,
		TDX: &TDXResult{
			BodyType: q.BodyType, Report: q.Body, ModuleStatus: moduleStatus,
			ModuleAdvisories: moduleAdvisories, SGXStatus: sgxStatus,
		},
	}
	if moduleID != nil {
		res.TDX.ModuleID = moduleID.ID
	}
	if res.CollateralExpired {
		return res, fail(StepCollateralTime, ErrCollateralExpired, fmt.Errorf("verification time %s: %s",
			now.UTC().Format(time.RFC3339), strings.Join(c.validity.problems, "; ")))
	}
	return res, nil
}

// tdxModule selects the module identity by the module's major version and
// checks MRSIGNERSEAM and SEAMATTRIBUTES against it. The identity is nil
// when the major version is 0 (tdxModule applies, with no TCB levels).
func tdxModule(info *collateral.TDXTCBInfo, td *tdxquote.TDReport) (collateral.TDXModule, *collateral.TDXModuleIdentity, error) {
	module := info.Module
	var id *collateral.TDXModuleIdentity
	if major := td.ModuleMajor(); major > 0 {
		want := fmt.Sprintf("TDX_%02X", major)
		for i := range info.ModuleIdentities {
			if strings.EqualFold(info.ModuleIdentities[i].ID, want) {
				id = &info.ModuleIdentities[i]
				break
			}
		}
		if id == nil {
			return module, nil, fail(StepTDXModule, ErrTDXModule, fmt.Errorf("no module identity %s for module major version %d", want, major))
		}
		module = id.TDXModule
	}
	if td.MRSIGNERSEAM != module.MRSIGNER {
		return module, nil, fail(StepTDXModule, ErrTDXModule, fmt.Errorf("MRSIGNERSEAM %x, want %x", td.MRSIGNERSEAM, module.MRSIGNER))
	}
	for i := range td.SEAMAttributes {
		if td.SEAMAttributes[i]&module.AttributesMask[i] != module.Attributes[i] {
			return module, nil, fail(StepTDXModule, ErrTDXModule, fmt.Errorf("SEAMATTRIBUTES %x masked with %x are not %x", td.SEAMAttributes, module.AttributesMask, module.Attributes))
		}
	}
	return module, id, nil
}

// matchTDXLevel walks the TCB levels in the given (descending) order: the
// first level the PCK's SGX components and PCESVN reach is the SGX level;
// from there, the first that also has TEE_TCB_SVN[i] ≥ tdxtcbcomponents[i]
// (from index 2 when the module's major version is set, which the module
// identity grades) is the TDX level.
func matchTDXLevel(levels []collateral.TDXTCBLevel, pcesvn uint16, comps [16]uint8, td *tdxquote.TDReport) (sgx, tdx collateral.TDXTCBLevel, err error) {
	sgxOK := func(l collateral.TDXTCBLevel) bool {
		if pcesvn < l.PCESVN {
			return false
		}
		for i := range l.CompSVN {
			if comps[i] < l.CompSVN[i] {
				return false
			}
		}
		return true
	}
	start := 0
	if td.ModuleMajor() > 0 {
		start = 2
	}
	found := false
	for _, l := range levels {
		if !sgxOK(l) {
			continue
		}
		if !found {
			sgx, found = l, true
		}
		ok := true
		for i := start; i < len(l.TDXCompSVN); i++ {
			if td.TEETCBSVN[i] < l.TDXCompSVN[i] {
				ok = false
				break
			}
		}
		if ok {
			return sgx, l, nil
		}
	}
	if !found {
		return sgx, tdx, fail(StepTCBLevel, ErrTCBNotSupported, fmt.Errorf("no matching TCB level: no level's SGX components apply to PCESVN %d, component SVNs %v", pcesvn, comps))
	}
	return sgx, tdx, fail(StepTCBLevel, ErrTCBNotSupported, fmt.Errorf("no matching TCB level: no level's TDX components apply to TEE_TCB_SVN %x", td.TEETCBSVN))
}

// firstLevelAtOrBelow returns the level with the highest ISVSVN not above svn.
func firstLevelAtOrBelow(levels []collateral.QELevel, svn uint16) (collateral.QELevel, bool) {
	sorted := slices.Clone(levels)
	slices.SortStableFunc(sorted, func(a, b collateral.QELevel) int { return cmp.Compare(b.ISVSVN, a.ISVSVN) })
	for _, l := range sorted {
		if l.ISVSVN <= svn {
			return l, true
		}
	}
	return collateral.QELevel{}, false
}

// levelStatus parses the status of a QE or module level, which may only be
// UpToDate, OutOfDate or Revoked.
func levelStatus(s string, step Step, what string) (tcbstatus.Status, error) {
	st, err := tcbstatus.Parse(s)
	if err != nil {
		return st, fail(step, ErrCollateral, err)
	}
	switch st {
	case tcbstatus.UpToDate, tcbstatus.OutOfDate, tcbstatus.Revoked:
		return st, nil
	}
	return st, fail(step, ErrCollateral, fmt.Errorf("%s TCB status %s (%s levels are UpToDate, OutOfDate or Revoked)", what, st, what))
}

// relaunchAdvised is Intel's TD 1.5 relaunch check: the platform was
// updated (module out of date) while the TD's TEE_TCB_SVN2 shows it would
// be current after a relaunch.
func relaunchAdvised(info *collateral.TDXTCBInfo, td *tdxquote.TDReport, qe, sgx, merged, module tcbstatus.Status, hasModule bool) bool {
	if !hasModule || module != tcbstatus.OutOfDate {
		return false
	}
	if qe == tcbstatus.OutOfDate || qe == tcbstatus.Revoked {
		return false
	}
	switch sgx {
	case tcbstatus.UpToDate, tcbstatus.SWHardeningNeeded, tcbstatus.ConfigurationNeeded, tcbstatus.ConfigurationAndSWHardeningNeeded:
	default:
		return false
	}
	if merged != tcbstatus.OutOfDate && merged != tcbstatus.OutOfDateConfigurationNeeded {
		return false
	}
	newest := info.Levels[0].TDXCompSVN
	svn2 := td.TEETCBSVN2
	if svn2[2] < newest[2] {
		return false
	}
	if svn2[1] == 0 {
		return svn2[0] >= newest[0]
	}
	want := fmt.Sprintf("TDX_%02X", svn2[1])
	for _, id := range info.ModuleIdentities {
		if strings.EqualFold(id.ID, want) {
			top := slices.MaxFunc(id.Levels, func(a, b collateral.QELevel) int { return cmp.Compare(a.ISVSVN, b.ISVSVN) })
			return uint16(svn2[0]) >= top.ISVSVN
		}
	}
	return false
}
