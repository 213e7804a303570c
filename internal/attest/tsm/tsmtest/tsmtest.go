//go:build unix

// Package tsmtest fakes the kernel's configfs-tsm report directory for
// tests: the test plays the kernel. For every entry the issuer creates, it
// adds the attributes (provider, generation, and inblob and outblob as
// named pipes), reads the report data written to inblob, counts the write
// in generation and answers on outblob with the quote a function makes for
// exactly that report data.
package tsmtest

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/tsm"
)

// QuoteFunc returns the quote for the report data written to inblob.
type QuoteFunc func(reportData [64]byte) []byte

// Kernel is a fake report directory.
type Kernel struct {
	// Dir is the report directory to give the issuer.
	Dir         string
	provider    string
	extraWrites int

	quote QuoteFunc

	mu     sync.Mutex
	seen   map[string]bool
	served [][64]byte
	stop   chan struct{}
	done   chan struct{}
}

// New creates the directory in a temporary directory of tb and serves it
// until tb's cleanup.
func New(tb testing.TB, quote QuoteFunc) *Kernel {
	tb.Helper()
	k := &Kernel{Dir: filepath.Join(tb.TempDir(), "report"), provider: tsm.ProviderTDX, quote: quote,
		seen: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	if err := os.Mkdir(k.Dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	go k.run()
	tb.Cleanup(func() { close(k.stop); <-k.done })
	return k
}

// SetProvider sets what the provider attribute of new entries says.
func (k *Kernel) SetProvider(p string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.provider = p
}

// SetExtraWrites adds n to generation after each inblob write, as if
// another process wrote the entry too.
func (k *Kernel) SetExtraWrites(n int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.extraWrites = n
}

// Served returns the report data of every quote served so far.
func (k *Kernel) Served() [][64]byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([][64]byte(nil), k.served...)
}

func (k *Kernel) run() {
	defer close(k.done)
	for {
		select {
		case <-k.stop:
			return
		case <-time.After(time.Millisecond):
		}
		entries, _ := os.ReadDir(k.Dir)
		for _, e := range entries {
			if !e.IsDir() || k.seen[e.Name()] {
				continue
			}
			k.seen[e.Name()] = true
			k.mu.Lock()
			provider, extra := k.provider, k.extraWrites
			k.mu.Unlock()
			go k.serve(filepath.Join(k.Dir, e.Name()), provider, extra)
		}
	}
}

// serve plays one report entry: attributes first, provider last (the
// issuer waits for it), then one inblob → outblob exchange.
func (k *Kernel) serve(entry, provider string, extra int) {
	for _, name := range []string{tsm.FileInblob, tsm.FileOutblob} {
		if err := syscall.Mkfifo(filepath.Join(entry, name), 0o600); err != nil {
			return
		}
	}
	setAttr(entry, tsm.FileGeneration, "0\n")
	setAttr(entry, tsm.FileProvider, provider+"\n")

	in, err := os.Open(filepath.Join(entry, tsm.FileInblob)) // waits for the writer
	if err != nil {
		return
	}
	b, err := io.ReadAll(io.LimitReader(in, 65))
	in.Close()
	if err != nil {
		return
	}
	var rd [64]byte
	copy(rd[:], b)
	setAttr(entry, tsm.FileGeneration, strconv.Itoa(1+extra)+"\n")
	q := k.quote(rd)
	out, err := os.OpenFile(filepath.Join(entry, tsm.FileOutblob), os.O_WRONLY, 0) // waits for the reader
	if err != nil {
		return
	}
	out.Write(q)
	out.Close()
	k.mu.Lock()
	k.served = append(k.served, rd)
	k.mu.Unlock()
}

// setAttr replaces an attribute file atomically.
func setAttr(entry, name, value string) {
	tmp := filepath.Join(entry, "."+name+".tmp")
	if os.WriteFile(tmp, []byte(value), 0o600) == nil {
		os.Rename(tmp, filepath.Join(entry, name))
	}
}
