package dcap_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
)

func at(t time.Time) func() time.Time { return func() time.Time { return t } }

func phalaVerifier(t testing.TB) ([]byte, *collateral.Collateral, *dcap.Verifier) {
	t.Helper()
	quote, col := dcaptest.Phala(t)
	return quote, col, &dcap.Verifier{Collateral: collateral.Static{Collateral: col}, Now: dcaptest.PhalaTime}
}

func TestPhala(t *testing.T) {
	quote, _, v := phalaVerifier(t)
	res, err := v.Verify(context.Background(), quote)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != tcbstatus.ConfigurationAndSWHardeningNeeded || res.Status.String() != "ConfigurationAndSWHardeningNeeded" {
		t.Errorf("Status = %v", res.Status)
	}
	if res.PlatformStatus != tcbstatus.ConfigurationAndSWHardeningNeeded || res.QEStatus != tcbstatus.UpToDate {
		t.Errorf("platform %v, QE %v", res.PlatformStatus, res.QEStatus)
	}
	if want := []string{"INTEL-SA-00289", "INTEL-SA-00615"}; !slices.Equal(res.Advisories, want) {
		t.Errorf("Advisories = %v, want %v", res.Advisories, want)
	}
	if len(res.QEAdvisories) != 0 {
		t.Errorf("QEAdvisories = %v", res.QEAdvisories)
	}
	rd := res.Report.ReportData()
	if !bytes.HasPrefix(rd[:], []byte("Hello, world!")) {
		t.Errorf("report data = %q", rd[:])
	}
	if res.FMSPC() != [6]byte{0x00, 0xa0, 0x67, 0x11, 0x00, 0x00} || res.CA != collateral.CAProcessor || res.Version != 3 {
		t.Errorf("FMSPC %X, CA %s, version %d", res.FMSPC(), res.CA, res.Version)
	}
	if want := time.Date(2025, 7, 19, 10, 1, 18, 0, time.UTC); !res.CollateralExpiry.Equal(want) || res.CollateralExpired {
		t.Errorf("collateral expiry %v (expired %v), want %v", res.CollateralExpiry, res.CollateralExpired, want)
	}
	if res.Report.Debug() || res.QEReport.ISVSVN() != 10 {
		t.Errorf("debug %v, QE ISVSVN %d", res.Report.Debug(), res.QEReport.ISVSVN())
	}

	// The OE-wrapped form gives the same result.
	wrapped, err := v.Verify(context.Background(), sgxquote.Wrap(quote))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(wrapped, res) {
		t.Errorf("wrapped result %+v differs from raw %+v", wrapped, res)
	}
}

func TestPhalaCollateralValidity(t *testing.T) {
	quote, _, v := phalaVerifier(t)
	from := time.Date(2025, 6, 19, 10, 56, 11, 0, time.UTC)
	until := time.Date(2025, 7, 19, 10, 1, 18, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		now     time.Time
		expired bool
		what    string // named in the error
	}{
		{"first valid second", from, false, ""},
		{"last valid second", until.Add(-time.Second), false, ""},
		{"before TCB info issue", from.Add(-time.Second), true, "TCB info valid from 2025-06-19T10:56:11Z"},
		{"at QE identity nextUpdate", until, true, "QE identity valid from"},
		{"a month later", until.AddDate(0, 1, 0), true, "TCB info"},
		{"a week earlier", from.AddDate(0, 0, -7), true, "PCK CRL valid from 2025-06-19T10:23:18Z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v.Now = at(tc.now)
			res, err := v.Verify(context.Background(), quote)
			if !tc.expired {
				if err != nil || res.CollateralExpired {
					t.Fatalf("Verify = %v (expired %v)", err, res != nil && res.CollateralExpired)
				}
				return
			}
			if !errors.Is(err, dcap.ErrCollateralExpired) {
				t.Fatalf("err = %v, want ErrCollateralExpired", err)
			}
			if res == nil || !res.CollateralExpired || res.Status != tcbstatus.ConfigurationAndSWHardeningNeeded {
				t.Fatalf("result = %+v, want the full result flagged expired", res)
			}
			var de *dcap.Error
			if !errors.As(err, &de) || de.Step != dcap.StepCollateralTime || !bytes.Contains([]byte(err.Error()), []byte(tc.what)) {
				t.Errorf("error %q does not name %q", err, tc.what)
			}
		})
	}
	// Long after, the PCK certificate itself has expired: that is a chain
	// failure, not a collateral one.
	v.Now = at(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))
	if res, err := v.Verify(context.Background(), quote); !errors.Is(err, dcap.ErrBadChain) || res != nil {
		t.Errorf("2031: %v, %v; want ErrBadChain", res, err)
	}
}

// TestPhalaFlippedSignedBytes flips every byte of quote[0:432] (header and
// enclave report body, the region the attestation key signs).
func TestPhalaFlippedSignedBytes(t *testing.T) {
	quote, _, v := phalaVerifier(t)
	kinds := map[error]int{}
	for i := range 432 {
		q := bytes.Clone(quote)
		q[i] ^= 0xff
		res, err := v.Verify(context.Background(), q)
		if err == nil || res != nil {
			t.Fatalf("byte %d flipped: accepted", i)
		}
		var de *dcap.Error
		if !errors.As(err, &de) {
			t.Fatalf("byte %d: error %v is not a *dcap.Error", i, err)
		}
		kinds[de.Kind]++
	}
	// Most flips break the signature; header fields are rejected earlier.
	if kinds[dcap.ErrBadSignature] < 380 {
		t.Errorf("error kinds = %v", kinds)
	}
}

func TestPhalaTamperedCollateral(t *testing.T) {
	quote, col, _ := phalaVerifier(t)
	for _, tc := range []struct {
		name string
		edit func(c *collateral.Collateral)
		kind error
		step dcap.Step
	}{
		{"TCB info text", func(c *collateral.Collateral) {
			c.TCBInfo = bytes.Replace(c.TCBInfo, []byte(`"tcbStatus":"ConfigurationAndSWHardeningNeeded"`), []byte(`"tcbStatus":"UpToDate"`), 1)
		}, dcap.ErrBadSignature, dcap.StepTCBInfo},
		{"TCB info signature", func(c *collateral.Collateral) { c.TCBInfoSignature = flip(c.TCBInfoSignature, 5) }, dcap.ErrBadSignature, dcap.StepTCBInfo},
		{"QE identity text", func(c *collateral.Collateral) {
			c.QEIdentity = bytes.Replace(c.QEIdentity, []byte(`"isvsvn":8`), []byte(`"isvsvn":9`), 1)
		}, dcap.ErrBadSignature, dcap.StepQEIdentity},
		{"QE identity signature", func(c *collateral.Collateral) { c.QEIdentitySignature = flip(c.QEIdentitySignature, 40) }, dcap.ErrBadSignature, dcap.StepQEIdentity},
		{"root CRL as PCK CRL", func(c *collateral.Collateral) { c.PCKCRL = c.RootCACRL }, dcap.ErrBadCRL, dcap.StepPCKCRL},
		{"PCK CRL as root CRL", func(c *collateral.Collateral) { c.RootCACRL = c.PCKCRL }, dcap.ErrBadCRL, dcap.StepRootCACRL},
		{"no PCK CRL", func(c *collateral.Collateral) { c.PCKCRL = nil }, dcap.ErrCollateral, dcap.StepPCKCRL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := *col
			tc.edit(&c)
			if reflect.DeepEqual(c, *col) {
				t.Fatal("the edit changed nothing")
			}
			v := &dcap.Verifier{Collateral: collateral.Static{Collateral: &c}, Now: dcaptest.PhalaTime}
			checkErr(t, v, quote, tc.kind, tc.step)
		})
	}
}

func TestPhalaRoots(t *testing.T) {
	quote, col, _ := phalaVerifier(t)
	pemData, err := os.ReadFile(dcaptest.SGXTestdata(t, "intel-root/Intel_SGX_Root_CA.pem"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemData)
	intel, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	// The Intel root configured explicitly works like the pin.
	v := &dcap.Verifier{Collateral: collateral.Static{Collateral: col}, Now: dcaptest.PhalaTime, RootCA: intel}
	if _, err := v.Verify(context.Background(), quote); err != nil {
		t.Errorf("explicit Intel root: %v", err)
	}
	// Another configured root rejects the real quote.
	v.RootCA = dcaptest.NewPKI(t).Root
	checkErr(t, v, quote, dcap.ErrUntrustedRoot, dcap.StepRootCA)
}

func flip(b []byte, i int) []byte {
	b = bytes.Clone(b)
	b[i] ^= 0x01
	return b
}

func checkErr(t *testing.T, v *dcap.Verifier, quote []byte, kind error, step dcap.Step) *dcap.Error {
	t.Helper()
	res, err := v.Verify(context.Background(), quote)
	if !errors.Is(err, kind) {
		t.Fatalf("err = %v, want %v", err, kind)
	}
	var de *dcap.Error
	if !errors.As(err, &de) || de.Step != step || de.Kind != kind {
		t.Fatalf("err = %#v, want step %q kind %v", err, step, kind)
	}
	if res != nil && kind != dcap.ErrCollateralExpired {
		t.Fatalf("result %+v returned with error", res)
	}
	return de
}

func BenchmarkVerify(b *testing.B) {
	quote, _, v := phalaVerifier(b)
	ctx := context.Background()
	b.ReportAllocs()
	start := cpuTime()
	for b.Loop() {
		if _, err := v.Verify(ctx, quote); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifications/s")
	reportPerCPUSecond(b, start)
}
