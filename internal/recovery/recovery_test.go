package recovery

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"
	"sync"
	"testing"
)

// testKeyNames name the shared test keys; the last one is never a recovery
// key of a fixture, so it can sign as an outsider.
var testKeyNames = []string{"alice", "bob", "carol", "dave", "mallory"}

// sharedTestKeys generates the RSA-2048 test keys once per test binary.
var sharedTestKeys = sync.OnceValues(func() (map[string]*rsa.PrivateKey, error) {
	keys := make(map[string]*rsa.PrivateKey, len(testKeyNames))
	for _, name := range testKeyNames {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, err
		}
		keys[name] = k
	}
	return keys, nil
})

func testKeys(t testing.TB) map[string]*rsa.PrivateKey {
	t.Helper()
	keys, err := sharedTestKeys()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// publicKeys returns the public halves of the first n test keys.
func publicKeys(t testing.TB, n int) map[string]*rsa.PublicKey {
	t.Helper()
	priv := testKeys(t)
	pub := make(map[string]*rsa.PublicKey, n)
	for _, name := range testKeyNames[:n] {
		pub[name] = &priv[name].PublicKey
	}
	return pub
}

// decryptOAEP decrypts the way MarbleRun's CLI and SDK do.
func decryptOAEP(t testing.TB, priv *rsa.PrivateKey, ct []byte) []byte {
	t.Helper()
	plain, err := rsa.DecryptOAEP(sha256.New(), nil, priv, ct, nil)
	if err != nil {
		t.Fatalf("OAEP-SHA256 decryption: %v", err)
	}
	return plain
}

func pemOf(t *testing.T, typ string, der []byte) string {
	t.Helper()
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func TestParsePublicKeyPEM(t *testing.T) {
	rsaKey := &testKeys(t)["alice"].PublicKey
	rsaDER, err := x509.MarshalPKIXPublicKey(rsaKey)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, err := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	good := pemOf(t, "PUBLIC KEY", rsaDER)

	for _, tc := range []struct {
		name    string
		pem     string
		wantErr error
		wantMsg string
	}{
		{"RSA", good, nil, ""},
		{"RSA with trailing text", good + "trailing\n", nil, ""},
		{"empty", "", ErrNotPublicKey, "given PEM data is not a public key"},
		{"not PEM", "hello", ErrNotPublicKey, "given PEM data is not a public key"},
		{"PKCS#1 block", pemOf(t, "RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(rsaKey)), ErrNotPublicKey, "given PEM data is not a public key"},
		{"private key block", pemOf(t, "PRIVATE KEY", rsaDER), ErrNotPublicKey, "given PEM data is not a public key"},
		{"garbage DER", pemOf(t, "PUBLIC KEY", []byte("garbage")), ErrNotPublicKey, ""},
		{"ECDSA", pemOf(t, "PUBLIC KEY", ecDER), ErrUnsupportedKeyType, "unsupported type of public key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ParsePublicKeyPEM(tc.pem)
			if tc.wantErr == nil {
				if err != nil || !k.Equal(rsaKey) {
					t.Fatalf("ParsePublicKeyPEM = %v, %v; want the key", k, err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || k != nil {
				t.Fatalf("ParsePublicKeyPEM = %v, %v; want %v", k, err, tc.wantErr)
			}
			if tc.wantMsg != "" && err.Error() != tc.wantMsg {
				t.Fatalf("message %q, want %q", err, tc.wantMsg)
			}
		})
	}
}

func TestGenerate(t *testing.T) {
	priv := testKeys(t)
	for _, tc := range []struct {
		keys      int
		threshold uint
		wantMode  Mode
		wantNeed  int
	}{
		{0, 0, ModeNone, 0},
		{1, 0, ModeSingle, 1},
		{2, 0, ModeXOR, 2},
		{2, 2, ModeXOR, 2},
		{3, 0, ModeXOR, 3},
		{3, 3, ModeXOR, 3},
		{3, 2, ModeShamir, 2},
		{4, 2, ModeShamir, 2},
		{4, 3, ModeShamir, 3},
	} {
		t.Run(fmt.Sprintf("%d keys threshold %d", tc.keys, tc.threshold), func(t *testing.T) {
			keys := publicKeys(t, tc.keys)
			dek, secrets, pub, err := Generate(rand.Reader, keys, tc.threshold)
			if err != nil {
				t.Fatal(err)
			}
			if len(dek) != DEKSize || bytes.Equal(dek, make([]byte, DEKSize)) {
				t.Fatalf("DEK = %x", dek)
			}
			if pub.Mode != tc.wantMode || pub.Threshold != tc.wantNeed {
				t.Fatalf("mode %q threshold %d, want %q %d", pub.Mode, pub.Threshold, tc.wantMode, tc.wantNeed)
			}
			if err := pub.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if secrets == nil || len(secrets) != tc.keys || len(pub.Keys) != tc.keys {
				t.Fatalf("%d secrets, %d public keys, want %d", len(secrets), len(pub.Keys), tc.keys)
			}

			var shares [][]byte
			for name, ct := range secrets {
				if len(ct) != priv[name].Size() {
					t.Fatalf("%s: ciphertext of %d bytes", name, len(ct))
				}
				plain := decryptOAEP(t, priv[name], ct)
				// The same with both OAEP hashes spelled out (MGF1 is SHA-256 too).
				plain2, err := priv[name].Decrypt(nil, ct, &rsa.OAEPOptions{Hash: crypto.SHA256, MGFHash: crypto.SHA256})
				if err != nil || !bytes.Equal(plain, plain2) {
					t.Fatalf("%s: explicit OAEP options: %v", name, err)
				}
				if len(plain) != shareSize(tc.wantMode) || !IsPlainSecretLength(len(plain)) {
					t.Fatalf("%s: share of %d bytes", name, len(plain))
				}
				r := pub.Keys[name]
				wantDER, _ := x509.MarshalPKIXPublicKey(keys[name])
				if !bytes.Equal(r.PublicKey, wantDER) {
					t.Fatalf("%s: stored public key differs", name)
				}
				h := sha256.Sum256(plain)
				if r.ShareHash != hex.EncodeToString(h[:]) {
					t.Fatalf("%s: share hash %s, want %x", name, r.ShareHash, h)
				}
				shares = append(shares, plain)
			}

			switch tc.wantMode {
			case ModeNone:
			case ModeSingle:
				if !bytes.Equal(shares[0], dek) {
					t.Fatal("the single secret is not the DEK")
				}
			case ModeXOR:
				if !bytes.Equal(xorCombine(shares), dek) {
					t.Fatal("the XOR of the shares is not the DEK")
				}
			case ModeShamir:
				for mask := 1; mask < 1<<len(shares); mask++ {
					sub := subset(shares, mask)
					got, err := shamirCombine(sub)
					if err != nil {
						t.Fatal(err)
					}
					if enough := len(sub) >= tc.wantNeed; bytes.Equal(got, dek) != enough {
						t.Fatalf("subset %b recombines to the DEK: %v, want %v", mask, !enough, enough)
					}
				}
			}

			// The public data survives JSON.
			j, err := json.Marshal(pub)
			if err != nil {
				t.Fatal(err)
			}
			var back Public
			if err := json.Unmarshal(j, &back); err != nil {
				t.Fatal(err)
			}
			if back.Mode != pub.Mode || back.Threshold != pub.Threshold || len(back.Keys) != len(pub.Keys) {
				t.Fatalf("JSON round trip: %+v", back)
			}
			for name, r := range pub.Keys {
				if b := back.Keys[name]; !bytes.Equal(b.PublicKey, r.PublicKey) || b.ShareHash != r.ShareHash {
					t.Fatalf("JSON round trip of %s differs", name)
				}
			}
		})
	}
}

func TestGenerateDeterministic(t *testing.T) {
	keys := publicKeys(t, 3)
	dek1, _, pub1, err1 := Generate(&detReader{seed: "gen"}, keys, 2)
	dek2, _, pub2, err2 := Generate(&detReader{seed: "gen"}, keys, 2)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if !bytes.Equal(dek1, dek2) {
		t.Fatal("same reader, different DEKs")
	}
	for name := range keys {
		if pub1.Keys[name].ShareHash != pub2.Keys[name].ShareHash {
			t.Fatalf("same reader, different share for %s", name)
		}
	}
}

func TestGenerateErrors(t *testing.T) {
	keys := publicKeys(t, 3)
	tinyN, _ := new(big.Int).SetString(strings.Repeat("c3", 64), 16)
	tiny := &rsa.PublicKey{N: tinyN, E: 65537} // 512 bits: refused for encryption
	for _, tc := range []struct {
		name      string
		rand      io.Reader
		keys      map[string]*rsa.PublicKey
		threshold uint
		wantErr   error  // nil: any error
		wantMsg   string // empty: any message
	}{
		{"0 keys threshold 2", rand.Reader, nil, 2, ErrInvalidThreshold,
			"invalid recovery threshold: not enough recovery keys (0) defined to meet the recovery threshold of 2"},
		{"1 key threshold 1", rand.Reader, publicKeys(t, 1), 1, ErrInvalidThreshold,
			"invalid recovery threshold: if set, threshold must be at least 2"},
		{"1 key threshold 2", rand.Reader, publicKeys(t, 1), 2, ErrInvalidThreshold, ""},
		{"3 keys threshold 1", rand.Reader, keys, 1, ErrInvalidThreshold, ""},
		{"3 keys threshold 4", rand.Reader, keys, 4, ErrInvalidThreshold,
			"invalid recovery threshold: not enough recovery keys (3) defined to meet the recovery threshold of 4"},
		{"nil key", rand.Reader, map[string]*rsa.PublicKey{"a": keys["alice"], "b": nil}, 0, nil, `recovery key "b" is missing`},
		{"no randomness, 0 keys", bytes.NewReader(nil), nil, 0, io.EOF, ""},
		{"no randomness, 1 key", bytes.NewReader(nil), publicKeys(t, 1), 0, io.EOF, ""},
		{"no randomness, XOR", io.LimitReader(rand.Reader, 40), keys, 0, io.ErrUnexpectedEOF, ""},
		{"no randomness, Shamir", io.LimitReader(rand.Reader, 40), keys, 2, io.ErrUnexpectedEOF, ""},
		{"no randomness for OAEP", io.LimitReader(rand.Reader, 32), publicKeys(t, 1), 0, io.EOF, ""},
		{"key too small", rand.Reader, map[string]*rsa.PublicKey{"tiny": tiny, "alice": keys["alice"]}, 0, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dek, secrets, pub, err := Generate(tc.rand, tc.keys, tc.threshold)
			if err == nil {
				t.Fatalf("Generate = %x, %v, %+v; want an error", dek, secrets, pub)
			}
			if dek != nil || secrets != nil || pub.Mode != "" {
				t.Fatalf("Generate returned data with error %v", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if tc.wantMsg != "" && err.Error() != tc.wantMsg {
				t.Fatalf("message %q, want %q", err, tc.wantMsg)
			}
		})
	}
}

func TestDecryptWithEphemeral(t *testing.T) {
	eph := testKeys(t)["mallory"]
	for _, n := range []int{16, 32, 33} {
		plain := make([]byte, n)
		rand.Read(plain)
		ct, err := rsa.EncryptOAEP(sha256.New(), rand.Reader, &eph.PublicKey, plain, nil)
		if err != nil {
			t.Fatal(err)
		}
		if IsPlainSecretLength(len(ct)) {
			t.Fatalf("a ciphertext of %d bytes looks plain", len(ct))
		}
		got, err := DecryptWithEphemeral(eph, ct)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("%d bytes: DecryptWithEphemeral = %x, %v; want %x", n, got, err, plain)
		}
	}

	good, _ := rsa.EncryptOAEP(sha256.New(), rand.Reader, &eph.PublicKey, []byte("secret"), nil)
	sha1CT, _ := rsa.EncryptOAEP(crypto.SHA1.New(), rand.Reader, &eph.PublicKey, []byte("secret"), nil)
	labelled, _ := rsa.EncryptOAEP(sha256.New(), rand.Reader, &eph.PublicKey, []byte("secret"), []byte("label"))
	otherKey, _ := rsa.EncryptOAEP(sha256.New(), rand.Reader, &testKeys(t)["alice"].PublicKey, []byte("secret"), nil)
	for _, tc := range []struct {
		name string
		priv *rsa.PrivateKey
		ct   []byte
	}{
		{"no key", nil, good},
		{"empty", eph, nil},
		{"garbage", eph, bytes.Repeat([]byte{7}, 300)},
		{"OAEP with SHA-1", eph, sha1CT},
		{"with a label", eph, labelled},
		{"to another key", eph, otherKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, err := DecryptWithEphemeral(tc.priv, tc.ct); !errors.Is(err, ErrUndecryptable) || got != nil {
				t.Fatalf("DecryptWithEphemeral = %x, %v; want ErrUndecryptable", got, err)
			}
		})
	}
}

func TestIsPlainSecretLength(t *testing.T) {
	var plain []int
	for n := range 1025 {
		if IsPlainSecretLength(n) {
			plain = append(plain, n)
		}
	}
	if want := []int{16, 32, 33}; !slices.Equal(plain, want) {
		t.Fatalf("plain lengths %v, want %v", plain, want)
	}
}

// testDER is a fixed PKIX public key (an arbitrary 1024-bit modulus) for the
// JSON vector.
func testDER(t *testing.T) []byte {
	t.Helper()
	n, _ := new(big.Int).SetString(strings.Repeat("c3", 128), 16)
	der, err := x509.MarshalPKIXPublicKey(&rsa.PublicKey{N: n, E: 65537})
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestPublicJSONVector(t *testing.T) {
	der := testDER(t)
	pub := Public{Mode: ModeShamir, Threshold: 2, Keys: map[string]Recipient{
		"a": {PublicKey: der, ShareHash: strings.Repeat("0a", 32)},
		"b": {PublicKey: der, ShareHash: strings.Repeat("0b", 32)},
		"c": {PublicKey: der, ShareHash: strings.Repeat("0c", 32)},
	}}
	if err := pub.Validate(); err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(pub)
	if err != nil {
		t.Fatal(err)
	}
	k := `"publicKey":"` + base64.StdEncoding.EncodeToString(der) + `"`
	want := `{"mode":"shamir","threshold":2,"keys":{` +
		`"a":{` + k + `,"shareHash":"` + strings.Repeat("0a", 32) + `"},` +
		`"b":{` + k + `,"shareHash":"` + strings.Repeat("0b", 32) + `"},` +
		`"c":{` + k + `,"shareHash":"` + strings.Repeat("0c", 32) + `"}}}`
	if string(got) != want {
		t.Fatalf("JSON\n got %s\nwant %s", got, want)
	}
	none, _ := json.Marshal(Public{Mode: ModeNone})
	if string(none) != `{"mode":"none","threshold":0}` {
		t.Fatalf("ModeNone JSON %s", none)
	}
}

func TestPublicValidate(t *testing.T) {
	der := testDER(t)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	h := func(c string) string { return strings.Repeat(c, 32) }
	rec := func(hash string) Recipient { return Recipient{PublicKey: der, ShareHash: hash} }
	three := map[string]Recipient{"a": rec(h("0a")), "b": rec(h("0b")), "c": rec(h("0c"))}
	for _, tc := range []struct {
		name string
		pub  Public
		ok   bool
	}{
		{"none", Public{Mode: ModeNone}, true},
		{"single", Public{Mode: ModeSingle, Threshold: 1, Keys: map[string]Recipient{"a": rec(h("0a"))}}, true},
		{"xor", Public{Mode: ModeXOR, Threshold: 3, Keys: three}, true},
		{"shamir", Public{Mode: ModeShamir, Threshold: 2, Keys: three}, true},
		{"empty mode", Public{}, false},
		{"unknown mode", Public{Mode: "XOR", Threshold: 3, Keys: three}, false},
		{"none with keys", Public{Mode: ModeNone, Keys: three}, false},
		{"none with threshold", Public{Mode: ModeNone, Threshold: 1}, false},
		{"single with two keys", Public{Mode: ModeSingle, Threshold: 1, Keys: map[string]Recipient{"a": rec(h("0a")), "b": rec(h("0b"))}}, false},
		{"single threshold 0", Public{Mode: ModeSingle, Keys: map[string]Recipient{"a": rec(h("0a"))}}, false},
		{"xor threshold below N", Public{Mode: ModeXOR, Threshold: 2, Keys: three}, false},
		{"xor one key", Public{Mode: ModeXOR, Threshold: 1, Keys: map[string]Recipient{"a": rec(h("0a"))}}, false},
		{"shamir threshold N", Public{Mode: ModeShamir, Threshold: 3, Keys: three}, false},
		{"shamir threshold 1", Public{Mode: ModeShamir, Threshold: 1, Keys: three}, false},
		{"shamir threshold 0", Public{Mode: ModeShamir, Keys: three}, false},
		{"bad DER", Public{Mode: ModeSingle, Threshold: 1, Keys: map[string]Recipient{"a": {PublicKey: []byte("x"), ShareHash: h("0a")}}}, false},
		{"ECDSA key", Public{Mode: ModeSingle, Threshold: 1, Keys: map[string]Recipient{"a": {PublicKey: ecDER, ShareHash: h("0a")}}}, false},
		{"upper-case hash", Public{Mode: ModeSingle, Threshold: 1, Keys: map[string]Recipient{"a": rec(h("0A"))}}, false},
		{"short hash", Public{Mode: ModeSingle, Threshold: 1, Keys: map[string]Recipient{"a": rec("0a0a")}}, false},
		{"not hex", Public{Mode: ModeSingle, Threshold: 1, Keys: map[string]Recipient{"a": rec(h("zz"))}}, false},
		{"same hash twice", Public{Mode: ModeXOR, Threshold: 2, Keys: map[string]Recipient{"a": rec(h("0a")), "b": rec(h("0a"))}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.pub.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidPublic) {
				t.Fatalf("Validate = %v, want ErrInvalidPublic", err)
			}
		})
	}
}

func BenchmarkGenerate3Keys(b *testing.B) {
	keys := publicKeys(b, 3)
	for _, threshold := range []uint{0, 2} {
		b.Run(fmt.Sprintf("threshold=%d", threshold), func(b *testing.B) {
			for b.Loop() {
				if _, _, _, err := Generate(rand.Reader, keys, threshold); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
