package policy

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
	"github.com/quarry-cc/quarry/manifest"
)

// Reasons a TDX quote does not satisfy a package, or a quote of the other
// kind is refused.
var (
	ErrTEE          = errors.New("policy: quote kind does not match the package (SGX enclave or TDX guest)")
	ErrMRTD         = errors.New("policy: MRTD does not match the package")
	ErrRTMR         = errors.New("policy: RTMR does not match the package")
	ErrMRSEAM       = errors.New("policy: MRSEAM does not match the package")
	ErrMRSIGNERSEAM = errors.New("policy: MRSIGNERSEAM does not match the package")
	ErrTDAttributes = errors.New("policy: TD attributes do not match the package")
	ErrXFAM         = errors.New("policy: XFAM does not match the package")
	ErrTEETCBSVN    = errors.New("policy: TEE_TCB_SVN below the package's MinTEETCBSVN")
)

// checkTEE refuses an SGX quote for a TDX package and the reverse.
func checkTEE(res *dcap.Result, pkg manifest.Package) error {
	switch {
	case res.TDX != nil && !pkg.IsTDX():
		return fmt.Errorf("%w: a TDX quote for an SGX package", ErrTEE)
	case res.TDX == nil && pkg.IsTDX():
		return fmt.Errorf("%w: an SGX quote for a TDX package", ErrTEE)
	}
	return nil
}

// checkTD compares a verified TD report with a TDX package: Debug with the
// TD's debug state (any of TDATTRIBUTES bits 7:0, the "TD under debug"
// group; tdxquote.TDReport.Debug), then each measurement the package names
// (hex, any case), the masked attributes and the minimum TEE_TCB_SVN.
func checkTD(r *tdxquote.TDReport, pkg manifest.Package) error {
	if r.Debug() != pkg.Debug {
		return fmt.Errorf("%w: TD debug=%v (TDATTRIBUTES %x; any of bits 7:0 makes a debug TD), package Debug=%v", ErrDebug, r.Debug(), r.TDAttributes, pkg.Debug)
	}
	for _, m := range []struct {
		want string
		got  []byte
		err  error
		name string
	}{
		{pkg.MRTD, r.MRTD[:], ErrMRTD, "MRTD"},
		{pkg.RTMR0, r.RTMR[0][:], ErrRTMR, "RTMR0"},
		{pkg.RTMR1, r.RTMR[1][:], ErrRTMR, "RTMR1"},
		{pkg.RTMR2, r.RTMR[2][:], ErrRTMR, "RTMR2"},
		{pkg.RTMR3, r.RTMR[3][:], ErrRTMR, "RTMR3"},
		{pkg.MRSEAM, r.MRSEAM[:], ErrMRSEAM, "MRSEAM"},
		{pkg.MRSIGNERSEAM, r.MRSIGNERSEAM[:], ErrMRSIGNERSEAM, "MRSIGNERSEAM"},
	} {
		if m.want != "" && !strings.EqualFold(hex.EncodeToString(m.got), m.want) {
			return fmt.Errorf("%w: %s is %x, package %s", m.err, m.name, m.got, m.want)
		}
	}
	if err := masked(r.TDAttributes[:], pkg.TDAttributes, pkg.TDAttributesMask, ErrTDAttributes); err != nil {
		return err
	}
	if err := masked(r.XFAM[:], pkg.XFAM, pkg.XFAMMask, ErrXFAM); err != nil {
		return err
	}
	if pkg.MinTEETCBSVN != "" {
		min, err := hex.DecodeString(pkg.MinTEETCBSVN)
		if err != nil || len(min) != len(r.TEETCBSVN) {
			return fmt.Errorf("%w: package value %q is not 16 bytes of hex", ErrTEETCBSVN, pkg.MinTEETCBSVN)
		}
		for i := range min {
			if r.TEETCBSVN[i] < min[i] {
				return fmt.Errorf("%w: byte %d is %d, package minimum %d", ErrTEETCBSVN, i, r.TEETCBSVN[i], min[i])
			}
		}
	}
	return nil
}

// masked compares got&mask with want&mask; an empty mask means all bits, an
// empty want skips the comparison.
func masked(got []byte, want, mask string, reason error) error {
	if want == "" {
		return nil
	}
	w, err := hex.DecodeString(want)
	if err != nil || len(w) != len(got) {
		return fmt.Errorf("%w: package value %q is not %d bytes of hex", reason, want, len(got))
	}
	m := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if mask != "" {
		if m, err = hex.DecodeString(mask); err != nil || len(m) != len(got) {
			return fmt.Errorf("%w: package mask %q is not %d bytes of hex", reason, mask, len(got))
		}
	}
	for i := range got {
		if got[i]&m[i] != w[i]&m[i] {
			return fmt.Errorf("%w: report %x, package %s under mask %x", reason, got, want, m)
		}
	}
	return nil
}
