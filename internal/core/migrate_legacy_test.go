package core

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
)

// checkLegacyRefusal: the message says what is wrong and what to do.
func checkLegacyRefusal(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrMigration) {
		t.Fatalf("legacy key: %v", err)
	}
	for _, want := range []string{"16 bytes", "before 1.9.0", "32-byte", "RecoveryKeys", "MarbleRun 1.9"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the message lacks %q: %v", want, err)
		}
	}
}

// TestMigrateLegacyDataKeyRefused: a 16-byte legacy data key is refused with
// a clear message, at start, in the dry run and after a recovery with it;
// nothing is written or copied.
func TestMigrateLegacyDataKeyRefused(t *testing.T) {
	data, key := readVector(t, "single").WithLegacyKey(t)
	ctx := context.Background()
	t.Run("sealed_key", func(t *testing.T) {
		s := newStores()
		s.data.Save(ctx, data, "")
		s.key.Save(ctx, key, "")
		_, err := migrateCore(t, s)
		checkLegacyRefusal(t, err)
		_, err = InspectMigration(ctx, s.data, s.key, seal.SimulationKeySealer{}, MigrateMarbleRunAuto)
		checkLegacyRefusal(t, err)
		unchanged(t, s, data, key)
		if _, ok := s.data.Aside("memory:marblerun-" + testStamp); ok {
			t.Error("a copy was made although nothing was migrated")
		}
	})
	t.Run("recovery", func(t *testing.T) {
		s := newStores()
		s.data.Save(ctx, data, "")
		c, err := migrateCore(t, s)
		if err != nil {
			t.Fatal(err)
		}
		if c.Status() != StateRecovery {
			t.Fatalf("state %d, want recovery mode", c.Status())
		}
		// The single key's recovery secret is the 16-byte data key.
		_, err = c.RecoverUnsigned(ctx, key)
		checkLegacyRefusal(t, err)
		if !errors.Is(err, ErrConflict) {
			t.Errorf("not a conflict: %v", err)
		}
		if c.Status() != StateRecovery {
			t.Error("left recovery mode")
		}
		unchanged(t, s, data, nil)
	})
}
