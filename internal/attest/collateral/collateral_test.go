package collateral_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
)

func mustTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestPhalaJSON(t *testing.T) {
	_, c := dcaptest.Phala(t)
	if !bytes.HasPrefix(c.TCBInfo, []byte(`{"id":"SGX","version":3,`)) || !bytes.HasPrefix(c.QEIdentity, []byte(`{"id":"QE","version":2,`)) {
		t.Error("signed documents are not the raw text")
	}
	if len(c.TCBInfoSignature) != 64 || len(c.QEIdentitySignature) != 64 {
		t.Error("signatures are not 64 bytes")
	}
	if len(c.TCBInfoIssuerChain) != 2 || len(c.QEIdentityIssuerChain) != 2 || len(c.PCKCRLIssuerChain) != 2 {
		t.Error("issuer chains are not two certificates")
	}
	if c.PCKCRL.Issuer.CommonName != "Intel SGX PCK Processor CA" || c.RootCACRL.Issuer.CommonName != "Intel SGX Root CA" {
		t.Errorf("CRL issuers %q, %q", c.PCKCRL.Issuer.CommonName, c.RootCACRL.Issuer.CommonName)
	}
	from, until, err := c.Validity()
	if err != nil {
		t.Fatal(err)
	}
	if !from.Equal(mustTime("2025-06-19T10:56:11Z")) || !until.Equal(mustTime("2025-07-19T10:01:18Z")) {
		t.Errorf("Validity = %v .. %v", from, until)
	}

	info, err := collateral.ParseTCBInfo(c.TCBInfo)
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != "SGX" || info.Version != 3 || info.FMSPC != [6]byte{0, 0xa0, 0x67, 0x11, 0, 0} || info.PCEID != [2]byte{} || info.TCBEvaluationDataNumber != 17 {
		t.Errorf("TCB info header = %+v", info)
	}
	l := info.Levels[1]
	if l.Status != "ConfigurationAndSWHardeningNeeded" || strings.Join(l.Advisories, ",") != "INTEL-SA-00289,INTEL-SA-00615" ||
		l.CompSVN != [16]uint8{11, 11, 2, 2, 255, 1} || l.PCESVN != 13 || !l.Date.Equal(mustTime("2024-03-13T00:00:00Z")) {
		t.Errorf("level 1 = %+v", l)
	}

	qe, err := collateral.ParseQEIdentity(c.QEIdentity)
	if err != nil {
		t.Fatal(err)
	}
	wantSigner, _ := hex.DecodeString("8C4F5775D796503E96137F77C68A829A0056AC8DED70140B081B094490C57BFF")
	wantMask, _ := hex.DecodeString("FBFFFFFFFFFFFFFF0000000000000000")
	switch {
	case qe.ID != "QE" || qe.Version != 2 || qe.ISVProdID != 1:
		t.Errorf("QE identity = %+v", qe)
	case qe.MiscSelect != 0 || qe.MiscSelectMask != 0xffffffff:
		t.Errorf("miscselect %#x mask %#x", qe.MiscSelect, qe.MiscSelectMask)
	case !bytes.Equal(qe.MRSIGNER[:], wantSigner) || !bytes.Equal(qe.AttributesMask[:], wantMask) || qe.Attributes[0] != 0x11:
		t.Errorf("QE identity measurements = %+v", qe)
	case len(qe.Levels) != 6 || qe.Levels[0].ISVSVN != 8 || qe.Levels[0].Status != "UpToDate" || qe.Levels[1].Advisories[0] != "INTEL-SA-00615":
		t.Errorf("QE levels = %+v", qe.Levels)
	}
}

func TestParseTCBInfoV2(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	o := dcaptest.CollateralOptions{IssueDate: pl.PKI.Time, NextUpdate: pl.PKI.Time.Add(time.Hour), TCBLevels: []dcaptest.TCBLevel{
		{CompSVN: [16]uint8{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, PCESVN: 11, Status: "SWHardeningNeeded", Advisories: []string{"INTEL-SA-1"}},
		{PCESVN: 1, Status: "OutOfDate"},
	}}
	o.TCBInfoVersion = 3
	v3, err := collateral.ParseTCBInfo(pl.TCBInfoJSON(t, o))
	if err != nil {
		t.Fatal(err)
	}
	o.TCBInfoVersion = 2
	v2, err := collateral.ParseTCBInfo(pl.TCBInfoJSON(t, o))
	if err != nil {
		t.Fatal(err)
	}
	if v2.Version != 2 || v2.ID != "" || len(v2.Levels) != 2 {
		t.Fatalf("v2 = %+v", v2)
	}
	for i := range v3.Levels {
		a, b := v3.Levels[i], v2.Levels[i]
		if a.CompSVN != b.CompSVN || a.PCESVN != b.PCESVN || a.Status != b.Status {
			t.Errorf("level %d: v3 %+v, v2 %+v", i, a, b)
		}
	}
}

func TestParseTCBInfoErrors(t *testing.T) {
	comps := `[` + strings.Repeat(`{"svn":1},`, 15) + `{"svn":1}]`
	level := func(tcb string) string {
		return `{"tcb":` + tcb + `,"tcbDate":"2024-01-01T00:00:00Z","tcbStatus":"UpToDate"}`
	}
	doc := func(version, fmspc, levels string) string {
		return `{"id":"SGX","version":` + version + `,"issueDate":"2025-01-01T00:00:00Z","nextUpdate":"2025-02-01T00:00:00Z","fmspc":"` + fmspc + `","pceId":"0000","tcbLevels":[` + levels + `]}`
	}
	good := level(`{"sgxtcbcomponents":` + comps + `,"pcesvn":1}`)
	if _, err := collateral.ParseTCBInfo([]byte(doc("3", "00906EA10000", good))); err != nil {
		t.Fatalf("baseline: %v", err)
	}
	for name, in := range map[string]string{
		"not JSON":        `{"id":`,
		"version 1":       doc("1", "00906EA10000", good),
		"version 4":       doc("4", "00906EA10000", good),
		"fmspc short":     doc("3", "00906EA100", good),
		"fmspc not hex":   doc("3", "00906EA1000G", good),
		"no levels":       doc("3", "00906EA10000", ""),
		"15 components":   doc("3", "00906EA10000", level(`{"sgxtcbcomponents":`+strings.Replace(comps, `{"svn":1},`, "", 1)+`,"pcesvn":1}`)),
		"svn 256":         doc("3", "00906EA10000", level(`{"sgxtcbcomponents":`+strings.Replace(comps, `{"svn":1}`, `{"svn":256}`, 1)+`,"pcesvn":1}`)),
		"svn missing":     doc("3", "00906EA10000", level(`{"sgxtcbcomponents":`+strings.Replace(comps, `{"svn":1}`, `{}`, 1)+`,"pcesvn":1}`)),
		"pcesvn missing":  doc("3", "00906EA10000", level(`{"sgxtcbcomponents":`+comps+`}`)),
		"pcesvn 65536":    doc("3", "00906EA10000", level(`{"sgxtcbcomponents":`+comps+`,"pcesvn":65536}`)),
		"no status":       doc("3", "00906EA10000", `{"tcb":{"sgxtcbcomponents":`+comps+`,"pcesvn":1}}`),
		"bad tcbDate":     doc("3", "00906EA10000", `{"tcb":{"sgxtcbcomponents":`+comps+`,"pcesvn":1},"tcbDate":"yesterday","tcbStatus":"UpToDate"}`),
		"v2 missing comp": doc("2", "00906EA10000", level(`{"sgxtcbcomp01svn":1,"pcesvn":1}`)),
	} {
		if _, err := collateral.ParseTCBInfo([]byte(in)); !errors.Is(err, collateral.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

func TestParseQEIdentityErrors(t *testing.T) {
	doc := func(version, mrsigner, prodid, levels string) string {
		return `{"id":"QE","version":` + version + `,"issueDate":"2025-01-01T00:00:00Z","nextUpdate":"2025-02-01T00:00:00Z",` +
			`"miscselect":"00000000","miscselectMask":"FFFFFFFF","attributes":"11000000000000000000000000000000",` +
			`"attributesMask":"FBFFFFFFFFFFFFFF0000000000000000","mrsigner":"` + mrsigner + `"` + prodid + `,"tcbLevels":[` + levels + `]}`
	}
	signer := strings.Repeat("AB", 32)
	good := `{"tcb":{"isvsvn":8},"tcbDate":"2024-01-01T00:00:00Z","tcbStatus":"UpToDate"}`
	if _, err := collateral.ParseQEIdentity([]byte(doc("2", signer, `,"isvprodid":1`, good))); err != nil {
		t.Fatalf("baseline: %v", err)
	}
	for name, in := range map[string]string{
		"not JSON":        `[`,
		"version 1":       doc("1", signer, `,"isvprodid":1`, good),
		"mrsigner short":  doc("2", signer[2:], `,"isvprodid":1`, good),
		"mrsigner hex":    doc("2", "ZZ"+signer[2:], `,"isvprodid":1`, good),
		"no isvprodid":    doc("2", signer, ``, good),
		"no levels":       doc("2", signer, `,"isvprodid":1`, ``),
		"no isvsvn":       doc("2", signer, `,"isvprodid":1`, `{"tcb":{},"tcbStatus":"UpToDate"}`),
		"isvsvn negative": doc("2", signer, `,"isvprodid":1`, `{"tcb":{"isvsvn":-1},"tcbStatus":"UpToDate"}`),
		"no status":       doc("2", signer, `,"isvprodid":1`, `{"tcb":{"isvsvn":1}}`),
	} {
		if _, err := collateral.ParseQEIdentity([]byte(in)); !errors.Is(err, collateral.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

func TestParseCRL(t *testing.T) {
	p := dcaptest.NewPKI(t)
	crl := p.PCKCRL(t, dcaptest.CRLOptions{ThisUpdate: p.Time, NextUpdate: p.Time.Add(time.Hour)})
	hexText := hex.EncodeToString(crl.Raw)
	pemText := pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: crl.Raw})
	for name, in := range map[string][]byte{
		"DER":           crl.Raw,
		"hex":           []byte(hexText),
		"hex uppercase": []byte(strings.ToUpper(hexText)),
		"hex newline":   []byte(hexText + "\n"),
		"PEM":           pemText,
	} {
		got, err := collateral.ParseCRL(in)
		if err != nil || !bytes.Equal(got.Raw, crl.Raw) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, in := range map[string][]byte{
		"empty":         nil,
		"odd hex":       []byte(hexText[1:]),
		"garbage":       []byte("not a CRL"),
		"certificate":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.Root.Raw}),
		"truncated DER": crl.Raw[:len(crl.Raw)-1],
		"two PEM":       append(bytes.Clone(pemText), pemText...),
	} {
		if _, err := collateral.ParseCRL(in); !errors.Is(err, collateral.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

func TestSplitBody(t *testing.T) {
	raw := `{ "id" : "SGX",  "version":3 }`
	body := []byte(`{"tcbInfo":` + raw + `,"signature":"0a0b"}`)
	got, sig, err := collateral.SplitTCBInfoBody(body)
	if err != nil || string(got) != raw || !bytes.Equal(sig, []byte{0x0a, 0x0b}) {
		t.Fatalf("SplitTCBInfoBody = %q, %x, %v", got, sig, err)
	}
	got, _, err = collateral.SplitQEIdentityBody([]byte(`{"enclaveIdentity":{"id":"QE"},"signature":""}`))
	if err != nil || string(got) != `{"id":"QE"}` {
		t.Fatalf("SplitQEIdentityBody = %q, %v", got, err)
	}
	for name, in := range map[string]string{
		"not JSON":          `{`,
		"no tcbInfo":        `{"enclaveIdentity":{},"signature":"00"}`,
		"tcbInfo string":    `{"tcbInfo":"{}","signature":"00"}`,
		"no signature":      `{"tcbInfo":{}}`,
		"signature number":  `{"tcbInfo":{},"signature":5}`,
		"signature not hex": `{"tcbInfo":{},"signature":"xyz"}`,
	} {
		if _, _, err := collateral.SplitTCBInfoBody([]byte(in)); !errors.Is(err, collateral.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

func pemOf(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// pcsFiles lays out c as raw PCS responses, the directory format.
func pcsFiles(c *collateral.Collateral, ca collateral.CA) fstest.MapFS {
	return fstest.MapFS{
		collateral.FileTCBInfo:               {Data: []byte(`{"tcbInfo":` + string(c.TCBInfo) + `,"signature":"` + hex.EncodeToString(c.TCBInfoSignature) + `"}`)},
		collateral.FileTCBInfoIssuerChain:    {Data: pemOf(c.TCBInfoIssuerChain)},
		collateral.FileQEIdentity:            {Data: []byte(`{"enclaveIdentity":` + string(c.QEIdentity) + `,"signature":"` + hex.EncodeToString(c.QEIdentitySignature) + `"}`)},
		collateral.FileQEIdentityIssuerChain: {Data: pemOf(c.QEIdentityIssuerChain)},
		collateral.FilePCKCRL(ca):            {Data: c.PCKCRL.Raw},
		collateral.FilePCKCRLIssuerChain(ca): {Data: pemOf(c.PCKCRLIssuerChain)},
		collateral.FileRootCACRL:             {Data: []byte(hex.EncodeToString(c.RootCACRL.Raw))},
	}
}

func sameCollateral(t *testing.T, got, want *collateral.Collateral) {
	t.Helper()
	if !bytes.Equal(got.TCBInfo, want.TCBInfo) || !bytes.Equal(got.TCBInfoSignature, want.TCBInfoSignature) ||
		!bytes.Equal(got.QEIdentity, want.QEIdentity) || !bytes.Equal(got.QEIdentitySignature, want.QEIdentitySignature) ||
		!bytes.Equal(got.PCKCRL.Raw, want.PCKCRL.Raw) || !bytes.Equal(got.RootCACRL.Raw, want.RootCACRL.Raw) ||
		!bytes.Equal(pemOf(got.TCBInfoIssuerChain), pemOf(want.TCBInfoIssuerChain)) ||
		!bytes.Equal(pemOf(got.QEIdentityIssuerChain), pemOf(want.QEIdentityIssuerChain)) ||
		!bytes.Equal(pemOf(got.PCKCRLIssuerChain), pemOf(want.PCKCRLIssuerChain)) {
		t.Error("collateral differs from what was stored")
	}
}

func TestFromFS(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	want := pl.Collateral(t, dcaptest.CollateralOptions{})
	fsys := pcsFiles(want, collateral.CAProcessor)
	got, err := collateral.FromFS(fsys, collateral.CAProcessor)
	if err != nil {
		t.Fatal(err)
	}
	sameCollateral(t, got, want)

	if _, err := collateral.FromFS(fsys, collateral.CAPlatform); !errors.Is(err, collateral.ErrNotFound) {
		t.Errorf("other CA: err = %v, want ErrNotFound", err)
	}
	for name := range fsys {
		broken := maps.Clone(fsys)
		broken[name] = &fstest.MapFile{Data: []byte("garbage")}
		if _, err := collateral.FromFS(broken, collateral.CAProcessor); !errors.Is(err, collateral.ErrFormat) || !strings.Contains(err.Error(), name) {
			t.Errorf("garbage %s: err = %v, want ErrFormat naming the file", name, err)
		}
		missing := maps.Clone(fsys)
		delete(missing, name)
		if _, err := collateral.FromFS(missing, collateral.CAProcessor); !errors.Is(err, collateral.ErrNotFound) {
			t.Errorf("missing %s: err = %v, want ErrNotFound", name, err)
		}
	}
}

func TestFileProvider(t *testing.T) {
	ctx := context.Background()
	// A dcap-qvl JSON file.
	jsonPath := dcaptest.SGXTestdata(t, dcaptest.PhalaCollateralFile)
	_, phala := dcaptest.Phala(t)
	got, err := collateral.File{Path: jsonPath}.Get(ctx, [6]byte{}, collateral.CAProcessor)
	if err != nil {
		t.Fatal(err)
	}
	sameCollateral(t, got, phala)

	// A directory of PCS responses.
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	want := pl.Collateral(t, dcaptest.CollateralOptions{})
	dir := t.TempDir()
	for name, f := range pcsFiles(want, collateral.CAPlatform) {
		if err := os.WriteFile(filepath.Join(dir, name), f.Data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got, err = (collateral.File{Path: dir}).Get(ctx, [6]byte{}, collateral.CAPlatform); err != nil {
		t.Fatal(err)
	}
	sameCollateral(t, got, want)

	if _, err := (collateral.File{Path: filepath.Join(dir, "absent")}).Get(ctx, [6]byte{}, collateral.CAProcessor); !errors.Is(err, collateral.ErrNotFound) {
		t.Errorf("absent path: err = %v, want ErrNotFound", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"tcb_info_signature":"zz"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (collateral.File{Path: bad}).Get(ctx, [6]byte{}, collateral.CAProcessor); !errors.Is(err, collateral.ErrFormat) {
		t.Errorf("bad JSON file: err = %v, want ErrFormat", err)
	}
}

func TestFromQVLJSONErrors(t *testing.T) {
	for name, in := range map[string]string{
		"not JSON":      `[`,
		"bad signature": `{"tcb_info_signature":"zz"}`,
		"no chains":     `{"tcb_info_signature":"00","qe_identity_signature":"00"}`,
	} {
		if _, err := collateral.FromQVLJSON([]byte(in)); !errors.Is(err, collateral.ErrFormat) {
			t.Errorf("%s: err = %v, want ErrFormat", name, err)
		}
	}
}

type countingProvider struct {
	calls atomic.Int32
	c     *collateral.Collateral
	err   error
}

func (p *countingProvider) Get(context.Context, [6]byte, collateral.CA) (*collateral.Collateral, error) {
	p.calls.Add(1)
	return p.c, p.err
}

func TestCache(t *testing.T) {
	ctx := context.Background()
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	next := pl.PKI.Time.Add(time.Hour)
	col := pl.Collateral(t, dcaptest.CollateralOptions{NextUpdate: next})
	now := pl.PKI.Time
	src := &countingProvider{c: col}
	cache := collateral.NewCache(src, func() time.Time { return now })
	fmspc := pl.Ext.FMSPC
	get := func() *collateral.Collateral {
		t.Helper()
		got, err := cache.Get(ctx, fmspc, collateral.CAProcessor)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, step := range []struct {
		name  string
		now   time.Time
		calls int32
	}{
		{"first fetch", pl.PKI.Time, 1},
		{"cached", pl.PKI.Time.Add(time.Minute), 1},
		{"just before nextUpdate", next.Add(-time.Nanosecond), 1},
		{"at nextUpdate", next, 2},
		{"still stale", next.Add(time.Minute), 3},
	} {
		now = step.now
		if get() != col || src.calls.Load() != step.calls {
			t.Errorf("%s: %d fetches, want %d", step.name, src.calls.Load(), step.calls)
		}
	}
	// Another key is fetched separately.
	now = pl.PKI.Time
	before := src.calls.Load()
	if _, err := cache.Get(ctx, fmspc, collateral.CAPlatform); err != nil || src.calls.Load() != before+1 {
		t.Errorf("other CA: %v, %d fetches", err, src.calls.Load()-before)
	}

	// Concurrent readers share one entry.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if got, err := cache.Get(ctx, fmspc, collateral.CAProcessor); err != nil || got != col {
				t.Errorf("concurrent Get = %v", err)
			}
		})
	}
	wg.Wait()

	// Errors are returned, not cached.
	failing := &countingProvider{err: errors.New("boom")}
	fc := collateral.NewCache(failing, func() time.Time { return now })
	for range 2 {
		if _, err := fc.Get(ctx, fmspc, collateral.CAProcessor); err == nil {
			t.Error("error swallowed")
		}
	}
	if failing.calls.Load() != 2 {
		t.Errorf("failing source called %d times, want 2", failing.calls.Load())
	}

	// Collateral that cannot be dated is returned but not kept.
	undated := &countingProvider{c: &collateral.Collateral{}}
	uc := collateral.NewCache(undated, nil)
	for range 2 {
		if got, err := uc.Get(ctx, fmspc, collateral.CAProcessor); err != nil || got != undated.c {
			t.Errorf("undated: %v", err)
		}
	}
	if undated.calls.Load() != 2 {
		t.Errorf("undated collateral cached")
	}
}

func TestStatic(t *testing.T) {
	if _, err := (collateral.Static{}).Get(context.Background(), [6]byte{}, collateral.CAProcessor); !errors.Is(err, collateral.ErrNotFound) {
		t.Errorf("empty Static: err = %v", err)
	}
	c := &collateral.Collateral{}
	if got, err := (collateral.Static{Collateral: c}).Get(context.Background(), [6]byte{}, collateral.CAPlatform); got != c || err != nil {
		t.Errorf("Static = %v, %v", got, err)
	}
}
