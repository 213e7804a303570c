// Package tsm obtains TDX quotes inside a TDX guest through the Linux
// kernel's configfs-tsm report interface (Documentation/ABI/testing/
// configfs-tsm, kernel 6.7 and later): it creates a report entry under
// /sys/kernel/config/tsm/report, checks that the provider is tdx_guest,
// writes the 64 bytes of report data to inblob, reads the quote from
// outblob and checks with generation that no other writer interfered.
package tsm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

// DefaultDir is the kernel's report directory.
const DefaultDir = "/sys/kernel/config/tsm/report"

// Attribute files of a report entry.
const (
	FileInblob     = "inblob"     // write: report data (≤ 64 bytes)
	FileOutblob    = "outblob"    // read: the quote
	FileProvider   = "provider"   // read: tdx_guest, sev_guest, …
	FileGeneration = "generation" // read: counts writes to the entry
)

// ProviderTDX is the provider name of a TDX guest.
const ProviderTDX = "tdx_guest"

// maxSmallFile bounds reads of provider and generation.
const maxSmallFile = 64

var (
	// ErrProvider means the report interface belongs to another TEE.
	ErrProvider = errors.New("tsm: the report provider is not tdx_guest")
	// ErrRace means another writer changed the entry during the exchange.
	ErrRace = errors.New("tsm: the report entry was written concurrently")
	// ErrQuote means outblob did not hold a TDX quote over the report data.
	ErrQuote = errors.New("tsm: outblob is not a TDX quote over the report data")
)

// Issuer issues TDX quotes through the report directory Dir. Calls are
// serialised. The zero value is ready to use with Dir set.
type Issuer struct {
	Dir string

	mu sync.Mutex
}

var _ attest.Issuer = (*Issuer)(nil)

// Issue creates a report entry, writes reportData, reads the quote, checks
// that it is a TDX quote carrying reportData and removes the entry. The
// quote is returned raw (TDX quotes have no Open Enclave header).
func (is *Issuer) Issue(ctx context.Context, reportData [attest.ReportDataSize]byte) ([]byte, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	entry, err := newEntry(is.Dir)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(entry)

	if err := waitForAttributes(ctx, entry); err != nil {
		return nil, err
	}
	if err := checkProvider(entry); err != nil {
		return nil, err
	}
	gen, err := readGeneration(entry)
	if err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(entry, FileInblob), reportData[:]); err != nil {
		return nil, fmt.Errorf("tsm: writing inblob: %w", err)
	}
	quote, err := readBounded(filepath.Join(entry, FileOutblob), tdxquote.MaxQuoteSize)
	if err != nil {
		return nil, fmt.Errorf("tsm: reading outblob: %w", err)
	}
	after, err := readGeneration(entry)
	if err != nil {
		return nil, err
	}
	if after != gen+1 {
		return nil, fmt.Errorf("%w: generation %d before, %d after one write", ErrRace, gen, after)
	}
	q, err := tdxquote.Parse(quote)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrQuote, err)
	}
	if q.Body.ReportData != reportData {
		return nil, fmt.Errorf("%w: it carries report data %x", ErrQuote, q.Body.ReportData[:8])
	}
	return q.Raw(), nil
}

// Detect reports the provider of the report interface in dir: it creates
// and removes an entry. A missing dir gives an error matching
// fs.ErrNotExist.
func Detect(dir string) (string, error) {
	if _, err := os.Stat(dir); err != nil {
		return "", err
	}
	entry, err := newEntry(dir)
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(entry)
	if err := waitForAttributes(context.Background(), entry); err != nil {
		return "", err
	}
	b, err := readBounded(filepath.Join(entry, FileProvider), maxSmallFile)
	if err != nil {
		return "", fmt.Errorf("tsm: reading provider: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// newEntry creates a report entry with a random name.
func newEntry(dir string) (string, error) {
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	entry := filepath.Join(dir, "quarry-"+hex.EncodeToString(id[:]))
	if err := os.Mkdir(entry, 0o700); err != nil {
		return "", fmt.Errorf("tsm: creating a report entry: %w", err)
	}
	return entry, nil
}

// waitForAttributes waits until the entry's provider attribute exists.
// configfs creates the attributes together with the entry, so this returns
// at once in a real guest; an emulated interface may take a moment.
func waitForAttributes(ctx context.Context, entry string) error {
	path := filepath.Join(entry, FileProvider)
	deadline := time.Now().Add(attributeWait)
	for {
		if _, err := os.Stat(path); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tsm: %s has no %s attribute (is %s a configfs-tsm report directory?)", entry, FileProvider, filepath.Dir(entry))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// attributeWait bounds waitForAttributes.
const attributeWait = 2 * time.Second

func checkProvider(entry string) error {
	b, err := readBounded(filepath.Join(entry, FileProvider), maxSmallFile)
	if err != nil {
		return fmt.Errorf("tsm: reading provider: %w", err)
	}
	if p := strings.TrimSpace(string(b)); p != ProviderTDX {
		return fmt.Errorf("%w: %q", ErrProvider, p)
	}
	return nil
}

func readGeneration(entry string) (uint64, error) {
	b, err := readBounded(filepath.Join(entry, FileGeneration), maxSmallFile)
	if err != nil {
		return 0, fmt.Errorf("tsm: reading generation: %w", err)
	}
	g, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("tsm: generation %q: %w", b, err)
	}
	return g, nil
}

func writeFile(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readBounded reads at most max bytes; more is an error.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("more than %d bytes", max)
	}
	return b, nil
}
