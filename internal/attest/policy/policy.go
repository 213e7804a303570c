// Package policy decides whether a verified SGX quote satisfies a manifest
// package, by MarbleRun's rules: the debug attribute must equal the
// package's, MRENCLAVE and MRSIGNER must match the hex IDs (any case),
// ISVPRODID must equal ProductID and ISVSVN must reach SecurityVersion when
// they are set, and the TCB status must be UpToDate or accepted.
package policy

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/manifest"
)

// Reasons a quote does not satisfy a package.
var (
	ErrTCBStatus       = errors.New("policy: TCB status not accepted")
	ErrAdvisory        = errors.New("policy: advisory not accepted")
	ErrDebug           = errors.New("policy: debug attribute does not match the package")
	ErrUniqueID        = errors.New("policy: MRENCLAVE does not match UniqueID")
	ErrSignerID        = errors.New("policy: MRSIGNER does not match SignerID")
	ErrProductID       = errors.New("policy: ISVPRODID does not match ProductID")
	ErrSecurityVersion = errors.New("policy: ISVSVN below SecurityVersion")
	ErrReportData      = errors.New("policy: report data does not match")
)

// Check reports whether res satisfies pkg. It checks, in MarbleRun's order,
// the TCB status, the advisories, then the enclave's identity:
//   - UpToDate is always accepted; other statuses only if listed in
//     AcceptedTCBStatuses (compared case-insensitively), which defaults to
//     [SWHardeningNeeded] when empty;
//   - for SWHardeningNeeded, every advisory must be in AcceptedAdvisories
//     (case-insensitively); an empty list accepts all;
//   - Debug must equal the report's DEBUG attribute;
//   - UniqueID and SignerID, when set, must equal the hex of MRENCLAVE and
//     MRSIGNER, case-insensitively;
//   - ProductID, when set, must equal ISVPRODID; SecurityVersion, when set,
//     must not exceed ISVSVN.
func Check(res *dcap.Result, pkg manifest.Package) error {
	if err := checkTEE(res, pkg); err != nil {
		return err
	}
	if err := checkStatus(res.Status, pkg.AcceptedTCBStatuses); err != nil {
		return err
	}
	if res.Status == tcbstatus.SWHardeningNeeded && len(pkg.AcceptedAdvisories) > 0 {
		for _, a := range res.Advisories {
			if !slices.ContainsFunc(pkg.AcceptedAdvisories, func(s string) bool { return strings.EqualFold(s, a) }) {
				return fmt.Errorf("%w: %s (accepted: %v)", ErrAdvisory, a, pkg.AcceptedAdvisories)
			}
		}
	}
	if res.TDX != nil {
		return checkTD(&res.TDX.Report, pkg)
	}
	r := &res.Report
	if r.Debug() != pkg.Debug {
		return fmt.Errorf("%w: enclave debug=%v, package Debug=%v", ErrDebug, r.Debug(), pkg.Debug)
	}
	if mr := r.MRENCLAVE(); pkg.UniqueID != "" && !strings.EqualFold(hex.EncodeToString(mr[:]), pkg.UniqueID) {
		return fmt.Errorf("%w: enclave %x, package %s", ErrUniqueID, mr, pkg.UniqueID)
	}
	if mr := r.MRSIGNER(); pkg.SignerID != "" && !strings.EqualFold(hex.EncodeToString(mr[:]), pkg.SignerID) {
		return fmt.Errorf("%w: enclave %x, package %s", ErrSignerID, mr, pkg.SignerID)
	}
	if pkg.ProductID != nil && uint64(r.ISVProdID()) != *pkg.ProductID {
		return fmt.Errorf("%w: enclave %d, package %d", ErrProductID, r.ISVProdID(), *pkg.ProductID)
	}
	if pkg.SecurityVersion != nil && uint(r.ISVSVN()) < *pkg.SecurityVersion {
		return fmt.Errorf("%w: enclave %d, package %d", ErrSecurityVersion, r.ISVSVN(), *pkg.SecurityVersion)
	}
	return nil
}

func checkStatus(status tcbstatus.Status, accepted []string) error {
	if status == tcbstatus.UpToDate {
		return nil
	}
	if len(accepted) == 0 {
		// MarbleRun's ERT validator default.
		accepted = []string{tcbstatus.SWHardeningNeeded.String()}
	}
	if status != tcbstatus.Unknown && slices.ContainsFunc(accepted, func(s string) bool { return strings.EqualFold(s, status.String()) }) {
		return nil
	}
	return fmt.Errorf("%w: %s (accepted: UpToDate, %s)", ErrTCBStatus, status, strings.Join(accepted, ", "))
}

// CheckReportData reports whether the report data of res starts with want
// (1 to 64 bytes): a Marble binds the 32-byte SHA-256 of its certificate, the
// Coordinator the whole 64-byte value.
func CheckReportData(res *dcap.Result, want []byte) error {
	rd := res.Report.ReportData()
	if res.TDX != nil {
		rd = res.TDX.Report.ReportData
	}
	if len(want) == 0 || len(want) > len(rd) {
		return fmt.Errorf("%w: expected value has %d bytes, want 1 to %d", ErrReportData, len(want), len(rd))
	}
	if !bytes.Equal(rd[:len(want)], want) {
		return fmt.Errorf("%w: quote has %x, want %x", ErrReportData, rd[:len(want)], want)
	}
	return nil
}
