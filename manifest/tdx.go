package manifest

import (
	"encoding/hex"
	"slices"
	"strings"
)

// TDX field sizes in hex digits.
const (
	tdxMeasurementHexDigits = 96 // 48-byte SHA-384 registers
	tdxAttributesHexDigits  = 16 // 8-byte TDATTRIBUTES / XFAM
	tdxTCBSVNHexDigits      = 32 // 16-byte TEE_TCB_SVN
)

// tdxTCBStatuses are the statuses only a TDX quote can have, acceptable in
// the AcceptedTCBStatuses of a TDX package.
var tdxTCBStatuses = []string{"TDRelaunchAdvised", "TDRelaunchAdvisedConfigurationNeeded"}

// TDXMeasurements are the fields of a package that describes a TDX guest
// instead of an SGX enclave (docs/tdx.md). They are embedded in Package, so
// they appear at the package's top level in the manifest. A package that
// sets any of them is a TDX package and may not set UniqueID, SignerID,
// ProductID or SecurityVersion. Values are hex of the bytes as they stand in
// the TD report (any case). Debug is compared with the TD's debug state:
// any of TDATTRIBUTES bits 7:0 (the "TD under debug" group). A package
// that is not Debug must set MRTD, RTMR1, RTMR2 and TDAttributes.
type TDXMeasurements struct {
	// MRTD is the TD's build-time measurement (96 hex digits); required
	// unless Debug is set.
	MRTD string `json:",omitempty"`
	// RTMR0 to RTMR3 are the run-time measurement registers (96 hex digits
	// each), compared when set; RTMR1 and RTMR2 are required unless Debug
	// is set.
	RTMR0 string `json:",omitempty"`
	RTMR1 string `json:",omitempty"`
	RTMR2 string `json:",omitempty"`
	RTMR3 string `json:",omitempty"`
	// MRSEAM and MRSIGNERSEAM pin the TDX module (96 hex digits), when set.
	MRSEAM       string `json:",omitempty"`
	MRSIGNERSEAM string `json:",omitempty"`
	// TDAttributes and XFAM (16 hex digits, the 8 bytes as in the report)
	// must equal the report's bits selected by their masks; a mask left
	// empty means all bits (an exact comparison). Without a value the
	// field is not compared (Debug still is); TDAttributes is required
	// unless Debug is set.
	TDAttributes     string `json:",omitempty"`
	TDAttributesMask string `json:",omitempty"`
	XFAM             string `json:",omitempty"`
	XFAMMask         string `json:",omitempty"`
	// MinTEETCBSVN (32 hex digits) is a lower bound for every byte of the
	// report's TEE_TCB_SVN (TDX module SVN, major version, microcode, …).
	MinTEETCBSVN string `json:",omitempty"`
}

// IsTDX reports whether the package describes a TDX guest: any TDX field is
// set.
func (p Package) IsTDX() bool { return p.TDXMeasurements != (TDXMeasurements{}) }

// tdxFields lists the TDX fields with their names and hex sizes.
func (t TDXMeasurements) fields() []struct {
	name, value string
	digits      int
} {
	return []struct {
		name, value string
		digits      int
	}{
		{"MRTD", t.MRTD, tdxMeasurementHexDigits},
		{"RTMR0", t.RTMR0, tdxMeasurementHexDigits},
		{"RTMR1", t.RTMR1, tdxMeasurementHexDigits},
		{"RTMR2", t.RTMR2, tdxMeasurementHexDigits},
		{"RTMR3", t.RTMR3, tdxMeasurementHexDigits},
		{"MRSEAM", t.MRSEAM, tdxMeasurementHexDigits},
		{"MRSIGNERSEAM", t.MRSIGNERSEAM, tdxMeasurementHexDigits},
		{"TDAttributes", t.TDAttributes, tdxAttributesHexDigits},
		{"TDAttributesMask", t.TDAttributesMask, tdxAttributesHexDigits},
		{"XFAM", t.XFAM, tdxAttributesHexDigits},
		{"XFAMMask", t.XFAMMask, tdxAttributesHexDigits},
		{"MinTEETCBSVN", t.MinTEETCBSVN, tdxTCBSVNHexDigits},
	}
}

// checkTDXPackages validates TDX packages: SGX or TDX, never both; hex
// lengths; a mask only with its value; unless Debug, MRTD, RTMR1, RTMR2 and
// TDAttributes.
func (m *Manifest) checkTDXPackages() *ValidationError {
	for _, name := range sorted(m.Packages) {
		p := m.Packages[name]
		if !p.IsTDX() {
			continue
		}
		for _, f := range []struct {
			name string
			set  bool
		}{{"UniqueID", p.UniqueID != ""}, {"SignerID", p.SignerID != ""}, {"ProductID", p.ProductID != nil}, {"SecurityVersion", p.SecurityVersion != nil}} {
			if f.set {
				return invalid(sectionPackages, name, f.name, "package %s sets both the SGX field %s and TDX fields; a package describes an SGX enclave or a TDX guest, never both", name, f.name)
			}
		}
		for _, f := range p.TDXMeasurements.fields() {
			if f.value == "" {
				continue
			}
			if _, err := hex.DecodeString(f.value); err != nil || len(f.value) != f.digits {
				return invalid(sectionPackages, name, f.name, "invalid %s in package %s: want %d hexadecimal digits (%d bytes), got %s",
					f.name, name, f.digits, f.digits/2, quoteClipped(f.value))
			}
		}
		if p.TDAttributesMask != "" && p.TDAttributes == "" {
			return invalid(sectionPackages, name, "TDAttributesMask", "package %s sets TDAttributesMask without TDAttributes", name)
		}
		if p.XFAMMask != "" && p.XFAM == "" {
			return invalid(sectionPackages, name, "XFAMMask", "package %s sets XFAMMask without XFAM", name)
		}
		if p.Debug {
			continue
		}
		for _, f := range []struct{ name, value string }{
			{"MRTD", p.MRTD}, {"RTMR1", p.RTMR1}, {"RTMR2", p.RTMR2}, {"TDAttributes", p.TDAttributes},
		} {
			if f.value == "" {
				return invalid(sectionPackages, name, f.name, "manifest misses value for %s in TDX package %s: %s", f.name, name, tdxRequiredHint)
			}
		}
	}
	return nil
}

// tdxRequiredHint explains the fields a TDX package that is not Debug must
// set (docs/tdx.md): MRTD alone pins only the firmware, so any kernel,
// initrd and command line would run under it, and TDAttributes pins
// SEPT_VE_DISABLE and the other TD attributes.
const tdxRequiredHint = "a TDX package that is not Debug must set MRTD (firmware), RTMR1 (kernel), RTMR2 (kernel command line and initrd) and TDAttributes (for example 0000001000000000, SEPT_VE_DISABLE); see docs/tdx.md"

// acceptedStatusKnown reports whether status may stand in the
// AcceptedTCBStatuses of p.
func (p Package) acceptedStatusKnown(status string) bool {
	eq := func(s string) bool { return strings.EqualFold(s, status) }
	return slices.ContainsFunc(tcbStatuses, eq) || (p.IsTDX() && slices.ContainsFunc(tdxTCBStatuses, eq))
}

// ValidatePackages runs only the checks of the Packages section (SGX and
// TDX fields, value formats), for callers that describe one expected
// enclave or TD outside a manifest (the SDK's era config).
func (m *Manifest) ValidatePackages() error {
	for _, check := range []func() *ValidationError{m.checkPackages, m.checkTDXPackages, m.checkPackageValues} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}
