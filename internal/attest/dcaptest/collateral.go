package dcaptest

import (
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
)

// TCBLevel is a platform TCB level of synthetic TCB info.
type TCBLevel struct {
	CompSVN    [16]uint8
	PCESVN     uint16
	Status     string
	Advisories []string
}

// QELevel is a TCB level of a synthetic QE identity.
type QELevel struct {
	ISVSVN     uint16
	Status     string
	Advisories []string
}

// CollateralOptions shape synthetic collateral. The zero value gives
// collateral under which the platform is UpToDate, valid from a day before
// PKI.Time until thirty days after.
type CollateralOptions struct {
	// TCBLevels nil means one UpToDate level at the platform's SVNs.
	TCBLevels []TCBLevel
	// QELevels nil means one UpToDate level at the QE's ISVSVN.
	QELevels []QELevel
	// IssueDate and NextUpdate bound TCB info, QE identity and both CRLs;
	// zero means PKI.Time minus a day and plus thirty days.
	IssueDate, NextUpdate time.Time
	// TCBInfoVersion is 3 (default) or 2 (flat component fields).
	TCBInfoVersion int
	// Revoke lists certificates to revoke: the PCK leaf goes on the PCK CRL,
	// anything else on the root CA CRL.
	Revoke []*x509.Certificate
}

// Collateral returns signed collateral for the platform.
func (pl *Platform) Collateral(tb testing.TB, o CollateralOptions) *collateral.Collateral {
	tb.Helper()
	p := pl.PKI
	if o.IssueDate.IsZero() {
		o.IssueDate = p.Time.Add(-24 * time.Hour)
	}
	if o.NextUpdate.IsZero() {
		o.NextUpdate = p.Time.Add(30 * 24 * time.Hour)
	}
	if o.TCBLevels == nil {
		o.TCBLevels = []TCBLevel{{CompSVN: pl.Ext.CompSVN, PCESVN: pl.Ext.PCESVN, Status: "UpToDate"}}
	}
	if o.QELevels == nil {
		o.QELevels = []QELevel{{ISVSVN: pl.QE.ISVSVN, Status: "UpToDate"}}
	}
	if o.TCBInfoVersion == 0 {
		o.TCBInfoVersion = 3
	}
	var pckRevoked, rootRevoked []*x509.Certificate
	for _, c := range o.Revoke {
		if c.Equal(pl.PCK) {
			pckRevoked = append(pckRevoked, c)
		} else {
			rootRevoked = append(rootRevoked, c)
		}
	}
	tcbInfo := pl.TCBInfoJSON(tb, o)
	qeIdentity := pl.QEIdentityJSON(tb, o)
	tcbChain := []*x509.Certificate{p.TCBSigning, p.Root}
	return &collateral.Collateral{
		TCBInfo:               tcbInfo,
		TCBInfoSignature:      p.Sign(tb, tcbInfo),
		TCBInfoIssuerChain:    tcbChain,
		QEIdentity:            qeIdentity,
		QEIdentitySignature:   p.Sign(tb, qeIdentity),
		QEIdentityIssuerChain: tcbChain,
		PCKCRL:                p.PCKCRL(tb, CRLOptions{ThisUpdate: o.IssueDate, NextUpdate: o.NextUpdate, Revoked: pckRevoked}),
		PCKCRLIssuerChain:     []*x509.Certificate{p.PCKCA, p.Root},
		RootCACRL:             p.RootCRL(tb, CRLOptions{ThisUpdate: o.IssueDate, NextUpdate: o.NextUpdate, Revoked: rootRevoked}),
	}
}

// TCBInfoJSON returns the (unsigned) tcbInfo object for the options.
func (pl *Platform) TCBInfoJSON(tb testing.TB, o CollateralOptions) []byte {
	tb.Helper()
	type tcbLevel struct {
		TCB         any      `json:"tcb"`
		TCBDate     string   `json:"tcbDate"`
		TCBStatus   string   `json:"tcbStatus"`
		AdvisoryIDs []string `json:"advisoryIDs,omitempty"`
	}
	doc := struct {
		ID                      string     `json:"id,omitempty"`
		Version                 int        `json:"version"`
		IssueDate               string     `json:"issueDate"`
		NextUpdate              string     `json:"nextUpdate"`
		FMSPC                   string     `json:"fmspc"`
		PCEID                   string     `json:"pceId"`
		TCBType                 int        `json:"tcbType"`
		TCBEvaluationDataNumber int        `json:"tcbEvaluationDataNumber"`
		TCBLevels               []tcbLevel `json:"tcbLevels"`
	}{
		Version:                 o.TCBInfoVersion,
		IssueDate:               o.IssueDate.UTC().Format(time.RFC3339),
		NextUpdate:              o.NextUpdate.UTC().Format(time.RFC3339),
		FMSPC:                   strings.ToUpper(hex.EncodeToString(pl.Ext.FMSPC[:])),
		PCEID:                   strings.ToUpper(hex.EncodeToString(pl.Ext.PCEID[:])),
		TCBEvaluationDataNumber: 17,
	}
	if o.TCBInfoVersion == 3 {
		doc.ID = "SGX"
	}
	for i, l := range o.TCBLevels {
		var tcb any
		if o.TCBInfoVersion == 3 {
			type comp struct {
				SVN int `json:"svn"`
			}
			t := struct {
				Comps  []comp `json:"sgxtcbcomponents"`
				PCESVN int    `json:"pcesvn"`
			}{PCESVN: int(l.PCESVN)}
			for _, s := range l.CompSVN {
				t.Comps = append(t.Comps, comp{int(s)})
			}
			tcb = t
		} else {
			m := map[string]int{"pcesvn": int(l.PCESVN)}
			for j, s := range l.CompSVN {
				m[fmt.Sprintf("sgxtcbcomp%02dsvn", j+1)] = int(s)
			}
			tcb = m
		}
		date := o.IssueDate.AddDate(0, -i, 0).UTC().Truncate(24 * time.Hour).Format(time.RFC3339)
		doc.TCBLevels = append(doc.TCBLevels, tcbLevel{tcb, date, l.Status, l.Advisories})
	}
	b, err := json.Marshal(doc)
	if err != nil {
		tb.Fatalf("dcaptest: TCB info: %v", err)
	}
	return b
}

// QEIdentityJSON returns the (unsigned) enclaveIdentity object for the
// options and the platform's QE.
func (pl *Platform) QEIdentityJSON(tb testing.TB, o CollateralOptions) []byte {
	tb.Helper()
	type qeLevel struct {
		TCB struct {
			ISVSVN uint16 `json:"isvsvn"`
		} `json:"tcb"`
		TCBDate     string   `json:"tcbDate"`
		TCBStatus   string   `json:"tcbStatus"`
		AdvisoryIDs []string `json:"advisoryIDs,omitempty"`
	}
	// The identity fixes the low attribute byte except MODE64BIT, like
	// Intel's (attributesMask FBFFFFFFFFFFFFFF0000000000000000).
	var attr, mask [16]byte
	for i := 0; i < 8; i++ {
		mask[i] = 0xff
	}
	mask[0] = 0xfb
	for i := range attr {
		attr[i] = pl.QE.Attributes[i] & mask[i]
	}
	doc := struct {
		ID                      string    `json:"id"`
		Version                 int       `json:"version"`
		IssueDate               string    `json:"issueDate"`
		NextUpdate              string    `json:"nextUpdate"`
		TCBEvaluationDataNumber int       `json:"tcbEvaluationDataNumber"`
		MiscSelect              string    `json:"miscselect"`
		MiscSelectMask          string    `json:"miscselectMask"`
		Attributes              string    `json:"attributes"`
		AttributesMask          string    `json:"attributesMask"`
		MRSIGNER                string    `json:"mrsigner"`
		ISVProdID               uint16    `json:"isvprodid"`
		TCBLevels               []qeLevel `json:"tcbLevels"`
	}{
		ID:                      "QE",
		Version:                 2,
		IssueDate:               o.IssueDate.UTC().Format(time.RFC3339),
		NextUpdate:              o.NextUpdate.UTC().Format(time.RFC3339),
		TCBEvaluationDataNumber: 17,
		MiscSelect:              fmt.Sprintf("%08X", pl.QE.MiscSelect),
		MiscSelectMask:          "FFFFFFFF",
		Attributes:              strings.ToUpper(hex.EncodeToString(attr[:])),
		AttributesMask:          strings.ToUpper(hex.EncodeToString(mask[:])),
		MRSIGNER:                strings.ToUpper(hex.EncodeToString(pl.QE.MRSIGNER[:])),
		ISVProdID:               pl.QE.ISVProdID,
	}
	for _, l := range o.QELevels {
		var ql qeLevel
		ql.TCB.ISVSVN = l.ISVSVN
		ql.TCBDate = o.IssueDate.UTC().Truncate(24 * time.Hour).Format(time.RFC3339)
		ql.TCBStatus = l.Status
		ql.AdvisoryIDs = l.Advisories
		doc.TCBLevels = append(doc.TCBLevels, ql)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		tb.Fatalf("dcaptest: QE identity: %v", err)
	}
	return b
}
