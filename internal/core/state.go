package core

import (
	"fmt"

	"github.com/quarry-cc/quarry/internal/sealedstate"
)

// State is the Coordinator's state code (MarbleRun's numbers, which
// clients read from the status endpoint).
type State int

// The states. StateUninitialized is internal and never reported.
const (
	StateUninitialized     State = 0
	StateRecovery          State = 1
	StateAcceptingManifest State = 2
	StateAcceptingMarbles  State = sealedstate.Running // the state every stored state has
)

// Message is the exact status message MarbleRun reports for the state.
func (s State) Message() string {
	switch s {
	case StateRecovery:
		return "Coordinator is in recovery mode. Either upload a key to unseal the saved state, or set a new manifest. For more information on how to proceed, consult the documentation."
	case StateAcceptingManifest:
		return "Coordinator is ready to accept a manifest."
	case StateAcceptingMarbles:
		return "Coordinator is running correctly and ready to accept marbles."
	}
	return "Coordinator is not initialized."
}

func (s State) String() string {
	switch s {
	case StateRecovery:
		return "recovery mode"
	case StateAcceptingManifest:
		return "ready for a manifest"
	case StateAcceptingMarbles:
		return "running"
	}
	return "uninitialized"
}

// event is something that moves the state machine.
type event string

const (
	eventStartFresh      event = "start without sealed state"
	eventStartSealed     event = "start with readable sealed state"
	eventStartUnreadable event = "start with unreadable sealed state"
	eventManifestSet     event = "manifest set"
	eventRecovered       event = "recovery completed"
)

// transitions is the whole state machine: every allowed (from, event) pair
// and where it leads. Anything not listed is refused.
var transitions = []struct {
	from State
	on   event
	to   State
}{
	{StateUninitialized, eventStartFresh, StateAcceptingManifest},
	{StateUninitialized, eventStartSealed, StateAcceptingMarbles},
	{StateUninitialized, eventStartUnreadable, StateRecovery},
	{StateAcceptingManifest, eventManifestSet, StateAcceptingMarbles},
	{StateRecovery, eventManifestSet, StateAcceptingMarbles},
	{StateRecovery, eventRecovered, StateAcceptingMarbles},
}

// next returns the state reached from s on e, or a *WrongStateError.
func next(s State, e event) (State, error) {
	for _, t := range transitions {
		if t.from == s && t.on == e {
			return t.to, nil
		}
	}
	return s, &WrongStateError{State: s, Op: string(e)}
}

// operation is a use case whose availability depends on the state.
type operation string

const (
	opQuote       operation = "get the quote"
	opSetManifest operation = "set the manifest"
	opGetManifest operation = "get the manifest"
	opRecover     operation = "recover"
	opSecrets     operation = "read or write secrets"
	opUpdate      operation = "update"
	opReadLog     operation = "read the verifiable update log"
	opCounter     operation = "set a monotonic counter"
)

// allowedIn lists, per operation, the states in which it may run.
var allowedIn = map[operation][]State{
	opQuote:       {StateRecovery, StateAcceptingManifest, StateAcceptingMarbles},
	opSetManifest: {StateRecovery, StateAcceptingManifest},
	opGetManifest: {StateAcceptingMarbles},
	opRecover:     {StateRecovery},
	opSecrets:     {StateAcceptingMarbles},
	opUpdate:      {StateAcceptingMarbles},
	opReadLog:     {StateAcceptingMarbles},
	opCounter:     {StateAcceptingMarbles},
}

// require returns nil if op may run in s, else a *WrongStateError.
func require(s State, op operation) error {
	for _, ok := range allowedIn[op] {
		if ok == s {
			return nil
		}
	}
	return &WrongStateError{State: s, Op: string(op)}
}

// WrongStateError says an operation is not possible in the current state.
type WrongStateError struct {
	State State
	Op    string
}

func (e *WrongStateError) Error() string {
	hint := ""
	switch e.State {
	case StateAcceptingMarbles:
		if e.Op == string(opSetManifest) {
			hint = "; a manifest is already set, use the update endpoint to change it"
		}
	case StateAcceptingManifest:
		hint = "; no manifest has been set yet"
	case StateRecovery:
		hint = "; the sealed state must be recovered or replaced by a new manifest first"
	}
	return fmt.Sprintf("server is not in expected state: cannot %s in state %d (%s)%s", e.Op, e.State, e.State, hint)
}

// Unwrap makes errors.Is(err, ErrWrongState) true.
func (e *WrongStateError) Unwrap() error { return ErrWrongState }
