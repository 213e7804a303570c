// Package graminetest fakes Gramine's /dev/attestation directory for tests:
// the test acts as the quoting enclave. In the directory, attestation_type
// says dcap, and user_report_data and quote are named pipes (FIFOs): a
// goroutine of the test reads each report data the issuer writes and
// answers with the quote a function makes for exactly that report data.
// Because both files are pipes, each exchange is synchronised with one
// Issue call, also across processes (a Coordinator started by the test).
// keys/_sgx_mrsigner and keys/_sgx_mrenclave hold random 16-byte sealing
// keys, which SetSealingKey replaces (another enclave or signer).
package graminetest

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/gramine"
	"github.com/quarry-cc/quarry/internal/seal"
)

// QuoteFunc returns the raw quote for the report data written by the issuer.
type QuoteFunc func(reportData [64]byte) []byte

// Device is a fake Gramine attestation directory served by the test.
type Device struct {
	// Dir is the directory to give the issuer (--gramine-dir).
	Dir string

	quote QuoteFunc

	mu     sync.Mutex
	served [][64]byte
	errs   []error

	stop chan struct{}
	done chan struct{}
}

// NewDevice creates the directory in a temporary directory of tb and serves
// quotes made by quote until tb's cleanup. It skips tb where named pipes are
// not available.
func NewDevice(tb testing.TB, quote QuoteFunc) *Device {
	tb.Helper()
	d := &Device{Dir: filepath.Join(tb.TempDir(), "attestation"), quote: quote, stop: make(chan struct{}), done: make(chan struct{})}
	if err := os.Mkdir(d.Dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Dir, gramine.FileAttestationType), []byte("dcap\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(d.Dir, "keys"), 0o700); err != nil {
		tb.Fatal(err)
	}
	for _, mode := range []string{seal.ModeProductKey, seal.ModeUniqueKey} {
		d.SetSealingKey(tb, mode, nil)
	}
	for _, name := range []string{gramine.FileUserReportData, gramine.FileQuote} {
		if err := mkfifo(filepath.Join(d.Dir, name)); err != nil {
			if errors.Is(err, errUnsupported) {
				tb.Skipf("graminetest: %v", err)
			}
			tb.Fatalf("graminetest: %v", err)
		}
	}
	go d.serve()
	tb.Cleanup(d.Close)
	return d
}

// serve answers exchanges until Close.
func (d *Device) serve() {
	defer close(d.done)
	for {
		rd, err := d.readReportData()
		if d.stopped() {
			return
		}
		if err != nil {
			d.fail(err)
			continue
		}
		q := d.quote(rd)
		w, err := os.OpenFile(filepath.Join(d.Dir, gramine.FileQuote), os.O_WRONLY, 0)
		if d.stopped() {
			if err == nil {
				w.Close()
			}
			return
		}
		if err != nil {
			d.fail(err)
			continue
		}
		d.mu.Lock()
		d.served = append(d.served, rd)
		d.mu.Unlock()
		if _, err := w.Write(q); err != nil {
			d.fail(err)
		}
		w.Close()
	}
}

// readReportData waits for the issuer to write user_report_data and
// reads what it wrote (until it closes the file).
func (d *Device) readReportData() ([64]byte, error) {
	var rd [64]byte
	f, err := os.Open(filepath.Join(d.Dir, gramine.FileUserReportData))
	if err != nil {
		return rd, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<10))
	if err != nil {
		return rd, err
	}
	if len(b) != len(rd) {
		return rd, fmt.Errorf("graminetest: the issuer wrote %d bytes of report data, want 64", len(b))
	}
	copy(rd[:], b)
	return rd, nil
}

func (d *Device) stopped() bool {
	select {
	case <-d.stop:
		return true
	default:
		return false
	}
}

func (d *Device) fail(err error) {
	d.mu.Lock()
	d.errs = append(d.errs, err)
	d.mu.Unlock()
}

// Served returns the report data of every quote served (or being served),
// in order.
func (d *Device) Served() [][64]byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([][64]byte(nil), d.served...)
}

// Errors returns the problems the device met (bad writes by the issuer).
func (d *Device) Errors() []error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]error(nil), d.errs...)
}

// Close stops serving: it unblocks the goroutine waiting on a pipe and
// waits for it to end.
func (d *Device) Close() {
	select {
	case <-d.stop:
		return
	default:
	}
	close(d.stop)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		// Open the other ends without blocking: whichever pipe the
		// goroutine waits on now has a peer.
		for _, fl := range []struct {
			name string
			flag int
		}{{gramine.FileUserReportData, os.O_WRONLY}, {gramine.FileQuote, os.O_RDONLY}} {
			if f, err := openNonblock(filepath.Join(d.Dir, fl.name), fl.flag); err == nil {
				f.Close()
			}
		}
		select {
		case <-d.done:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// SetSealingKey writes the 16-byte SGX sealing key of mode (seal.ModeProductKey:
// keys/_sgx_mrsigner, seal.ModeUniqueKey: keys/_sgx_mrenclave); a nil key
// means a new random one, as another enclave would have.
func (d *Device) SetSealingKey(tb testing.TB, mode string, key []byte) {
	tb.Helper()
	if key == nil {
		key = make([]byte, 16)
		rand.Read(key)
	}
	name := seal.GramineMRSignerKey
	if mode == seal.ModeUniqueKey {
		name = seal.GramineMREnclaveKey
	}
	if err := os.WriteFile(filepath.Join(d.Dir, filepath.FromSlash(name)), key, 0o600); err != nil {
		tb.Fatal(err)
	}
}
