package recovery

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/bits"
	"testing"
)

// detReader is a deterministic byte stream: SHA-256(seed ‖ counter) blocks.
type detReader struct {
	seed string
	ctr  uint64
	buf  []byte
}

func (r *detReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(r.buf) == 0 {
			var c [8]byte
			binary.BigEndian.PutUint64(c[:], r.ctr)
			r.ctr++
			h := sha256.Sum256(append([]byte(r.seed), c[:]...))
			r.buf = h[:]
		}
		k := copy(p[n:], r.buf)
		r.buf = r.buf[k:]
		n += k
	}
	return n, nil
}

// constReader returns the same byte forever.
type constReader byte

func (c constReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c)
	}
	return len(p), nil
}

// refMul multiplies in GF(2^8) by carry-less multiplication and long
// division by 0x11B: a different algorithm from gfMul.
func refMul(a, b byte) byte {
	var p uint16
	for i := range 8 {
		if b>>i&1 == 1 {
			p ^= uint16(a) << i
		}
	}
	for d := 15; d >= 8; d-- {
		if p>>d&1 == 1 {
			p ^= 0x11B << (d - 8)
		}
	}
	return byte(p)
}

func TestGFMulVectors(t *testing.T) {
	for _, tc := range []struct{ a, b, want byte }{
		{0x57, 0x83, 0xC1}, // FIPS 197 §4.2
		{0x57, 0x13, 0xFE}, // FIPS 197 §4.2.1
		{0x53, 0xCA, 0x01}, // inverse pair
		{0x57, 0x02, 0xAE}, // xtime
		{0xAE, 0x02, 0x47}, // xtime with reduction
		{0x80, 0x02, 0x1B},
		{0x00, 0xFF, 0x00},
		{0x01, 0xA5, 0xA5},
		{0xFF, 0xFF, 0x13},
	} {
		if got := gfMul(tc.a, tc.b); got != tc.want {
			t.Errorf("gfMul(%#02x, %#02x) = %#02x, want %#02x", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestGFMulExhaustive(t *testing.T) {
	for a := range 256 {
		for b := range 256 {
			x, y := byte(a), byte(b)
			if got, want := gfMul(x, y), refMul(x, y); got != want {
				t.Fatalf("gfMul(%#02x, %#02x) = %#02x, reference %#02x", x, y, got, want)
			}
		}
	}
}

func TestGFInv(t *testing.T) {
	for _, tc := range []struct{ a, want byte }{
		{0x00, 0x00}, // by convention
		{0x01, 0x01},
		{0x53, 0xCA},
		{0xCA, 0x53},
		{0x02, 0x8D},
		{0xFF, 0x1C},
	} {
		if got := gfInv(tc.a); got != tc.want {
			t.Errorf("gfInv(%#02x) = %#02x, want %#02x", tc.a, got, tc.want)
		}
	}
	for a := 1; a < 256; a++ {
		if p := gfMul(byte(a), gfInv(byte(a))); p != 1 {
			t.Fatalf("%#02x · gfInv(%#02x) = %#02x, want 1", a, a, p)
		}
	}
}

func TestXORProperty(t *testing.T) {
	for n := 2; n <= 5; n++ {
		for trial := range 20 {
			shares, secret, err := xorShares(rand.Reader, n, DEKSize)
			if err != nil {
				t.Fatal(err)
			}
			if len(shares) != n || len(secret) != DEKSize {
				t.Fatalf("n=%d: %d shares, secret %d bytes", n, len(shares), len(secret))
			}
			for mask := 1; mask < 1<<n; mask++ {
				sub := subset(shares, mask)
				got := xorCombine(sub)
				if all := len(sub) == n; bytes.Equal(got, secret) != all {
					t.Fatalf("n=%d trial %d: subset %b recombines to secret: %v, want %v", n, trial, mask, !all, all)
				}
			}
		}
	}
	if xorCombine(nil) != nil {
		t.Fatal("xorCombine(nil) is not nil")
	}
}

// subset returns the shares whose bit is set in mask.
func subset(shares [][]byte, mask int) [][]byte {
	var out [][]byte
	for i, s := range shares {
		if mask>>i&1 == 1 {
			out = append(out, s)
		}
	}
	return out
}

func TestShamirProperty(t *testing.T) {
	for n := 2; n <= 5; n++ {
		for th := 2; th <= n; th++ {
			t.Run(fmt.Sprintf("n=%d,t=%d", n, th), func(t *testing.T) {
				for trial := range 10 {
					secret := make([]byte, DEKSize)
					rand.Read(secret)
					shares, err := shamirSplit(rand.Reader, secret, n, th)
					if err != nil {
						t.Fatal(err)
					}
					seen := map[byte]bool{}
					for _, s := range shares {
						if len(s) != DEKSize+1 {
							t.Fatalf("share of %d bytes", len(s))
						}
						if x := s[DEKSize]; x == 0 || seen[x] {
							t.Fatalf("x = %d is zero or repeated", x)
						}
						seen[s[DEKSize]] = true
					}
					for mask := 1; mask < 1<<n; mask++ {
						got, err := shamirCombine(subset(shares, mask))
						if err != nil {
							t.Fatal(err)
						}
						enough := bits.OnesCount(uint(mask)) >= th
						if bytes.Equal(got, secret) != enough {
							t.Fatalf("trial %d: subset %0*b recombines to the secret: %v, want %v", trial, n, mask, !enough, enough)
						}
					}
				}
			})
		}
	}
}

// TestShamirSplitGolden pins the split for a deterministic reader: the first
// 64 bytes give the x coordinates (first distinct non-zero values), the next
// 32 the degree-1 coefficients. The golden shares were also computed with an
// independent Python implementation of the same steps.
func TestShamirSplitGolden(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	shares, err := shamirSplit(&detReader{seed: "quarry recovery golden"}, secret, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	golden := []string{
		"27b7b33cd34eb8c72ad15a42b6818acfd80bcc5d7af9b1fb152bb61260ec2a011d",
		"283ddaa94f52445456d8db81958d6013d1c282de3a08730ad35705a0b8bb22bcf4",
		"aff31c6b5c7540c06609f684b321b91a003d06c120b96fbbab679c20d565eabb06",
	}
	for i, s := range shares {
		if got := hex.EncodeToString(s); got != golden[i] {
			t.Errorf("share %d = %s, want %s", i, got, golden[i])
		}
	}
	for _, pair := range [][2]int{{0, 1}, {0, 2}, {1, 2}, {2, 0}} {
		g0, _ := hex.DecodeString(golden[pair[0]])
		g1, _ := hex.DecodeString(golden[pair[1]])
		got, err := shamirCombine([][]byte{g0, g1})
		if err != nil || !bytes.Equal(got, secret) {
			t.Errorf("golden shares %v combine to %q, %v; want %q", pair, got, err, secret)
		}
	}
}

// TestShamirCombineVectors checks interpolation on points computed by hand
// from the multiplication vectors: p(x) = s ⊕ a·x.
func TestShamirCombineVectors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shares [][]byte
		want   []byte
	}{
		// s = 0x01, a = 0x57: p(0x83) = 0x01 ⊕ 0xC1 = 0xC0, p(0x01) = 0x01 ⊕ 0x57 = 0x56.
		{"linear", [][]byte{{0xC0, 0x83}, {0x56, 0x01}}, []byte{0x01}},
		{"linear reversed", [][]byte{{0x56, 0x01}, {0xC0, 0x83}}, []byte{0x01}},
		// s = 0x00, a = 0x53: p(0xCA) = 0x01, p(0x01) = 0x53.
		{"inverse pair", [][]byte{{0x01, 0xCA}, {0x53, 0x01}}, []byte{0x00}},
		// A single point of a constant polynomial.
		{"constant", [][]byte{{0x42, 0x07}}, []byte{0x42}},
		// Two bytes with s = (0x01, 0x00) and a = (0x57, 0x53) at x = 0x83, 0xCA.
		// p0(0x83) = 0xC0; p0(0xCA) = 0x01 ⊕ 0x57·0xCA; p1(0x83) = 0x53·0x83; p1(0xCA) = 0x01.
		{"two bytes", [][]byte{
			{0xC0, refMul(0x53, 0x83), 0x83},
			{0x01 ^ refMul(0x57, 0xCA), 0x01, 0xCA},
		}, []byte{0x01, 0x00}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := shamirCombine(tc.shares)
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("shamirCombine = %x, %v; want %x", got, err, tc.want)
			}
		})
	}
}

func TestShamirErrors(t *testing.T) {
	secret := make([]byte, DEKSize)
	for _, tc := range []struct {
		name   string
		rand   io.Reader
		secret []byte
		n, t   int
	}{
		{"threshold 1", rand.Reader, secret, 3, 1},
		{"threshold above n", rand.Reader, secret, 3, 4},
		{"too many shares", rand.Reader, secret, 256, 2},
		{"empty secret", rand.Reader, nil, 3, 2},
		{"short reader", io.LimitReader(rand.Reader, 70), secret, 3, 2},
		{"reader without distinct values", constReader(7), secret, 3, 2},
		{"empty reader", bytes.NewReader(nil), secret, 3, 2},
	} {
		t.Run("split "+tc.name, func(t *testing.T) {
			if s, err := shamirSplit(tc.rand, tc.secret, tc.n, tc.t); err == nil {
				t.Fatalf("shamirSplit = %x, want an error", s)
			}
		})
	}
	if _, err := shamirSplit(rand.Reader, secret, 255, 2); err != nil {
		t.Fatalf("255 shares: %v", err)
	}

	for _, tc := range []struct {
		name   string
		shares [][]byte
	}{
		{"no shares", nil},
		{"too short", [][]byte{{0x01}}},
		{"different lengths", [][]byte{{1, 2, 3}, {1, 4}}},
		{"zero x", [][]byte{{1, 0}, {2, 1}}},
		{"repeated x", [][]byte{{1, 5}, {2, 5}}},
	} {
		t.Run("combine "+tc.name, func(t *testing.T) {
			if s, err := shamirCombine(tc.shares); err == nil {
				t.Fatalf("shamirCombine = %x, want an error", s)
			}
		})
	}
}

func TestXORSharesShortReader(t *testing.T) {
	if _, _, err := xorShares(io.LimitReader(rand.Reader, 40), 2, DEKSize); err == nil {
		t.Fatal("xorShares with a short reader: no error")
	}
}
