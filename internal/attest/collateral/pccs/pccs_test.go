package pccs_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/collateral/pccs"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
)

// server serves h on loopback and records the request URIs.
func server(t *testing.T, h http.Handler) (*pccs.Client, *[]string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RequestURI())
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return &pccs.Client{BaseURL: srv.URL + dcaptest.PCCSPath, HTTPClient: srv.Client()}, &seen
}

func pemOf(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

func sameCollateral(t *testing.T, got, want *collateral.Collateral) {
	t.Helper()
	switch {
	case !bytes.Equal(got.TCBInfo, want.TCBInfo), !bytes.Equal(got.TCBInfoSignature, want.TCBInfoSignature):
		t.Error("TCB info differs")
	case !bytes.Equal(got.QEIdentity, want.QEIdentity), !bytes.Equal(got.QEIdentitySignature, want.QEIdentitySignature):
		t.Error("QE identity differs")
	case !bytes.Equal(got.PCKCRL.Raw, want.PCKCRL.Raw), !bytes.Equal(got.RootCACRL.Raw, want.RootCACRL.Raw):
		t.Error("CRLs differ")
	case !bytes.Equal(pemOf(got.TCBInfoIssuerChain), pemOf(want.TCBInfoIssuerChain)),
		!bytes.Equal(pemOf(got.QEIdentityIssuerChain), pemOf(want.QEIdentityIssuerChain)),
		!bytes.Equal(pemOf(got.PCKCRLIssuerChain), pemOf(want.PCKCRLIssuerChain)):
		t.Error("issuer chains differ")
	}
}

// TestPhalaOverPCCS serves the real vector's collateral the way a PCCS does
// (hex CRLs, URL-encoded chains) and verifies the quote with it.
func TestPhalaOverPCCS(t *testing.T) {
	quote, fromFile := dcaptest.Phala(t)
	client, seen := server(t, dcaptest.PCCSHandler(fromFile, dcaptest.PCCSOptions{}))
	ctx := context.Background()

	fileRes, err := (&dcap.Verifier{Collateral: collateral.File{Path: dcaptest.SGXTestdata(t, dcaptest.PhalaCollateralFile)}, Now: dcaptest.PhalaTime}).Verify(ctx, quote)
	if err != nil {
		t.Fatal(err)
	}
	httpRes, err := (&dcap.Verifier{Collateral: client, Now: dcaptest.PhalaTime}).Verify(ctx, quote)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(httpRes, fileRes) {
		t.Errorf("PCCS result %+v differs from file result %+v", httpRes, fileRes)
	}
	if httpRes.Status.String() != "ConfigurationAndSWHardeningNeeded" {
		t.Errorf("status %v", httpRes.Status)
	}
	want := []string{
		dcaptest.PCCSPath + "tcb?fmspc=00A067110000",
		dcaptest.PCCSPath + "qe/identity",
		dcaptest.PCCSPath + "pckcrl?ca=processor",
		dcaptest.PCCSPath + "rootcacrl",
	}
	if !reflect.DeepEqual(*seen, want) {
		t.Errorf("requests %q, want %q", *seen, want)
	}
	got, err := client.Get(ctx, httpRes.FMSPC(), collateral.CAProcessor)
	if err != nil {
		t.Fatal(err)
	}
	sameCollateral(t, got, fromFile)
}

func TestEncodings(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	want := pl.Collateral(t, dcaptest.CollateralOptions{})
	for name, o := range map[string]dcaptest.PCCSOptions{
		"hex CRLs":          {},
		"DER CRLs":          {DERCRLs: true},
		"PCS v3 TCB header": {LegacyTCBHeader: true},
		"form-encoded":      {FormEncodedChains: true},
	} {
		t.Run(name, func(t *testing.T) {
			client, _ := server(t, dcaptest.PCCSHandler(want, o))
			got, err := client.Get(context.Background(), pl.Ext.FMSPC, collateral.CAPlatform)
			if err != nil {
				t.Fatal(err)
			}
			sameCollateral(t, got, want)
		})
	}
}

func TestQuery(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	client, seen := server(t, dcaptest.PCCSHandler(pl.Collateral(t, dcaptest.CollateralOptions{}), dcaptest.PCCSOptions{}))
	client.Update = "early"
	client.BaseURL = strings.TrimSuffix(client.BaseURL, "/") // with or without the slash
	if _, err := client.Get(context.Background(), [6]byte{0xab, 0, 0, 0, 0, 0x0f}, collateral.CAPlatform); err != nil {
		t.Fatal(err)
	}
	if (*seen)[0] != dcaptest.PCCSPath+"tcb?fmspc=AB000000000F&update=early" || (*seen)[2] != dcaptest.PCCSPath+"pckcrl?ca=platform" {
		t.Errorf("requests %q", *seen)
	}
}

func TestErrors(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	good := dcaptest.PCCSHandler(pl.Collateral(t, dcaptest.CollateralOptions{}), dcaptest.PCCSOptions{})
	// override answers one path differently and passes the rest through.
	override := func(path string, h http.HandlerFunc) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == dcaptest.PCCSPath+path {
				h(w, r)
				return
			}
			good.ServeHTTP(w, r)
		})
	}
	status := func(code int) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", code) }
	}
	body := func(hdr, val, b string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			if hdr != "" {
				w.Header().Set(hdr, val)
			}
			w.Write([]byte(b))
		}
	}
	chain := dcaptest.ChainHeader([]*x509.Certificate{pl.PKI.TCBSigning, pl.PKI.Root}, false)
	for _, tc := range []struct {
		name string
		h    http.Handler
		want error
		text string
	}{
		{"TCB info 404", override("tcb", status(http.StatusNotFound)), collateral.ErrNotFound, "tcb"},
		{"QE identity 500", override("qe/identity", status(http.StatusInternalServerError)), pccs.ErrHTTP, "500"},
		{"PCK CRL 503", override("pckcrl", status(http.StatusServiceUnavailable)), pccs.ErrHTTP, "pckcrl"},
		{"root CRL 404", override("rootcacrl", status(http.StatusNotFound)), collateral.ErrNotFound, "rootcacrl"},
		{"TCB info not JSON", override("tcb", body("TCB-Info-Issuer-Chain", chain, "<html>")), collateral.ErrFormat, "tcb"},
		{"TCB info without chain", override("tcb", body("", "", `{"tcbInfo":{},"signature":"00"}`)), collateral.ErrFormat, "TCB-Info-Issuer-Chain"},
		{"chain not URL-encoded PEM", override("tcb", body("TCB-Info-Issuer-Chain", "%zz", `{"tcbInfo":{},"signature":"00"}`)), collateral.ErrFormat, "header"},
		{"chain garbage", override("qe/identity", body("SGX-Enclave-Identity-Issuer-Chain", "garbage", `{"enclaveIdentity":{},"signature":"00"}`)), collateral.ErrFormat, "qe/identity"},
		{"PCK CRL garbage", override("pckcrl", body("SGX-PCK-CRL-Issuer-Chain", chain, "not a CRL")), collateral.ErrFormat, "pckcrl"},
		{"root CRL garbage", override("rootcacrl", body("", "", "zz")), collateral.ErrFormat, "rootcacrl"},
		{"body too large", override("rootcacrl", body("", "", strings.Repeat("0", 1<<20+1))), collateral.ErrFormat, "larger"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, _ := server(t, tc.h)
			c, err := client.Get(context.Background(), pl.Ext.FMSPC, collateral.CAProcessor)
			if !errors.Is(err, tc.want) || c != nil || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Get = %v, %v; want %v mentioning %q", c, err, tc.want, tc.text)
			}
		})
	}

	client, seen := server(t, good)
	if _, err := client.Get(context.Background(), pl.Ext.FMSPC, "elsewhere"); err == nil || len(*seen) != 0 {
		t.Errorf("unknown CA: %v after %d requests", err, len(*seen))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := client.Get(ctx, pl.Ext.FMSPC, collateral.CAProcessor); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	bad := &pccs.Client{BaseURL: "://bad"}
	if _, err := bad.Get(context.Background(), pl.Ext.FMSPC, collateral.CAProcessor); err == nil {
		t.Error("bad base URL accepted")
	}
}

// TestCachedClient checks that a Cache in front of the client fetches once
// per nextUpdate.
func TestCachedClient(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	col := pl.Collateral(t, dcaptest.CollateralOptions{NextUpdate: pl.PKI.Time.Add(time.Hour)})
	client, seen := server(t, dcaptest.PCCSHandler(col, dcaptest.PCCSOptions{}))
	now := pl.PKI.Time
	clock := func() time.Time { return now }
	v := &dcap.Verifier{Collateral: collateral.NewCache(client, clock), Now: clock, RootCA: pl.PKI.Root}
	quote := pl.Quote(t, dcaptest.QuoteOptions{})
	for range 3 {
		if _, err := v.Verify(context.Background(), quote); err != nil {
			t.Fatal(err)
		}
	}
	if len(*seen) != 4 {
		t.Errorf("%d requests for three verifications, want 4", len(*seen))
	}
	now = now.Add(time.Hour)
	if _, err := v.Verify(context.Background(), quote); !errors.Is(err, dcap.ErrCollateralExpired) {
		t.Errorf("after nextUpdate: %v", err)
	}
	if len(*seen) != 8 {
		t.Errorf("%d requests after nextUpdate, want 8", len(*seen))
	}
}
