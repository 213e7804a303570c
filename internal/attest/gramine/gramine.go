// Package gramine obtains SGX DCAP quotes inside a Gramine enclave through
// Gramine's attestation pseudo-files: the 64 bytes of report data are
// written to <dir>/user_report_data, then the quote is read from
// <dir>/quote. The quote is returned wrapped in the Open Enclave header, the
// form MarbleRun's tools expect.
package gramine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

// DefaultDir is where Gramine serves its attestation files.
const DefaultDir = "/dev/attestation"

// File names in the attestation directory.
const (
	FileAttestationType = "attestation_type" // none, epid or dcap
	FileUserReportData  = "user_report_data" // write: 64 bytes
	FileQuote           = "quote"            // read: the raw quote
)

// TypeDCAP is the attestation type whose quotes Quarry can issue and verify.
const TypeDCAP = "dcap"

// MaxQuoteSize bounds the quote read from Gramine; real DCAP quotes are
// about 5 KB.
const MaxQuoteSize = 64 << 10

// maxTypeSize bounds the attestation_type file read.
const maxTypeSize = 64

// Issuer issues quotes through Gramine's files in Dir. Writing the report
// data and reading the quote is one transaction: concurrent calls are
// serialised, so that a quote is never read for another call's report data.
// The zero value is ready to use with Dir set; an Issuer must not be copied
// after first use.
type Issuer struct {
	Dir string

	once sync.Once
	sem  chan struct{} // held from writing the report data until the quote is read
}

var _ attest.Issuer = (*Issuer)(nil)

// Issue writes reportData, reads the quote, checks that it carries
// reportData, and returns it OE-wrapped. If ctx ends while Gramine has not
// answered, Issue returns ctx's error, and the pending exchange still
// completes before the next one starts.
func (is *Issuer) Issue(ctx context.Context, reportData [attest.ReportDataSize]byte) ([]byte, error) {
	is.once.Do(func() { is.sem = make(chan struct{}, 1) })
	select {
	case is.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("gramine: waiting for the quoting device: %w", ctx.Err())
	}
	type result struct {
		quote []byte
		err   error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-is.sem }()
		q, err := is.exchange(reportData)
		done <- result{q, err}
	}()
	select {
	case r := <-done:
		return r.quote, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("gramine: waiting for the quote: %w", ctx.Err())
	}
}

// exchange writes the report data and reads the quote; the caller holds sem.
func (is *Issuer) exchange(reportData [attest.ReportDataSize]byte) ([]byte, error) {
	if err := writeFile(filepath.Join(is.Dir, FileUserReportData), reportData[:]); err != nil {
		return nil, fmt.Errorf("gramine: writing the report data: %w", err)
	}
	raw, err := readFile(filepath.Join(is.Dir, FileQuote), MaxQuoteSize)
	if err != nil {
		return nil, fmt.Errorf("gramine: reading the quote: %w", err)
	}
	q, err := sgxquote.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("gramine: the quote from %s: %w", is.Dir, err)
	}
	if q.Body.ReportData() != reportData {
		return nil, fmt.Errorf("gramine: the quote from %s carries other report data than was written (another process using the attestation files?)", is.Dir)
	}
	return sgxquote.Wrap(raw), nil
}

// Detect returns Gramine's attestation type from dir (none, epid or dcap).
// Outside Gramine the error matches fs.ErrNotExist.
func Detect(dir string) (string, error) {
	b, err := readFile(filepath.Join(dir, FileAttestationType), maxTypeSize)
	if err != nil {
		return "", fmt.Errorf("gramine: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// writeFile writes data to an existing file (a Gramine pseudo-file is never
// created).
func writeFile(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readFile reads a file of at most limit bytes.
func readFile(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, limit)
	}
	if len(b) == 0 {
		return nil, errors.New(name + ": empty")
	}
	return b, nil
}
