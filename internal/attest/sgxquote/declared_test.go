package sgxquote_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// declaredQuotes are well-formed quotes of every layout DeclaredLen reads,
// each with the strict parser that accepts exactly it.
func declaredQuotes(t *testing.T) map[string]struct {
	quote []byte
	parse func([]byte) error
} {
	pl := platform(t)
	sgx := func(b []byte) error { _, err := sgxquote.Parse(b); return err }
	tdx := func(b []byte) error {
		q, err := tdxquote.Parse(b)
		if err == nil && q.Padding != 0 {
			return errors.New("padding left")
		}
		return err
	}
	out := map[string]struct {
		quote []byte
		parse func([]byte) error
	}{
		"SGX v3":          {pl.Quote(t, dcaptest.QuoteOptions{}), sgx},
		"SGX v4":          {pl.Quote(t, dcaptest.QuoteOptions{Version: 4}), sgx},
		"SGX v5":          {pl.Quote(t, dcaptest.QuoteOptions{Version: 5, AuthData: make([]byte, 7)}), sgx},
		"TDX v4":          {pl.TDXQuote(t, dcaptest.TDXQuoteOptions{}), tdx},
		"TDX v5 (TD 1.0)": {pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5}), tdx},
		"TDX v5 (TD 1.5)": {pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15}), tdx},
	}
	b, err := os.ReadFile(dcaptest.SGXTestdata(t, dcaptest.PhalaQuoteFile))
	if err != nil {
		t.Fatal(err)
	}
	out["SGX Phala (real)"] = struct {
		quote []byte
		parse func([]byte) error
	}{b, sgx}
	return out
}

// TestDeclaredLen: the declared length of each quote is its length, with
// anything appended (zeros, other bytes, another quote) or not; what
// Declared keeps is what the strict parser accepts.
func TestDeclaredLen(t *testing.T) {
	for name, q := range declaredQuotes(t) {
		for tail, extra := range map[string][]byte{"nothing": nil, "zeros": make([]byte, 70), "bytes": []byte("ConfigurationAnd"), "a quote": q.quote} {
			b := append(bytes.Clone(q.quote), extra...)
			n, err := sgxquote.DeclaredLen(b)
			if err != nil || n != len(q.quote) {
				t.Errorf("%s + %s: %d, %v; want %d", name, tail, n, err, len(q.quote))
				continue
			}
			d, err := sgxquote.Declared(b)
			if err != nil || !bytes.Equal(d, q.quote) {
				t.Errorf("%s + %s: Declared kept %d bytes, %v", name, tail, len(d), err)
			}
			if err := q.parse(d); err != nil {
				t.Errorf("%s + %s: the strict parser refuses what Declared kept: %v", name, tail, err)
			}
		}
		// Shorter than declared: no quote.
		for _, cut := range []int{1, len(q.quote) / 2, len(q.quote) - sgxquote.HeaderSize} {
			if _, err := sgxquote.DeclaredLen(q.quote[:len(q.quote)-cut]); !errors.Is(err, sgxquote.ErrFormat) {
				t.Errorf("%s without its last %d bytes: %v, want ErrFormat", name, cut, err)
			}
		}
	}
}

// TestDeclaredOE: an Open Enclave report keeps its quote as declared and
// gets a header with that length; bytes after the report, or inside the
// length the OE header declares but after the quote, go.
func TestDeclaredOE(t *testing.T) {
	raw := platform(t).Quote(t, dcaptest.QuoteOptions{})
	wrapped := sgxquote.Wrap(raw)
	if d, err := sgxquote.Declared(wrapped); err != nil || !bytes.Equal(d, wrapped) {
		t.Fatalf("a well-formed OE report: %d bytes, %v", len(d), err)
	}
	// Bytes after the report, and the OE header counting them.
	inside := sgxquote.Wrap(append(bytes.Clone(raw), "trailing"...))
	for name, b := range map[string][]byte{
		"after the report":                append(bytes.Clone(wrapped), "trailing"...),
		"inside the OE length":            inside,
		"inside the OE length, and after": append(bytes.Clone(inside), 0, 0),
	} {
		d, err := sgxquote.Declared(b)
		if err != nil || !bytes.Equal(d, wrapped) {
			t.Errorf("%s: kept %d bytes, %v; want the report of the declared quote", name, len(d), err)
			continue
		}
		if _, err := sgxquote.ParseAny(d); err != nil {
			t.Errorf("%s: the strict parser refuses what Declared kept: %v", name, err)
		}
	}
	// An OE header that declares more than follows, or less than the quote.
	more := bytes.Clone(wrapped)
	binary.LittleEndian.PutUint64(more[8:], uint64(len(raw)+1))
	less := bytes.Clone(wrapped)
	binary.LittleEndian.PutUint64(less[8:], uint64(len(raw)-1))
	for name, b := range map[string][]byte{"more": more, "less": less, "header only": wrapped[:sgxquote.OEHeaderSize]} {
		if _, err := sgxquote.Declared(b); !errors.Is(err, sgxquote.ErrFormat) {
			t.Errorf("OE length %s: %v, want ErrFormat", name, err)
		}
	}
}

// TestDeclaredLenRefuses: inputs that are no quote of a known layout.
func TestDeclaredLenRefuses(t *testing.T) {
	q := platform(t).Quote(t, dcaptest.QuoteOptions{})
	v2 := bytes.Clone(q)
	binary.LittleEndian.PutUint16(v2, 2)
	tdx3 := bytes.Clone(q)
	binary.LittleEndian.PutUint32(tdx3[4:], sgxquote.TEETypeTDX) // a v3 quote cannot be TDX
	huge := bytes.Clone(q)
	binary.LittleEndian.PutUint32(huge[sgxquote.HeaderSize+sgxquote.ReportBodySize:], 0xffffffff)
	v5 := platform(t).Quote(t, dcaptest.QuoteOptions{Version: 5})
	hugeBody := bytes.Clone(v5)
	binary.LittleEndian.PutUint32(hugeBody[sgxquote.HeaderSize+2:], 0xffffffff)
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"empty":             {nil, sgxquote.ErrFormat},
		"header only":       {q[:sgxquote.HeaderSize], sgxquote.ErrFormat},
		"version 2":         {v2, sgxquote.ErrUnsupported},
		"v3 TDX":            {tdx3, sgxquote.ErrUnsupported},
		"signature 4 GiB":   {huge, sgxquote.ErrFormat},
		"v5 body 4 GiB":     {hugeBody, sgxquote.ErrFormat},
		"v5 descriptor cut": {v5[:sgxquote.HeaderSize+3], sgxquote.ErrFormat},
	} {
		if _, err := sgxquote.DeclaredLen(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

// TestDeclaredRealTDX: real TDX quotes, one with 70 bytes of zero padding:
// the declared quote is the quote without its padding, as the TDX parser
// measures it.
func TestDeclaredRealTDX(t *testing.T) {
	for _, name := range []string{dcaptest.TDXQuoteA, dcaptest.TDXQuoteB, dcaptest.TDXQuoteC} {
		b, err := os.ReadFile(dcaptest.TDXTestdata(t, name))
		if err != nil {
			t.Fatal(err)
		}
		q, err := tdxquote.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		d, err := sgxquote.Declared(b)
		if err != nil || len(d) != len(b)-q.Padding || !bytes.Equal(d, q.Raw()) {
			t.Errorf("%s: kept %d bytes, %v; want %d (%d bytes of padding)", name, len(d), err, len(b)-q.Padding, q.Padding)
		}
	}
}
