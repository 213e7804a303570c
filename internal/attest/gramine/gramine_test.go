package gramine_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/gramine"
	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

// fakeDir makes a directory like Gramine's with regular files: the quote
// file holds quote, user_report_data is empty.
func fakeDir(t *testing.T, attType string, quote []byte) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string][]byte{gramine.FileUserReportData: nil, gramine.FileQuote: quote}
	if attType != "" {
		files[gramine.FileAttestationType] = []byte(attType)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func newPlatform(t *testing.T) *dcaptest.Platform {
	t.Helper()
	return dcaptest.NewPKI(t).NewPlatform(t, dcaptest.DefaultExtension())
}

func TestIssue(t *testing.T) {
	pl := newPlatform(t)
	rd := attest.ReportData([]byte("root DER"), []byte("nonce"))
	raw := pl.Quote(t, dcaptest.QuoteOptions{Enclave: dcaptest.Enclave{ReportData: rd}})
	dir := fakeDir(t, "dcap\n", raw)

	is := &gramine.Issuer{Dir: dir}
	got, err := is.Issue(context.Background(), rd)
	if err != nil {
		t.Fatal(err)
	}
	// OE-wrapped, like MarbleRun's Gramine quotes.
	if !sgxquote.IsWrapped(got) {
		t.Fatalf("quote is not OE-wrapped: % x", got[:16])
	}
	inner, err := sgxquote.Unwrap(got)
	if err != nil || !bytes.Equal(inner, raw) {
		t.Fatalf("unwrapped quote differs from the device's (err %v)", err)
	}
	// The report data went to user_report_data, exactly 64 bytes.
	written, err := os.ReadFile(filepath.Join(dir, gramine.FileUserReportData))
	if err != nil || !bytes.Equal(written, rd[:]) {
		t.Fatalf("user_report_data = %x (err %v), want %x", written, err, rd)
	}
	typ, err := gramine.Detect(dir)
	if err != nil || typ != gramine.TypeDCAP {
		t.Fatalf("Detect = %q, %v; want dcap", typ, err)
	}
}

func TestIssueFailures(t *testing.T) {
	pl := newPlatform(t)
	rd := attest.ReportData([]byte("root DER"), nil)
	other := attest.ReportData([]byte("another root"), nil)
	good := pl.Quote(t, dcaptest.QuoteOptions{Enclave: dcaptest.Enclave{ReportData: rd}})
	for _, tc := range []struct {
		name  string
		dir   func(t *testing.T) string
		want  string
		isErr error
	}{
		{"no directory", func(t *testing.T) string { return filepath.Join(t.TempDir(), "absent") }, "writing the report data", fs.ErrNotExist},
		{"no user_report_data", func(t *testing.T) string {
			d := fakeDir(t, "dcap", good)
			os.Remove(filepath.Join(d, gramine.FileUserReportData))
			return d
		}, "writing the report data", fs.ErrNotExist},
		{"empty quote", func(t *testing.T) string { return fakeDir(t, "dcap", nil) }, "empty", nil},
		{"quote too large", func(t *testing.T) string { return fakeDir(t, "dcap", make([]byte, gramine.MaxQuoteSize+1)) }, "larger than", nil},
		{"not a quote", func(t *testing.T) string {
			return fakeDir(t, "dcap", []byte("garbage that is not a quote at all, but long enough to look like one"))
		}, "the quote from", nil},
		{"other report data", func(t *testing.T) string {
			return fakeDir(t, "dcap", pl.Quote(t, dcaptest.QuoteOptions{Enclave: dcaptest.Enclave{ReportData: other}}))
		}, "other report data", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := &gramine.Issuer{Dir: tc.dir(t)}
			q, err := is.Issue(context.Background(), rd)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Issue = %d bytes, %v; want an error containing %q", len(q), err, tc.want)
			}
			if tc.isErr != nil && !errors.Is(err, tc.isErr) {
				t.Fatalf("error %v does not match %v", err, tc.isErr)
			}
		})
	}
}

func TestDetect(t *testing.T) {
	for _, typ := range []string{"none", "epid", "dcap"} {
		got, err := gramine.Detect(fakeDir(t, typ+"\n", nil))
		if err != nil || got != typ {
			t.Errorf("Detect(%s) = %q, %v", typ, got, err)
		}
	}
	if _, err := gramine.Detect(fakeDir(t, "", nil)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Detect without attestation_type: %v, want fs.ErrNotExist", err)
	}
	if _, err := gramine.Detect(t.TempDir() + "/absent"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Detect outside Gramine: %v, want fs.ErrNotExist", err)
	}
}

// TestConcurrentIssue drives one Issuer from many goroutines against a
// device whose files are pipes: every caller must get a quote over its own
// report data, which holds only if writing the report data and reading the
// quote never interleave.
func TestConcurrentIssue(t *testing.T) {
	pl := newPlatform(t)
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte {
		return pl.Quote(t, dcaptest.QuoteOptions{Enclave: dcaptest.Enclave{ReportData: rd}})
	})
	is := &gramine.Issuer{Dir: dev.Dir}
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rd := attest.ReportData([]byte("root"), []byte{byte(i)})
			q, err := is.Issue(context.Background(), rd)
			if err != nil {
				errs <- err
				return
			}
			parsed, err := sgxquote.ParseAny(q)
			if err != nil {
				errs <- err
				return
			}
			if parsed.Body.ReportData() != rd {
				errs <- errors.New("quote for another caller's report data")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := len(dev.Served()); got != n {
		t.Errorf("device served %d quotes, want %d", got, n)
	}
	if errs := dev.Errors(); len(errs) > 0 {
		t.Errorf("device errors: %v", errs)
	}
}

// TestIssueContext: a caller whose context ends stops waiting; the pending
// exchange still completes before the next caller's starts.
func TestIssueContext(t *testing.T) {
	pl := newPlatform(t)
	release := make(chan struct{})
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte {
		<-release
		return pl.Quote(t, dcaptest.QuoteOptions{Enclave: dcaptest.Enclave{ReportData: rd}})
	})
	is := &gramine.Issuer{Dir: dev.Dir}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	first := attest.ReportData([]byte("first"), nil)
	if _, err := is.Issue(ctx, first); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Issue with an expiring context: %v", err)
	}
	second := attest.ReportData([]byte("second"), nil)
	done := make(chan error, 1)
	go func() {
		q, err := is.Issue(context.Background(), second)
		if err == nil {
			var p *sgxquote.Quote
			if p, err = sgxquote.ParseAny(q); err == nil && p.Body.ReportData() != second {
				err = errors.New("second caller got a quote over other report data")
			}
		}
		done <- err
	}()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s := dev.Served(); len(s) != 2 || s[0] != first || s[1] != second {
		t.Fatalf("served %d exchanges", len(s))
	}
}
