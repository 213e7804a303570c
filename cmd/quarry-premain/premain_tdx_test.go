//go:build unix

package main

import (
	"testing"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
	"github.com/quarry-cc/quarry/internal/attest/tsm/tsmtest"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// TestTDXQuote: in a TDX guest (a fake configfs-tsm directory) the premain
// sends a raw TDX quote over SHA-256 of its TLS client certificate, with
// QUARRY_ATTESTATION=tdx and when auto finds no Gramine.
func TestTDXQuote(t *testing.T) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	kernel := tsmtest.New(t, func(rd [64]byte) []byte {
		return pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Body: tdxquote.TDReport{ReportData: rd}})
	})
	for _, mode := range []string{"tdx", "auto"} {
		t.Run("mode "+mode, func(t *testing.T) {
			coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
			h := newHarness(t, coord.Addr)
			h.executable("bin/app")
			h.setenv("QUARRY_TSM_REPORT_DIR="+kernel.Dir, "QUARRY_ATTESTATION="+mode)
			if code := h.run(); code != 0 {
				t.Fatalf("exit %d: %s", code, h.stderr.String())
			}
			req := coord.Requests()[0]
			q, err := tdxquote.Parse(req.Quote)
			if err != nil {
				t.Fatalf("not a TDX quote: %v", err)
			}
			if q.Body.ReportData != marbletest.ReportData(req.Peer[0].Raw) {
				t.Error("quote's report data is not SHA-256 of the client certificate")
			}
		})
	}
	t.Run("tdx without configfs-tsm", func(t *testing.T) {
		coord := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
		h := newHarness(t, coord.Addr)
		h.executable("bin/app")
		h.setenv("QUARRY_ATTESTATION=tdx")
		if code := h.run(); code == 0 || len(coord.Requests()) != 0 {
			t.Fatalf("exit %d with %d activations; want a configuration error", code, len(coord.Requests()))
		}
	})
}
