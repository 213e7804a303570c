package tdxquote_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

func readVector(tb testing.TB, name string) []byte {
	tb.Helper()
	b, err := os.ReadFile(dcaptest.TDXTestdata(tb, name))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestParseRealVectors checks the fields the test data README lists.
func TestParseRealVectors(t *testing.T) {
	for _, tc := range []struct {
		file                    string
		version, body           uint16
		padding, signed         int
		teeTCBSVN, teeTCBSVN2   string
		mrtd, rtmr0, reportData string
		tdAttributes, xfam      string
		qeISVSVN                uint16
	}{
		{dcaptest.TDXQuoteA, 4, tdxquote.BodyTypeTD10, 70, 632, "060103", "000000", "91eb2b44d141d4ec", "44c0197b39157fdd", "9a9d48e7f6799642", "0000001000000000", "e702060000000000", 6},
		{dcaptest.TDXQuoteB, 5, tdxquote.BodyTypeTD15, 0, 702, "070103", "0d0103", "273828c46252fcbd", "000000000000", "d2142b643598eb5f", "0000001000000000", "e718060000000000", 7},
		{dcaptest.TDXQuoteC, 5, tdxquote.BodyTypeTD15, 0, 702, "0b0104", "0d0104", "7348651a34b2d2d3", "5c8daf76063a71ac", "945eaacf5abc1f71", "0000001000000000", "e702060000000000", 7},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b := readVector(t, tc.file)
			if !tdxquote.IsTDX(b) {
				t.Fatal("IsTDX false")
			}
			q, err := tdxquote.Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			h := func(s []byte) string { return hex.EncodeToString(s) }
			checks := []struct{ name, got, want string }{
				{"TEE_TCB_SVN", h(q.Body.TEETCBSVN[:3]), tc.teeTCBSVN},
				{"TEE_TCB_SVN2", h(q.Body.TEETCBSVN2[:3]), tc.teeTCBSVN2},
				{"MRTD", h(q.Body.MRTD[:8]), tc.mrtd},
				{"RTMR0", h(q.Body.RTMR[0][:len(tc.rtmr0)/2]), tc.rtmr0},
				{"REPORTDATA", h(q.Body.ReportData[:8]), tc.reportData},
				{"TDATTRIBUTES", h(q.Body.TDAttributes[:]), tc.tdAttributes},
				{"XFAM", h(q.Body.XFAM[:]), tc.xfam},
				{"RTMR3", h(q.Body.RTMR[3][:]), strings.Repeat("0", 96)},
				{"MRSIGNERSEAM", h(q.Body.MRSIGNERSEAM[:]), strings.Repeat("0", 96)},
				{"QE vendor", h(q.Header.QEVendorID[:]), "939a7233f79c4ca9940a0db3957f0607"},
			}
			for _, c := range checks {
				if c.got != c.want {
					t.Errorf("%s = %s, want %s", c.name, c.got, c.want)
				}
			}
			if q.Header.Version != tc.version || q.BodyType != tc.body || q.Padding != tc.padding || len(q.SignedData()) != tc.signed {
				t.Errorf("version %d body %d padding %d signed %d", q.Header.Version, q.BodyType, q.Padding, len(q.SignedData()))
			}
			if q.QEReport.ISVSVN() != tc.qeISVSVN || q.CertType != 5 || len(q.QEAuthData) != 32 {
				t.Errorf("QE ISVSVN %d, cert type %d, auth %d", q.QEReport.ISVSVN(), q.CertType, len(q.QEAuthData))
			}
			if q.Body.Debug() || q.Body.TDAttributesValue()&tdxquote.TDAttributeSEPTVEDisable == 0 {
				t.Error("TD attributes: want SEPT_VE_DISABLE, not DEBUG")
			}
			if chain, err := q.PCKChain(); err != nil || len(chain) != 3 {
				t.Errorf("PCK chain: %d, %v", len(chain), err)
			}
			if !bytes.Equal(q.Body.Marshal(q.BodyType), q.SignedData()[len(q.SignedData())-len(q.Body.Marshal(q.BodyType)):]) {
				t.Error("Marshal does not reproduce the body")
			}
		})
	}
}

// TestParseErrors: each malformed or unsupported shape gets its error.
func TestParseErrors(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	v4 := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{})
	v5 := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15})
	mod := func(q []byte, f func([]byte) []byte) []byte { return f(bytes.Clone(q)) }
	for _, tc := range []struct {
		name string
		in   []byte
		want error
		text string
	}{
		{"empty", nil, tdxquote.ErrFormat, "version"},
		{"truncated header", v4[:40], tdxquote.ErrFormat, "user data"},
		{"version 3", mod(v4, func(b []byte) []byte { b[0] = 3; return b }), tdxquote.ErrUnsupported, "version"},
		{"key type 3", mod(v4, func(b []byte) []byte { b[2] = 3; return b }), tdxquote.ErrUnsupported, "key type"},
		{"TEE type SGX", mod(v4, func(b []byte) []byte { b[4] = 0; return b }), tdxquote.ErrUnsupported, "TEE type"},
		{"v5 SGX body", mod(v5, func(b []byte) []byte { b[48] = 1; return b }), tdxquote.ErrUnsupported, "body type 1"},
		{"v5 body type 4", mod(v5, func(b []byte) []byte { b[48] = 4; return b }), tdxquote.ErrUnsupported, "body type 4"},
		{"v5 body size", mod(v5, func(b []byte) []byte { b[50]++; return b }), tdxquote.ErrFormat, "size"},
		{"truncated body", v4[:600], tdxquote.ErrFormat, "need"},
		{"signature length too long", mod(v4, func(b []byte) []byte { binary.LittleEndian.PutUint32(b[632:], uint32(len(b))); return b }), tdxquote.ErrFormat, "signature data length"},
		{"non-zero trailing byte", append(bytes.Clone(v4), 0, 0, 7), tdxquote.ErrFormat, "non-zero"},
		{"outer cert type 5", mod(v4, func(b []byte) []byte { b[636+128] = 5; return b }), tdxquote.ErrUnsupported, "want 6"},
		{"outer cert size", mod(v4, func(b []byte) []byte { b[636+130]++; return b }), tdxquote.ErrFormat, "certification data size"},
		{"inner cert type 7", mod(v4, func(b []byte) []byte { b[len(b)-len(pl.ChainPEM())-6] = 7; return b }), tdxquote.ErrUnsupported, "inside type 6"},
		{"too large", make([]byte, tdxquote.MaxQuoteSize+1), tdxquote.ErrFormat, "more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := tdxquote.Parse(tc.in)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Parse = %v, %v; want %v mentioning %q", q, err, tc.want, tc.text)
			}
		})
	}
	// Zero padding is tolerated and not part of Raw.
	q, err := tdxquote.Parse(append(bytes.Clone(v4), 0, 0, 0))
	if err != nil || q.Padding != 3 || !bytes.Equal(q.Raw(), v4) {
		t.Fatalf("padded: %v, padding %d", err, q.Padding)
	}
}

// TestDebugGroup: every bit of TDATTRIBUTES 7:0 (the "TD under debug"
// group of the TDX Module ABI) makes a debug TD, not only bit 0; bits above
// (SEPT_VE_DISABLE, PKS, …) do not.
func TestDebugGroup(t *testing.T) {
	for bit := range 64 {
		var r tdxquote.TDReport
		r.TDAttributes[bit/8] = 1 << (bit % 8)
		if got, want := r.Debug(), bit < 8; got != want {
			t.Errorf("TDATTRIBUTES bit %d: Debug() = %v, want %v", bit, got, want)
		}
	}
	var r tdxquote.TDReport
	if r.Debug() {
		t.Error("no attribute set: Debug() = true")
	}
}
