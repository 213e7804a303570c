package seal

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// fakeGramine writes random sealing keys into a fake attestation directory.
func fakeGramine(t *testing.T) GramineKeySealer {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{GramineMRSignerKey, GramineMREnclaveKey} {
		setKey(t, dir, name, nil)
	}
	return GramineKeySealer{Dir: dir}
}

func setKey(t *testing.T, dir, name string, k []byte) {
	t.Helper()
	if k == nil {
		k = make([]byte, 16)
		rand.Read(k)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), k, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestGramineKeySealer(t *testing.T) {
	dek := bytes.Repeat([]byte{0x5a}, KeySize)
	binding := Binding([]byte("sealed_data"))
	for _, tc := range []struct {
		mode, file string
	}{{"", GramineMRSignerKey}, {ModeProductKey, GramineMRSignerKey}, {ModeUniqueKey, GramineMREnclaveKey}} {
		g := fakeGramine(t)
		sealed, err := g.SealKey(dek, binding[:], tc.mode)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(sealed, dek) {
			t.Fatalf("mode %q: the sealed key contains the data key", tc.mode)
		}
		got, err := g.UnsealKey(sealed, binding[:])
		if err != nil || !bytes.Equal(got, dek) {
			t.Fatalf("mode %q: unseal = %x, %v", tc.mode, got, err)
		}
		// Another binding (another sealed_data) does not open.
		other := Binding([]byte("older sealed_data"))
		if _, err := g.UnsealKey(sealed, other[:]); !errors.Is(err, ErrSealedElsewhere) {
			t.Errorf("mode %q, other binding: %v", tc.mode, err)
		}
		// The mode named in the header cannot be changed.
		swapped := append([]byte{}, sealed...)
		swapped[len(gramineMagic)+2] ^= 0x20 // the mode's first letter
		if _, err := g.UnsealKey(swapped, binding[:]); err == nil {
			t.Errorf("mode %q: a key with a changed mode opened", tc.mode)
		}
		// The other mode's key does not matter; this mode's key does.
		otherFile := GramineMREnclaveKey
		if tc.file == GramineMREnclaveKey {
			otherFile = GramineMRSignerKey
		}
		setKey(t, g.Dir, otherFile, nil)
		if _, err := g.UnsealKey(sealed, binding[:]); err != nil {
			t.Errorf("mode %q: changing the other mode's key broke it: %v", tc.mode, err)
		}
		setKey(t, g.Dir, tc.file, nil) // another enclave or signer
		if _, err := g.UnsealKey(sealed, binding[:]); !errors.Is(err, ErrSealedElsewhere) {
			t.Errorf("mode %q, another enclave: %v", tc.mode, err)
		}
	}
}

func TestGramineKeySealerRefuses(t *testing.T) {
	g := fakeGramine(t)
	dek := make([]byte, KeySize)
	binding := Binding(nil)
	// A key sealed by the simulation sealer is never opened by this one.
	raw, _ := SimulationKeySealer{}.SealKey(dek, binding[:], "")
	if _, err := g.UnsealKey(raw, binding[:]); !errors.Is(err, ErrOtherSealer) {
		t.Errorf("simulation key: %v", err)
	}
	// And a Gramine-sealed key is never opened by the simulation sealer.
	sealed, err := g.SealKey(dek, binding[:], ModeProductKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (SimulationKeySealer{}).UnsealKey(sealed, binding[:]); err == nil {
		t.Error("the simulation sealer opened a Gramine-sealed key")
	}
	for n := 0; n < len(sealed); n++ {
		if _, err := g.UnsealKey(sealed[:n], binding[:]); err == nil {
			t.Fatalf("truncated to %d bytes: opened", n)
		}
	}
	if _, err := g.SealKey(dek[:16], binding[:], ""); !errors.Is(err, ErrKeySize) {
		t.Errorf("short data key: %v", err)
	}
	setKey(t, g.Dir, GramineMRSignerKey, make([]byte, 15))
	if _, err := g.SealKey(dek, binding[:], ""); err == nil {
		t.Error("a 15-byte sealing key was used")
	}
	if _, err := (GramineKeySealer{Dir: t.TempDir()}).SealKey(dek, binding[:], ""); err == nil {
		t.Error("sealed without sealing-key files")
	}
}

func FuzzGramineUnsealKey(f *testing.F) {
	dir := f.TempDir()
	os.MkdirAll(filepath.Join(dir, "keys"), 0o700)
	for _, name := range []string{GramineMRSignerKey, GramineMREnclaveKey} {
		os.WriteFile(filepath.Join(dir, filepath.FromSlash(name)), bytes.Repeat([]byte{1}, 16), 0o600)
	}
	g := GramineKeySealer{Dir: dir}
	b := Binding(nil)
	good, _ := g.SealKey(make([]byte, KeySize), b[:], ModeUniqueKey)
	f.Add(good)
	f.Add([]byte("QRYGSK\x01\x0aProductKey"))
	f.Fuzz(func(t *testing.T, sealed []byte) {
		dek, err := g.UnsealKey(sealed, b[:])
		if err == nil && len(dek) != KeySize {
			t.Fatalf("opened to %d bytes", len(dek))
		}
	})
}
