package marblerun

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/recovery"
)

// vectorRoot is the MarbleRun state vectors' directory at the module root.
const vectorRoot = "../../testdata/marblerun-state"

func readVector(t testing.TB, name string) (data, key []byte) {
	t.Helper()
	dir := filepath.Join(vectorRoot, name)
	var err error
	if data, err = os.ReadFile(filepath.Join(dir, "sealed_data")); err != nil {
		t.Fatalf("MarbleRun state vector %s: %v (the vectors are committed under testdata/marblerun-state at the module root)", name, err)
	}
	if key, err = os.ReadFile(filepath.Join(dir, "sealed_key")); err != nil {
		t.Fatal(err)
	}
	return data, key
}

func TestVectorsDecode(t *testing.T) {
	for name, want := range map[string]struct {
		keys, secrets, hashes int
	}{"single": {36, 8, 0}, "multiparty": {19, 3, 2}, "threshold": {19, 3, 3}} {
		t.Run(name, func(t *testing.T) {
			data, key := readVector(t, name)
			sd, err := ParseSealedData(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(sd.ShareHashes) != want.hashes {
				t.Errorf("%d share hashes, want %d", len(sd.ShareHashes), want.hashes)
			}
			kv, err := sd.Open(key)
			if err != nil {
				t.Fatal(err)
			}
			if len(kv) != want.keys {
				t.Errorf("%d store keys, want %d", len(kv), want.keys)
			}
			st, err := Decode(kv)
			if err != nil {
				t.Fatal(err)
			}
			if st.StateCode != 3 || len(st.Secrets) != want.secrets || len(st.PreviousSecrets) != want.secrets || len(st.RootSecret) != 32 {
				t.Errorf("state %d, %d secrets, %d previous, root secret %d bytes", st.StateCode, len(st.Secrets), len(st.PreviousSecrets), len(st.RootSecret))
			}
			if name == "single" {
				if st.Activations["backend"] != 2 || len(st.MonotonicCounters) != 2 || *st.Packages["backend"].SecurityVersion != 2 {
					t.Errorf("activations %v, counters %v", st.Activations, st.MonotonicCounters)
				}
				for k, v := range st.MonotonicCounters {
					if v != 3 {
						t.Errorf("counter %s = %d, want 3", k, v)
					}
				}
			}
		})
	}
}

func TestParseSealedDataRefuses(t *testing.T) {
	data, key := readVector(t, "multiparty")
	for name, b := range map[string][]byte{
		"empty":           nil,
		"3 bytes":         {1, 0, 0},
		"length too long": append([]byte{0xff, 0xff, 0, 0}, data[4:]...),
		"no ciphertext":   data[:4+len("{}")],
		"not JSON":        append([]byte{2, 0, 0, 0, 'x', 'y'}, make([]byte, 40)...),
		"bad hash":        append([]byte{13, 0, 0, 0}, append([]byte(`{"ab":true}  `), make([]byte, 40)...)...),
		"Quarry's blob":   append([]byte("QRYSEAL\x00"), make([]byte, 60)...),
	} {
		if _, err := ParseSealedData(b); !errors.Is(err, ErrNotSealedData) {
			t.Errorf("%s: %v", name, err)
		}
	}
	sd, err := ParseSealedData(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sd.Open(key[:31]); !errors.Is(err, ErrKeySize) {
		t.Errorf("short key: %v", err)
	}
	bad := bytes.Clone(key)
	bad[0] ^= 1
	if _, err := sd.Open(bad); !errors.Is(err, ErrDecrypt) {
		t.Errorf("wrong key: %v", err)
	}
	flipped := bytes.Clone(data)
	flipped[len(flipped)-1] ^= 0x80
	sd, _ = ParseSealedData(flipped)
	if _, err := sd.Open(key); !errors.Is(err, ErrDecrypt) {
		t.Errorf("bit flip: %v", err)
	}
}

func TestDecodeRefuses(t *testing.T) {
	data, key := readVector(t, "multiparty")
	sd, _ := ParseSealedData(data)
	base, err := sd.Open(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		key     string
		value   []byte
		unknown bool
	}{
		"unknown key":          {"somethingNew", []byte("x"), true},
		"unknown prefix":       {"frob:x", []byte("x"), true},
		"bad state":            {"state", []byte("three"), false},
		"bad activations":      {"activations:backend", []byte("zz"), false},
		"bad counter length":   {"monotonicCounter:YQ==:AAAAAAAAAAAAAAAAAAAAAA==:Yg==", []byte{1}, false},
		"bad counter key":      {"monotonicCounter:YQ==:AA==:Yg==", make([]byte, 8), false},
		"unknown secret field": {"secret:userPlain", []byte(`{"Type":"plain","Extra":1}`), false},
		"bad package":          {"package:backend", []byte(`{"ProductID":"x"}`), false},
		"bad user name":        {"user:admin", []byte(`{"Name":"eve"}`), false},
		"marble not an object": {"marble:backend", []byte(`[]`), false},
		"bad log line":         {"updateLog", []byte("{}\nnot json\n"), false},
	} {
		kv := map[string][]byte{}
		for k, v := range base {
			kv[k] = v
		}
		kv[tc.key] = tc.value
		_, err := Decode(kv)
		var u *UnknownKeyError
		if !errors.Is(err, ErrInvalid) || errors.As(err, &u) != tc.unknown {
			t.Errorf("%s: %v", name, err)
		}
		if tc.unknown && (u == nil || u.Key != tc.key) {
			t.Errorf("%s: the error does not name the key: %v", name, err)
		}
	}
	delete(base, "manifest")
	if _, err := Decode(base); !errors.Is(err, ErrInvalid) {
		t.Errorf("missing manifest: %v", err)
	}
}

func TestCollectorXORAndShamir(t *testing.T) {
	dek := bytes.Repeat([]byte{7}, 32)
	a, b := bytes.Repeat([]byte{1}, 32), make([]byte, 32)
	for i := range b {
		b[i] = dek[i] ^ a[i]
	}
	hash := func(s []byte) string { h := sha256.Sum256(s); return hex.EncodeToString(h[:]) }
	opens := func(k []byte) bool { return bytes.Equal(k, dek) }
	c := NewCollector([]string{hash(a), hash(b)}, CollectorOptions{Opens: opens})
	if r, _, _, err := c.Add(a, []byte("sig"), true); err != nil || r != 1 {
		t.Fatalf("first share: %d, %v", r, err)
	}
	if _, _, _, err := c.Add(a, nil, true); !errors.Is(err, recovery.ErrReusedSecret) {
		t.Fatalf("reused: %v", err)
	}
	if _, _, _, err := c.Add(make([]byte, 32), nil, true); !errors.Is(err, recovery.ErrUnknownSecret) {
		t.Fatalf("unknown: %v", err)
	}
	if _, _, _, err := c.Add(make([]byte, 33), nil, true); !errors.Is(err, recovery.ErrInvalidSecret) {
		t.Fatalf("length: %v", err)
	}
	r, key, shares, err := c.Add(b, []byte("sig"), true)
	if err != nil || r != 0 || !bytes.Equal(key, dek) || len(shares) != 2 {
		t.Fatalf("second share: %d %x %v", r, key, err)
	}
	// Single key: the secret must open the state.
	s := NewCollector(nil, CollectorOptions{Opens: opens})
	if _, _, _, err := s.Add(a, nil, true); !errors.Is(err, recovery.ErrUnknownSecret) {
		t.Fatalf("wrong single key: %v", err)
	}
	if r, k, _, err := s.Add(dek, nil, true); err != nil || r != 0 || !bytes.Equal(k, dek) {
		t.Fatalf("single key: %v", err)
	}
}

// TestDecodePendingUpdate: MarbleRun's pendingUpdate with and without the
// missingAcknowledgments member (without it MarbleRun counts the required
// users that have not acknowledged); a member Quarry does not know stops the
// decoding (it would be dropped).
func TestDecodePendingUpdate(t *testing.T) {
	data, key := readVector(t, "single")
	sd, _ := ParseSealedData(data)
	base, err := sd.Open(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		value   string
		missing int
	}{
		"with count":    {`{"manifestRaw":"e30=","requiredUsers":{"a":true,"b":false,"c":false},"missingAcknowledgments":1}`, 1},
		"without count": {`{"manifestRaw":"e30=","requiredUsers":{"a":true,"b":false,"c":false}}`, 2},
		"zero is kept":  {`{"manifestRaw":"e30=","requiredUsers":{"a":false},"missingAcknowledgments":0}`, 0},
	} {
		base["pendingUpdate"] = []byte(tc.value)
		st, err := Decode(base)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if string(st.Pending.ManifestRaw) != "{}" || len(st.Pending.RequiredUsers) == 0 || st.Pending.Missing() != tc.missing {
			t.Errorf("%s: %+v, missing %d, want %d", name, st.Pending, st.Pending.Missing(), tc.missing)
		}
	}
	base["pendingUpdate"] = []byte(`{"manifestRaw":"e30=","requiredUsers":{},"initiator":"a"}`)
	if _, err := Decode(base); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "pendingUpdate") {
		t.Errorf("unknown member: %v", err)
	}
}
