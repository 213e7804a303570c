package manifest

import (
	"errors"
	"reflect"
	"testing"
)

func TestIsPackageUpdate(t *testing.T) {
	tests := []struct {
		name string
		m    *Manifest
		want bool
	}{
		{"packages only", &Manifest{Packages: map[string]Package{"p": {}}}, true},
		{"empty", &Manifest{}, true},
		{"config is ignored", &Manifest{Packages: map[string]Package{"p": {}}, Config: Config{SealMode: "x", UpdateThreshold: 1}}, true},
		{"empty maps", &Manifest{Marbles: map[string]Marble{}, Users: map[string]User{}}, true},
		{"infrastructures", &Manifest{Infrastructures: map[string]Infrastructure{"i": {}}}, false},
		{"marbles", &Manifest{Marbles: map[string]Marble{"m": {}}}, false},
		{"users", &Manifest{Users: map[string]User{"u": {}}}, false},
		{"recovery keys", &Manifest{RecoveryKeys: map[string]string{"k": ""}}, false},
		{"roles", &Manifest{Roles: map[string]Role{"r": {}}}, false},
		{"secrets", &Manifest{Secrets: map[string]Secret{"s": {}}}, false},
		{"TLS", &Manifest{TLS: map[string]TLSTag{"t": {}}}, false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		if got := tt.m.IsPackageUpdate(); got != tt.want {
			t.Errorf("%s: IsPackageUpdate() = %v, want %v", tt.name, got, tt.want)
		}
	}
	if loadFixture(t, "manifest.json").IsPackageUpdate() {
		t.Error("the full fixture is a package update")
	}
}

func TestValidatePackageUpdate(t *testing.T) {
	current := map[string]Package{
		"backend":  {SignerID: "ab", ProductID: ptr[uint64](1), SecurityVersion: ptr[uint](5)},
		"frontend": {UniqueID: "cd"},
	}
	tests := []struct {
		name     string
		packages map[string]Package
		pkg      string
		field    string
		want     string // "" means valid
	}{
		{"raise", map[string]Package{"backend": {SecurityVersion: ptr[uint](6)}}, "", "", ""},
		{"equal is a no-op", map[string]Package{"backend": {SecurityVersion: ptr[uint](5)}}, "", "", ""},
		{"current without SVN", map[string]Package{"frontend": {SecurityVersion: ptr[uint](0)}}, "", "", ""},
		{"TCB fields are ignored", map[string]Package{"backend": {SecurityVersion: ptr[uint](7), AcceptedTCBStatuses: []string{"x"}, AcceptedAdvisories: []string{"y"}}}, "", "", ""},
		{"Debug false is allowed", map[string]Package{"backend": {Debug: false, SecurityVersion: ptr[uint](5)}}, "", "", ""},
		{"no packages", nil, "", "", "no packages defined"},
		{"unknown package", map[string]Package{"backend": {SecurityVersion: ptr[uint](6)}, "nope": {SecurityVersion: ptr[uint](1)}}, "nope", "",
			"update manifest specifies package nope, which the current manifest does not contain"},
		{"existence before values", map[string]Package{"backend": {Debug: true}, "nope": {}}, "nope", "",
			"update manifest specifies package nope, which the current manifest does not contain"},
		{"debug", map[string]Package{"backend": {Debug: true, SecurityVersion: ptr[uint](6)}}, "backend", "Debug", "update manifest contains unupdatable values"},
		{"UniqueID", map[string]Package{"backend": {UniqueID: "x", SecurityVersion: ptr[uint](6)}}, "backend", "UniqueID", "update manifest contains unupdatable values"},
		{"SignerID", map[string]Package{"backend": {SignerID: "ab", SecurityVersion: ptr[uint](6)}}, "backend", "SignerID", "update manifest contains unupdatable values"},
		{"ProductID", map[string]Package{"backend": {ProductID: ptr[uint64](1), SecurityVersion: ptr[uint](6)}}, "backend", "ProductID", "update manifest contains unupdatable values"},
		{"no SecurityVersion", map[string]Package{"backend": {}}, "backend", "SecurityVersion", "update manifest does not specify a SecurityVersion to update"},
		{"downgrade", map[string]Package{"backend": {SecurityVersion: ptr[uint](4)}}, "backend", "SecurityVersion", "update manifest tries to downgrade SecurityVersion of the original manifest"},
		{"sorted order", map[string]Package{"frontend": {}, "backend": {SecurityVersion: ptr[uint](4)}}, "backend", "SecurityVersion", "update manifest tries to downgrade SecurityVersion of the original manifest"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &Manifest{Packages: tt.packages}
			err := m.ValidatePackageUpdate(current)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("ValidatePackageUpdate: %v", err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not a *ValidationError wrapping ErrInvalid", err)
			}
			if verr.Message != tt.want || verr.Section != "Packages" || verr.Name != tt.pkg || verr.Field != tt.field {
				t.Errorf("got %+v, want %q in %s.%s", verr, tt.want, tt.pkg, tt.field)
			}
			if verr.Stage() != "checking update manifest" {
				t.Errorf("Stage() = %q", verr.Stage())
			}
		})
	}
	var nilManifest *Manifest
	if err := nilManifest.ValidatePackageUpdate(current); err == nil || err.Error() != "no packages defined" {
		t.Errorf("nil manifest: %v", err)
	}
}

func TestUpdateManifestUsers(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m *Manifest)
		want   []string
	}{
		{"fixture", func(*Manifest) {}, []string{"alice", "bob"}},
		{"any action, any case", func(m *Manifest) {
			m.Roles["late"] = Role{ResourceType: ResourceManifest, Actions: []string{"Other", "UPDATEMANIFEST"}}
			setUser(m, "carol", func(u *User) { u.Roles = append(u.Roles, "late") })
		}, []string{"alice", "bob", "carol"}},
		{"resource type is case-sensitive", func(m *Manifest) {
			setRole(m, "updateManifest", func(r *Role) { r.ResourceType = "manifest" })
		}, nil},
		{"other resource types do not count", func(m *Manifest) {
			m.Roles["secrets"] = Role{ResourceType: ResourceSecrets, Actions: []string{"UpdateManifest"}}
			setUser(m, "carol", func(u *User) { u.Roles = []string{"secrets"} })
		}, []string{"alice", "bob"}},
		{"unknown roles do not count", func(m *Manifest) { setUser(m, "carol", func(u *User) { u.Roles = []string{"nope"} }) }, []string{"alice", "bob"}},
		{"no users", func(m *Manifest) { m.Users = nil }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := loadFixture(t, "manifest.json")
			tt.mutate(m)
			if got := m.UpdateManifestUsers(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("UpdateManifestUsers() = %v, want %v", got, tt.want)
			}
		})
	}
	var nilManifest *Manifest
	if got := nilManifest.UpdateManifestUsers(); got != nil {
		t.Errorf("nil manifest: %v", got)
	}
}

func TestFeatureEnabled(t *testing.T) {
	m := &Manifest{Config: Config{FeatureGates: []string{"signquoteendpoint", "MonotonicCounter"}}}
	tests := []struct {
		gate string
		want bool
	}{
		{FeatureSignQuoteEndpoint, true},
		{"SIGNQUOTEENDPOINT", true},
		{FeatureMonotonicCounter, true},
		{FeatureAzureHSMSealing, false},
		{"", false},
	}
	for _, tt := range tests {
		if got := m.FeatureEnabled(tt.gate); got != tt.want {
			t.Errorf("FeatureEnabled(%q) = %v, want %v", tt.gate, got, tt.want)
		}
	}
	var nilManifest *Manifest
	if nilManifest.FeatureEnabled(FeatureSignQuoteEndpoint) {
		t.Error("nil manifest has a feature")
	}
}

func TestRecoveryKeysChanged(t *testing.T) {
	fixture := loadFixture(t, "manifest.json")
	k1, k2 := fixture.RecoveryKeys["recoveryKey1"], fixture.RecoveryKeys["recoveryKey2"]
	k1Rewrapped := rewrapPEM(t, k1) // same key bytes, different PEM text and type
	keys := func(kv ...string) map[string]string {
		m := make(map[string]string)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	man := func(keys map[string]string, threshold uint) *Manifest {
		return &Manifest{RecoveryKeys: keys, Config: Config{RecoveryThreshold: threshold}}
	}
	tests := []struct {
		name     string
		old, new *Manifest
		want     bool
	}{
		{"same", man(keys("a", k1, "b", k2), 0), man(keys("a", k1, "b", k2), 0), false},
		{"both without keys", man(nil, 0), man(keys(), 0), false},
		{"nil manifests", nil, nil, false},
		{"nil old, no new keys", nil, man(nil, 0), false},
		{"nil old, new keys", nil, man(keys("a", k1), 0), true},
		{"0 is equivalent to N", man(keys("a", k1, "b", k2), 0), man(keys("a", k1, "b", k2), 2), false},
		{"N is equivalent to 0", man(keys("a", k1, "b", k2), 2), man(keys("a", k1, "b", k2), 0), false},
		{"threshold changed", man(keys("a", k1, "b", k2, "c", k1), 2), man(keys("a", k1, "b", k2, "c", k1), 3), true},
		{"threshold 0 to 2 of 3", man(keys("a", k1, "b", k2, "c", k1), 0), man(keys("a", k1, "b", k2, "c", k1), 2), true},
		{"key added", man(keys("a", k1), 0), man(keys("a", k1, "b", k2), 0), true},
		{"key removed", man(keys("a", k1, "b", k2), 0), man(keys("a", k1), 0), true},
		{"key replaced", man(keys("a", k1), 0), man(keys("a", k2), 0), true},
		{"key renamed", man(keys("a", k1), 0), man(keys("b", k1), 0), true},
		{"keys swapped", man(keys("a", k1, "b", k2), 0), man(keys("a", k2, "b", k1), 0), true},
		{"PEM re-wrapped but a different block type", man(keys("a", k1), 0), man(keys("a", k1Rewrapped), 0), true},
		{"PEM with other line breaks", man(keys("a", k1), 0), man(keys("a", "\n"+k1+"\n"), 0), false},
		{"not PEM, same text", man(keys("a", "x"), 0), man(keys("a", "x"), 0), false},
		{"not PEM, other text", man(keys("a", "x"), 0), man(keys("a", "y"), 0), true},
	}
	for _, tt := range tests {
		if got := RecoveryKeysChanged(tt.old, tt.new); got != tt.want {
			t.Errorf("%s: RecoveryKeysChanged = %v, want %v", tt.name, got, tt.want)
		}
	}
}
