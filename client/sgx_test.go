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

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

// sgxSetup is a synthetic SGX platform whose fake quoting enclave quotes a
// fixed enclave, and collateral for it in a file.
type sgxSetup struct {
	pki            *dcaptest.PKI
	pl             *dcaptest.Platform
	enclave        dcaptest.Enclave
	collateralFile string
}

func newSGXSetup(t *testing.T, status string, advisories ...string) *sgxSetup {
	t.Helper()
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	col := pl.Collateral(t, dcaptest.CollateralOptions{TCBLevels: []dcaptest.TCBLevel{{
		CompSVN: pl.Ext.CompSVN, PCESVN: pl.Ext.PCESVN, Status: status, Advisories: advisories,
	}}})
	file := filepath.Join(t.TempDir(), "collateral.json")
	if err := os.WriteFile(file, dcaptest.QVLJSON(t, col), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &sgxSetup{pki: p, pl: pl, collateralFile: file, enclave: dcaptest.Enclave{ISVProdID: 3, ISVSVN: 2}}
	copy(s.enclave.MRENCLAVE[:], "the coordinator enclave measured")
	copy(s.enclave.MRSIGNER[:], "the coordinator enclave signer!!")
	return s
}

// quote is the fake QE's OE-wrapped quote over rd, as a Coordinator serves it.
func (s *sgxSetup) quote(t *testing.T, rd [64]byte) []byte {
	e := s.enclave
	e.ReportData = rd
	return sgxquote.Wrap(s.pl.Quote(t, dcaptest.QuoteOptions{Enclave: e}))
}

func (s *sgxSetup) verifier(t *testing.T, era client.EraConfig) *client.DCAPVerifier {
	t.Helper()
	v, err := client.NewDCAPVerifier(client.DCAPOptions{
		Expected: era, CollateralFile: s.collateralFile, RootCA: s.pki.Root,
		Now: func() time.Time { return s.pki.Time },
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func (s *sgxSetup) era() client.EraConfig {
	return client.EraConfig{UniqueID: hex.EncodeToString(s.enclave.MRENCLAVE[:])}
}

// TestVerifyCoordinatorSGX verifies a Coordinator that issues synthetic SGX
// quotes over SHA-256(root ‖ nonce), with the DCAP verifier.
func TestVerifyCoordinatorSGX(t *testing.T) {
	ctx := context.Background()
	s := newSGXSetup(t, "SWHardeningNeeded", "INTEL-SA-00615")
	f := newFake(t)
	honest := quoteHandler(f, certPEM(f.inter, f.root), func(nonce []byte) []byte {
		return s.quote(t, client.ReportData(f.root.Raw, nonce))
	})
	f.handle("GET "+v2.PathQuote, honest)

	signer := hex.EncodeToString(s.enclave.MRSIGNER[:])
	for _, tc := range []struct {
		name string
		era  client.EraConfig
	}{
		{"UniqueID", s.era()},
		{"UniqueID upper case", client.EraConfig{UniqueID: strings.ToUpper(s.era().UniqueID)}},
		{"SignerID, ProductID, SecurityVersion", client.EraConfig{SignerID: signer, ProductID: 3, SecurityVersion: 2}},
		{"lower SecurityVersion", client.EraConfig{SignerID: signer, ProductID: 3, SecurityVersion: 1}},
		{"Debug allowed, production enclave", client.EraConfig{UniqueID: s.era().UniqueID, Debug: true}},
		{"advisory accepted", client.EraConfig{UniqueID: s.era().UniqueID, AcceptedAdvisories: []string{"intel-sa-00615"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			att, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{Verifier: s.verifier(t, tc.era)})
			if err != nil {
				t.Fatal(err)
			}
			if !att.QuoteVerified || !att.Root.Equal(f.root) || len(att.Quote) == 0 {
				t.Fatalf("attestation %+v", att)
			}
		})
	}

	wrongID := s.era()
	wrongID.UniqueID = strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name    string
		era     client.EraConfig
		handler func() // changes the fake before the call
		want    error
		text    string
	}{
		{"wrong MRENCLAVE", wrongID, nil, client.ErrEnclaveMismatch, "MRENCLAVE"},
		{"wrong MRSIGNER", client.EraConfig{SignerID: strings.Repeat("cd", 32), ProductID: 3, SecurityVersion: 2}, nil, client.ErrEnclaveMismatch, "MRSIGNER"},
		{"wrong ProductID", client.EraConfig{SignerID: signer, ProductID: 4, SecurityVersion: 2}, nil, client.ErrEnclaveMismatch, "ISVPRODID"},
		{"SecurityVersion too high", client.EraConfig{SignerID: signer, ProductID: 3, SecurityVersion: 3}, nil, client.ErrEnclaveMismatch, "ISVSVN"},
		{"TCB status not accepted", client.EraConfig{UniqueID: s.era().UniqueID, AcceptedTCBStatuses: []string{"UpToDate"}}, nil, client.ErrTCBNotAccepted, "SWHardeningNeeded"},
		{"advisory not accepted", client.EraConfig{UniqueID: s.era().UniqueID, AcceptedAdvisories: []string{"INTEL-SA-00289"}}, nil, client.ErrTCBNotAccepted, "INTEL-SA-00615"},
		{"quote over another nonce", s.era(), func() {
			f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.inter, f.root), func(nonce []byte) []byte {
				return s.quote(t, client.ReportData(f.root.Raw, append(nonce, 'x')))
			}))
		}, client.ErrReportDataMismatch, "report data"},
		{"quote without the nonce (replayed)", s.era(), func() {
			f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.inter, f.root), func([]byte) []byte {
				return s.quote(t, client.ReportData(f.root.Raw, nil))
			}))
		}, client.ErrReportDataMismatch, "report data"},
		{"quote for another root", s.era(), func() {
			other := newPKI(t)
			f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.inter, f.root), func(nonce []byte) []byte {
				return s.quote(t, client.ReportData(other.root.Raw, nonce))
			}))
		}, client.ErrReportDataMismatch, "report data"},
		{"tampered quote", s.era(), func() {
			f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.inter, f.root), func(nonce []byte) []byte {
				q := s.quote(t, client.ReportData(f.root.Raw, nonce))
				q[16+112] ^= 1 // a byte of MRENCLAVE
				return q
			}))
		}, client.ErrQuoteInvalid, "signature"},
		{"quote under another SGX root", s.era(), func() {
			other := newSGXSetup(t, "UpToDate")
			other.enclave = s.enclave
			f.handle("GET "+v2.PathQuote, quoteHandler(f, certPEM(f.inter, f.root), func(nonce []byte) []byte {
				return other.quote(t, client.ReportData(f.root.Raw, nonce))
			}))
		}, client.ErrQuoteInvalid, "root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.handle("GET "+v2.PathQuote, honest)
			if tc.handler != nil {
				tc.handler()
			}
			_, err := client.VerifyCoordinator(ctx, f.endpoint(), client.VerifyOptions{Verifier: s.verifier(t, tc.era)})
			if !errors.Is(err, client.ErrVerification) || !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want ErrVerification and %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.text)
			}
		})
	}
}

func TestDCAPVerifierExpiredCollateral(t *testing.T) {
	s := newSGXSetup(t, "UpToDate")
	v, err := client.NewDCAPVerifier(client.DCAPOptions{
		Expected: s.era(), CollateralFile: s.collateralFile, RootCA: s.pki.Root,
		Now: func() time.Time { return s.pki.Time.Add(60 * 24 * time.Hour) },
	})
	if err != nil {
		t.Fatal(err)
	}
	rd := client.ReportData([]byte("root"), nil)
	err = v.VerifyQuote(context.Background(), s.quote(t, rd), rd)
	if !errors.Is(err, client.ErrQuoteInvalid) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired collateral: %v", err)
	}
}

func TestDCAPVerifierDebug(t *testing.T) {
	s := newSGXSetup(t, "UpToDate")
	s.enclave.Debug = true
	rd := client.ReportData([]byte("root"), []byte("n"))
	q := s.quote(t, rd)
	if err := s.verifier(t, s.era()).VerifyQuote(context.Background(), q, rd); !errors.Is(err, client.ErrEnclaveMismatch) {
		t.Fatalf("debug enclave with Debug false: %v", err)
	}
	era := s.era()
	era.Debug = true
	if err := s.verifier(t, era).VerifyQuote(context.Background(), q, rd); err != nil {
		t.Fatalf("debug enclave with Debug true: %v", err)
	}
}

func TestParseEraConfig(t *testing.T) {
	id := strings.Repeat("0a", 32)
	good := `{"SecurityVersion":2,"SignerID":"` + id + `","ProductID":3,"Debug":false,` +
		`"AcceptedTCBStatuses":["UpToDate","swhardeningneeded"],"AcceptedAdvisories":["INTEL-SA-00615"],"Nonce":null}`
	cfg, err := client.ParseEraConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SecurityVersion != 2 || cfg.SignerID != id || cfg.ProductID != 3 || len(cfg.AcceptedTCBStatuses) != 2 || cfg.AcceptedAdvisories[0] != "INTEL-SA-00615" {
		t.Fatalf("config %+v", cfg)
	}
	// The TDX relaunch statuses may be accepted too (any case).
	tdx := `{"MRTD":"` + strings.Repeat("ab", 48) + `","RTMR1":"` + strings.Repeat("01", 48) + `","RTMR2":"` + strings.Repeat("02", 48) +
		`","AcceptedTCBStatuses":["TDRelaunchAdvised","tdrelaunchadvisedconfigurationneeded"]}`
	if cfg, err := client.ParseEraConfig([]byte(tdx)); err != nil || len(cfg.AcceptedTCBStatuses) != 2 {
		t.Errorf("TDX relaunch statuses: %+v, %v", cfg, err)
	}
	for _, tc := range []struct{ json, want string }{
		{`{"UniqueID":"` + id + `","AcceptedAdivsories":["x"]}`, "unknown field"},
		{`{"UniqueID":"xyz"}`, "not 64 hex digits"},
		{`{"UniqueID":"` + id[:10] + `"}`, "not 64 hex digits"},
		{`{"SignerID":"` + id + `","ProductID":3}`, "SecurityVersion is required"},
		{`{"SecurityVersion":1,"ProductID":3}`, "SignerID is required"},
		{`{"UniqueID":"` + id + `","AcceptedTCBStatuses":["Fine"]}`, `"Fine" is not one of`},
		{`{"UniqueID":"` + id + `","AcceptedTCBStatuses":["Unknown"]}`, `"Unknown" is not one of`},
		{`{"UniqueID":"` + id + `","ProductID":70000}`, "cannot unmarshal"},
		{`{"UniqueID":"` + id + `"} {}`, "unexpected data"},
		{`[]`, "cannot unmarshal"},
	} {
		if _, err := client.ParseEraConfig([]byte(tc.json)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.json, err, tc.want)
		}
	}
}

func TestNewDCAPVerifierOptions(t *testing.T) {
	era := client.EraConfig{UniqueID: strings.Repeat("00", 32)}
	file := filepath.Join(t.TempDir(), "c.json")
	os.WriteFile(file, []byte("{}"), 0o600)
	for _, tc := range []struct {
		name string
		o    client.DCAPOptions
		want string
	}{
		{"no collateral", client.DCAPOptions{Expected: era}, "needs collateral"},
		{"both sources", client.DCAPOptions{Expected: era, CollateralFile: file, PCCSURL: "https://pccs.example/"}, "not both"},
		{"missing file", client.DCAPOptions{Expected: era, CollateralFile: file + ".absent"}, "no such file"},
		{"no identity", client.DCAPOptions{CollateralFile: file}, "without UniqueID"},
	} {
		if _, err := client.NewDCAPVerifier(tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := client.NewDCAPVerifier(client.DCAPOptions{Expected: era, PCCSURL: "https://pccs.example/sgx/certification/v4/"}); err != nil {
		t.Errorf("PCCS: %v", err)
	}
}
