package loadgen

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/manifest"
)

func userPEM(t *testing.T) string {
	t.Helper()
	_, text, err := NewUserCertificate("tester")
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// parsed generates a manifest and checks it the way the Coordinator does.
func parsed(t *testing.T, o ManifestOptions) ([]byte, ManifestInfo, *manifest.Manifest) {
	t.Helper()
	raw, info, err := GenerateManifest(o)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Parse(raw)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("Validate: %v\n%s", err, raw)
	}
	if info.Bytes != len(raw) {
		t.Fatalf("info.Bytes = %d, len = %d", info.Bytes, len(raw))
	}
	return raw, info, m
}

func typeCounts(m *manifest.Manifest) map[string]int {
	c := map[string]int{}
	for _, s := range m.Secrets {
		if !s.Shared || s.UserDefined {
			c["not shared or user-defined"]++
		}
		c[s.Type]++
		if s.Type == manifest.SecretTypeCertRSA && s.Size != 2048 {
			c["rsa not 2048"]++
		}
	}
	return c
}

func TestGenerateManifestDefault(t *testing.T) {
	pemText := userPEM(t)
	raw, info, m := parsed(t, ManifestOptions{TargetBytes: 12800, Secrets: 50, Mix: DefaultMix, UserCertPEM: pemText})
	if len(raw) != 12800 {
		t.Errorf("size %d, want exactly 12800 (12.5 KiB)", len(raw))
	}
	want := map[string]int{
		manifest.SecretTypeCertRSA:     10,
		manifest.SecretTypeCertECDSA:   20,
		manifest.SecretTypeCertED25519: 10,
		manifest.SecretTypeSymmetric:   10,
	}
	if got := typeCounts(m); !mapsEqual(got, want) {
		t.Errorf("secret types %v, want %v", got, want)
	}
	if (info.Mix != Mix{RSA: 10, ECDSA: 20, Ed25519: 10, Symmetric: 10}) || info.Secrets != 50 {
		t.Errorf("info %+v", info)
	}
	if len(m.Packages) < 2 || len(m.Marbles) < 2 || info.Marbles != len(m.Marbles) || info.Packages != len(m.Packages) {
		t.Errorf("%d packages, %d Marbles; info %+v", len(m.Packages), len(m.Marbles), info)
	}
	// The user may read ReadableSecret, a symmetric key.
	u, ok := m.Users[BenchUser]
	if !ok || u.Certificate != pemText {
		t.Fatalf("user %q missing or with another certificate", BenchUser)
	}
	if m.Secrets[info.ReadableSecret].Type != manifest.SecretTypeSymmetric {
		t.Errorf("readable secret %q is not a symmetric key", info.ReadableSecret)
	}
	var readable bool
	for _, role := range u.Roles {
		r := m.Roles[role]
		if r.ResourceType == manifest.ResourceSecrets && slices.Contains(r.ResourceNames, info.ReadableSecret) &&
			slices.Contains(r.Actions, manifest.ActionReadSecret) {
			readable = true
		}
	}
	if !readable {
		t.Errorf("user %s has no ReadSecret role on %s", BenchUser, info.ReadableSecret)
	}
	// Deterministic for the same options.
	again, _, err := GenerateManifest(ManifestOptions{TargetBytes: 12800, Secrets: 50, Mix: DefaultMix, UserCertPEM: pemText})
	if err != nil || !bytes.Equal(raw, again) {
		t.Error("two manifests from the same options differ")
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestGenerateManifestSizes(t *testing.T) {
	pemText := userPEM(t)
	for _, kb := range []float64{4, 12.5, 64, 1024} {
		target := int(kb * 1024)
		raw, _, _ := parsed(t, ManifestOptions{TargetBytes: target, Secrets: 10, Mix: DefaultMix, UserCertPEM: pemText})
		if len(raw) != target {
			t.Errorf("%g KiB: size %d, want %d", kb, len(raw), target)
		}
	}
	// Secrets that need more room than the target: larger, still valid.
	raw, info, m := parsed(t, ManifestOptions{TargetBytes: 1024, Secrets: 120, Mix: DefaultMix, UserCertPEM: pemText})
	if len(raw) <= 1024 || len(m.Secrets) != 120 || info.Secrets != 120 {
		t.Errorf("size %d with %d secrets", len(raw), len(m.Secrets))
	}
}

func TestGenerateManifestMixes(t *testing.T) {
	pemText := userPEM(t)
	tests := []struct {
		n    int
		mix  Mix
		want map[string]int
	}{
		// 7 × (10, 20, 10, 10)/50 = 1.4, 2.8, 1.4, 1.4: the two largest
		// remainders (ECDSA, then RSA, the first of the ties) get one more.
		{7, DefaultMix, map[string]int{"cert-rsa": 2, "cert-ecdsa": 3, "cert-ed25519": 1, "symmetric-key": 1}},
		{3, Mix{ECDSA: 1}, map[string]int{"cert-ecdsa": 3}},
		{4, Mix{Symmetric: 1, Ed25519: 1}, map[string]int{"cert-ed25519": 2, "symmetric-key": 2}},
		{0, DefaultMix, map[string]int{}},
	}
	for _, tt := range tests {
		_, info, m := parsed(t, ManifestOptions{TargetBytes: 8 << 10, Secrets: tt.n, Mix: tt.mix, UserCertPEM: pemText})
		if got := typeCounts(m); !mapsEqual(got, tt.want) {
			t.Errorf("%d secrets, mix %v: types %v, want %v", tt.n, tt.mix, got, tt.want)
		}
		if tt.n == 0 && (info.ReadableSecret != "" || len(m.Roles) != 0) {
			t.Errorf("no secrets but readable %q, roles %v", info.ReadableSecret, m.Roles)
		}
		if tt.n > 0 && m.Secrets[info.ReadableSecret].Type == "" {
			t.Errorf("mix %v: readable secret %q not in the manifest", tt.mix, info.ReadableSecret)
		}
	}
	// Without a user certificate: no users, still valid.
	_, _, m := parsed(t, ManifestOptions{TargetBytes: 2048, Secrets: 4, Mix: DefaultMix})
	if len(m.Users) != 0 {
		t.Errorf("users without a certificate: %v", m.Users)
	}
	if _, _, err := GenerateManifest(ManifestOptions{Secrets: 5}); err == nil {
		t.Error("a mix without weights was accepted")
	}
}

func TestMixCounts(t *testing.T) {
	if got := DefaultMix.Counts(50); got != (Mix{10, 20, 10, 10}) {
		t.Errorf("Counts(50) = %+v", got)
	}
	if got := DefaultMix.Counts(100); got != (Mix{20, 40, 20, 20}) {
		t.Errorf("Counts(100) = %+v", got)
	}
	// Always n in all, each type within one of its exact share.
	for n := range 60 {
		c := DefaultMix.Counts(n)
		exact := []float64{float64(n) / 5, float64(n) * 2 / 5, float64(n) / 5, float64(n) / 5}
		for i, got := range []int{c.RSA, c.ECDSA, c.Ed25519, c.Symmetric} {
			if d := float64(got) - exact[i]; d <= -1 || d >= 1 {
				t.Errorf("Counts(%d) = %+v: type %d is %d, share %.1f", n, c, i, got, exact[i])
			}
		}
		if c.total() != n {
			t.Errorf("Counts(%d) = %+v adds up to %d", n, c, c.total())
		}
	}
	if got := (Mix{}).Counts(5); got != (Mix{}) {
		t.Errorf("zero mix: %+v", got)
	}
}

func TestParseMix(t *testing.T) {
	good := map[string]Mix{
		"rsa=10,ecdsa=20,ed25519=10,symmetric=10": DefaultMix,
		DefaultMix.String():                       DefaultMix,
		" RSA=1 , sym=3 ":                         {RSA: 1, Symmetric: 3},
		"ecdsa=5":                                 {ECDSA: 5},
	}
	for in, want := range good {
		got, err := ParseMix(in)
		if err != nil || got != want {
			t.Errorf("ParseMix(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "rsa=0", "rsa", "rsa=-1", "rsa=x", "dsa=3", "rsa=1,rsa=2", "10:20:10:10"} {
		if _, err := ParseMix(in); err == nil {
			t.Errorf("ParseMix(%q) accepted", in)
		} else if !strings.Contains(err.Error(), "mix") {
			t.Errorf("ParseMix(%q): error %q does not name the flag value", in, err)
		}
	}
}

func TestSetRequest(t *testing.T) {
	body, err := SetRequest([]byte(`{"Packages":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"manifest":"eyJQYWNrYWdlcyI6e319"}`; string(body) != want {
		t.Errorf("SetRequest = %s, want %s", body, want)
	}
}
