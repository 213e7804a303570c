package vault

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
)

// With a shared store every instance has its own entry in the key file
// (seal.InstanceKeyFile, version 2): the data key sealed by the instance's
// own sealer. An instance opens the state with its own entry, else with
// any other entry its sealer opens (an instance on the same CPU and
// enclave, or simulation), else it asks a KeySource (an attested peer,
// internal/peer) for the key; it then adds its own entry with a
// compare-and-swap of the key file. Every commit writes new key records
// for the new blob, seals this instance's entry again and keeps the
// others' entries of the keys still in use.

// KeySource gives the data key with key ID keyID, obtained elsewhere (from
// a running peer that verified this instance's quote and proved with its
// own that it is the same enclave, internal/peer).
type KeySource interface {
	FetchKey(ctx context.Context, keyID [32]byte) (*FetchedKey, error)
}

// FetchedKey is a data key a KeySource obtained.
type FetchedKey struct {
	DEK []byte
	// Allows reports whether the instance that gave the key may hold the
	// key of a state with seal mode mode (its quote satisfies that mode's
	// rules). The giver was checked against the mode it stated before
	// the key was returned; once the key opened the state, the Core
	// checks the state's own SealMode with Allows before it uses the key
	// for anything else. Required: a key without it is not used.
	Allows func(mode string) error
}

// fetchKeyTimeout bounds how long a load waits for a KeySource.
const fetchKeyTimeout = 30 * time.Second

// instances is the vault's part for per-instance key entries.
type instances struct {
	// instance is this instance's id; nil: the single-instance key file.
	instance *seal.InstanceID
	source   KeySource
	// keys is the key file last read or written (version 2), whose other
	// instances' entries a commit keeps.
	keys *seal.InstanceKeyFile
	// needEntry: the key was opened without this instance's own entry.
	needEntry bool
	// fetched is set while the key of the blob being loaded came from the
	// KeySource: the state it opens must pass its Allows (CheckFetched).
	fetched *FetchedKey

	// known is guarded by knownMu alone (PeerKey reads it without the
	// Core's lock); the fields above are guarded by Core.mu.
	knownMu sync.Mutex
	known   []knownKey // newest last, at most 2
}

type knownKey struct {
	id   [32]byte
	dek  []byte
	mode string
}

// remember records a data key that opens a stored state, for PeerKey.
func (in *instances) remember(dek []byte, mode string) {
	if in.instance == nil {
		return
	}
	k := knownKey{id: seal.KeyID(dek), dek: dek, mode: mode}
	in.knownMu.Lock()
	defer in.knownMu.Unlock()
	in.known = slices.DeleteFunc(in.known, func(o knownKey) bool { return o.id == k.id })
	in.known = append(in.known, k)
	if len(in.known) > 2 {
		in.known = in.known[len(in.known)-2:]
	}
}

// PeerKey returns the data key with key ID keyID and the seal mode of the
// state it opens, if this instance holds it (for the peer key server).
// Safe for concurrent use: it takes only the known keys' lock.
func (v *Vault) PeerKey(keyID [32]byte) (dek []byte, mode string, ok bool) {
	in := &v.instances
	in.knownMu.Lock()
	defer in.knownMu.Unlock()
	for _, k := range in.known {
		if k.id == keyID {
			return append([]byte{}, k.dek...), k.mode, true
		}
	}
	return nil, "", false
}

// errNoEntry: no entry of the key file opens here and no KeySource gave
// the key.
var errNoEntry = errors.New("no entry of the key file opens on this instance")

// instanceKeyFor finds the data key of blob in a version 2 key file.
func (v *Vault) instanceKeyFor(ctx context.Context, raw, blob []byte) ([]byte, *KeyProblem) {
	kf, err := seal.DecodeInstanceKeyFile(raw)
	if err != nil {
		return nil, &KeyProblem{"the sealed data key is corrupt", err}
	}
	v.keys = kf
	rec, ok := kf.Record(blob)
	if !ok {
		return nil, &KeyProblem{"the sealed data key belongs to another sealed_data (an older or newer sealed_key)", errors.New("no key record is bound to the stored sealed_data")}
	}
	var firstErr error
	try := func(e seal.InstanceEntry) []byte {
		dek, err := v.sealer.UnsealKey(e.Sealed, e.KeyID[:])
		if err == nil && inClear(v.sealer, e.Sealed, dek) {
			err = errRawKeyInEnclave
		}
		if err == nil && !rec.Verify(dek) {
			err = errors.New("the unsealed key does not match the key record")
		}
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			return nil
		}
		return dek
	}
	if v.instance != nil {
		if e, ok := kf.Entry(*v.instance, rec.KeyID); ok {
			if dek := try(e); dek != nil {
				return dek, nil
			}
		}
	}
	for _, e := range kf.Entries {
		if e.KeyID != rec.KeyID || (v.instance != nil && e.Instance == *v.instance) {
			continue
		}
		if dek := try(e); dek != nil {
			v.needEntry = v.instance != nil
			return dek, nil
		}
	}
	if v.source == nil || v.instance == nil {
		if firstErr == nil {
			firstErr = errNoEntry
		}
		return nil, unsealProblem(firstErr)
	}
	fctx, cancel := context.WithTimeout(ctx, fetchKeyTimeout)
	defer cancel()
	v.log.Info("no entry of the key file opens here (a new instance, or one on another CPU); asking a running instance for the data key", "keyID", fmt.Sprintf("%x", rec.KeyID[:8]))
	fk, err := v.source.FetchKey(fctx, rec.KeyID)
	if err != nil {
		return nil, &KeyProblem{"no entry of the key file opens here and no running instance gave the data key (all instances that hold it are gone, run another enclave, or are not genuine)", err}
	}
	if fk == nil || fk.Allows == nil {
		return nil, &KeyProblem{"the data key source gave no way to check the giver against the state's seal mode", errors.New("FetchedKey.Allows is nil")}
	}
	if !rec.Verify(fk.DEK) {
		return nil, &KeyProblem{"the data key a peer gave does not match the key record", errors.New("key ID or binding tag mismatch")}
	}
	v.fetched = fk
	v.needEntry = true
	return fk.DEK, nil
}

// CheckFetched checks, when the key of the state just opened came from
// the KeySource, that its giver may hold the key of a state with the
// state's seal mode; the key is not used otherwise (not kept for PeerKey,
// not sealed into the key file).
func (v *Vault) CheckFetched(mode string) error {
	fk := v.fetched
	v.fetched = nil
	if fk == nil {
		return nil
	}
	if err := fk.Allows(mode); err != nil {
		v.needEntry = false
		return err
	}
	v.log.Info("opened the state with the data key from a running instance; adding this instance's entry to the key file")
	return nil
}

// instanceKeyFile builds the key file of a commit of a blob with binding
// under dek: records for the new blob (and, while the data key changes,
// the stored one), this instance's entries sealed anew, and the other
// instances' entries of those keys.
func (v *Vault) instanceKeyFile(dek []byte, binding [32]byte, mode string) ([]byte, error) {
	kf, err := v.buildKeyFile(dek, binding, mode)
	if err != nil {
		return nil, err
	}
	return kf.Encode()
}

func (v *Vault) buildKeyFile(dek []byte, binding [32]byte, mode string) (*seal.InstanceKeyFile, error) {
	type key struct {
		dek  []byte
		mode string
	}
	keys := []key{{dek, mode}}
	kf := &seal.InstanceKeyFile{Records: []seal.KeyRecord{seal.NewKeyRecord(dek, binding)}}
	if d := v.disk; d != nil && d.dek != nil && d.binding != binding {
		kf.Records = append(kf.Records, seal.NewKeyRecord(d.dek, d.binding))
		if seal.KeyID(d.dek) != seal.KeyID(dek) {
			keys = append(keys, key{d.dek, d.mode})
		}
	}
	var own []seal.InstanceEntry
	for _, k := range keys {
		id := seal.KeyID(k.dek)
		sealed, err := v.sealer.SealKey(k.dek, id[:], k.mode)
		if err != nil {
			return nil, fmt.Errorf("sealing data key: %w", err)
		}
		own = append(own, seal.InstanceEntry{Instance: *v.instance, KeyID: id, Sealed: sealed})
	}
	kf.Entries = v.otherEntries(kf.Records, len(own))
	kf.Entries = append(kf.Entries, own...)
	return kf, nil
}

// otherEntries are the other instances' entries of the last key file for
// the keys of records, the oldest dropped so that room entries remain.
func (v *Vault) otherEntries(records []seal.KeyRecord, room int) []seal.InstanceEntry {
	if v.keys == nil {
		return nil
	}
	var out []seal.InstanceEntry
	for _, e := range v.keys.Entries {
		if e.Instance == *v.instance {
			continue
		}
		if slices.ContainsFunc(records, func(r seal.KeyRecord) bool { return r.KeyID == e.KeyID }) {
			out = append(out, e)
		}
	}
	if extra := len(out) + room - seal.MaxInstanceEntries; extra > 0 {
		out = out[extra:]
	}
	return out
}

// committed records a key file this instance stored with dek.
func (v *Vault) committed(keyFile, dek []byte, mode string) {
	if v.instance == nil {
		return
	}
	if kf, err := seal.DecodeInstanceKeyFile(keyFile); err == nil {
		v.keys = kf
	}
	v.needEntry = false
	v.remember(dek, mode)
}

// AddOwnEntry adds this instance's entry to the stored key file (a
// compare-and-swap of the key file alone; the blob does not change) when
// the key was opened another way. A failure is logged: the next commit of
// this instance adds the entry anyway.
func (v *Vault) AddOwnEntry(ctx context.Context) {
	if !v.needEntry || v.instance == nil || v.keys == nil || v.disk == nil || v.disk.dek == nil {
		return
	}
	v.needEntry = false
	kf, err := v.buildKeyFile(v.disk.dek, v.disk.binding, v.disk.mode)
	if err != nil {
		v.log.Warn("cannot seal this instance's entry of the key file", "error", err.Error())
		return
	}
	raw, err := kf.Encode()
	if err != nil {
		v.log.Warn("cannot encode the key file with this instance's entry", "error", err.Error())
		return
	}
	rev, err := v.key.Save(ctx, raw, v.keyRev)
	if err != nil {
		v.log.Warn("could not add this instance's entry to the key file (another instance changed it first?); its next change adds it", "error", err.Error())
		return
	}
	v.keyRev, v.keys = rev, kf
	v.log.Info("added this instance's entry to the key file")
}
