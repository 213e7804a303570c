package secrets

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/manifest"
)

func TestEstimateWork(t *testing.T) {
	rsa := func(bits uint) manifest.Secret {
		return manifest.Secret{Type: manifest.SecretTypeCertRSA, Size: bits, Shared: true}
	}
	if w2, w4 := EstimateWork(map[string]manifest.Secret{"a": rsa(2048)}), EstimateWork(map[string]manifest.Secret{"a": rsa(4096)}); w4 != 16*w2 {
		t.Errorf("RSA-4096 estimate %s is not 16 × RSA-2048 %s", w4, w2)
	}
	// Per-Marble and user-defined secrets are not generated at set.
	if w := EstimateWork(map[string]manifest.Secret{
		"perMarble": {Type: manifest.SecretTypeCertRSA, Size: 4096},
		"user":      {Type: manifest.SecretTypeCertRSA, Size: 4096, Shared: true, UserDefined: true},
	}); w != 0 {
		t.Errorf("estimate of secrets not generated at set = %s", w)
	}
}

func TestLimitsCheck(t *testing.T) {
	many := map[string]manifest.Secret{}
	for i := range 100 {
		many[fmt.Sprint("k", i)] = manifest.Secret{Type: manifest.SecretTypeCertRSA, Size: 4096, Shared: true}
	}
	for _, tc := range []struct {
		name   string
		limits Limits
		defs   map[string]manifest.Secret
		want   string // "" = accepted
	}{
		{"defaults accept a small manifest", DefaultLimits(), map[string]manifest.Secret{"a": {Type: manifest.SecretTypeSymmetric, Size: 128, Shared: true}}, ""},
		{"100 RSA-4096 are too much work", DefaultLimits(), many, "QUARRY_MAX_SECRET_GENERATION"},
		{"count", Limits{MaxSecrets: 99}, many, "QUARRY_MAX_SECRETS"},
		{"zero means no limit", Limits{}, many, ""},
		{"work limit raised", Limits{MaxWork: time.Hour}, many, ""},
	} {
		err := tc.limits.Check(tc.defs)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want ErrInvalid naming %s", tc.name, err, tc.want)
		}
	}
}
