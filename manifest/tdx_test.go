package manifest

import (
	"errors"
	"strings"
	"testing"
)

var tdxManifest = `{
	"Packages": {
		"enclave": {"UniqueID": "6b2822ac2585040d4b9397675d54977a71ef292ab5b3c0a6acceca26074ae585"},
		"td": {
			"MRTD": "` + mrtdHex + `",
			"RTMR1": "` + mrtdHex + `",
			"RTMR2": "` + mrtdHex + `",
			"TDAttributes": "0000001000000000",
			"TDAttributesMask": "FFFFFFFFFFFFFFFF",
			"MinTEETCBSVN": "06010300000000000000000000000000",
			"AcceptedTCBStatuses": ["TDRelaunchAdvised"]
		}
	},
	"Marbles": {
		"sgx": {"Package": "enclave"},
		"tdx": {"Package": "td"}
	}
}`

var mrtdHex = strings.Repeat("ab", 48)

// TestTDXPackageParses: TDX fields sit at the package's top level; SGX
// packages keep meaning what they meant.
func TestTDXPackageParses(t *testing.T) {
	m, err := Parse([]byte(tdxManifest))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	td, enc := m.Packages["td"], m.Packages["enclave"]
	if !td.IsTDX() || td.MRTD != mrtdHex || td.RTMR1 != mrtdHex || td.TDAttributes != "0000001000000000" {
		t.Errorf("TDX package %+v", td)
	}
	if enc.IsTDX() {
		t.Error("SGX package reads as TDX")
	}
}

func TestTDXPackageValidation(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   func(*Package)
		field string
	}{
		{"SGX and TDX", func(p *Package) { p.UniqueID = strings.Repeat("a", 64) }, "UniqueID"},
		{"SignerID and TDX", func(p *Package) { p.SignerID = strings.Repeat("a", 64) }, "SignerID"},
		{"ProductID and TDX", func(p *Package) { p.ProductID = ptr(uint64(1)) }, "ProductID"},
		{"MRTD short", func(p *Package) { p.MRTD = "abcd" }, "MRTD"},
		{"MRTD not hex", func(p *Package) { p.MRTD = strings.Repeat("zz", 48) }, "MRTD"},
		{"RTMR3 long", func(p *Package) { p.RTMR3 = mrtdHex + "00" }, "RTMR3"},
		{"MRSEAM short", func(p *Package) { p.MRSEAM = "00" }, "MRSEAM"},
		{"MRSIGNERSEAM short", func(p *Package) { p.MRSIGNERSEAM = "00" }, "MRSIGNERSEAM"},
		{"XFAM short", func(p *Package) { p.XFAM = "e702" }, "XFAM"},
		{"XFAMMask without XFAM", func(p *Package) { p.XFAMMask = "ffffffffffffffff" }, "XFAMMask"},
		{"TDAttributesMask without value", func(p *Package) { p.TDAttributes, p.TDAttributesMask = "", "ffffffffffffffff" }, "TDAttributesMask"},
		{"MinTEETCBSVN short", func(p *Package) { p.MinTEETCBSVN = "0601" }, "MinTEETCBSVN"},
		{"no MRTD", func(p *Package) { p.MRTD = "" }, "MRTD"},
		{"no RTMR1", func(p *Package) { p.RTMR1 = "" }, "RTMR1"},
		{"no RTMR2", func(p *Package) { p.RTMR2 = "" }, "RTMR2"},
		{"no TDAttributes", func(p *Package) { p.TDAttributes, p.TDAttributesMask = "", "" }, "TDAttributes"},
		{"MRTD only", func(p *Package) { p.TDXMeasurements = TDXMeasurements{MRTD: mrtdHex} }, "RTMR1"},
		{"MRTD and RTMR1 only", func(p *Package) { p.TDXMeasurements = TDXMeasurements{MRTD: mrtdHex, RTMR1: mrtdHex} }, "RTMR2"},
		{"all but TDAttributes", func(p *Package) {
			p.TDXMeasurements = TDXMeasurements{MRTD: mrtdHex, RTMR0: mrtdHex, RTMR1: mrtdHex, RTMR2: mrtdHex, RTMR3: mrtdHex, XFAM: "e702060000000000"}
		}, "TDAttributes"},
		{"unknown status", func(p *Package) { p.AcceptedTCBStatuses = []string{"Fine"} }, "AcceptedTCBStatuses"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tdxManifest))
			if err != nil {
				t.Fatal(err)
			}
			setPackage(m, "td", tc.set)
			err = m.Validate()
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Section != "Packages" || ve.Name != "td" || ve.Field != tc.field {
				t.Fatalf("Validate = %v, want a Packages/td/%s error", err, tc.field)
			}
		})
	}
	// A debug TDX package needs none of MRTD, RTMR1, RTMR2 and
	// TDAttributes; SGX packages may not accept the TDX-only statuses.
	m, _ := Parse([]byte(tdxManifest))
	setPackage(m, "td", func(p *Package) { p.TDXMeasurements, p.Debug = TDXMeasurements{RTMR0: mrtdHex}, true })
	if err := m.Validate(); err != nil {
		t.Errorf("debug TDX package without MRTD, RTMR1, RTMR2, TDAttributes: %v", err)
	}
	m, _ = Parse([]byte(tdxManifest))
	setPackage(m, "enclave", func(p *Package) { p.AcceptedTCBStatuses = []string{"TDRelaunchAdvised"} })
	if err := m.Validate(); err == nil {
		t.Error("SGX package accepts TDRelaunchAdvised")
	}
}

// TestTDXPackageUpdate: a package update neither carries TDX measurements
// nor gives a TDX package a SecurityVersion.
func TestTDXPackageUpdate(t *testing.T) {
	m, err := Parse([]byte(tdxManifest))
	if err != nil {
		t.Fatal(err)
	}
	for name, upd := range map[string]map[string]Package{
		"SecurityVersion for a TDX package": {"td": {SecurityVersion: ptr(uint(3))}},
		"TDX measurements in an update":     {"enclave": {SecurityVersion: ptr(uint(3)), TDXMeasurements: TDXMeasurements{MRTD: mrtdHex}}},
	} {
		err := (&Manifest{Packages: upd}).ValidatePackageUpdate(m.Packages)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := (&Manifest{Packages: map[string]Package{"enclave": {SecurityVersion: ptr(uint(3))}}}).ValidatePackageUpdate(m.Packages); err != nil {
		t.Errorf("SGX update: %v", err)
	}
}

// TestTDXPackageMissingFieldMessage: the refusal of a production TDX package
// that pins only MRTD names the missing field, the package and what to set.
func TestTDXPackageMissingFieldMessage(t *testing.T) {
	m, err := Parse([]byte(`{"Packages":{"vm":{"MRTD":"` + mrtdHex + `","TDAttributes":"0000001000000000"}},"Marbles":{"app":{"Package":"vm"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Validate()
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Field != "RTMR1" || ve.Name != "vm" {
		t.Fatalf("Validate = %v, want a Packages/vm/RTMR1 error", err)
	}
	for _, want := range []string{"manifest misses value for RTMR1 in TDX package vm", "not Debug", "RTMR2", "TDAttributes", "docs/tdx.md"} {
		if !strings.Contains(ve.Message, want) {
			t.Errorf("message %q does not say %q", ve.Message, want)
		}
	}
}
