package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// startTDXCoordinator serves GET /api/v2/quote with a synthetic TDX quote of
// body over SHA-256(root ‖ nonce), as a Coordinator in a TDX guest does, and
// GET /api/v2/status; it returns its address.
func startTDXCoordinator(t *testing.T, pl *dcaptest.Platform, body tdxquote.TDReport) string {
	t.Helper()
	rootKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	interKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	root := caCert(t, "root", nil, nil, rootKey)
	inter := caCert(t, "intermediate", root, rootKey, interKey)
	chain := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: inter.Raw})) +
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v2/quote", func(w http.ResponseWriter, r *http.Request) {
		nonce, err := base64.URLEncoding.DecodeString(r.URL.Query().Get("nonce"))
		if err != nil {
			reply(w, http.StatusBadRequest, "fail", nil, "bad nonce")
			return
		}
		b := body
		b.ReportData = client.ReportData(root.Raw, nonce)
		q := pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15, Body: b})
		reply(w, http.StatusOK, "success", v2.QuoteResponse{Cert: chain, Quote: q}, "")
	})
	mux.HandleFunc("GET /api/v2/status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, "success", v2.StatusResponse{Code: 2, Status: 2, Message: "Coordinator is ready to accept a manifest."}, "")
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{root.Raw}, PrivateKey: rootKey}}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "https://")
}

// TestEraConfigTDX: --era-config with TD measurements verifies a Coordinator
// in a TDX guest. An era config must name the TD's firmware (MRTD) also
// with Debug, and its kernel and initrd (RTMR1, RTMR2) unless it opts out
// with InsecureAllowUnsetRTMR1RTMR2; a config that does not is a usage
// error naming the missing field, before the Coordinator is contacted.
func TestEraConfigTDX(t *testing.T) {
	pki := dcaptest.NewPKI(t)
	pl := pki.NewPlatform(t, dcaptest.DefaultExtension())
	dir := t.TempDir()
	t.Chdir(dir)
	// The CLI verifies at the current time: collateral valid now.
	from, until := time.Now().Add(-24*time.Hour), time.Now().Add(30*24*time.Hour)
	for name, data := range map[string][]byte{
		"collateral.json": dcaptest.QVLJSON(t, pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{IssueDate: from, NextUpdate: until})),
		"intel-root.pem":  dcaptest.PEM(pki.Root),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var body tdxquote.TDReport
	copy(body.MRTD[:], "the coordinator TD's firmware")
	copy(body.RTMR[1][:], "the coordinator TD's kernel")
	copy(body.RTMR[2][:], "the coordinator TD's initrd")
	body.TDAttributes[3] = 0x10 // SEPT_VE_DISABLE
	addr := startTDXCoordinator(t, pl, body)
	mrtd := `"MRTD":"` + hex.EncodeToString(body.MRTD[:]) + `"`
	rtmr1 := `"RTMR1":"` + hex.EncodeToString(body.RTMR[1][:]) + `"`
	rtmr2 := `"RTMR2":"` + hex.EncodeToString(body.RTMR[2][:]) + `"`
	other := `"` + strings.Repeat("ee", 48) + `"`

	for _, tc := range []struct {
		name, era string
		code      int
		want      string // in stdout for exit 0, else in stderr
	}{
		{"MRTD, RTMR1, RTMR2", `{` + mrtd + `,` + rtmr1 + `,` + rtmr2 + `}`, ExitOK, "2: Coordinator is ready"},
		{"with Debug", `{` + mrtd + `,` + rtmr1 + `,` + rtmr2 + `,"Debug":true}`, ExitOK, "2: Coordinator is ready"},
		{"opted out of RTMR1 and RTMR2", `{` + mrtd + `,"InsecureAllowUnsetRTMR1RTMR2":true}`, ExitOK, "2: Coordinator is ready"},
		{"Debug without MRTD", `{` + rtmr1 + `,` + rtmr2 + `,"Debug":true}`, ExitUsage, "era.json: era config: MRTD is missing"},
		{"Debug, opted out, without MRTD", `{"RTMR0":` + other + `,"Debug":true,"InsecureAllowUnsetRTMR1RTMR2":true}`, ExitUsage, "MRTD is missing"},
		{"MRTD only", `{` + mrtd + `}`, ExitUsage, "era.json: era config: RTMR1 is missing"},
		{"MRTD and RTMR1 with Debug", `{` + mrtd + `,` + rtmr1 + `,"Debug":true}`, ExitUsage, "RTMR2 is missing"},
		{"other firmware", `{"MRTD":` + other + `,` + rtmr1 + `,` + rtmr2 + `}`, ExitVerification, "MRTD"},
		{"other kernel", `{` + mrtd + `,"RTMR1":` + other + `,` + rtmr2 + `}`, ExitVerification, "RTMR1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(dir, "era.json"), []byte(tc.era), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errOut := run(t, nil, "status", "--coordinator", addr, "--era-config", "era.json",
				"--collateral-file", "collateral.json", "--sgx-root-ca", "intel-root.pem")
			text := errOut
			if tc.code == ExitOK {
				text = out
			}
			if code != tc.code || !strings.Contains(text, tc.want) {
				t.Fatalf("exit %d, want %d with %q; stdout %q, stderr %q", code, tc.code, tc.want, out, errOut)
			}
		})
	}
}
