package dcap

import (
	"crypto/x509"
	"testing"
	"time"
)

// TestCollateralCacheBounded: however many different collaterals are kept,
// at most maxCachedCollaterals stay.
func TestCollateralCacheBounded(t *testing.T) {
	ForgetCollaterals()
	t.Cleanup(ForgetCollaterals)
	for i := range 3 * maxCachedCollaterals {
		storeCollateral(collateralKey{byte(i), byte(i >> 8)}, &checkedCollateral{})
	}
	if n := CachedCollaterals(); n != maxCachedCollaterals {
		t.Fatalf("%d collaterals kept, want at most and (once full) exactly %d", n, maxCachedCollaterals)
	}
}

// TestCheckedCollateralValidAt: a kept collateral is used only while every
// certificate of its issuer chains is within its validity period, the
// bounds included (as x509.Certificate.Verify counts them).
func TestCheckedCollateralValidAt(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	signer := &x509.Certificate{NotBefore: t0, NotAfter: t0.Add(time.Hour)}
	root := &x509.Certificate{NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(2 * time.Hour)}
	c := &checkedCollateral{chains: [][]*x509.Certificate{{root}, {signer, root}}}
	for _, tc := range []struct {
		at   time.Time
		want bool
	}{
		{t0.Add(-time.Second), false},
		{t0, true},
		{t0.Add(time.Hour), true},
		{t0.Add(time.Hour + time.Second), false},
	} {
		if got := c.validAt(tc.at); got != tc.want {
			t.Errorf("validAt(%s) = %v, want %v", tc.at, got, tc.want)
		}
	}
}
