package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/quarry-cc/quarry/internal/store"
)

// FaultMode says what happens at the write step a Faults is armed for.
type FaultMode int

const (
	// FailBefore: the step returns an error and writes nothing.
	FailBefore FaultMode = iota + 1
	// FailAfter: the step writes, then returns an error (a write whose
	// outcome the caller cannot know, e.g. a failed directory sync).
	FailAfter
	// CrashBefore: the step writes nothing, and it and every later call
	// (reads included) fail, as if the process had been killed.
	CrashBefore
	// CrashAfter: the step writes, then it and every later call fail.
	CrashAfter
)

func (m FaultMode) String() string {
	switch m {
	case FailBefore:
		return "fail-before"
	case FailAfter:
		return "fail-after"
	case CrashBefore:
		return "crash-before"
	case CrashAfter:
		return "crash-after"
	}
	return fmt.Sprintf("FaultMode(%d)", int(m))
}

// ErrInjected is the error of an injected fault.
var ErrInjected = errors.New("storetest: injected fault")

// Faults injects failures into the write steps (Save, MoveAside,
// CopyAside) of the stores it wraps; the wrapped stores share one step
// counter, so "the k-th write step" counts across them. Its zero value
// injects nothing. Methods are safe for concurrent use.
type Faults struct {
	mu         sync.Mutex
	steps      int
	at         int
	mode       FaultMode
	persistent bool
	crashed    bool
	fired      bool
	saved      [][]byte // blobs passed to Save of stores wrapped with log
}

// Arm makes write step number at (1-based, counted from now) fail with
// mode. With persistent set, every later write step fails too, writing
// nothing (Crash modes stop everything anyway).
func (f *Faults) Arm(at int, mode FaultMode, persistent bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps, f.at, f.mode, f.persistent, f.crashed, f.fired = 0, at, mode, persistent, false, false
	f.saved = nil
}

// Disarm stops injecting (a crash stays a crash: make new stores).
func (f *Faults) Disarm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.at = 0
}

// Fired reports whether the armed fault has happened.
func (f *Faults) Fired() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

// Saved returns the blobs passed to Save of the stores wrapped with
// WrapLogged since Arm, in order, whether or not they were written.
func (f *Faults) Saved() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.saved...)
}

// Wrap returns s with faults injected into its write steps. A store that
// stages (store.Stager) stays one: Stage is a write step when it is
// called (its write runs in the background, or not at all), and the
// staged blob's Save another.
func (f *Faults) Wrap(s store.Store) store.Store { return f.wrap(s, false) }

// WrapLogged is Wrap, and the blobs passed to Save (and staged blobs,
// when their Save is called) are kept for Saved.
func (f *Faults) WrapLogged(s store.Store) store.Store { return f.wrap(s, true) }

func (f *Faults) wrap(s store.Store, log bool) store.Store {
	w := &faulty{f: f, s: s, log: log}
	if st, ok := s.(store.Stager); ok {
		return &faultyStager{faulty: w, st: st}
	}
	return w
}

// logSaved keeps blob for Saved when w is logged.
func (w *faulty) logSaved(blob []byte) {
	if w.log {
		w.f.mu.Lock()
		w.f.saved = append(w.f.saved, append([]byte{}, blob...))
		w.f.mu.Unlock()
	}
}

// read is called before every read.
func (f *Faults) read() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.crashed {
		return fmt.Errorf("%w: crashed", ErrInjected)
	}
	return nil
}

// write runs one write step: do carries it out.
func (f *Faults) write(do func() error) error { return f.step().run(do) }

// fate is what happens at one write step, decided when the step is taken.
type fate struct {
	crashed bool      // the process was already dead: nothing happens
	hit     bool      // the fault fires here
	mode    FaultMode // how, when hit
	at      int
}

// step counts one write step and decides its fate.
func (f *Faults) step() fate {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.crashed {
		return fate{crashed: true}
	}
	f.steps++
	hit := f.at > 0 && (f.steps == f.at || f.persistent && f.steps > f.at)
	mode := f.mode
	if f.steps > f.at {
		mode = FailBefore // the store stays broken: later steps write nothing
	}
	if hit {
		f.fired = true
		if mode == CrashBefore || mode == CrashAfter {
			f.crashed = true
		}
	}
	return fate{hit: hit, mode: mode, at: f.at}
}

// writes reports whether the step's write happens.
func (d fate) writes() bool {
	return !d.crashed && (!d.hit || d.mode == FailAfter || d.mode == CrashAfter)
}

// err is the step's error after its write (if any) succeeded.
func (d fate) err() error {
	switch {
	case d.crashed:
		return fmt.Errorf("%w: crashed", ErrInjected)
	case d.hit:
		return fmt.Errorf("%w: %s at write step %d", ErrInjected, d.mode, d.at)
	}
	return nil
}

// run carries the step out with do.
func (d fate) run(do func() error) error {
	if d.writes() {
		if err := do(); err != nil {
			return err
		}
	}
	return d.err()
}

type faulty struct {
	f   *Faults
	s   store.Store
	log bool
}

var (
	_ store.Store  = (*faulty)(nil)
	_ store.Mover  = (*faulty)(nil)
	_ store.Copier = (*faulty)(nil)
)

func (w *faulty) Load(ctx context.Context) ([]byte, store.Revision, error) {
	if err := w.f.read(); err != nil {
		return nil, "", err
	}
	return w.s.Load(ctx)
}

func (w *faulty) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	w.logSaved(blob)
	var rev store.Revision
	err := w.f.write(func() (err error) {
		rev, err = w.s.Save(ctx, blob, prev)
		return err
	})
	if err != nil {
		return "", err
	}
	return rev, nil
}

func (w *faulty) MoveAside(ctx context.Context, suffix string) (string, error) {
	m, ok := w.s.(store.Mover)
	if !ok {
		return "", errors.New("storetest: the wrapped store cannot move aside")
	}
	var where string
	err := w.f.write(func() (err error) {
		where, err = m.MoveAside(ctx, suffix)
		return err
	})
	return where, err
}

func (w *faulty) CopyAside(ctx context.Context, suffix string) (string, error) {
	c, ok := w.s.(store.Copier)
	if !ok {
		return "", errors.New("storetest: the wrapped store cannot copy aside")
	}
	var where string
	err := w.f.write(func() (err error) {
		where, err = c.CopyAside(ctx, suffix)
		return err
	})
	return where, err
}

// faultyStager is a faulty store over a store that stages.
type faultyStager struct {
	*faulty
	st store.Stager
}

var _ store.Stager = (*faultyStager)(nil)

func (w *faultyStager) Stage(ctx context.Context, blob []byte) store.Staged {
	d := w.f.step()
	fs := &faultyStaged{w: w, blob: blob, stageErr: d.err()}
	if d.writes() {
		fs.under = w.st.Stage(ctx, blob)
	}
	return fs
}

// faultyStaged is a staged blob whose Stage step may have failed.
type faultyStaged struct {
	w        *faultyStager
	blob     []byte
	under    store.Staged // nil: the staged write did not happen
	stageErr error
}

// Save is where Saved records the blob: it is put in place in this order.
func (s *faultyStaged) Save(ctx context.Context, prev store.Revision) (store.Revision, error) {
	s.w.logSaved(s.blob)
	if s.stageErr != nil {
		if s.under != nil {
			s.under.Discard() // written, but its caller was told it failed
		}
		return "", s.stageErr
	}
	var rev store.Revision
	err := s.w.f.write(func() (err error) {
		rev, err = s.under.Save(ctx, prev)
		return err
	})
	if err != nil {
		return "", err
	}
	return rev, nil
}

// Discard waits for the staged write even after a crash (a test's
// directory must not be written to once it ends); what it removes is
// invisible to Load either way.
func (s *faultyStaged) Discard() {
	if s.under != nil {
		s.under.Discard()
	}
}
