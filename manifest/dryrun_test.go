package manifest

import (
	"errors"
	"testing"
)

func TestDryRunWithValues(t *testing.T) {
	m, err := Parse([]byte(`{
		"Packages": {"p": {"Debug": true}},
		"Marbles": {"m": {"Package": "p", "Parameters": {"Env": {"PW": "{{ string .Secrets.pw }}"}, "Files": {"/k": "{{ hex .Secrets.k.Private }}"}}}},
		"Secrets": {"pw": {"Type": "plain", "UserDefined": true}, "k": {"Type": "symmetric-key", "Size": 128, "Shared": true}}
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DryRun(nil); err != nil {
		t.Fatalf("dummies only: %v", err)
	}
	ok := map[string]TemplateSecret{"pw": {Type: SecretTypePlain, UserDefined: true, Private: PrivateKey("pass"), Public: PublicKey("pass")}}
	if err := m.DryRun(ok); err != nil {
		t.Fatalf("good value: %v", err)
	}
	bad := map[string]TemplateSecret{"pw": {Type: SecretTypePlain, UserDefined: true, Private: PrivateKey("a\x00b"), Public: PublicKey("a\x00b")}}
	err = m.DryRun(bad)
	var ve *ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) || ve.Name != "m" || ve.Field != "Parameters.Env.PW" {
		t.Fatalf("NUL through string: %v", err)
	}
	empty := map[string]TemplateSecret{"k": {Type: SecretTypeSymmetric, Size: 128, Shared: true}}
	if err := m.DryRun(empty); err == nil {
		t.Fatal("a secret given without bytes must fail the template that uses it")
	}
}
