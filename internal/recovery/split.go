package recovery

import (
	"errors"
	"fmt"
	"io"
)

// This file holds the secret-sharing arithmetic: XOR sharing (every share is
// needed) and Shamir's threshold sharing over GF(2^8).
//
// GF(2^8) is the field of AES (FIPS 197 §4): bytes are polynomials over GF(2)
// reduced modulo x^8 + x^4 + x^3 + x + 1 (0x11B); addition is XOR. The
// multiplication below is branch-free and table-free, so its timing does not
// depend on the (secret) operands.

// gfMul returns a·b in GF(2^8) with the AES polynomial.
func gfMul(a, b byte) byte {
	var p byte
	for range 8 {
		p ^= -(b & 1) & a     // add a if the low bit of b is set
		carry := -(a >> 7)    // 0xFF if a's top bit is set, else 0
		a = a<<1 ^ 0x1B&carry // a·x, reduced modulo 0x11B
		b >>= 1
	}
	return p
}

// gfInv returns the multiplicative inverse of a in GF(2^8), computed as
// a^254 (a^255 = 1 for every non-zero a). gfInv(0) is 0.
func gfInv(a byte) byte {
	r, s := byte(1), a
	for range 7 { // 254 = 2 + 4 + 8 + 16 + 32 + 64 + 128
		s = gfMul(s, s)
		r = gfMul(r, s)
	}
	return r
}

// randomBytes reads n bytes from rand.
func randomBytes(rand io.Reader, n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(rand, b); err != nil {
		return nil, fmt.Errorf("reading randomness: %w", err)
	}
	return b, nil
}

// xorShares returns n random shares of size bytes each and the secret they
// share: the XOR of all of them.
func xorShares(rand io.Reader, n, size int) (shares [][]byte, secret []byte, err error) {
	shares = make([][]byte, n)
	for i := range shares {
		if shares[i], err = randomBytes(rand, size); err != nil {
			return nil, nil, err
		}
	}
	return shares, xorCombine(shares), nil
}

// xorCombine returns the XOR of equally long shares.
func xorCombine(shares [][]byte) []byte {
	if len(shares) == 0 {
		return nil
	}
	out := make([]byte, len(shares[0]))
	for _, s := range shares {
		for i := range out {
			out[i] ^= s[i]
		}
	}
	return out
}

// maxShamirShares is the number of distinct non-zero x coordinates in GF(2^8).
const maxShamirShares = 255

// maxXReads bounds the reads distinctXs makes, so that a broken reader (one
// that keeps returning the same bytes) cannot make it loop forever. With a
// real random source, missing one of 255 values in 256·64 bytes has
// probability below 2^-90.
const maxXReads = 256

// distinctXs returns n distinct non-zero random bytes.
func distinctXs(rand io.Reader, n int) ([]byte, error) {
	var used [256]bool
	used[0] = true
	xs := make([]byte, 0, n)
	buf := make([]byte, 64)
	for range maxXReads {
		if _, err := io.ReadFull(rand, buf); err != nil {
			return nil, fmt.Errorf("reading randomness: %w", err)
		}
		for _, b := range buf {
			if used[b] {
				continue
			}
			used[b] = true
			if xs = append(xs, b); len(xs) == n {
				return xs, nil
			}
		}
	}
	return nil, errors.New("reading randomness: the source does not yield enough distinct values")
}

// shamirSplit splits secret into n shares, any t of which recombine to it.
// Each share is len(secret)+1 bytes: y[0..len(secret)-1] ‖ x, where x is a
// distinct random non-zero point and y[i] = p_i(x) for a random polynomial
// p_i of degree t−1 whose constant term is secret[i].
func shamirSplit(rand io.Reader, secret []byte, n, t int) ([][]byte, error) {
	switch {
	case len(secret) == 0:
		return nil, errors.New("shamir: empty secret")
	case t < 2 || t > n:
		return nil, fmt.Errorf("shamir: threshold %d out of range 2..%d", t, n)
	case n > maxShamirShares:
		return nil, fmt.Errorf("shamir: %d shares, at most %d possible", n, maxShamirShares)
	}
	xs, err := distinctXs(rand, n)
	if err != nil {
		return nil, err
	}
	deg := t - 1
	coeffs, err := randomBytes(rand, len(secret)*deg) // a_1..a_deg per secret byte
	if err != nil {
		return nil, err
	}
	defer clear(coeffs)
	shares := make([][]byte, n)
	for i, x := range xs {
		share := make([]byte, len(secret)+1)
		for b, s := range secret {
			c := coeffs[b*deg : (b+1)*deg]
			var y byte // Horner: ((a_deg·x + a_deg−1)·x + … + a_1)·x + s
			for j := deg - 1; j >= 0; j-- {
				y = gfMul(y, x) ^ c[j]
			}
			share[b] = gfMul(y, x) ^ s
		}
		share[len(secret)] = x
		shares[i] = share
	}
	return shares, nil
}

// shamirCombine interpolates the shares' polynomials at x = 0 (Lagrange) and
// returns the secret. Given fewer shares than the threshold it returns a
// value unrelated to the secret; callers count shares themselves.
func shamirCombine(shares [][]byte) ([]byte, error) {
	if len(shares) == 0 {
		return nil, errors.New("shamir: no shares")
	}
	size := len(shares[0])
	if size < 2 {
		return nil, fmt.Errorf("shamir: share of %d bytes is too short", size)
	}
	var seen [256]bool
	for _, s := range shares {
		if len(s) != size {
			return nil, errors.New("shamir: shares differ in length")
		}
		x := s[size-1]
		if x == 0 || seen[x] {
			return nil, fmt.Errorf("shamir: zero or repeated x coordinate %d", x)
		}
		seen[x] = true
	}
	secret := make([]byte, size-1)
	for i, si := range shares {
		xi := si[size-1]
		// Lagrange basis at 0: Π_{j≠i} x_j / (x_j − x_i); subtraction is XOR.
		num, den := byte(1), byte(1)
		for j, sj := range shares {
			if j != i {
				num = gfMul(num, sj[size-1])
				den = gfMul(den, xi^sj[size-1])
			}
		}
		l := gfMul(num, gfInv(den))
		for b := range secret {
			secret[b] ^= gfMul(si[b], l)
		}
	}
	return secret, nil
}
