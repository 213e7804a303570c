package client_test

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
	"github.com/quarry-cc/quarry/manifest"
)

// tdxSetup is a synthetic TDX platform whose fake TD quoting enclave quotes
// a Coordinator TD, and TDX collateral for it in a file.
type tdxSetup struct {
	pki            *dcaptest.PKI
	pl             *dcaptest.Platform
	body           tdxquote.TDReport
	collateralFile string
}

func newTDXSetup(t *testing.T) *tdxSetup {
	t.Helper()
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	file := filepath.Join(t.TempDir(), "collateral.json")
	if err := os.WriteFile(file, dcaptest.QVLJSON(t, pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{})), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &tdxSetup{pki: p, pl: pl, collateralFile: file}
	copy(s.body.MRTD[:], "the coordinator TD's firmware, measured.........")
	copy(s.body.RTMR[1][:], "the coordinator TD's kernel, measured...........")
	copy(s.body.RTMR[2][:], "the coordinator TD's command line and initrd....")
	s.body.TDAttributes[3] = 0x10 // SEPT_VE_DISABLE
	return s
}

// quote is a TDX quote over rd of the setup's TD, changed by f.
func (s *tdxSetup) quote(t *testing.T, rd [64]byte, f func(*tdxquote.TDReport)) []byte {
	b := s.body
	b.ReportData = rd
	if f != nil {
		f(&b)
	}
	return s.pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15, Body: b})
}

func (s *tdxSetup) verifier(era client.EraConfig) (*client.DCAPVerifier, error) {
	return client.NewDCAPVerifier(client.DCAPOptions{
		Expected: era, CollateralFile: s.collateralFile, RootCA: s.pki.Root,
		Now: func() time.Time { return s.pki.Time },
	})
}

// era expects exactly the setup's TD: MRTD, RTMR1 and RTMR2.
func (s *tdxSetup) era() client.EraConfig {
	return client.EraConfig{TDXMeasurements: manifest.TDXMeasurements{
		MRTD: hex.EncodeToString(s.body.MRTD[:]), RTMR1: hex.EncodeToString(s.body.RTMR[1][:]), RTMR2: hex.EncodeToString(s.body.RTMR[2][:]),
	}}
}

// TestTDXEraConfigVerifiesTheTD runs TDX quotes through the DCAP verifier:
// the expected TD is accepted; another firmware, kernel or initrd is
// refused; Debug accepts debug TDs as well, and without it a TD with any
// bit of the "TD under debug" group (TDATTRIBUTES 7:0) is refused.
func TestTDXEraConfigVerifiesTheTD(t *testing.T) {
	s := newTDXSetup(t)
	rd := client.ReportData([]byte("root"), []byte("nonce"))
	with := func(f func(*client.EraConfig)) client.EraConfig { e := s.era(); f(&e); return e }
	debugBit := func(bit int) func(*tdxquote.TDReport) {
		return func(b *tdxquote.TDReport) { b.TDAttributes[0] |= 1 << bit }
	}
	for _, tc := range []struct {
		name string
		era  client.EraConfig
		td   func(*tdxquote.TDReport)
		want error
	}{
		{"the expected TD", s.era(), nil, nil},
		{"Debug, production TD", with(func(e *client.EraConfig) { e.Debug = true }), nil, nil},
		{"Debug, debug TD", with(func(e *client.EraConfig) { e.Debug = true }), debugBit(0), nil},
		{"Debug, TD under debug by bit 2", with(func(e *client.EraConfig) { e.Debug = true }), debugBit(2), nil},
		{"debug TD", s.era(), debugBit(0), client.ErrEnclaveMismatch},
		{"TD under debug by bit 2", s.era(), debugBit(2), client.ErrEnclaveMismatch},
		{"TD under debug by bit 7", s.era(), debugBit(7), client.ErrEnclaveMismatch},
		{"other firmware", s.era(), func(b *tdxquote.TDReport) { b.MRTD[0] ^= 1 }, client.ErrEnclaveMismatch},
		{"other kernel", s.era(), func(b *tdxquote.TDReport) { b.RTMR[1][0] ^= 1 }, client.ErrEnclaveMismatch},
		{"other initrd", s.era(), func(b *tdxquote.TDReport) { b.RTMR[2][0] ^= 1 }, client.ErrEnclaveMismatch},
		{"Debug, other firmware", with(func(e *client.EraConfig) { e.Debug = true }), func(b *tdxquote.TDReport) { b.MRTD[0] ^= 1 }, client.ErrEnclaveMismatch},
		{"opted out of RTMR1 and RTMR2, other kernel", with(func(e *client.EraConfig) { e.RTMR1, e.RTMR2, e.InsecureAllowUnsetRTMR1RTMR2 = "", "", true }),
			func(b *tdxquote.TDReport) { b.RTMR[1][0] ^= 1; b.RTMR[2][0] ^= 1 }, nil},
		{"opted out, other firmware", with(func(e *client.EraConfig) { e.RTMR1, e.RTMR2, e.InsecureAllowUnsetRTMR1RTMR2 = "", "", true }),
			func(b *tdxquote.TDReport) { b.MRTD[0] ^= 1 }, client.ErrEnclaveMismatch},
		{"opted out, RTMR2 still set, other initrd", with(func(e *client.EraConfig) { e.RTMR1, e.InsecureAllowUnsetRTMR1RTMR2 = "", true }),
			func(b *tdxquote.TDReport) { b.RTMR[2][0] ^= 1 }, client.ErrEnclaveMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := s.verifier(tc.era)
			if err != nil {
				t.Fatal(err)
			}
			err = v.VerifyQuote(context.Background(), s.quote(t, rd, tc.td), rd)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("VerifyQuote = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestTDXEraConfigRequiresMRTD: Debug in an era config adds debug TDs to
// the accepted ones; it never lifts MRTD, RTMR1 or RTMR2, so a config
// without MRTD is refused before any quote is verified (it would accept a
// production TD with any firmware).
func TestTDXEraConfigRequiresMRTD(t *testing.T) {
	s := newTDXSetup(t)
	noMRTD := s.era()
	noMRTD.MRTD, noMRTD.Debug = "", true
	v, err := s.verifier(noMRTD)
	if err == nil {
		rd := client.ReportData([]byte("root"), nil)
		err := v.VerifyQuote(context.Background(), s.quote(t, rd, func(b *tdxquote.TDReport) { copy(b.MRTD[:], "any other firmware") }), rd)
		t.Fatalf("an era config with Debug and no MRTD is accepted; a production TD with other firmware verifies: %v", err)
	}
	if !strings.Contains(err.Error(), "MRTD is missing") {
		t.Fatalf("error %q does not name MRTD", err)
	}
}

func TestParseTDXEraConfig(t *testing.T) {
	h := func(b byte) string { return strings.Repeat(hex.EncodeToString([]byte{b}), 48) }
	mrtd, rtmr := `"MRTD":"`+h(0xab)+`"`, `"RTMR1":"`+h(0x01)+`","RTMR2":"`+h(0x02)+`"`
	for _, tc := range []struct{ json, want string }{
		// Accepted ("" = no error).
		{`{` + mrtd + `,` + rtmr + `}`, ""},
		{`{` + mrtd + `,` + rtmr + `,"Debug":true}`, ""},
		{`{` + mrtd + `,` + rtmr + `,"TDAttributes":"0000001000000000","AcceptedTCBStatuses":["TDRelaunchAdvised","tdrelaunchadvisedconfigurationneeded"]}`, ""},
		{`{` + mrtd + `,"InsecureAllowUnsetRTMR1RTMR2":true}`, ""},
		{`{` + mrtd + `,"RTMR2":"` + h(0x02) + `","InsecureAllowUnsetRTMR1RTMR2":true}`, ""},
		// MRTD, whatever Debug says.
		{`{` + rtmr + `,"Debug":true}`, "era config: MRTD is missing"},
		{`{"RTMR0":"` + h(0x00) + `","Debug":true}`, "era config: MRTD is missing"},
		{`{` + rtmr + `,"Debug":true,"InsecureAllowUnsetRTMR1RTMR2":true}`, "era config: MRTD is missing"},
		{`{` + rtmr + `}`, "era config: MRTD is missing"},
		// RTMR1 and RTMR2 unless opted out, whatever Debug says.
		{`{` + mrtd + `}`, "era config: RTMR1 is missing"},
		{`{` + mrtd + `,"Debug":true}`, "era config: RTMR1 is missing"},
		{`{` + mrtd + `,"RTMR1":"` + h(0x01) + `"}`, "era config: RTMR2 is missing"},
		{`{` + mrtd + `,"RTMR2":"` + h(0x02) + `","Debug":true}`, `or set "InsecureAllowUnsetRTMR1RTMR2": true`},
		// The opt-out is for TDX only, and spelt exactly.
		{`{"UniqueID":"` + strings.Repeat("0a", 32) + `","InsecureAllowUnsetRTMR1RTMR2":true}`, "applies to a TDX guest only"},
		{`{` + mrtd + `,"InsecureAllowUnsetRTMR":true}`, "unknown field"},
		// Formats, as in a manifest package.
		{`{"MRTD":"abcd",` + rtmr + `}`, "era config: invalid MRTD: want 96 hexadecimal digits"},
		{`{` + mrtd + `,` + rtmr + `,"XFAMMask":"ffffffffffffffff"}`, "era config: it sets XFAMMask without XFAM"},
		{`{` + mrtd + `,` + rtmr + `,"AcceptedTCBStatuses":["Fine"]}`, `unknown TCB status "Fine" in AcceptedTCBStatuses: want one of`},
		{`{` + mrtd + `,` + rtmr + `,"UniqueID":"` + strings.Repeat("0a", 32) + `"}`, "TDX measurements exclude UniqueID"},
	} {
		_, err := client.ParseEraConfig([]byte(tc.json))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.json, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err = %v, want %q", tc.json, err, tc.want)
		}
	}
}
