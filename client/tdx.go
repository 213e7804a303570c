package client

import (
	"errors"
	"fmt"
	"strings"

	"github.com/quarry-cc/quarry/manifest"
)

// validateTDX checks an era config that expects a TDX guest: no SGX
// identity, and TD measurements a manifest package would accept.
func (c EraConfig) validateTDX() error {
	if c.UniqueID != "" || c.SignerID != "" || c.ProductID != 0 || c.SecurityVersion != 0 {
		return errors.New("era config: TDX measurements exclude UniqueID, SignerID, ProductID and SecurityVersion")
	}
	pkg := manifest.Package{Debug: c.Debug, AcceptedTCBStatuses: c.AcceptedTCBStatuses, TDXMeasurements: c.TDXMeasurements}
	m := &manifest.Manifest{Packages: map[string]manifest.Package{"coordinator": pkg}}
	if err := m.ValidatePackages(); err != nil {
		return fmt.Errorf("era config: %s", strings.ReplaceAll(err.Error(), " in TDX package coordinator", ""))
	}
	return nil
}
