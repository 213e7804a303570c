package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/policy"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
	"github.com/quarry-cc/quarry/manifest"
)

// tdResult returns a TDX result: MRTD 0x11…, RTMR0 0x22…, TEE_TCB_SVN
// 06 01 03, TDATTRIBUTES with SEPT_VE_DISABLE, XFAM e7 02 06.
func tdResult(status tcbstatus.Status, advisories ...string) *dcap.Result {
	var r tdxquote.TDReport
	for i := range r.MRTD {
		r.MRTD[i], r.RTMR[0][i] = 0x11, 0x22
	}
	r.TEETCBSVN = [16]byte{6, 1, 3}
	r.TDAttributes = [8]byte{0, 0, 0, 0x10}
	r.XFAM = [8]byte{0xe7, 0x02, 0x06}
	copy(r.ReportData[:], "td report data")
	return &dcap.Result{Status: status, Advisories: advisories, TDX: &dcap.TDXResult{Report: r}}
}

// tdAttrs is tdResult(UpToDate) with one more TDATTRIBUTES bit set: bit
// of byte (the attributes are little-endian, so byte 0 holds bits 7:0).
func tdAttrs(byteIndex, bit int) *dcap.Result {
	res := tdResult(tcbstatus.UpToDate)
	res.TDX.Report.TDAttributes[byteIndex] |= 1 << bit
	return res
}

func tdPackage() manifest.Package {
	return manifest.Package{TDXMeasurements: manifest.TDXMeasurements{
		MRTD: strings.Repeat("11", 48), RTMR0: strings.Repeat("22", 48),
		TDAttributes: "0000001000000000", XFAM: "E702060000000000", XFAMMask: "FFFFFFFF00000000",
		MinTEETCBSVN: "06010300000000000000000000000000",
	}}
}

func TestTDXCheck(t *testing.T) {
	with := func(f func(*manifest.Package)) manifest.Package { p := tdPackage(); f(&p); return p }
	for _, tc := range []struct {
		name string
		res  *dcap.Result
		pkg  manifest.Package
		want error
	}{
		{"accepted", tdResult(tcbstatus.UpToDate), tdPackage(), nil},
		{"MRTD only", tdResult(tcbstatus.UpToDate), manifest.Package{TDXMeasurements: manifest.TDXMeasurements{MRTD: strings.Repeat("11", 48)}}, nil},
		{"MRTD upper-case", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.MRTD = strings.Repeat("11", 48) }), nil},
		{"wrong MRTD", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.MRTD = strings.Repeat("12", 48) }), policy.ErrMRTD},
		{"wrong RTMR0", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.RTMR0 = strings.Repeat("21", 48) }), policy.ErrRTMR},
		{"RTMR3 pinned, report zero", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.RTMR3 = strings.Repeat("33", 48) }), policy.ErrRTMR},
		{"MRSEAM pinned", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.MRSEAM = strings.Repeat("01", 48) }), policy.ErrMRSEAM},
		{"MRSIGNERSEAM zero", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.MRSIGNERSEAM = strings.Repeat("00", 48) }), nil},
		{"MRSIGNERSEAM other", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.MRSIGNERSEAM = strings.Repeat("0f", 48) }), policy.ErrMRSIGNERSEAM},
		{"TD attributes differ", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.TDAttributes = "0000000000000000" }), policy.ErrTDAttributes},
		{"TD attributes masked", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.TDAttributes, p.TDAttributesMask = "0000000000000000", "FFFFFF0FFFFFFFFF" }), nil},
		{"XFAM differs inside mask", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.XFAM = "E703060000000000" }), policy.ErrXFAM},
		{"XFAM differs outside mask", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.XFAM = "E702060011000000" }), nil},
		{"TEE_TCB_SVN below minimum", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.MinTEETCBSVN = "07000000000000000000000000000000" }), policy.ErrTEETCBSVN},
		{"debug package, production TD", tdResult(tcbstatus.UpToDate), with(func(p *manifest.Package) { p.Debug = true }), policy.ErrDebug},
		// Any of TDATTRIBUTES bits 7:0 (the "TD under debug" group) makes
		// a debug TD, not only bit 0; the package's mask cannot hide it.
		{"TDATTRIBUTES bit 0, production package", tdAttrs(0, 0), tdPackage(), policy.ErrDebug},
		{"TDATTRIBUTES bit 1, production package", tdAttrs(0, 1), tdPackage(), policy.ErrDebug},
		{"TDATTRIBUTES bit 7, production package", tdAttrs(0, 7), tdPackage(), policy.ErrDebug},
		{"TDATTRIBUTES bit 3, bits 7:0 outside the mask", tdAttrs(0, 3), with(func(p *manifest.Package) { p.TDAttributesMask = "00FFFFFFFFFFFFFF" }), policy.ErrDebug},
		{"TDATTRIBUTES bit 1, MRTD-only package", tdAttrs(0, 1), manifest.Package{TDXMeasurements: manifest.TDXMeasurements{MRTD: strings.Repeat("11", 48)}}, policy.ErrDebug},
		{"TDATTRIBUTES bit 5, debug package", tdAttrs(0, 5), manifest.Package{Debug: true, TDXMeasurements: manifest.TDXMeasurements{MRTD: strings.Repeat("11", 48)}}, nil},
		{"TDATTRIBUTES bit 8, production package", tdAttrs(1, 0), with(func(p *manifest.Package) { p.TDAttributesMask = "FF00FFFFFFFFFFFF" }), nil},
		{"OutOfDate refused", tdResult(tcbstatus.OutOfDate), tdPackage(), policy.ErrTCBStatus},
		{"OutOfDate accepted", tdResult(tcbstatus.OutOfDate), with(func(p *manifest.Package) { p.AcceptedTCBStatuses = []string{"OutOfDate"} }), nil},
		{"TDRelaunchAdvised refused by default", tdResult(tcbstatus.TDRelaunchAdvised), tdPackage(), policy.ErrTCBStatus},
		{"TDRelaunchAdvised accepted", tdResult(tcbstatus.TDRelaunchAdvised), with(func(p *manifest.Package) { p.AcceptedTCBStatuses = []string{"tdrelaunchadvised"} }), nil},
		{"advisory refused", tdResult(tcbstatus.SWHardeningNeeded, "INTEL-SA-1"), with(func(p *manifest.Package) { p.AcceptedAdvisories = []string{"INTEL-SA-2"} }), policy.ErrAdvisory},
		{"SGX package, TDX quote", tdResult(tcbstatus.UpToDate), manifest.Package{UniqueID: strings.Repeat("11", 32)}, policy.ErrTEE},
		{"SGX debug package, TDX quote", tdResult(tcbstatus.UpToDate), manifest.Package{Debug: true}, policy.ErrTEE},
		{"TDX package, SGX quote", result(t, tcbstatus.UpToDate), tdPackage(), policy.ErrTEE},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := policy.Check(tc.res, tc.pkg)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Check = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestTDXReportData(t *testing.T) {
	res := tdResult(tcbstatus.UpToDate)
	if err := policy.CheckReportData(res, []byte("td report data")); err != nil {
		t.Error(err)
	}
	if err := policy.CheckReportData(res, []byte("sgx")); !errors.Is(err, policy.ErrReportData) {
		t.Errorf("other report data: %v", err)
	}
}
