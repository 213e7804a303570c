package core

import (
	"errors"

	"github.com/quarry-cc/quarry/internal/vault"
)

// Outcome is what a state change that failed left in the store.
type Outcome int

const (
	// NotStored: the store holds the state from before the change.
	NotStored Outcome = iota
	// Stored: the change is stored although the request failed (the
	// store reported an error after the write landed, and the previous
	// state could not be put back).
	Stored
	// OutcomeUnknown: whether the change was stored cannot be told (the
	// store could not be read back after a failed write).
	OutcomeUnknown
)

// OutcomeOf tells what the state change whose use case failed with err
// left in the store, for answers that must say so (an abandoned request,
// say). Every use case stores its change last, and a commit error that
// cannot say "nothing was changed" wraps vault.ErrUnconfirmed or
// vault.ErrOutcomeUnknown: any other failure stored nothing.
func OutcomeOf(err error) Outcome {
	switch {
	case errors.Is(err, vault.ErrUnconfirmed):
		return Stored
	case errors.Is(err, vault.ErrOutcomeUnknown):
		return OutcomeUnknown
	}
	return NotStored
}

// vaultError gives a commit's error the class callers branch on (a shared
// store away, a state too large for it); its message stays the vault's.
func vaultError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, vault.ErrUnavailable):
		return classify(ErrUnavailable, err)
	case errors.Is(err, vault.ErrTooLarge):
		return classify(ErrTooLarge, err)
	}
	return err
}

// KeySource gives the data key of a state when no entry of the key file
// opens on this instance (an attested peer; internal/peer). See
// vault.KeySource.
type KeySource = vault.KeySource

// FetchedKey is a data key a KeySource obtained. See vault.FetchedKey.
type FetchedKey = vault.FetchedKey

// PeerKey returns the data key with key ID keyID and the seal mode of the
// state it opens, if this instance holds it (for the peer key server).
// It takes no lock of the Core.
func (c *Core) PeerKey(keyID [32]byte) (dek []byte, mode string, ok bool) {
	return c.vault.PeerKey(keyID)
}
