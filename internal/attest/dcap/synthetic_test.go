package dcap_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
)

// svns returns component SVNs all equal to n.
func svns(n uint8) [16]uint8 {
	var s [16]uint8
	for i := range s {
		s[i] = n
	}
	return s
}

func newPlatform(t testing.TB) *dcaptest.Platform {
	t.Helper()
	return dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
}

func verifier(pl *dcaptest.Platform, c *collateral.Collateral) *dcap.Verifier {
	return &dcap.Verifier{Collateral: collateral.Static{Collateral: c}, Now: at(pl.PKI.Time), RootCA: pl.PKI.Root}
}

func TestSyntheticStatuses(t *testing.T) {
	pl := newPlatform(t) // component SVNs 5, PCESVN 13, QE ISVSVN 8
	quote := pl.Quote(t, dcaptest.QuoteOptions{})
	adv := []string{"INTEL-SA-00001", "INTEL-SA-00002"}
	qeAdv := []string{"INTEL-SA-00099"}
	platformStatuses := []tcbstatus.Status{
		tcbstatus.UpToDate, tcbstatus.SWHardeningNeeded, tcbstatus.ConfigurationNeeded,
		tcbstatus.ConfigurationAndSWHardeningNeeded, tcbstatus.OutOfDate,
		tcbstatus.OutOfDateConfigurationNeeded, tcbstatus.Revoked,
	}
	for _, platform := range platformStatuses {
		for _, qe := range []tcbstatus.Status{tcbstatus.UpToDate, tcbstatus.OutOfDate, tcbstatus.Revoked} {
			t.Run(platform.String()+"/QE "+qe.String(), func(t *testing.T) {
				col := pl.Collateral(t, dcaptest.CollateralOptions{
					// A higher level the platform does not reach comes first.
					TCBLevels: []dcaptest.TCBLevel{
						{CompSVN: svns(6), PCESVN: 13, Status: "UpToDate"},
						{CompSVN: svns(5), PCESVN: 13, Status: platform.String(), Advisories: adv},
						{CompSVN: svns(1), PCESVN: 1, Status: "OutOfDate", Advisories: []string{"older"}},
					},
					QELevels: []dcaptest.QELevel{
						{ISVSVN: 9, Status: "UpToDate"},
						{ISVSVN: 8, Status: qe.String(), Advisories: qeAdv},
						{ISVSVN: 1, Status: "OutOfDate"},
					},
				})
				res, err := verifier(pl, col).Verify(context.Background(), quote)
				if err != nil {
					t.Fatal(err)
				}
				if want := tcbstatus.Converge(platform, qe); res.Status != want {
					t.Errorf("Status = %v, want %v", res.Status, want)
				}
				if res.PlatformStatus != platform || res.QEStatus != qe {
					t.Errorf("platform %v, QE %v", res.PlatformStatus, res.QEStatus)
				}
				if !slices.Equal(res.Advisories, adv) || !slices.Equal(res.QEAdvisories, qeAdv) {
					t.Errorf("advisories %v, QE advisories %v", res.Advisories, res.QEAdvisories)
				}
			})
		}
	}
}

// TestSyntheticConvergence spells out Intel's convergence rule end to end.
func TestSyntheticConvergence(t *testing.T) {
	pl := newPlatform(t)
	quote := pl.Quote(t, dcaptest.QuoteOptions{})
	for _, tc := range []struct {
		platform, qe, want string
	}{
		{"UpToDate", "OutOfDate", "OutOfDate"},
		{"SWHardeningNeeded", "OutOfDate", "OutOfDate"},
		{"ConfigurationNeeded", "OutOfDate", "OutOfDateConfigurationNeeded"},
		{"ConfigurationAndSWHardeningNeeded", "OutOfDate", "OutOfDateConfigurationNeeded"},
		{"OutOfDateConfigurationNeeded", "OutOfDate", "OutOfDateConfigurationNeeded"},
		{"SWHardeningNeeded", "Revoked", "Revoked"},
		{"ConfigurationNeeded", "UpToDate", "ConfigurationNeeded"},
	} {
		col := pl.Collateral(t, dcaptest.CollateralOptions{
			TCBLevels: []dcaptest.TCBLevel{{CompSVN: svns(5), PCESVN: 13, Status: tc.platform}},
			QELevels:  []dcaptest.QELevel{{ISVSVN: 8, Status: tc.qe}},
		})
		res, err := verifier(pl, col).Verify(context.Background(), quote)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status.String() != tc.want {
			t.Errorf("platform %s, QE %s: %v, want %s", tc.platform, tc.qe, res.Status, tc.want)
		}
	}
}

func TestSyntheticTCBLevelSelection(t *testing.T) {
	ext := dcaptest.DefaultExtension()
	ext.CompSVN = [16]uint8{5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5}
	ext.CompSVN[6] = 3 // one component lags
	pl := dcaptest.NewPKI(t).NewPlatform(t, ext)
	quote := pl.Quote(t, dcaptest.QuoteOptions{})
	lagging := svns(5)
	lagging[6] = 0
	levels := []dcaptest.TCBLevel{
		{CompSVN: svns(5), PCESVN: 13, Status: "UpToDate"},                                       // comp 7 too low
		{CompSVN: svns(4), PCESVN: 14, Status: "SWHardeningNeeded"},                              // PCESVN too low
		{CompSVN: lagging, PCESVN: 13, Status: "ConfigurationNeeded", Advisories: []string{"A"}}, // match
		{CompSVN: svns(2), PCESVN: 10, Status: "OutOfDate", Advisories: []string{"B"}},
	}
	for _, tc := range []struct {
		name   string
		levels []dcaptest.TCBLevel
		want   string
		adv    []string
	}{
		{"Intel order", levels, "ConfigurationNeeded", []string{"A"}},
		{"reversed order", []dcaptest.TCBLevel{levels[3], levels[2], levels[1], levels[0]}, "ConfigurationNeeded", []string{"A"}},
		{"only lower levels", levels[3:], "OutOfDate", []string{"B"}},
	} {
		col := pl.Collateral(t, dcaptest.CollateralOptions{TCBLevels: tc.levels})
		res, err := verifier(pl, col).Verify(context.Background(), quote)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if res.Status.String() != tc.want || !slices.Equal(res.Advisories, tc.adv) {
			t.Errorf("%s: %v %v, want %s %v", tc.name, res.Status, res.Advisories, tc.want, tc.adv)
		}
	}
	col := pl.Collateral(t, dcaptest.CollateralOptions{TCBLevels: levels[:2]})
	checkErr(t, verifier(pl, col), quote, dcap.ErrTCBNotSupported, dcap.StepTCBLevel)
}

func TestSyntheticFormats(t *testing.T) {
	pl := newPlatform(t)
	col := pl.Collateral(t, dcaptest.CollateralOptions{})
	v2 := pl.Collateral(t, dcaptest.CollateralOptions{TCBInfoVersion: 2})
	enc := dcaptest.Enclave{ISVProdID: 7, ISVSVN: 3}
	copy(enc.ReportData[:], "bound")
	for _, tc := range []struct {
		name  string
		quote []byte
		col   *collateral.Collateral
	}{
		{"v3", pl.Quote(t, dcaptest.QuoteOptions{Enclave: enc}), col},
		{"v3 OE-wrapped", sgxquote.Wrap(pl.Quote(t, dcaptest.QuoteOptions{Enclave: enc})), col},
		{"v4", pl.Quote(t, dcaptest.QuoteOptions{Version: 4, Enclave: enc}), col},
		{"v5", pl.Quote(t, dcaptest.QuoteOptions{Version: 5, Enclave: enc}), col},
		{"v5 OE-wrapped", sgxquote.Wrap(pl.Quote(t, dcaptest.QuoteOptions{Version: 5, Enclave: enc})), col},
		{"TCB info v2", pl.Quote(t, dcaptest.QuoteOptions{Enclave: enc}), v2},
		{"no auth data", pl.Quote(t, dcaptest.QuoteOptions{Enclave: enc, AuthData: []byte{}}), col},
	} {
		res, err := verifier(pl, tc.col).Verify(context.Background(), tc.quote)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		rd := res.Report.ReportData()
		if res.Status != tcbstatus.UpToDate || res.Report.ISVProdID() != 7 || res.Report.ISVSVN() != 3 || !bytes.HasPrefix(rd[:], []byte("bound")) {
			t.Errorf("%s: result %v, prodid %d, svn %d", tc.name, res.Status, res.Report.ISVProdID(), res.Report.ISVSVN())
		}
	}
}

func TestSyntheticPlatformCA(t *testing.T) {
	pki := dcaptest.NewPKIWithCA(t, dcaptest.CNPlatformCA)
	pl := pki.NewPlatform(t, dcaptest.DefaultExtension())
	var asked collateral.CA
	v := verifier(pl, nil)
	v.Collateral = providerFunc(func(_ context.Context, _ [6]byte, ca collateral.CA) (*collateral.Collateral, error) {
		asked = ca
		return pl.Collateral(t, dcaptest.CollateralOptions{}), nil
	})
	res, err := v.Verify(context.Background(), pl.Quote(t, dcaptest.QuoteOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	if res.CA != collateral.CAPlatform || asked != collateral.CAPlatform {
		t.Errorf("CA %s, provider asked for %s", res.CA, asked)
	}
}

type providerFunc func(context.Context, [6]byte, collateral.CA) (*collateral.Collateral, error)

func (f providerFunc) Get(ctx context.Context, fmspc [6]byte, ca collateral.CA) (*collateral.Collateral, error) {
	return f(ctx, fmspc, ca)
}

func pemChain(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// Offsets in a v3 quote.
const (
	offISVSig   = 436
	offAttKey   = 436 + 64
	offQEReport = 436 + 128
	offQESig    = 436 + 512
	offAuthData = 436 + 578
)

func TestSyntheticFailures(t *testing.T) {
	pl := newPlatform(t)
	other := newPlatform(t) // a different PKI
	good := pl.Quote(t, dcaptest.QuoteOptions{})
	col := pl.Collateral(t, dcaptest.CollateralOptions{})
	now := pl.PKI.Time

	flipAt := func(i int) []byte { return flip(good, i) }
	// A leaf whose signature no longer verifies.
	badLeaf, err := x509.ParseCertificate(flip(pl.PCK.Raw, len(pl.PCK.Raw)-3))
	if err != nil {
		t.Fatal(err)
	}
	// A platform with another FMSPC and PCE-ID under the same PKI.
	otherExt := dcaptest.DefaultExtension()
	otherExt.FMSPC[5] = 1
	otherFMSPC := pl.PKI.NewPlatform(t, otherExt)
	otherExt = dcaptest.DefaultExtension()
	otherExt.PCEID[1] = 1
	otherPCEID := pl.PKI.NewPlatform(t, otherExt)
	// A platform with a PCK CA of the wrong name.
	oddCA := dcaptest.NewPKIWithCA(t, "Intel SGX PCK Odd CA").NewPlatform(t, dcaptest.DefaultExtension())

	resigned := func(edit func(c *collateral.Collateral)) *collateral.Collateral {
		c := pl.Collateral(t, dcaptest.CollateralOptions{})
		edit(c)
		c.TCBInfoSignature = pl.PKI.Sign(t, c.TCBInfo)
		c.QEIdentitySignature = pl.PKI.Sign(t, c.QEIdentity)
		return c
	}
	withQE := func(edit func(qe *dcaptest.QE)) []byte {
		p := *pl
		edit(&p.QE)
		return p.Quote(t, dcaptest.QuoteOptions{})
	}
	expiredPCKCRL := pl.Collateral(t, dcaptest.CollateralOptions{})
	expiredPCKCRL.PCKCRL = pl.PKI.PCKCRL(t, dcaptest.CRLOptions{ThisUpdate: now.Add(-48 * time.Hour), NextUpdate: now.Add(-time.Hour)})

	for _, tc := range []struct {
		name  string
		quote []byte
		col   *collateral.Collateral
		v     func(v *dcap.Verifier)
		kind  error
		step  dcap.Step
		text  string // expected in the message
	}{
		// Parsing.
		{name: "empty", quote: nil, kind: dcap.ErrFormat, step: dcap.StepParse},
		{name: "truncated", quote: good[:len(good)-1], kind: dcap.ErrFormat, step: dcap.StepParse},
		{name: "truncated header", quote: good[:40], kind: dcap.ErrFormat, step: dcap.StepParse},
		{name: "type-3 certification data", quote: pl.Quote(t, dcaptest.QuoteOptions{CertType: 3, CertData: make([]byte, 384)}), kind: dcap.ErrUnsupported, step: dcap.StepParse},
		{name: "QE vendor not Intel", quote: flipAt(12), kind: dcap.ErrUnsupported, step: dcap.StepParse, text: "vendor"},
		{name: "SGX body under TEE type TDX", quote: func() []byte { q := pl.Quote(t, dcaptest.QuoteOptions{Version: 4}); q[4] = 0x81; return q }(), kind: dcap.ErrFormat, step: dcap.StepParse, text: "tdxquote"},
		// Roots and chains.
		{name: "default pin rejects test root", v: func(v *dcap.Verifier) { v.RootCA = nil }, kind: dcap.ErrUntrustedRoot, step: dcap.StepRootCA},
		{name: "other configured root", v: func(v *dcap.Verifier) { v.RootCA = other.PKI.Root }, kind: dcap.ErrUntrustedRoot, step: dcap.StepRootCA},
		{name: "tampered PCK leaf", quote: pl.Quote(t, dcaptest.QuoteOptions{CertData: pemChain(badLeaf, pl.PKI.PCKCA, pl.PKI.Root)}), kind: dcap.ErrBadChain, step: dcap.StepPCKChain},
		{name: "leaf from another PKI", quote: pl.Quote(t, dcaptest.QuoteOptions{CertData: pemChain(other.PCK, pl.PKI.PCKCA, pl.PKI.Root)}), kind: dcap.ErrBadChain, step: dcap.StepPCKChain},
		{name: "two certificates", quote: pl.Quote(t, dcaptest.QuoteOptions{CertData: pemChain(pl.PCK, pl.PKI.Root)}), kind: dcap.ErrBadChain, step: dcap.StepPCKChain},
		{name: "leaf is not a PCK", quote: pl.Quote(t, dcaptest.QuoteOptions{CertData: pemChain(pl.PKI.TCBSigning, pl.PKI.PCKCA, pl.PKI.Root)}), kind: dcap.ErrBadChain, step: dcap.StepPCKChain, text: "leaf CN"},
		{name: "intermediate is not a PCK CA", quote: oddCA.Quote(t, dcaptest.QuoteOptions{}), v: func(v *dcap.Verifier) { v.RootCA = oddCA.PKI.Root }, kind: dcap.ErrBadChain, step: dcap.StepPCKChain, text: "intermediate CN"},
		{name: "PCK expired", v: func(v *dcap.Verifier) { v.Now = at(now.AddDate(11, 0, 0)) }, kind: dcap.ErrBadChain, step: dcap.StepPCKChain},
		// Quote signatures and binding.
		{name: "ISV signature", quote: flipAt(offISVSig + 3), kind: dcap.ErrBadSignature, step: dcap.StepISVSignature},
		{name: "report body", quote: flipAt(48 + 64), kind: dcap.ErrBadSignature, step: dcap.StepISVSignature},
		{name: "header user data", quote: flipAt(30), kind: dcap.ErrBadSignature, step: dcap.StepISVSignature},
		{name: "QE report", quote: flipAt(offQEReport + 100), kind: dcap.ErrBadSignature, step: dcap.StepQEReportSig},
		{name: "QE report signature", quote: flipAt(offQESig + 10), kind: dcap.ErrBadSignature, step: dcap.StepQEReportSig},
		{name: "QE auth data", quote: flipAt(offAuthData + 2), kind: dcap.ErrBinding, step: dcap.StepQEBinding},
		{name: "attestation key", quote: flipAt(offAttKey + 1), kind: dcap.ErrBinding, step: dcap.StepQEBinding},
		{name: "binding broken by the QE", quote: pl.Quote(t, dcaptest.QuoteOptions{BreakBinding: true}), kind: dcap.ErrBinding, step: dcap.StepQEBinding},
		// Collateral source.
		{name: "no provider", v: func(v *dcap.Verifier) { v.Collateral = nil }, kind: dcap.ErrCollateralUnavailable, step: dcap.StepFetchCollateral},
		{name: "provider fails", v: func(v *dcap.Verifier) {
			v.Collateral = providerFunc(func(context.Context, [6]byte, collateral.CA) (*collateral.Collateral, error) {
				return nil, collateral.ErrNotFound
			})
		}, kind: collateral.ErrNotFound, step: dcap.StepFetchCollateral},
		// CRLs and revocation.
		{name: "PCK revoked", col: pl.Collateral(t, dcaptest.CollateralOptions{Revoke: []*x509.Certificate{pl.PCK}}), kind: dcap.ErrRevoked, step: dcap.StepPCKCRL},
		{name: "PCK CA revoked", col: pl.Collateral(t, dcaptest.CollateralOptions{Revoke: []*x509.Certificate{pl.PKI.PCKCA}}), kind: dcap.ErrRevoked, step: dcap.StepRootCACRL},
		{name: "TCB Signing revoked", col: pl.Collateral(t, dcaptest.CollateralOptions{Revoke: []*x509.Certificate{pl.PKI.TCBSigning}}), kind: dcap.ErrRevoked, step: dcap.StepTCBInfo},
		{name: "PCK CRL from another CA", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.PCKCRL = other.PKI.PCKCRL(t, dcaptest.CRLOptions{ThisUpdate: now.Add(-time.Hour), NextUpdate: now.Add(time.Hour)})
			return c
		}(), kind: dcap.ErrBadCRL, step: dcap.StepPCKCRL, text: "bad signature"},
		{name: "root CRL by the PCK CA", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.RootCACRL = c.PCKCRL
			return c
		}(), kind: dcap.ErrBadCRL, step: dcap.StepRootCACRL, text: "issued by"},
		{name: "no root CRL", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.RootCACRL = nil
			return c
		}(), kind: dcap.ErrCollateral, step: dcap.StepRootCACRL},
		// TCB info.
		{name: "TCB info tampered", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.TCBInfo = bytes.Replace(c.TCBInfo, []byte(`"svn":5`), []byte(`"svn":4`), 1)
			return c
		}(), kind: dcap.ErrBadSignature, step: dcap.StepTCBInfo},
		{name: "TCB info signature", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.TCBInfoSignature = flip(c.TCBInfoSignature, 63)
			return c
		}(), kind: dcap.ErrBadSignature, step: dcap.StepTCBInfo},
		{name: "TCB info signed by the PCK CA", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.TCBInfoIssuerChain = []*x509.Certificate{pl.PKI.PCKCA, pl.PKI.Root}
			return c
		}(), kind: dcap.ErrBadChain, step: dcap.StepTCBInfo},
		{name: "TCB info chain of another PKI", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.TCBInfoIssuerChain = []*x509.Certificate{other.PKI.TCBSigning, other.PKI.Root}
			return c
		}(), kind: dcap.ErrUntrustedRoot, step: dcap.StepTCBInfo},
		{name: "TCB info signer without root", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.TCBInfoIssuerChain = c.TCBInfoIssuerChain[:1]
			return c
		}(), kind: dcap.ErrBadChain, step: dcap.StepTCBInfo},
		{name: "TCB info id TDX", col: resigned(func(c *collateral.Collateral) {
			c.TCBInfo = bytes.Replace(c.TCBInfo, []byte(`"id":"SGX"`), []byte(`"id":"TDX"`), 1)
		}), kind: dcap.ErrCollateral, step: dcap.StepTCBInfo, text: "TDX"},
		{name: "TCB info version 4", col: resigned(func(c *collateral.Collateral) {
			c.TCBInfo = bytes.Replace(c.TCBInfo, []byte(`"version":3`), []byte(`"version":4`), 1)
		}), kind: dcap.ErrCollateral, step: dcap.StepTCBInfo, text: "version"},
		{name: "TCB info for another FMSPC", quote: otherFMSPC.Quote(t, dcaptest.QuoteOptions{}), kind: dcap.ErrCollateral, step: dcap.StepTCBInfo, text: "FMSPC"},
		{name: "TCB info for another PCE-ID", quote: otherPCEID.Quote(t, dcaptest.QuoteOptions{}), kind: dcap.ErrCollateral, step: dcap.StepTCBInfo, text: "PCE-ID"},
		{name: "unknown TCB status", col: pl.Collateral(t, dcaptest.CollateralOptions{TCBLevels: []dcaptest.TCBLevel{{CompSVN: svns(1), Status: "TDRelaunchAdvised"}}}), kind: dcap.ErrCollateral, step: dcap.StepTCBLevel},
		{name: "no TCB level", col: pl.Collateral(t, dcaptest.CollateralOptions{TCBLevels: []dcaptest.TCBLevel{{CompSVN: svns(6), Status: "UpToDate"}}}), kind: dcap.ErrTCBNotSupported, step: dcap.StepTCBLevel},
		// QE identity.
		{name: "QE identity tampered", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.QEIdentity = bytes.Replace(c.QEIdentity, []byte(`"isvsvn":8`), []byte(`"isvsvn":7`), 1)
			return c
		}(), kind: dcap.ErrBadSignature, step: dcap.StepQEIdentity},
		{name: "QE identity signature", col: func() *collateral.Collateral {
			c := pl.Collateral(t, dcaptest.CollateralOptions{})
			c.QEIdentitySignature = flip(c.QEIdentitySignature, 0)
			return c
		}(), kind: dcap.ErrBadSignature, step: dcap.StepQEIdentity},
		{name: "QE identity id QVE", col: resigned(func(c *collateral.Collateral) {
			c.QEIdentity = bytes.Replace(c.QEIdentity, []byte(`"id":"QE"`), []byte(`"id":"QVE"`), 1)
		}), kind: dcap.ErrCollateral, step: dcap.StepQEIdentity, text: "QVE"},
		{name: "QE MRSIGNER", quote: withQE(func(qe *dcaptest.QE) { qe.MRSIGNER[0] ^= 1 }), kind: dcap.ErrQEIdentity, step: dcap.StepQEMatch, text: "MRSIGNER"},
		{name: "QE ISVPRODID", quote: withQE(func(qe *dcaptest.QE) { qe.ISVProdID = 2 }), kind: dcap.ErrQEIdentity, step: dcap.StepQEMatch, text: "ISVPRODID"},
		{name: "QE debug attribute", quote: withQE(func(qe *dcaptest.QE) { qe.Attributes[0] |= sgxquote.AttributeDebug }), kind: dcap.ErrQEIdentity, step: dcap.StepQEMatch, text: "attributes"},
		{name: "QE MISCSELECT", quote: withQE(func(qe *dcaptest.QE) { qe.MiscSelect = 1 }), kind: dcap.ErrQEIdentity, step: dcap.StepQEMatch, text: "MISCSELECT"},
		{name: "QE status not a QE status", col: pl.Collateral(t, dcaptest.CollateralOptions{QELevels: []dcaptest.QELevel{{ISVSVN: 8, Status: "ConfigurationNeeded"}}}), kind: dcap.ErrCollateral, step: dcap.StepQEMatch, text: "QE TCB status"},
		{name: "QE status unknown", col: pl.Collateral(t, dcaptest.CollateralOptions{QELevels: []dcaptest.QELevel{{ISVSVN: 8, Status: "Fine"}}}), kind: dcap.ErrCollateral, step: dcap.StepQEMatch},
		{name: "QE ISVSVN below every level", col: pl.Collateral(t, dcaptest.CollateralOptions{QELevels: []dcaptest.QELevel{{ISVSVN: 9, Status: "UpToDate"}}}), kind: dcap.ErrTCBNotSupported, step: dcap.StepQEMatch},
		// Time.
		{name: "collateral expired", col: pl.Collateral(t, dcaptest.CollateralOptions{IssueDate: now.AddDate(0, -2, 0), NextUpdate: now.AddDate(0, -1, 0)}), kind: dcap.ErrCollateralExpired, step: dcap.StepCollateralTime, text: "TCB info valid from"},
		{name: "collateral not yet valid", col: pl.Collateral(t, dcaptest.CollateralOptions{IssueDate: now.Add(time.Hour), NextUpdate: now.AddDate(0, 1, 0)}), kind: dcap.ErrCollateralExpired, step: dcap.StepCollateralTime, text: "QE identity valid from"},
		{name: "PCK CRL expired", col: expiredPCKCRL, kind: dcap.ErrCollateralExpired, step: dcap.StepCollateralTime, text: "PCK CRL valid from"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			quote := tc.quote
			if quote == nil && tc.name != "empty" {
				quote = good
			}
			c := tc.col
			if c == nil {
				c = col
			}
			v := verifier(pl, c)
			if tc.v != nil {
				tc.v(v)
			}
			res, err := v.Verify(context.Background(), quote)
			var de *dcap.Error
			if !errors.Is(err, tc.kind) || !errors.As(err, &de) || de.Step != tc.step {
				t.Fatalf("err = %v; want kind %v at step %q", err, tc.kind, tc.step)
			}
			if !strings.Contains(err.Error(), tc.text) || !strings.HasPrefix(err.Error(), "dcap: "+string(tc.step)+": ") {
				t.Errorf("message %q does not name the step and %q", err, tc.text)
			}
			if tc.kind == dcap.ErrCollateralExpired {
				if res == nil || !res.CollateralExpired || res.Status != tcbstatus.UpToDate {
					t.Errorf("expired collateral: result %+v", res)
				}
			} else if res != nil {
				t.Errorf("result returned with error: %+v", res)
			}
		})
	}
}

func TestSyntheticCRLSignatureIsBadSignature(t *testing.T) {
	pl, other := newPlatform(t), newPlatform(t)
	c := pl.Collateral(t, dcaptest.CollateralOptions{})
	c.PCKCRL = other.PKI.PCKCRL(t, dcaptest.CRLOptions{ThisUpdate: pl.PKI.Time.Add(-time.Hour), NextUpdate: pl.PKI.Time.Add(time.Hour)})
	_, err := verifier(pl, c).Verify(context.Background(), pl.Quote(t, dcaptest.QuoteOptions{}))
	if !errors.Is(err, dcap.ErrBadCRL) || !errors.Is(err, dcap.ErrBadSignature) {
		t.Errorf("err = %v, want both ErrBadCRL and ErrBadSignature", err)
	}
}

func TestSyntheticRevokedOthersIgnored(t *testing.T) {
	pl, other := newPlatform(t), newPlatform(t)
	c := pl.Collateral(t, dcaptest.CollateralOptions{Revoke: []*x509.Certificate{other.PKI.PCKCA, other.PKI.TCBSigning}})
	if _, err := verifier(pl, c).Verify(context.Background(), pl.Quote(t, dcaptest.QuoteOptions{})); err != nil {
		t.Errorf("revocations of other certificates: %v", err)
	}
}
