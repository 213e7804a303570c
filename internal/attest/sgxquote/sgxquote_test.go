package sgxquote_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

func platform(t testing.TB) *dcaptest.Platform {
	t.Helper()
	return dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
}

func TestParsePhala(t *testing.T) {
	raw, err := os.ReadFile(dcaptest.SGXTestdata(t, dcaptest.PhalaQuoteFile))
	if err != nil {
		t.Fatal(err)
	}
	q, err := sgxquote.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if q.Header.Version != 3 || q.Header.AttKeyType != 2 || q.Header.TEEType != 0 {
		t.Errorf("header = %+v", q.Header)
	}
	if q.Header.QEVendorID != sgxquote.IntelQEVendorID() {
		t.Errorf("QE vendor = %x", q.Header.QEVendorID)
	}
	if q.Header.QESVN != 10 || q.Header.PCESVN != 15 {
		t.Errorf("QE SVN %d, PCE SVN %d; want 10, 15", q.Header.QESVN, q.Header.PCESVN)
	}
	if len(q.QEAuthData) != 32 || q.CertType != 5 || len(q.CertData) != 3548 {
		t.Errorf("auth %d bytes, cert type %d, %d bytes; want 32, 5, 3548", len(q.QEAuthData), q.CertType, len(q.CertData))
	}
	if len(q.SignedData()) != 432 || !bytes.Equal(q.SignedData(), raw[:432]) || !bytes.Equal(q.Raw(), raw) {
		t.Error("SignedData is not quote[0:432] or Raw is not the input")
	}
	rd := q.Body.ReportData()
	if !bytes.HasPrefix(rd[:], []byte("Hello, world!")) {
		t.Errorf("report data = %q", rd[:16])
	}
	if mr := q.Body.MRENCLAVE(); hex.EncodeToString(mr[:4]) != "33d8736d" {
		got := hex.EncodeToString(mr[:4])
		t.Errorf("MRENCLAVE starts %s, want 33d8736d", got)
	}
	if q.Body.Debug() {
		t.Error("Debug = true")
	}
	if q.QEReport.ISVProdID() != 1 || q.QEReport.ISVSVN() != 10 {
		t.Errorf("QE ISVPRODID %d ISVSVN %d, want 1, 10", q.QEReport.ISVProdID(), q.QEReport.ISVSVN())
	}
	chain, err := q.PCKChain() // ends in a NUL byte
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Intel SGX PCK Certificate", "Intel SGX PCK Processor CA", "Intel SGX Root CA"}
	for i, c := range chain {
		if i >= len(want) || c.Subject.CommonName != want[i] {
			t.Errorf("chain[%d] = %q", i, c.Subject.CommonName)
		}
	}
	if !sgxquote.IsRaw(raw) || sgxquote.IsWrapped(raw) {
		t.Error("IsRaw/IsWrapped wrong for the raw vector")
	}
	w, err := sgxquote.ParseAny(sgxquote.Wrap(raw))
	if err != nil || !bytes.Equal(w.Raw(), raw) {
		t.Errorf("ParseAny(Wrap) = %v", err)
	}
}

func TestParseVersions(t *testing.T) {
	pl := platform(t)
	enc := dcaptest.Enclave{ISVProdID: 0x1234, ISVSVN: 0x0506, Debug: true}
	copy(enc.MRENCLAVE[:], "mrenclave mrenclave mrenclave 32")
	copy(enc.MRSIGNER[:], "mrsigner mrsigner mrsigner mrsig")
	copy(enc.ReportData[:], "report data")
	for _, tc := range []struct {
		version   uint16
		signedLen int
		bodyType  uint16
	}{
		{3, 432, 0},
		{4, 432, 0},
		{5, 438, 1},
	} {
		raw := pl.Quote(t, dcaptest.QuoteOptions{Version: tc.version, Enclave: enc})
		for _, input := range [][]byte{raw, sgxquote.Wrap(raw)} {
			q, err := sgxquote.ParseAny(input)
			if err != nil {
				t.Fatalf("v%d: %v", tc.version, err)
			}
			b := &q.Body
			switch {
			case q.Header.Version != tc.version, q.BodyType != tc.bodyType, len(q.SignedData()) != tc.signedLen:
				t.Errorf("v%d: version %d, body type %d, signed %d bytes", tc.version, q.Header.Version, q.BodyType, len(q.SignedData()))
			case b.MRENCLAVE() != enc.MRENCLAVE, b.MRSIGNER() != enc.MRSIGNER, b.ReportData() != enc.ReportData:
				t.Errorf("v%d: measurements or report data differ", tc.version)
			case b.ISVProdID() != enc.ISVProdID, b.ISVSVN() != enc.ISVSVN, !b.Debug():
				t.Errorf("v%d: ISVPRODID %#x ISVSVN %#x debug %v", tc.version, b.ISVProdID(), b.ISVSVN(), b.Debug())
			case q.CertType != 5 || len(q.QEAuthData) != 32:
				t.Errorf("v%d: cert type %d, auth %d bytes", tc.version, q.CertType, len(q.QEAuthData))
			}
			if _, err := q.PCKChain(); err != nil {
				t.Errorf("v%d: PCKChain: %v", tc.version, err)
			}
		}
	}
}

// TestReportBodyOffsets checks every accessor against the offsets of
// sgx_report_body_t, with a distinct byte pattern per field.
func TestReportBodyOffsets(t *testing.T) {
	var b sgxquote.ReportBody
	for i := range b {
		b[i] = byte(i)
	}
	le16 := func(off int) uint16 { return uint16(off) | uint16(off+1)<<8 }
	arr := func(off, n int) []byte {
		out := make([]byte, n)
		for i := range out {
			out[i] = byte(off + i)
		}
		return out
	}
	cpusvn, ext, attrRaw, mre, mrs, cfg, fam, rd := b.CPUSVN(), b.ISVExtProdID(), b.AttributesRaw(), b.MRENCLAVE(), b.MRSIGNER(), b.ConfigID(), b.ISVFamilyID(), b.ReportData()
	for _, tc := range []struct {
		name string
		got  []byte
		off  int
	}{
		{"CPUSVN", cpusvn[:], 0},
		{"ISVExtProdID", ext[:], 32},
		{"Attributes", attrRaw[:], 48},
		{"MRENCLAVE", mre[:], 64},
		{"MRSIGNER", mrs[:], 128},
		{"ConfigID", cfg[:], 192},
		{"ISVFamilyID", fam[:], 304},
		{"ReportData", rd[:], 320},
	} {
		if !bytes.Equal(tc.got, arr(tc.off, len(tc.got))) {
			t.Errorf("%s does not read offset %d", tc.name, tc.off)
		}
	}
	if got, want := b.MiscSelect(), binary.LittleEndian.Uint32(arr(16, 4)); got != want {
		t.Errorf("MiscSelect = %#x, want %#x", got, want)
	}
	for _, tc := range []struct {
		name      string
		got, want uint16
	}{
		{"ISVProdID", b.ISVProdID(), le16(256)},
		{"ISVSVN", b.ISVSVN(), le16(258)},
		{"ConfigSVN", b.ConfigSVN(), le16(260)},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %#x, want %#x", tc.name, tc.got, tc.want)
		}
	}
	a := b.Attributes()
	if a.Flags != binary.LittleEndian.Uint64(arr(48, 8)) || a.XFRM != binary.LittleEndian.Uint64(arr(56, 8)) {
		t.Errorf("Attributes = %+v", a)
	}
	var d sgxquote.ReportBody
	if d.Debug() {
		t.Error("zero body is debug")
	}
	d[48] = sgxquote.AttributeDebug
	if !d.Debug() {
		t.Error("DEBUG bit not seen")
	}
}

// patch returns a copy of q with f applied.
func patch(q []byte, f func(b []byte) []byte) []byte { return f(bytes.Clone(q)) }

func TestParseErrors(t *testing.T) {
	pl := platform(t)
	v3 := pl.Quote(t, dcaptest.QuoteOptions{})
	v4 := pl.Quote(t, dcaptest.QuoteOptions{Version: 4})
	v5 := pl.Quote(t, dcaptest.QuoteOptions{Version: 5})
	put16 := func(off int, v uint16) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint16(b[off:], v); return b }
	}
	put32 := func(off int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b }
	}
	// Offsets inside the signature data (v3): auth size at 436+576.
	authOff := 436 + 576
	certTypeOff := authOff + 2 + 32
	// v4: outer cert type at 436+128, inner type after QE report, sig, auth.
	v4Outer := 436 + 128
	v4Inner := v4Outer + 6 + 384 + 64 + 2 + 32
	for _, tc := range []struct {
		name  string
		input []byte
		want  error
	}{
		{"empty", nil, sgxquote.ErrFormat},
		{"header only", v3[:48], sgxquote.ErrFormat},
		{"trailing byte", append(bytes.Clone(v3), 0), sgxquote.ErrFormat},
		{"version 2", patch(v3, put16(0, 2)), sgxquote.ErrUnsupported},
		{"version 6", patch(v3, put16(0, 6)), sgxquote.ErrUnsupported},
		{"P-384 key type", patch(v3, put16(2, 3)), sgxquote.ErrUnsupported},
		{"TDX TEE type", patch(v4, put32(4, 0x81)), sgxquote.ErrUnsupported},
		{"other TEE type", patch(v3, put32(4, 1)), sgxquote.ErrUnsupported},
		{"signature length too long", patch(v3, put32(432, uint32(len(v3)-436+1))), sgxquote.ErrFormat},
		{"signature length too short", patch(v3, put32(432, uint32(len(v3)-436-1))), sgxquote.ErrFormat},
		{"auth size beyond end", patch(v3, put16(authOff, 0xffff)), sgxquote.ErrFormat},
		{"cert size too long", patch(v3, put32(certTypeOff+2, uint32(len(v3)-certTypeOff-6+1))), sgxquote.ErrFormat},
		{"cert size too short", patch(v3, put32(certTypeOff+2, uint32(len(v3)-certTypeOff-6-1))), sgxquote.ErrFormat},
		{"v3 cert type 6", patch(v3, put16(certTypeOff, 6)), sgxquote.ErrUnsupported},
		{"v3 cert type 0", patch(v3, put16(certTypeOff, 0)), sgxquote.ErrUnsupported},
		{"v4 outer cert type 5", patch(v4, put16(v4Outer, 5)), sgxquote.ErrUnsupported},
		{"v4 outer size wrong", patch(v4, put32(v4Outer+2, 7)), sgxquote.ErrFormat},
		{"v4 inner cert type 6", patch(v4, put16(v4Inner, 6)), sgxquote.ErrUnsupported},
		{"v4 inner size wrong", patch(v4, put32(v4Inner+2, 1)), sgxquote.ErrFormat},
		{"v5 TD report body", patch(v5, put16(48, 2)), sgxquote.ErrUnsupported},
		{"v5 body size", patch(v5, put32(50, 383)), sgxquote.ErrFormat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := sgxquote.Parse(tc.input)
			if !errors.Is(err, tc.want) || q != nil {
				t.Fatalf("Parse = %v, %v; want %v", q, err, tc.want)
			}
		})
	}
}

func TestParseTruncated(t *testing.T) {
	pl := platform(t)
	for _, v := range []uint16{3, 4, 5} {
		q := pl.Quote(t, dcaptest.QuoteOptions{Version: v})
		for n := range len(q) {
			if _, err := sgxquote.Parse(q[:n]); !errors.Is(err, sgxquote.ErrFormat) {
				t.Fatalf("v%d truncated to %d bytes: err = %v, want ErrFormat", v, n, err)
			}
		}
	}
}

func TestPCKChain(t *testing.T) {
	pl := platform(t)
	chain := pl.ChainPEM() // ends in NUL
	pemOnly := bytes.TrimRight(chain, "\x00")
	firstEnd := bytes.Index(pemOnly, []byte("-----END CERTIFICATE-----\n")) + len("-----END CERTIFICATE-----\n")
	for _, tc := range []struct {
		name    string
		data    []byte
		certs   int
		wantErr error
	}{
		{"trailing NUL", chain, 3, nil},
		{"no NUL", pemOnly, 3, nil},
		{"whitespace and NULs", append(bytes.Clone(pemOnly), "\r\n \x00\x00"...), 3, nil},
		{"one certificate", pemOnly[:firstEnd], 1, nil},
		{"garbage between", append(append(bytes.Clone(pemOnly[:firstEnd]), "junk\n"...), pemOnly[firstEnd:]...), 0, sgxquote.ErrFormat},
		{"garbage before", append([]byte("junk"), pemOnly...), 0, sgxquote.ErrFormat},
		{"NUL between", append(append(bytes.Clone(pemOnly[:firstEnd]), 0), pemOnly[firstEnd:]...), 0, sgxquote.ErrFormat},
		{"empty", nil, 0, sgxquote.ErrFormat},
		{"only NUL", []byte{0}, 0, sgxquote.ErrFormat},
		{"wrong block type", []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"), 0, sgxquote.ErrFormat},
		{"bad DER", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0, sgxquote.ErrFormat},
		{"unterminated", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n"), 0, sgxquote.ErrFormat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certs, err := sgxquote.ParsePEMChain(tc.data)
			if !errors.Is(err, tc.wantErr) || len(certs) != tc.certs {
				t.Fatalf("ParsePEMChain = %d certs, %v; want %d, %v", len(certs), err, tc.certs, tc.wantErr)
			}
		})
	}

	for _, typ := range []uint16{1, 2, 3, 4} {
		q, err := sgxquote.Parse(pl.Quote(t, dcaptest.QuoteOptions{CertType: typ, CertData: []byte("opaque")}))
		if err != nil {
			t.Fatalf("type %d: %v", typ, err)
		}
		if _, err := q.PCKChain(); !errors.Is(err, sgxquote.ErrUnsupported) {
			t.Errorf("type %d: PCKChain err = %v, want ErrUnsupported", typ, err)
		}
	}
}

func TestOEHeader(t *testing.T) {
	quote := []byte{3, 0, 2, 0, 0xaa, 0xbb}
	w := sgxquote.Wrap(quote)
	want, _ := hex.DecodeString("0100000002000000" + "0600000000000000" + "03000200aabb")
	if !bytes.Equal(w, want) {
		t.Fatalf("Wrap = %x, want %x", w, want)
	}
	if !sgxquote.IsWrapped(w) || sgxquote.IsWrapped(quote) {
		t.Error("IsWrapped wrong")
	}
	got, err := sgxquote.Unwrap(w)
	if err != nil || !bytes.Equal(got, quote) {
		t.Fatalf("Unwrap = %x, %v", got, err)
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"short", w[:15]},
		{"raw quote", append(quote, make([]byte, 16)...)},
		{"version 2", patch(w, func(b []byte) []byte { b[0] = 2; return b })},
		{"type 1", patch(w, func(b []byte) []byte { b[4] = 1; return b })},
		{"length too long", patch(w, func(b []byte) []byte { b[8] = 7; return b })},
		{"length too short", patch(w, func(b []byte) []byte { b[8] = 5; return b })},
		{"extra byte", append(bytes.Clone(w), 0)},
	} {
		if _, err := sgxquote.Unwrap(tc.in); !errors.Is(err, sgxquote.ErrFormat) {
			t.Errorf("Unwrap(%s) err = %v, want ErrFormat", tc.name, err)
		}
	}
	// ParseAny applies the same strictness to the wrapper.
	pl := platform(t)
	q := pl.Quote(t, dcaptest.QuoteOptions{})
	bad := sgxquote.Wrap(q)
	bad[8]++
	if _, err := sgxquote.ParseAny(bad); !errors.Is(err, sgxquote.ErrFormat) || !strings.Contains(err.Error(), "OE report") {
		t.Errorf("ParseAny(bad OE length) = %v", err)
	}
}

func TestIsRaw(t *testing.T) {
	pl := platform(t)
	v3 := pl.Quote(t, dcaptest.QuoteOptions{})
	for _, tc := range []struct {
		name string
		in   []byte
		want bool
	}{
		{"v3 quote", v3, true},
		{"header only", v3[:48], true},
		{"47 bytes", v3[:47], false},
		{"wrapped", sgxquote.Wrap(v3), false},
		{"v4", pl.Quote(t, dcaptest.QuoteOptions{Version: 4}), false},
		{"key type 3", patch(v3, func(b []byte) []byte { b[2] = 3; return b }), true},
		{"key type 4", patch(v3, func(b []byte) []byte { b[2] = 4; return b }), false},
		{"TEE type TDX", patch(v3, func(b []byte) []byte { b[4] = 0x81; return b }), false},
		{"QE SVN 0", patch(v3, func(b []byte) []byte { b[8], b[9] = 0, 0; return b }), false},
		{"PCE SVN 0", patch(v3, func(b []byte) []byte { b[10], b[11] = 0, 0; return b }), false},
	} {
		if got := sgxquote.IsRaw(tc.in); got != tc.want {
			t.Errorf("IsRaw(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestParseDoesNotAlias(t *testing.T) {
	pl := platform(t)
	in := pl.Quote(t, dcaptest.QuoteOptions{})
	q, err := sgxquote.Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	before := bytes.Clone(q.Raw())
	for i := range in {
		in[i] = 0
	}
	if !bytes.Equal(q.Raw(), before) {
		t.Error("Parse result changes with its input")
	}
}
