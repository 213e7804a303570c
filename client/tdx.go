package client

import (
	"errors"
	"fmt"
	"strings"

	"github.com/quarry-cc/quarry/manifest"
)

// validateTDX checks an era config that expects a TDX guest (docs/tdx.md):
// no SGX identity; the TD fields in the format a manifest package takes;
// MRTD always, and RTMR1 and RTMR2 unless InsecureAllowUnsetRTMR1RTMR2.
//
// The manifest's rule for required fields is not reused: there, Debug
// means "a debug TD" and lifts the requirements, while in an era config
// Debug means "also accept a debug TD" and so must not weaken what a
// production TD is checked against.
func (c EraConfig) validateTDX() error {
	if c.UniqueID != "" || c.SignerID != "" || c.ProductID != 0 || c.SecurityVersion != 0 {
		return errors.New("era config: TDX measurements exclude UniqueID, SignerID, ProductID and SecurityVersion")
	}
	// Debug: true here only selects the manifest's format checks (hex
	// sizes, masks, TCB statuses) without its required fields; the era
	// config's own required fields follow.
	pkg := manifest.Package{Debug: true, AcceptedTCBStatuses: c.AcceptedTCBStatuses, TDXMeasurements: c.TDXMeasurements}
	m := &manifest.Manifest{Packages: map[string]manifest.Package{"coordinator": pkg}}
	if err := m.ValidatePackages(); err != nil {
		msg := strings.NewReplacer(" in package coordinator", "", " of package coordinator", "", "package coordinator sets", "it sets").Replace(err.Error())
		return fmt.Errorf("era config: %s", msg)
	}
	if c.MRTD == "" {
		return fmt.Errorf("era config: MRTD is missing: an era config for a TDX guest must set MRTD (the measurement of the Coordinator TD's firmware), also with Debug, which only adds debug TDs to the accepted ones; see docs/tdx.md")
	}
	if c.InsecureAllowUnsetRTMR1RTMR2 {
		return nil
	}
	for _, f := range []struct{ name, value string }{{"RTMR1", c.RTMR1}, {"RTMR2", c.RTMR2}} {
		if f.value == "" {
			return fmt.Errorf("era config: %s is missing: set RTMR1 (the kernel) and RTMR2 (the kernel command line and initrd) of the Coordinator's TD, "+
				"or set \"InsecureAllowUnsetRTMR1RTMR2\": true to accept any kernel with this firmware; see docs/tdx.md", f.name)
		}
	}
	return nil
}
