package core

import (
	"bytes"
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"testing"

	"github.com/quarry-cc/quarry/internal/marblerun/marbleruntest"
)

// previousEnv are the template lines the crafted manifest adds to the
// Marble backend: current and previous values of a shared key, a
// per-Marble key and a shared certificate.
var previousEnv = map[string]string{
	"CUR_SHARED":  "{{ hex .Secrets.symKey128Shared }}",
	"PREV_SHARED": "{{ hex .Previous.Secrets.symKey128Shared }}",
	"CUR_UNIQUE":  "{{ hex .Secrets.symKey256Unique }}",
	"PREV_UNIQUE": "{{ hex .Previous.Secrets.symKey256Unique }}",
	"CUR_ECDSA":   "{{ pem .Secrets.certECDSAShared.Cert }}",
	"PREV_ECDSA":  "{{ pem .Previous.Secrets.certECDSAShared.Cert }}",
}

// perMarbleKey is MarbleRun's derivation of a per-Marble symmetric
// key: HKDF-SHA256, IKM the root secret, salt the UUID's canonical string
// and the secret's name, info the Marble type.
func perMarbleKey(t *testing.T, root []byte, uuid, name, marble string, size int) string {
	t.Helper()
	k, err := hkdf.Key(sha256.New, root, []byte(uuid+name), marble, size)
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(k)
}

// TestMigratePreviousSecrets: MarbleRun's previousRootSecret and
// previousSecret:* survive the migration (and a restart) with their meaning
// (as in MarbleRun, docs/migration.md): a Marble's .Previous.Secrets shows the
// stored previous values of shared secrets, and per-Marble keys derived from
// previousRootSecret; without a previousRootSecret (as MarbleRun wrote the
// vector) from the current root secret.
func TestMigratePreviousSecrets(t *testing.T) {
	for name, rotated := range map[string]bool{"previousRootSecret set": true, "as MarbleRun wrote it": false} {
		t.Run(name, func(t *testing.T) {
			v := readVector(t, "single")
			kv := v.Store(t)
			tree := marbleruntest.ManifestTree(t, kv)
			env := tree["Marbles"].(map[string]any)["backend"].(map[string]any)["Parameters"].(map[string]any)["Env"].(map[string]any)
			for k, tmpl := range previousEnv {
				env[k] = tmpl
			}
			marbleruntest.SetManifest(t, kv, tree)
			prevShared := bytes.Repeat([]byte{0x5a}, 16)
			var prev map[string]any
			if err := json.Unmarshal(kv["previousSecret:symKey128Shared"], &prev); err != nil {
				t.Fatal(err)
			}
			prev["Private"], prev["Public"] = prevShared, prevShared
			kv["previousSecret:symKey128Shared"], _ = json.Marshal(prev)
			rootSecret, prevRoot := kv["rootSecret"], bytes.Repeat([]byte{0xa5}, 32)
			if rotated {
				kv["previousRootSecret"] = prevRoot
			} else {
				prevRoot = rootSecret
			}
			var cur, old struct{ Cert, Private []byte }
			json.Unmarshal(kv["secret:certECDSAShared"], &cur)
			json.Unmarshal(kv["previousSecret:certECDSAShared"], &old)
			json.Unmarshal(kv["secret:symKey128Shared"], &struct{ Private *[]byte }{&cur.Private})
			if bytes.Equal(cur.Cert, old.Cert) || len(old.Cert) == 0 || len(cur.Private) != 16 {
				t.Fatal("the vector's previous ECDSA certificate is expected to differ from the current one (its package update re-issued it)")
			}

			s := newStores()
			s.data.Save(context.Background(), v.Reseal(t, kv), "")
			s.key.Save(context.Background(), v.key, "")
			m := newMarbleClient(t)
			for i := range 2 { // migrated, then the Quarry state
				c := mustCore(t, s)
				act, err := c.Activate(context.Background(), m.request("backend", uuidA, nil))
				if err != nil {
					t.Fatalf("start %d: %v", i+1, err)
				}
				pemOf := func(der []byte) string {
					return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
				}
				for k, want := range map[string]string{
					"CUR_SHARED":  hex.EncodeToString(cur.Private),
					"PREV_SHARED": hex.EncodeToString(prevShared),
					"CUR_UNIQUE":  perMarbleKey(t, rootSecret, uuidA, "symKey256Unique", "backend", 32),
					"PREV_UNIQUE": perMarbleKey(t, prevRoot, uuidA, "symKey256Unique", "backend", 32),
					"CUR_ECDSA":   pemOf(cur.Cert),
					"PREV_ECDSA":  pemOf(old.Cert),
				} {
					if got := string(act.Env[k]); got != want {
						t.Errorf("start %d: %s = %q, want %q", i+1, k, got, want)
					}
				}
				if rotated && bytes.Equal(act.Env["CUR_UNIQUE"], act.Env["PREV_UNIQUE"]) {
					t.Error("the previous per-Marble key is the current one although the root secret was rotated")
				}
			}
		})
	}
}
