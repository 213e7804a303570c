package migrate

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/marblerun"
	"github.com/quarry-cc/quarry/internal/marblerun/marbleruntest"
	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/manifest"
)

// vectorRoot is the MarbleRun state vectors' directory at the module root
// (states MarbleRun's own Coordinator wrote; testdata/marblerun-state).
const vectorRoot = "../../testdata/marblerun-state"

func readVector(t *testing.T, name string) (*marbleruntest.Vector, *marblerun.SealedData) {
	t.Helper()
	v := marbleruntest.ReadVector(t, vectorRoot, name)
	sd, err := marblerun.ParseSealedData(v.Data)
	if err != nil {
		t.Fatal(err)
	}
	return v, sd
}

// sealedData parses crafted sealed data.
func sealedData(t *testing.T, data []byte) *marblerun.SealedData {
	t.Helper()
	sd, err := marblerun.ParseSealedData(data)
	if err != nil {
		t.Fatal(err)
	}
	return sd
}

func pemDER(t *testing.T, text string) []byte {
	t.Helper()
	b, _ := pem.Decode([]byte(text))
	if b == nil {
		t.Fatal("no PEM block")
	}
	return b.Bytes
}

// TestConvertVectors converts each MarbleRun-written state and compares
// the result with what MarbleRun's API answered about it (expected.json):
// manifest, signature, certificates, secrets, update log; and the header
// with the recovery data MarbleRun's recovery secrets need.
func TestConvertVectors(t *testing.T) {
	for _, name := range marbleruntest.VectorNames {
		t.Run(name, func(t *testing.T) {
			v, sd := readVector(t, name)
			st, hdr, rep, err := Convert(sd, v.Key)
			if err != nil {
				t.Fatal(err)
			}
			want := v.Expected
			if st.Format != sealedstate.Format || st.State != sealedstate.Running {
				t.Errorf("format %d state %d", st.Format, st.State)
			}
			wantSig, _ := base64.StdEncoding.DecodeString(want.Manifest.Signature)
			if !bytes.Equal(st.Manifest, v.Manifest) || !bytes.Equal(st.ManifestSignature, wantSig) || rep.ManifestFingerprint != want.Manifest.Fingerprint {
				t.Errorf("manifest, signature or fingerprint (%s) differ from the vector's (%s)", rep.ManifestFingerprint, want.Manifest.Fingerprint)
			}
			if !bytes.Equal(st.CA.RootCert, pemDER(t, want.Certificates.Root)) || !bytes.Equal(st.CA.IntermediateCert, pemDER(t, want.Certificates.Intermediate)) ||
				!bytes.Equal(st.CA.MarbleRootCert, pemDER(t, want.Certificates.MarbleRoot)) {
				t.Error("the certificates differ from the vector's")
			}
			if len(st.CA.RootKey) == 0 || len(st.CA.IntermediateKey) == 0 || len(st.RootSecret) == 0 {
				t.Error("a key or the root secret is missing")
			}
			for n, w := range want.SecretsResponse.Secrets {
				g, ok := st.Secrets[n]
				if !ok || g.Type != w.Type || g.Size != w.Size || g.Shared != w.Shared || g.UserDefined != w.UserDefined || g.ValidFor != w.ValidFor ||
					!bytes.Equal(g.Cert, w.Cert) || !bytes.Equal(g.Private, w.Private) || !bytes.Equal(g.Public, w.Public) {
					t.Errorf("secret %s differs: %+v", n, g)
				}
			}
			if !slices.Equal(st.UpdateLog, want.UpdateLog.UpdateLog) || rep.UpdateLogEntries != len(want.UpdateLog.UpdateLog) {
				t.Errorf("update log %q, want %q", st.UpdateLog, want.UpdateLog.UpdateLog)
			}
			if st.Log != nil || st.Pending != nil {
				t.Error("a log head or a pending update was made up")
			}
			m, err := manifest.ParseStored(v.Manifest)
			if err != nil {
				t.Fatal(err)
			}
			if hdr.Format != sealedstate.Format || !slices.Equal(slices.Sorted(maps.Keys(hdr.Recovery.Keys)), slices.Sorted(maps.Keys(m.RecoveryKeys))) {
				t.Errorf("header %+v does not name the manifest's recovery keys", hdr)
			}
			if string(hdr.Recovery.Mode) != rep.RecoveryMode || rep.RecoveryShares != len(sd.ShareHashes) {
				t.Errorf("report says %s with %d shares, header %s", rep.RecoveryMode, rep.RecoveryShares, hdr.Recovery.Mode)
			}
			switch hdr.Recovery.Mode {
			case recovery.ModeSingle:
				// The single key's recovery secret is the data key.
				for k, secret := range v.RecoverySecrets {
					sum := sha256.Sum256(secret)
					if hdr.Recovery.Keys[k].ShareHash != hex.EncodeToString(sum[:]) || hdr.Recovery.Threshold != 1 {
						t.Errorf("key %s: share hash %s does not match its recovery secret", k, hdr.Recovery.Keys[k].ShareHash)
					}
				}
			case recovery.ModeXOR, recovery.ModeShamir:
				if !slices.Equal(hdr.MarbleRunShares, sd.ShareHashes) || len(hdr.MarbleRunShares) != len(v.RecoverySecrets) {
					t.Errorf("MarbleRun's share hashes were not kept: %v", hdr.MarbleRunShares)
				}
			default:
				t.Errorf("recovery mode %s for a vector with recovery keys", hdr.Recovery.Mode)
			}
			// The converted state is one the Coordinator can store and read.
			b, err := sealedstate.Encode(st)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := sealedstate.Decode(b); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestConvertRefusals: each state that decrypts but cannot be converted is
// refused with ErrMigration and a message that names the cause.
func TestConvertRefusals(t *testing.T) {
	v, sd := readVector(t, "multiparty")
	craft := func(change func(kv map[string][]byte)) *marblerun.SealedData {
		kv := v.Store(t)
		change(kv)
		return sealedData(t, v.Reseal(t, kv))
	}
	legacyData, legacyKey := v.WithLegacyKey(t)
	other := bytes.Clone(v.Key)
	other[0] ^= 1
	for _, tc := range []struct {
		name string
		sd   *marblerun.SealedData
		key  []byte
		want []string
	}{
		{"a 16-byte data key", sealedData(t, legacyData), legacyKey, []string{"16 bytes", "before 1.9.0", "32-byte"}},
		{"another data key", sd, other, nil},
		{"an unknown store key", craft(func(kv map[string][]byte) { kv["frobnicator:x"] = []byte("{}") }), v.Key, []string{`"frobnicator:x"`}},
		{"no manifest set", craft(func(kv map[string][]byte) { kv["state"] = []byte("2") }), v.Key, []string{"the stored state is 2, not 3"}},
		{"recovery keys and shares differ", craft(func(kv map[string][]byte) {
			tree := marbleruntest.ManifestTree(t, kv)
			keys := tree["RecoveryKeys"].(map[string]any)
			delete(keys, slices.Sorted(maps.Keys(keys))[0])
			marbleruntest.SetManifest(t, kv, tree)
		}), v.Key, []string{"1 recovery keys but the state's recovery data holds 2 shares"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, _, err := Convert(tc.sd, tc.key)
			if !errors.Is(err, ErrMigration) || st != nil {
				t.Fatalf("Convert = %v, %v; want ErrMigration", st, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
}

// TestConvertPendingUpdate: MarbleRun's pending multi-party update, with
// and without its missingAcknowledgments count, becomes Quarry's: admin
// initiated (acknowledged), alice has not, both are needed.
func TestConvertPendingUpdate(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		v, _ := readVector(t, "single")
		ps := v.WithPendingUpdate(t, legacy)
		st, _, rep, err := Convert(sealedData(t, ps.Data), v.Key)
		if err != nil {
			t.Fatal(err)
		}
		p := st.Pending
		if p == nil || !bytes.Equal(p.ManifestRaw, ps.Update) || !slices.Equal(p.RequiredUsers, []string{"admin", "alice"}) ||
			!slices.Equal(p.Acknowledged, []string{"admin"}) || p.Needed != 2 || !rep.PendingUpdate {
			t.Errorf("legacy %v: pending update %+v", legacy, p)
		}
		if p != nil && (p.MissingAcknowledgments() != 1 || !slices.Equal(p.MissingUsers(), []string{"alice"})) {
			t.Errorf("legacy %v: missing %d %v, want 1 [alice]", legacy, p.MissingAcknowledgments(), p.MissingUsers())
		}
	}
}

// TestConvertReportsQuarryRules: a manifest MarbleRun accepted that breaks
// a rule of Quarry's is converted as stored, and the report names the
// finding.
func TestConvertReportsQuarryRules(t *testing.T) {
	v, _ := readVector(t, "multiparty")
	kv := v.Store(t)
	raw := bytes.Replace(kv["manifest"], []byte(`"Packages": {`), []byte(`"Packages": {"unused": {"SignerID": "abc", "ProductID": 1, "SecurityVersion": 1}, `), 1)
	if bytes.Equal(raw, kv["manifest"]) {
		t.Fatal("manifest not changed")
	}
	kv["manifest"] = raw
	kv["package:unused"] = []byte(`{"SignerID":"abc","ProductID":1,"SecurityVersion":1}`)
	st, _, rep, err := Convert(sealedData(t, v.Reseal(t, kv)), v.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(st.Manifest, raw) {
		t.Error("the manifest was not kept as stored")
	}
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "SignerID") || !strings.Contains(rep.Warnings[0], "MarbleRun does not enforce") {
		t.Errorf("warnings %q, want one naming SignerID", rep.Warnings)
	}
}
