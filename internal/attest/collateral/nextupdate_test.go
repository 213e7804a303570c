package collateral_test

import (
	"context"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
)

// keyedProvider returns different collateral for the two CAs.
type keyedProvider map[collateral.CA]*collateral.Collateral

func (p keyedProvider) Get(_ context.Context, _ [6]byte, ca collateral.CA) (*collateral.Collateral, error) {
	return p[ca], nil
}

func TestCacheNextUpdate(t *testing.T) {
	ctx := context.Background()
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	later := pl.Collateral(t, dcaptest.CollateralOptions{NextUpdate: pl.PKI.Time.Add(48 * time.Hour)})
	sooner := pl.Collateral(t, dcaptest.CollateralOptions{NextUpdate: pl.PKI.Time.Add(2 * time.Hour)})
	_, laterUntil, err := later.Validity()
	if err != nil {
		t.Fatal(err)
	}
	_, soonerUntil, err := sooner.Validity()
	if err != nil {
		t.Fatal(err)
	}
	if !soonerUntil.Before(laterUntil) {
		t.Fatalf("test setup: %v is not before %v", soonerUntil, laterUntil)
	}
	cache := collateral.NewCache(keyedProvider{collateral.CAProcessor: later, collateral.CAPlatform: sooner},
		func() time.Time { return pl.PKI.Time })
	if got, ok := cache.NextUpdate(); ok {
		t.Errorf("empty cache: NextUpdate = %v, true", got)
	}
	if _, err := cache.Get(ctx, pl.Ext.FMSPC, collateral.CAProcessor); err != nil {
		t.Fatal(err)
	}
	if got, ok := cache.NextUpdate(); !ok || !got.Equal(laterUntil) {
		t.Errorf("one entry: NextUpdate = %v, %v; want %v", got, ok, laterUntil)
	}
	if _, err := cache.Get(ctx, pl.Ext.FMSPC, collateral.CAPlatform); err != nil {
		t.Fatal(err)
	}
	if got, ok := cache.NextUpdate(); !ok || !got.Equal(soonerUntil) {
		t.Errorf("two entries: NextUpdate = %v, %v; want the earlier %v", got, ok, soonerUntil)
	}
}
