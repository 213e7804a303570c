package core

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"

	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/manifest"
)

// TestUpdatedSecretsPrevious: a full update replaces a secret's previous
// value only when it regenerates the secret (MarbleRun's rule, docs/client-api.md,
// "Secrets across full updates"): kept values keep their previous value,
// regenerated ones get the value they had, new and redefined ones get their
// new value, removed ones go from both maps.
func TestUpdatedSecretsPrevious(t *testing.T) {
	const before = `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}},"Secrets":{
		"kept":{"Type":"symmetric-key","Size":256,"Shared":true},
		"mine":{"Type":"symmetric-key","Size":256},
		"ud":{"Type":"symmetric-key","Size":128,"UserDefined":true},
		"gone":{"Type":"symmetric-key","Size":256,"Shared":true},
		"redef":{"Type":"symmetric-key","Size":128,"Shared":true},
		"cert":{"Type":"cert-ecdsa","Size":256,"Shared":true}}}`
	const after = `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}},"Secrets":{
		"kept":{"Type":"symmetric-key","Size":256,"Shared":true},
		"mine":{"Type":"symmetric-key","Size":256},
		"ud":{"Type":"symmetric-key","Size":128,"UserDefined":true},
		"redef":{"Type":"symmetric-key","Size":256,"Shared":true},
		"cert":{"Type":"cert-ecdsa","Size":256,"Shared":true},
		"added":{"Type":"symmetric-key","Size":256,"Shared":true}}}`
	c := newCore(t, newStores())
	if _, err := c.SetManifest(context.Background(), []byte(before)); err != nil {
		t.Fatal(err)
	}
	s := c.snap.Load()
	cur := s.persisted.Secrets
	old, err := manifest.Parse([]byte(before))
	if err != nil {
		t.Fatal(err)
	}
	next, err := manifest.Parse([]byte(after))
	if err != nil {
		t.Fatal(err)
	}
	// Previous values from an earlier update: different from the current ones.
	earlier := map[string]secrets.Secret{}
	for name, v := range cur {
		v.Private = bytes.Repeat([]byte{'p'}, len(v.Private))
		earlier[name] = v
	}
	key := func(v secrets.Secret) string { return string(v.Private) }

	for _, tc := range []struct {
		name   string
		prev   map[string]secrets.Secret
		rotate bool
	}{
		{"after an earlier update", earlier, false},
		{"first update", nil, false},
		{"root secret rotates", earlier, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			authority, err := s.ca.Rotate(rand.Reader, c.opts.Now())
			if err != nil {
				t.Fatal(err)
			}
			got, prev, err := c.updatedSecrets(old, next, cur, tc.prev, authority, tc.rotate)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(next.Secrets) || len(prev) != len(next.Secrets) {
				t.Fatalf("%d secrets and %d previous values, want %d each", len(got), len(prev), len(next.Secrets))
			}
			if _, ok := prev["gone"]; ok {
				t.Error("a removed secret kept its previous value")
			}
			// What is kept keeps its previous value (the current one before
			// any earlier update).
			kept := []string{"ud"}
			if !tc.rotate {
				kept = append(kept, "kept", "mine")
			}
			for _, name := range kept {
				want := earlier[name]
				if tc.prev == nil {
					want = cur[name]
				}
				if key(got[name]) != key(cur[name]) {
					t.Errorf("%s: the value changed", name)
				}
				if key(prev[name]) != key(want) {
					t.Errorf("%s: the previous value changed", name)
				}
			}
			// What is regenerated from an unchanged definition: its old value
			// becomes the previous one.
			regenerated := []string{"cert"}
			if tc.rotate {
				regenerated = append(regenerated, "kept", "mine")
			}
			for _, name := range regenerated {
				if key(prev[name]) != key(cur[name]) {
					t.Errorf("%s: the previous value is not the value before the update", name)
				}
			}
			if tc.rotate && key(got["kept"]) == key(cur["kept"]) {
				t.Error("the shared key was not renewed with the root secret")
			}
			if bytes.Equal(got["cert"].Cert, cur["cert"].Cert) {
				t.Error("the certificate was not re-issued under the new intermediate")
			}
			// New and redefined secrets: the new value is the previous one too.
			for _, name := range []string{"added", "redef"} {
				if len(got[name].Private) != 32 || key(prev[name]) != key(got[name]) {
					t.Errorf("%s: previous %x, value %x: want the new 256-bit value as both", name, prev[name].Private, got[name].Private)
				}
			}
		})
	}
}
