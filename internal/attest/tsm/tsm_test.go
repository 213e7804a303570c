//go:build unix

package tsm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
	"github.com/quarry-cc/quarry/internal/attest/tsm"
	"github.com/quarry-cc/quarry/internal/attest/tsm/tsmtest"
)

func platformQuotes(t *testing.T) (*dcaptest.Platform, tsmtest.QuoteFunc) {
	pl := dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
	return pl, func(rd [64]byte) []byte {
		return pl.TDXQuote(t, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15, Body: tdxquote.TDReport{ReportData: rd}})
	}
}

// TestIssue: the issuer creates an entry, writes the report data, reads a
// quote the DCAP verifier accepts, and removes the entry.
func TestIssue(t *testing.T) {
	pl, qf := platformQuotes(t)
	k := tsmtest.New(t, qf)
	is := &tsm.Issuer{Dir: k.Dir}
	var rd [64]byte
	copy(rd[:], "report data of the coordinator")
	quote, err := is.Issue(context.Background(), rd)
	if err != nil {
		t.Fatal(err)
	}
	v := &dcap.Verifier{Collateral: collateral.Static{Collateral: pl.TDXCollateral(t, dcaptest.TDXCollateralOptions{})}, RootCA: pl.PKI.Root, Now: func() time.Time { return pl.PKI.Time }}
	res, err := v.Verify(context.Background(), quote)
	if err != nil || res.TDX == nil || res.TDX.Report.ReportData != rd {
		t.Fatalf("Verify: %v", err)
	}
	if served := k.Served(); len(served) != 1 || served[0] != rd {
		t.Errorf("kernel served %x", served)
	}
	if entries, _ := os.ReadDir(k.Dir); len(entries) != 0 {
		t.Errorf("%d report entries left behind", len(entries))
	}
	if p, err := tsm.Detect(k.Dir); err != nil || p != tsm.ProviderTDX {
		t.Errorf("Detect = %q, %v", p, err)
	}
}

// TestIssueConcurrent: concurrent calls each get the quote over their own
// report data.
func TestIssueConcurrent(t *testing.T) {
	_, qf := platformQuotes(t)
	k := tsmtest.New(t, qf)
	is := &tsm.Issuer{Dir: k.Dir}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			var rd [64]byte
			rd[0] = byte(i)
			q, err := is.Issue(context.Background(), rd)
			if err == nil {
				var p *tdxquote.Quote
				if p, err = tdxquote.Parse(q); err == nil && p.Body.ReportData != rd {
					err = errors.New("quote over other report data")
				}
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

func TestIssueErrors(t *testing.T) {
	pl, qf := platformQuotes(t)
	var rd [64]byte
	rd[0] = 1
	for _, tc := range []struct {
		name  string
		setup func(k *tsmtest.Kernel)
		quote tsmtest.QuoteFunc
		dir   func(k *tsmtest.Kernel) string
		want  error
		text  string
	}{
		{name: "SEV provider", setup: func(k *tsmtest.Kernel) { k.SetProvider("sev_guest") }, want: tsm.ErrProvider},
		{name: "concurrent writer", setup: func(k *tsmtest.Kernel) { k.SetExtraWrites(1) }, want: tsm.ErrRace},
		{name: "quote over other report data", quote: func([64]byte) []byte { return qf([64]byte{}) }, want: tsm.ErrQuote, text: "carries report data"},
		{name: "not a TDX quote", quote: func([64]byte) []byte { return pl.Quote(t, dcaptest.QuoteOptions{}) }, want: tsm.ErrQuote},
		{name: "no report directory", dir: func(k *tsmtest.Kernel) string { return filepath.Join(k.Dir, "absent") }, want: os.ErrNotExist},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := qf
			if tc.quote != nil {
				f = tc.quote
			}
			k := tsmtest.New(t, f)
			if tc.setup != nil {
				tc.setup(k)
			}
			dir := k.Dir
			if tc.dir != nil {
				dir = tc.dir(k)
			}
			q, err := (&tsm.Issuer{Dir: dir}).Issue(context.Background(), rd)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) || q != nil {
				t.Fatalf("Issue = %d bytes, %v; want %v", len(q), err, tc.want)
			}
		})
	}
	// A directory that is not a report interface: no attributes appear.
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := (&tsm.Issuer{Dir: dir}).Issue(ctx, rd); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("plain directory: %v", err)
	}
}
