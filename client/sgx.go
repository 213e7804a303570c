package client

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/collateral/pccs"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/policy"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/manifest"
)

// Reasons a DCAPVerifier rejects a quote. Each error of VerifyQuote wraps
// exactly one of them (VerifyCoordinator adds ErrVerification).
var (
	// ErrQuoteInvalid: the quote does not verify: a signature, the
	// certificate chain to the SGX root, a revocation, the collateral
	// (including expired collateral) or its format.
	ErrQuoteInvalid = errors.New("the SGX quote does not verify")
	// ErrEnclaveMismatch: the quote is genuine, but the enclave is not the
	// expected one (UniqueID, SignerID, ProductID, SecurityVersion, Debug).
	ErrEnclaveMismatch = errors.New("the enclave does not have the expected properties")
	// ErrTCBNotAccepted: the platform's TCB status, or an advisory, is not
	// accepted.
	ErrTCBNotAccepted = errors.New("the platform's TCB status is not accepted")
	// ErrReportDataMismatch: the quote is not bound to the expected report
	// data (the Coordinator's root certificate and the nonce).
	ErrReportDataMismatch = errors.New("the quote's report data does not match")
)

// EraConfig is the expected identity of the Coordinator's enclave and the
// accepted TCB statuses, in the JSON shape of MarbleRun's era config file
// (coordinator-era.json), with MarbleRun's meaning:
//   - UniqueID (MRENCLAVE) and SignerID (MRSIGNER) are hex, compared
//     case-insensitively when set;
//   - ProductID must equal ISVPRODID and SecurityVersion must not exceed
//     ISVSVN, each when not zero; without UniqueID, SignerID, ProductID and
//     SecurityVersion are all required;
//   - Debug true also accepts a debug enclave; false rejects it;
//   - UpToDate is always accepted; other TCB statuses only if listed in
//     AcceptedTCBStatuses, which defaults to [SWHardeningNeeded] (so
//     ["UpToDate","SWHardeningNeeded"], MarbleRun's default);
//   - with SWHardeningNeeded, every advisory of the platform must be in
//     AcceptedAdvisories when that is not empty.
type EraConfig struct {
	SecurityVersion     uint
	UniqueID            string   `json:",omitempty"`
	SignerID            string   `json:",omitempty"`
	ProductID           uint16   `json:",omitempty"`
	Debug               bool     `json:",omitempty"`
	AcceptedTCBStatuses []string `json:",omitempty"`
	AcceptedAdvisories  []string `json:",omitempty"`
	// TDXMeasurements, when set, expect a Coordinator in a TDX guest with
	// these TD measurements (MRTD, RTMR0–3, …; see docs/tdx.md) instead
	// of an SGX enclave. MRTD is required, and so are RTMR1 and RTMR2
	// unless InsecureAllowUnsetRTMR1RTMR2 is set; Debug does not lift
	// either requirement.
	manifest.TDXMeasurements
	// InsecureAllowUnsetRTMR1RTMR2 lets a TDX era config leave RTMR1 (the
	// kernel) or RTMR2 (the kernel command line and initrd) unset, so that
	// any kernel booted by the firmware MRTD names is accepted. Registers
	// that are set are still compared. Only for TDX era configs.
	InsecureAllowUnsetRTMR1RTMR2 bool `json:",omitempty"`
}

// ParseEraConfig decodes an era config file. Unknown members are an error
// (a misspelt member would silently weaken the check), except MarbleRun's
// Nonce, which is ignored: VerifyCoordinator always sends a fresh nonce.
// The result is validated.
func ParseEraConfig(data []byte) (EraConfig, error) {
	var aux struct {
		EraConfig
		Nonce json.RawMessage
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&aux); err != nil {
		return EraConfig{}, fmt.Errorf("era config: %w", err)
	}
	if dec.More() {
		return EraConfig{}, errors.New("era config: unexpected data after the JSON object")
	}
	if err := aux.EraConfig.Validate(); err != nil {
		return EraConfig{}, err
	}
	return aux.EraConfig, nil
}

// ReadEraConfig reads and parses an era config file.
func ReadEraConfig(path string) (EraConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return EraConfig{}, fmt.Errorf("era config: %w", err)
	}
	cfg, err := ParseEraConfig(data)
	if err != nil {
		return EraConfig{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Validate checks that the configuration identifies an enclave: UniqueID,
// or SignerID with ProductID and SecurityVersion; that IDs are 32-byte hex;
// and that the TCB statuses are Intel's names. A TDX era config must set
// MRTD, and RTMR1 and RTMR2 unless InsecureAllowUnsetRTMR1RTMR2, whatever
// Debug says (validateTDX).
func (c EraConfig) Validate() error {
	if (manifest.Package{TDXMeasurements: c.TDXMeasurements}).IsTDX() {
		return c.validateTDX()
	}
	var errs []error
	if c.InsecureAllowUnsetRTMR1RTMR2 {
		errs = append(errs, errors.New("era config: InsecureAllowUnsetRTMR1RTMR2 applies to a TDX guest only, and this era config sets no TD measurement (MRTD, …)"))
	}
	for _, id := range []struct{ name, value string }{{"UniqueID", c.UniqueID}, {"SignerID", c.SignerID}} {
		if id.value == "" {
			continue
		}
		if b, err := hex.DecodeString(id.value); err != nil || len(b) != 32 {
			errs = append(errs, fmt.Errorf("era config: %s %q is not 64 hex digits", id.name, id.value))
		}
	}
	if c.UniqueID == "" {
		for _, f := range []struct {
			name  string
			unset bool
		}{{"SignerID", c.SignerID == ""}, {"ProductID", c.ProductID == 0}, {"SecurityVersion", c.SecurityVersion == 0}} {
			if f.unset {
				errs = append(errs, fmt.Errorf("era config: without UniqueID, %s is required", f.name))
			}
		}
	}
	for _, s := range c.AcceptedTCBStatuses {
		if _, err := parseStatus(s); err != nil {
			errs = append(errs, fmt.Errorf("era config: AcceptedTCBStatuses: %q is not one of %s", s, strings.Join(statusNames(), ", ")))
		}
	}
	return errors.Join(errs...)
}

// parseStatus parses an Intel TCB status string case-insensitively: one of
// the TCB info statuses or, for TDX, the two relaunch statuses.
func parseStatus(s string) (tcbstatus.Status, error) {
	for _, v := range acceptableStatuses() {
		if strings.EqualFold(v.String(), s) {
			return v, nil
		}
	}
	return tcbstatus.Unknown, tcbstatus.ErrUnknown
}

// acceptableStatuses are the statuses an era config may accept: every
// status but Unknown.
func acceptableStatuses() []tcbstatus.Status {
	var out []tcbstatus.Status
	for s := tcbstatus.UpToDate; s < tcbstatus.Unknown; s++ {
		out = append(out, s)
	}
	return append(out, tcbstatus.TDRelaunchAdvised, tcbstatus.TDRelaunchAdvisedConfigurationNeeded)
}

func statusNames() []string {
	var out []string
	for _, s := range acceptableStatuses() {
		out = append(out, s.String())
	}
	return out
}

// DCAPOptions configure NewDCAPVerifier.
type DCAPOptions struct {
	// Expected is what the enclave must be and which TCB statuses are
	// accepted; it must pass EraConfig.Validate.
	Expected EraConfig
	// CollateralFile is DCAP collateral from disk: a JSON file in dcap-qvl's
	// QuoteCollateralV3 shape, or a directory of PCS/PCCS responses.
	CollateralFile string
	// PCCSURL is the base URL of a PCCS or of Intel's PCS (API v4), e.g.
	// https://pccs.example:8081/sgx/certification/v4/. Exactly one of
	// CollateralFile and PCCSURL is required.
	PCCSURL string
	// HTTPClient is used for the PCCS; nil means a client with a 30-second
	// timeout. The collateral is signed, so a PCCS with a self-signed TLS
	// certificate may be reached with a client that skips TLS verification.
	HTTPClient *http.Client
	// RootCA, when set, replaces the pinned Intel SGX Root CA (tests and
	// private PKIs only).
	RootCA *x509.Certificate
	// Now returns the verification time; nil means time.Now.
	Now func() time.Time
}

// DCAPVerifier is a QuoteVerifier for SGX DCAP quotes (raw or in the Open
// Enclave wrapper), verified in pure Go against Intel's collateral. It is
// safe for concurrent use; collateral is cached until its next update.
type DCAPVerifier struct {
	expected EraConfig
	v        dcap.Verifier
}

var _ QuoteVerifier = (*DCAPVerifier)(nil)

// NewDCAPVerifier returns a verifier for the options.
func NewDCAPVerifier(o DCAPOptions) (*DCAPVerifier, error) {
	if err := o.Expected.Validate(); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	var src collateral.Provider
	switch {
	case o.CollateralFile != "" && o.PCCSURL != "":
		return nil, errors.New("client: give either a collateral file or a PCCS URL, not both")
	case o.CollateralFile != "":
		if _, err := os.Stat(o.CollateralFile); err != nil {
			return nil, fmt.Errorf("client: collateral: %w", err)
		}
		src = collateral.File{Path: o.CollateralFile}
	case o.PCCSURL != "":
		hc := o.HTTPClient
		if hc == nil {
			hc = &http.Client{Timeout: 30 * time.Second}
		}
		src = &pccs.Client{BaseURL: o.PCCSURL, HTTPClient: hc}
	default:
		return nil, errors.New("client: verifying an SGX quote needs collateral: give a collateral file or a PCCS URL")
	}
	return &DCAPVerifier{
		expected: o.Expected,
		v:        dcap.Verifier{Collateral: collateral.NewCache(src, o.Now), Now: o.Now, RootCA: o.RootCA},
	}, nil
}

// VerifyQuote verifies the quote and checks it against the expected
// properties, the accepted TCB statuses and advisories, and reportData (all
// 64 bytes).
func (d *DCAPVerifier) VerifyQuote(ctx context.Context, quote []byte, reportData [ReportDataSize]byte) error {
	res, err := d.v.Verify(ctx, quote)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrQuoteInvalid, err)
	}
	if err := policy.CheckReportData(res, reportData[:]); err != nil {
		return fmt.Errorf("%w: %w", ErrReportDataMismatch, err)
	}
	e := d.expected
	pkg := manifest.Package{
		UniqueID: e.UniqueID,
		SignerID: e.SignerID,
		// MarbleRun: Debug true accepts debug and production enclaves.
		Debug:               e.Debug && res.Report.Debug(),
		TDXMeasurements:     e.TDXMeasurements,
		AcceptedTCBStatuses: e.AcceptedTCBStatuses,
		AcceptedAdvisories:  e.AcceptedAdvisories,
	}
	if res.TDX != nil {
		pkg.Debug = e.Debug && res.TDX.Report.Debug()
	}
	if e.ProductID != 0 {
		id := uint64(e.ProductID)
		pkg.ProductID = &id
	}
	if e.SecurityVersion != 0 {
		svn := e.SecurityVersion
		pkg.SecurityVersion = &svn
	}
	if err := policy.Check(res, pkg); err != nil {
		if errors.Is(err, policy.ErrTCBStatus) || errors.Is(err, policy.ErrAdvisory) {
			return fmt.Errorf("%w: %w", ErrTCBNotAccepted, err)
		}
		return fmt.Errorf("%w: %w", ErrEnclaveMismatch, err)
	}
	return nil
}
