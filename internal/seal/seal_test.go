package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata")

// Fixed inputs of the golden test vector.
var (
	goldenKey       = seq(0x00, KeySize)
	goldenNonce     = seq(0xa0, nonceSize)
	goldenHeader    = []byte(`{"recoveryKeys":{"admin":"MIIBIjAN"},"shareHashes":["3q2+7w=="]}`)
	goldenPlaintext = []byte(`{"state":"Mw==","manifest":"e30="}`)
	goldenFile      = filepath.Join("testdata", "v1.golden")
)

// seq returns n bytes counting up from start.
func seq(start byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = start + byte(i)
	}
	return b
}

func mustSeal(t testing.TB, dek, header, plaintext []byte) []byte {
	t.Helper()
	blob, err := Seal(nil, dek, header, plaintext)
	if err != nil {
		t.Fatalf("Seal: %v", err)
	}
	return blob
}

func TestRoundTrip(t *testing.T) {
	dek := seq(1, KeySize)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for _, tc := range []struct {
		name              string
		rand              io.Reader
		header, plaintext []byte
	}{
		{"empty", nil, nil, nil},
		{"header only", nil, []byte("hdr"), nil},
		{"plaintext only", nil, nil, []byte("state")},
		{"both", nil, goldenHeader, goldenPlaintext},
		{"large", nil, big[:4096], big},
		{"caller nonce", bytes.NewReader(goldenNonce), goldenHeader, goldenPlaintext},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob, err := Seal(tc.rand, dek, tc.header, tc.plaintext)
			if err != nil {
				t.Fatalf("Seal: %v", err)
			}
			if want := minSize + len(tc.header) + len(tc.plaintext); len(blob) != want {
				t.Errorf("len(blob) = %d, want %d", len(blob), want)
			}
			hdr, pt, err := Open(dek, blob)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if !bytes.Equal(hdr, tc.header) || !bytes.Equal(pt, tc.plaintext) {
				t.Errorf("Open = %q, %q; want %q, %q", short(hdr), short(pt), short(tc.header), short(tc.plaintext))
			}
			if hdr == nil || pt == nil {
				t.Errorf("Open returned nil slices (header %v, plaintext %v); want empty, non-nil", hdr == nil, pt == nil)
			}
			rh, err := ReadHeader(blob)
			if err != nil || !bytes.Equal(rh, tc.header) {
				t.Errorf("ReadHeader = %q, %v; want %q", short(rh), err, short(tc.header))
			}
		})
	}
}

func short(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}

func TestFreshNonce(t *testing.T) {
	dek := seq(1, KeySize)
	a := mustSeal(t, dek, goldenHeader, goldenPlaintext)
	b := mustSeal(t, dek, goldenHeader, goldenPlaintext)
	if bytes.Equal(a, b) {
		t.Fatal("two seals of the same input are identical; nonce not fresh")
	}
}

// TestGolden pins format version 1: sealing the fixed inputs gives exactly
// the bytes in testdata/v1.golden (refresh with go test -update), and those
// bytes open to the fixed inputs.
func TestGolden(t *testing.T) {
	blob, err := Seal(bytes.NewReader(goldenNonce), goldenKey, goldenHeader, goldenPlaintext)
	if err != nil {
		t.Fatalf("Seal: %v", err)
	}
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenFile, blob, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("read golden file (create it with -update): %v", err)
	}
	if !bytes.Equal(blob, want) {
		t.Fatalf("Seal output differs from %s:\n got %x\nwant %x", goldenFile, blob, want)
	}

	// The layout, checked by hand rather than through parse.
	if string(want[:8]) != "QRYSEAL\x00" {
		t.Errorf("magic = %q", want[:8])
	}
	if v := binary.LittleEndian.Uint16(want[8:10]); v != 1 {
		t.Errorf("version = %d, want 1", v)
	}
	h := int(binary.LittleEndian.Uint32(want[10:14]))
	if h != len(goldenHeader) || !bytes.Equal(want[14:14+h], goldenHeader) {
		t.Errorf("header = %q (length %d), want %q", want[14:14+h], h, goldenHeader)
	}
	if !bytes.Equal(want[14+h:14+h+12], goldenNonce) {
		t.Errorf("nonce = %x, want %x", want[14+h:14+h+12], goldenNonce)
	}
	// Independent decryption with plain AES-GCM: AAD is everything before the nonce.
	block, _ := aes.NewCipher(goldenKey)
	gcm, _ := cipher.NewGCM(block)
	pt, err := gcm.Open(nil, goldenNonce, want[14+h+12:], want[:14+h])
	if err != nil || !bytes.Equal(pt, goldenPlaintext) {
		t.Errorf("plain AES-GCM open = %q, %v; want %q", pt, err, goldenPlaintext)
	}

	hdr, pt, err := Open(goldenKey, want)
	if err != nil || !bytes.Equal(hdr, goldenHeader) || !bytes.Equal(pt, goldenPlaintext) {
		t.Errorf("Open(golden) = %q, %q, %v", hdr, pt, err)
	}
}

// TestFlipEveryByte flips each bit pattern of every byte of a sealed blob:
// no change may open. Only the version bytes may give ErrVersion.
func TestFlipEveryByte(t *testing.T) {
	dek := seq(1, KeySize)
	blob := mustSeal(t, dek, []byte("public recovery data"), []byte("secret state"))
	for i := range blob {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			b := bytes.Clone(blob)
			b[i] ^= mask
			_, _, err := Open(dek, b)
			switch {
			case err == nil:
				t.Fatalf("byte %d ^ %#x: Open succeeded", i, mask)
			case errors.Is(err, ErrDecrypt), errors.Is(err, ErrCorrupt):
			case errors.Is(err, ErrVersion) && (i == 8 || i == 9):
			default:
				t.Fatalf("byte %d ^ %#x: Open error %v, want ErrDecrypt or ErrCorrupt", i, mask, err)
			}
		}
	}
}

func TestTruncateAndExtend(t *testing.T) {
	dek := seq(1, KeySize)
	blob := mustSeal(t, dek, []byte("hdr"), []byte("secret state"))
	for n := range len(blob) {
		_, _, err := Open(dek, blob[:n])
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrDecrypt) {
			t.Errorf("Open(blob[:%d]) error = %v, want ErrCorrupt or ErrDecrypt", n, err)
		}
		if n < minSize+3 { // the header itself is cut: the structure is wrong
			if _, err := ReadHeader(blob[:n]); !errors.Is(err, ErrCorrupt) {
				t.Errorf("ReadHeader(blob[:%d]) error = %v, want ErrCorrupt", n, err)
			}
		}
	}
	if _, _, err := Open(dek, append(bytes.Clone(blob), 0)); !errors.Is(err, ErrDecrypt) {
		t.Errorf("Open(blob + 1 byte) error = %v, want ErrDecrypt", err)
	}
}

func TestWrongKey(t *testing.T) {
	blob := mustSeal(t, seq(1, KeySize), goldenHeader, goldenPlaintext)
	hdr, pt, err := Open(seq(2, KeySize), blob)
	if !errors.Is(err, ErrDecrypt) {
		t.Fatalf("Open with wrong key error = %v, want ErrDecrypt", err)
	}
	if hdr != nil || pt != nil {
		t.Errorf("Open with wrong key returned data")
	}
}

func TestMalformed(t *testing.T) {
	dek := seq(1, KeySize)
	good := mustSeal(t, dek, []byte("hdr"), []byte("pt"))
	withVersion := func(v uint16) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint16(b[8:], v)
		return b
	}
	withHeaderLen := func(h uint32) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint32(b[10:], h)
		return b
	}
	maxH := uint32(len(good) - minSize)
	for _, tc := range []struct {
		name    string
		blob    []byte
		want    error
		message string // substring of the error message, if set
	}{
		{"nil", nil, ErrCorrupt, "bad magic"},
		{"magic only", []byte(Magic), ErrCorrupt, "truncated"},
		{"bad magic", append([]byte("QRYSEAL\x01"), good[8:]...), ErrCorrupt, "bad magic"},
		{"other format", append([]byte{3, 0, 0, 0, 'a', 'b', 'c'}, good...), ErrCorrupt, "bad magic"},
		{"version 0", withVersion(0), ErrVersion, "version 0"},
		{"version 2", withVersion(2), ErrVersion, "version 2"},
		{"version 65535", withVersion(0xffff), ErrVersion, "version 65535"},
		{"version 2 truncated", withVersion(2)[:10], ErrVersion, "version 2"},
		{"header length max uint32", withHeaderLen(0xffffffff), ErrCorrupt, "header length"},
		{"header length one too long", withHeaderLen(maxH + 1), ErrCorrupt, "header length"},
		{"header length eats nonce", withHeaderLen(maxH), ErrDecrypt, ""},
		{"header length shorter", withHeaderLen(0), ErrDecrypt, ""},
		{"no ciphertext", good[:minSize-1], ErrCorrupt, "truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Open(dek, tc.blob)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open error = %v, want %v", err, tc.want)
			}
			if !bytes.Contains([]byte(err.Error()), []byte(tc.message)) {
				t.Errorf("Open error %q does not mention %q", err, tc.message)
			}
			if tc.want != ErrDecrypt {
				if _, err := ReadHeader(tc.blob); !errors.Is(err, tc.want) {
					t.Errorf("ReadHeader error = %v, want %v", err, tc.want)
				}
			}
		})
	}
}

func TestReadHeader(t *testing.T) {
	blob, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := ReadHeader(blob)
	if err != nil || !bytes.Equal(hdr, goldenHeader) {
		t.Fatalf("ReadHeader(golden) = %q, %v; want %q", hdr, err, goldenHeader)
	}
	hdr[0] ^= 0xff // the result is a copy
	if again, _ := ReadHeader(blob); !bytes.Equal(again, goldenHeader) {
		t.Error("ReadHeader result aliases the blob")
	}
	h2, _, err := Open(goldenKey, blob)
	if err != nil {
		t.Fatal(err)
	}
	h2[0] ^= 0xff
	if _, _, err := Open(goldenKey, blob); err != nil {
		t.Error("Open header aliases the blob")
	}
}

func TestKeySize(t *testing.T) {
	blob := mustSeal(t, seq(1, KeySize), nil, nil)
	for _, n := range []int{0, 16, 24, 31, 33, 64} {
		if _, err := Seal(nil, make([]byte, n), nil, nil); !errors.Is(err, ErrKeySize) {
			t.Errorf("Seal with %d-byte key error = %v, want ErrKeySize", n, err)
		}
		if _, _, err := Open(make([]byte, n), blob); !errors.Is(err, ErrKeySize) {
			t.Errorf("Open with %d-byte key error = %v, want ErrKeySize", n, err)
		}
	}
}

func TestRandErrors(t *testing.T) {
	if _, err := Seal(bytes.NewReader(make([]byte, nonceSize-1)), seq(1, KeySize), nil, nil); err == nil {
		t.Error("Seal with a short nonce reader succeeded")
	}
	if _, err := NewDataKey(bytes.NewReader(make([]byte, KeySize-1))); err == nil {
		t.Error("NewDataKey with a short reader succeeded")
	}
}

func TestNewDataKey(t *testing.T) {
	a, err := NewDataKey(nil)
	if err != nil || len(a) != KeySize {
		t.Fatalf("NewDataKey(nil) = %d bytes, %v", len(a), err)
	}
	b, _ := NewDataKey(nil)
	if bytes.Equal(a, b) {
		t.Error("two data keys are equal")
	}
	c, err := NewDataKey(bytes.NewReader(goldenKey))
	if err != nil || !bytes.Equal(c, goldenKey) {
		t.Errorf("NewDataKey(reader) = %x, %v; want %x", c, err, goldenKey)
	}
}

func TestSimulationKeySealer(t *testing.T) {
	var ks KeySealer = SimulationKeySealer{}
	dek := seq(7, KeySize)
	sealed, err := ks.SealKey(dek, nil, "")
	if err != nil || !bytes.Equal(sealed, dek) {
		t.Fatalf("SealKey = %x, %v; want the raw key", sealed, err)
	}
	sealed[0] ^= 0xff
	if dek[0] != 7 {
		t.Error("SealKey result aliases the key")
	}
	got, err := ks.UnsealKey(dek, nil)
	if err != nil || !bytes.Equal(got, dek) {
		t.Fatalf("UnsealKey = %x, %v", got, err)
	}
	for _, n := range []int{0, 1, 31, 33, 4096} {
		if _, err := ks.UnsealKey(make([]byte, n), nil); !errors.Is(err, ErrKeySize) {
			t.Errorf("UnsealKey(%d bytes) error = %v, want ErrKeySize", n, err)
		}
		if _, err := ks.SealKey(make([]byte, n), nil, ""); !errors.Is(err, ErrKeySize) {
			t.Errorf("SealKey(%d bytes) error = %v, want ErrKeySize", n, err)
		}
	}
}

// FuzzOpen feeds arbitrary blobs to Open and ReadHeader: neither may panic,
// every error wraps a sentinel, the two agree on structure, and a blob that
// opens re-seals to the same bytes under its own nonce.
func FuzzOpen(f *testing.F) {
	dek := goldenKey
	if golden, err := os.ReadFile(goldenFile); err == nil {
		f.Add(golden)
	}
	for _, in := range []struct{ h, p string }{{"", ""}, {"h", ""}, {"", "p"}, {"header", "plaintext"}} {
		blob, err := Seal(bytes.NewReader(goldenNonce), dek, []byte(in.h), []byte(in.p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(blob)
		f.Add(blob[:len(blob)/2])
	}
	f.Add([]byte{})
	f.Add([]byte(Magic))
	f.Add([]byte(Magic + "\x02\x00"))
	f.Add([]byte(Magic + "\x01\x00\xff\xff\xff\xff"))

	f.Fuzz(func(t *testing.T, blob []byte) {
		orig := bytes.Clone(blob)
		hdr, pt, err := Open(dek, blob)
		rh, rerr := ReadHeader(blob)
		if !bytes.Equal(blob, orig) {
			t.Fatal("Open or ReadHeader modified its input")
		}
		if rerr != nil {
			if !errors.Is(rerr, ErrCorrupt) && !errors.Is(rerr, ErrVersion) {
				t.Fatalf("ReadHeader error %v wraps no sentinel", rerr)
			}
			if err == nil {
				t.Fatalf("Open succeeded where ReadHeader failed: %v", rerr)
			}
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrDecrypt) {
				t.Fatalf("Open error %v wraps no sentinel", err)
			}
			if (rerr == nil) != errors.Is(err, ErrDecrypt) {
				t.Fatalf("Open error %v, ReadHeader error %v: structure verdicts disagree", err, rerr)
			}
			return
		}
		if !bytes.Equal(hdr, rh) {
			t.Fatalf("Open header %q != ReadHeader %q", hdr, rh)
		}
		nonce := blob[prefixSize+len(hdr) : prefixSize+len(hdr)+nonceSize]
		again, err := Seal(bytes.NewReader(nonce), dek, hdr, pt)
		if err != nil || !bytes.Equal(again, blob) {
			t.Fatalf("re-seal = %x, %v; want %x", again, err, blob)
		}
	})
}

func BenchmarkSealOpen(b *testing.B) {
	dek := seq(1, KeySize)
	header := bytes.Repeat([]byte("h"), 512)
	for _, size := range []int{10 << 10, 100 << 10, 1 << 20} {
		plaintext := bytes.Repeat([]byte{0x5a}, size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				blob, err := Seal(nil, dek, header, plaintext)
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := Open(dek, blob); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// unsaidSealer is a KeySealer that does not say whether it protects the key
// (it stores the key in clear, as the simulation sealer does).
type unsaidSealer struct{}

func (unsaidSealer) SealKey(dek, b []byte, m string) ([]byte, error) {
	return SimulationKeySealer{}.SealKey(dek, b, m)
}
func (unsaidSealer) UnsealKey(s, b []byte) ([]byte, error) {
	return SimulationKeySealer{}.UnsealKey(s, b)
}

func TestProtectsKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sealer KeySealer
		want   bool
	}{
		{"simulation", SimulationKeySealer{}, false},
		{"gramine", GramineKeySealer{Dir: t.TempDir()}, true},
		// Anything that does not say otherwise is treated as an enclave.
		{"a sealer that does not say", unsaidSealer{}, true},
		{"nil", nil, true},
	} {
		if got := ProtectsKey(tc.sealer); got != tc.want {
			t.Errorf("%s: ProtectsKey = %v, want %v", tc.name, got, tc.want)
		}
	}
}
