package dcaptest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// TDXQuoteOptions shape a synthetic TDX quote. The zero value gives a v4
// quote with a TD 1.0 body whose TEE_TCB_SVN is DefaultTEETCBSVN.
type TDXQuoteOptions struct {
	Version  uint16 // 0 means 4; 5 carries a body descriptor
	BodyType uint16 // v5 only: 0 means TD 1.0; tdxquote.BodyTypeTD15
	// Body is the TD report; a zero TEETCBSVN means DefaultTEETCBSVN.
	Body tdxquote.TDReport
	// CertData is the PCK certification data (type 5); nil means
	// ChainPEM.
	CertData []byte
}

// DefaultTEETCBSVN is module SVN 6, major version 1, late microcode SVN 3.
func DefaultTEETCBSVN() [16]byte { return [16]byte{6, 1, 3} }

// TDXQuote produces a TDX quote signed by the platform's fake TD QE.
func (pl *Platform) TDXQuote(tb testing.TB, o TDXQuoteOptions) []byte {
	tb.Helper()
	if o.Version == 0 {
		o.Version = tdxquote.Version4
	}
	if o.BodyType == 0 || o.Version == tdxquote.Version4 {
		o.BodyType = tdxquote.BodyTypeTD10
	}
	if o.Body.TEETCBSVN == ([16]byte{}) {
		o.Body.TEETCBSVN = DefaultTEETCBSVN()
	}
	ak := newKey(tb)
	akBytes, err := ak.PublicKey.Bytes()
	if err != nil {
		tb.Fatalf("dcaptest: attestation key: %v", err)
	}
	akBytes = akBytes[1:]
	auth := make([]byte, 32)
	for i := range auth {
		auth[i] = byte(i)
	}
	var qe sgxquote.ReportBody
	copy(qe[0:16], pl.Ext.CPUSVN[:])
	binary.LittleEndian.PutUint32(qe[16:], pl.QE.MiscSelect)
	copy(qe[48:64], pl.QE.Attributes[:])
	copy(qe[128:160], pl.QE.MRSIGNER[:])
	binary.LittleEndian.PutUint16(qe[256:], pl.QE.ISVProdID)
	binary.LittleEndian.PutUint16(qe[258:], pl.QE.ISVSVN)
	binding := sha256.Sum256(append(append([]byte{}, akBytes...), auth...))
	copy(qe[320:352], binding[:])

	hdr := make([]byte, sgxquote.HeaderSize)
	binary.LittleEndian.PutUint16(hdr[0:], o.Version)
	binary.LittleEndian.PutUint16(hdr[2:], sgxquote.AttestationKeyECDSAP256)
	binary.LittleEndian.PutUint32(hdr[4:], tdxquote.TEETypeTDX)
	vendor := sgxquote.IntelQEVendorID()
	copy(hdr[12:28], vendor[:])
	copy(hdr[28:44], "synthetic-tdqe!!")
	signed := hdr
	body := o.Body.Marshal(o.BodyType)
	if o.Version == tdxquote.Version5 {
		signed = binary.LittleEndian.AppendUint16(signed, o.BodyType)
		signed = binary.LittleEndian.AppendUint32(signed, uint32(len(body)))
	}
	signed = append(signed, body...)

	var qeData []byte
	qeData = append(qeData, qe[:]...)
	qeData = append(qeData, SignRaw(tb, pl.PCKKey, qe[:])...)
	qeData = binary.LittleEndian.AppendUint16(qeData, uint16(len(auth)))
	qeData = append(qeData, auth...)
	if o.CertData == nil {
		o.CertData = pl.ChainPEM()
	}
	qeData = appendCertData(qeData, sgxquote.CertTypePCKChain, o.CertData)
	sigData := SignRaw(tb, ak, signed)
	sigData = append(sigData, akBytes...)
	sigData = appendCertData(sigData, sgxquote.CertTypeQEReport, qeData)
	quote := append(signed, binary.LittleEndian.AppendUint32(nil, uint32(len(sigData)))...)
	return append(quote, sigData...)
}

// TDXLevel is a platform TCB level of synthetic TDX TCB info.
type TDXLevel struct {
	CompSVN    [16]uint8 // SGX components
	PCESVN     uint16
	TDXCompSVN [16]uint8
	Status     string
	Advisories []string
}

// TDXModuleIdentity is a synthetic tdxModuleIdentities entry.
type TDXModuleIdentity struct {
	ID       string // "TDX_01"
	MRSIGNER [48]byte
	Levels   []QELevel // by module SVN (TEE_TCB_SVN[0])
}

// TDXCollateralOptions shape synthetic TDX collateral. The zero value
// gives collateral under which a default TDX quote of the platform is
// UpToDate.
type TDXCollateralOptions struct {
	// Levels nil means one UpToDate level at the platform's SGX SVNs and
	// DefaultTEETCBSVN.
	Levels []TDXLevel
	// Modules nil means TDX_01 with one UpToDate level at SVN 6.
	Modules []TDXModuleIdentity
	// ModuleMRSIGNER is tdxModule's mrsigner (zero, as Intel's).
	ModuleMRSIGNER [48]byte
	// QELevels nil means one UpToDate level at the QE's ISVSVN.
	QELevels []QELevel
	// FMSPC overrides the text of the TCB info's fmspc (default upper-case
	// hex of the platform's).
	FMSPC string
	// TCBInfoID and QEIdentityID default to "TDX" and "TD_QE".
	TCBInfoID, QEIdentityID string
	IssueDate, NextUpdate   time.Time
}

// TDXCollateral returns signed TDX collateral for the platform.
func (pl *Platform) TDXCollateral(tb testing.TB, o TDXCollateralOptions) *collateral.Collateral {
	tb.Helper()
	p := pl.PKI
	if o.IssueDate.IsZero() {
		o.IssueDate = p.Time.Add(-24 * time.Hour)
	}
	if o.NextUpdate.IsZero() {
		o.NextUpdate = p.Time.Add(30 * 24 * time.Hour)
	}
	if o.Levels == nil {
		o.Levels = []TDXLevel{{CompSVN: pl.Ext.CompSVN, PCESVN: pl.Ext.PCESVN, TDXCompSVN: DefaultTEETCBSVN(), Status: "UpToDate"}}
	}
	if o.Modules == nil {
		o.Modules = []TDXModuleIdentity{{ID: "TDX_01", Levels: []QELevel{{ISVSVN: 6, Status: "UpToDate"}}}}
	}
	if o.FMSPC == "" {
		o.FMSPC = strings.ToUpper(hex.EncodeToString(pl.Ext.FMSPC[:]))
	}
	if o.TCBInfoID == "" {
		o.TCBInfoID = "TDX"
	}
	if o.QEIdentityID == "" {
		o.QEIdentityID = "TD_QE"
	}
	col := pl.Collateral(tb, CollateralOptions{QELevels: o.QELevels, IssueDate: o.IssueDate, NextUpdate: o.NextUpdate})
	// The TD QE identity: the SGX QE identity document with the TD_QE id.
	var qeDoc map[string]any
	if err := json.Unmarshal(col.QEIdentity, &qeDoc); err != nil {
		tb.Fatal(err)
	}
	qeDoc["id"] = o.QEIdentityID
	col.QEIdentity = mustJSON(tb, qeDoc)
	col.QEIdentitySignature = p.Sign(tb, col.QEIdentity)
	col.TCBInfo = pl.tdxTCBInfoJSON(tb, o)
	col.TCBInfoSignature = p.Sign(tb, col.TCBInfo)
	return col
}

func (pl *Platform) tdxTCBInfoJSON(tb testing.TB, o TDXCollateralOptions) []byte {
	type svn struct {
		SVN int `json:"svn"`
	}
	comps := func(c [16]uint8) []svn {
		out := make([]svn, len(c))
		for i, s := range c {
			out[i] = svn{int(s)}
		}
		return out
	}
	levels := func(ls []QELevel) []map[string]any {
		var out []map[string]any
		for _, l := range ls {
			m := map[string]any{"tcb": map[string]int{"isvsvn": int(l.ISVSVN)}, "tcbDate": o.IssueDate.UTC().Format(time.RFC3339), "tcbStatus": l.Status}
			if l.Advisories != nil {
				m["advisoryIDs"] = l.Advisories
			}
			out = append(out, m)
		}
		return out
	}
	var modules []map[string]any
	for _, m := range o.Modules {
		modules = append(modules, map[string]any{
			"id": m.ID, "mrsigner": strings.ToUpper(hex.EncodeToString(m.MRSIGNER[:])),
			"attributes": "0000000000000000", "attributesMask": "FFFFFFFFFFFFFFFF", "tcbLevels": levels(m.Levels),
		})
	}
	var tcbLevels []map[string]any
	for i, l := range o.Levels {
		m := map[string]any{
			"tcb":       map[string]any{"sgxtcbcomponents": comps(l.CompSVN), "pcesvn": int(l.PCESVN), "tdxtcbcomponents": comps(l.TDXCompSVN)},
			"tcbDate":   o.IssueDate.AddDate(0, -i, 0).UTC().Format(time.RFC3339),
			"tcbStatus": l.Status,
		}
		if l.Advisories != nil {
			m["advisoryIDs"] = l.Advisories
		}
		tcbLevels = append(tcbLevels, m)
	}
	doc := map[string]any{
		"id": o.TCBInfoID, "version": 3,
		"issueDate": o.IssueDate.UTC().Format(time.RFC3339), "nextUpdate": o.NextUpdate.UTC().Format(time.RFC3339),
		"fmspc": o.FMSPC, "pceId": strings.ToUpper(hex.EncodeToString(pl.Ext.PCEID[:])),
		"tcbType": 0, "tcbEvaluationDataNumber": 17,
		"tdxModule": map[string]string{
			"mrsigner": strings.ToUpper(hex.EncodeToString(o.ModuleMRSIGNER[:])), "attributes": "0000000000000000", "attributesMask": "FFFFFFFFFFFFFFFF",
		},
		"tdxModuleIdentities": modules,
		"tcbLevels":           tcbLevels,
	}
	return mustJSON(tb, doc)
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatalf("dcaptest: %v", err)
	}
	return b
}

// TDXPCCSHandler serves sgx and tdx collateral like a PCCS: the SGX paths
// under PCCSPath from sgx, and tcb and qe/identity under TDXPCCSPath from
// tdx.
func TDXPCCSHandler(sgx, tdx *collateral.Collateral) *TDXMux {
	return &TDXMux{sgx: PCCSHandler(sgx, PCCSOptions{}), tdx: PCCSHandler(tdx, PCCSOptions{})}
}

// TDXPCCSPath is the path prefix of TDX collateral on a fake PCCS.
const TDXPCCSPath = "/tdx/certification/v4/"

// TDXMux is the fake PCCS of TDXPCCSHandler; it counts TDX requests.
type TDXMux struct {
	sgx, tdx    http.Handler
	TDXRequests atomic.Int64
}

func (m *TDXMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if rest, ok := strings.CutPrefix(r.URL.Path, TDXPCCSPath); ok {
		if rest != "tcb" && rest != "qe/identity" {
			http.NotFound(w, r)
			return
		}
		m.TDXRequests.Add(1)
		r2 := r.Clone(r.Context())
		r2.URL.Path = PCCSPath + rest
		m.tdx.ServeHTTP(w, r2)
		return
	}
	m.sgx.ServeHTTP(w, r)
}
