package attest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"testing"
)

func TestReportData(t *testing.T) {
	root := []byte("root certificate DER")
	for _, tc := range []struct {
		name  string
		nonce []byte
	}{
		{"no nonce", nil},
		{"empty nonce", []byte{}},
		{"nonce", []byte("a fresh nonce")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ReportData(root, tc.nonce)
			want := sha256.Sum256(append(append([]byte{}, root...), tc.nonce...))
			if !bytes.Equal(got[:32], want[:]) {
				t.Fatalf("first half = %x, want %x", got[:32], want)
			}
			if !bytes.Equal(got[32:], make([]byte, 32)) {
				t.Fatalf("second half = %x, want zeros", got[32:])
			}
		})
	}
	a, b := ReportData(root, []byte("n1")), ReportData(root, []byte("n2"))
	if a == b {
		t.Fatal("different nonces give the same report data")
	}
}

func TestSimulationIssuer(t *testing.T) {
	q, err := SimulationIssuer{}.Issue(context.Background(), [ReportDataSize]byte{})
	if !errors.Is(err, ErrUnsupported) || q != nil {
		t.Fatalf("Issue = %v, %v; want nil, ErrUnsupported", q, err)
	}
	if ErrUnsupported.Error() != "OE_UNSUPPORTED" {
		t.Fatalf("ErrUnsupported text = %q", ErrUnsupported)
	}
}
