package marblerun

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/quarry-cc/quarry/manifest"
)

// UnknownKeyError is a store key this reader does not understand. The
// state must not be migrated: something would be dropped. It wraps
// ErrInvalid.
type UnknownKeyError struct {
	Key string
}

func (e *UnknownKeyError) Error() string {
	return fmt.Sprintf("the MarbleRun state holds the store key %q, which this Coordinator does not understand; nothing was migrated (a newer MarbleRun version? report it)", clip(e.Key))
}

// Unwrap returns ErrInvalid.
func (e *UnknownKeyError) Unwrap() error { return ErrInvalid }

// Secret is a stored MarbleRun secret (secret:<n>, previousSecret:<n>):
// Go's x509 certificate is stored as base64 DER.
type Secret struct {
	Type        string
	Size        uint
	Shared      bool
	UserDefined bool
	Cert        []byte
	ValidFor    uint
	Private     []byte
	Public      []byte
}

// PendingUpdate is MarbleRun's pendingUpdate: a full manifest update
// waiting for acknowledgements.
type PendingUpdate struct {
	ManifestRaw   []byte          `json:"manifestRaw"`
	RequiredUsers map[string]bool `json:"requiredUsers"`
	// MissingAcknowledgments is the number of acknowledgements still
	// needed; nil when the state does not say (MarbleRun versions that did
	// not write it): see Missing.
	MissingAcknowledgments *int `json:"missingAcknowledgments"`
}

// Missing is the number of acknowledgements still needed. Without a stored
// count it is, as MarbleRun reads such a state, the number of required users
// that have not acknowledged.
func (p *PendingUpdate) Missing() int {
	if p.MissingAcknowledgments != nil {
		return *p.MissingAcknowledgments
	}
	n := 0
	for _, acked := range p.RequiredUsers {
		if !acked {
			n++
		}
	}
	return n
}

// State is a decoded MarbleRun state: every store key, typed.
type State struct {
	// StateCode is the stored Coordinator state (3 when a manifest is set).
	StateCode int
	// Manifest is the raw manifest; ManifestSignature the root key's ASN.1
	// ECDSA signature over its SHA-256.
	Manifest, ManifestSignature []byte
	// Certificates (DER) and SEC1 EC private keys.
	RootCert, IntermediateCert, MarbleRootCert []byte
	RootKey, IntermediateKey                   []byte
	RootSecret, PreviousRootSecret             []byte
	// Packages are the effective packages (package updates change their
	// SecurityVersion).
	Packages map[string]manifest.Package
	// Marbles, TLS, Infrastructures and Users are the names MarbleRun keeps
	// beside the manifest (their definitions are the manifest's).
	Marbles, TLS, Infrastructures, Users []string
	// UserCertificates are the stored users' certificates (DER) by name.
	UserCertificates map[string][]byte
	Secrets          map[string]Secret
	PreviousSecrets  map[string]Secret
	// Activations counts the activations of each Marble with
	// MaxActivations.
	Activations map[string]uint64
	// MonotonicCounters by "<b64 type>:<b64 uuid bytes>:<b64 name>".
	MonotonicCounters map[string]uint64
	// UpdateLog holds one JSON entry per element.
	UpdateLog []string
	Pending   *PendingUpdate
}

// Decode types a decrypted store. Every key must be one MarbleRun writes
// (an unknown one gives *UnknownKeyError); errors wrap ErrInvalid and name
// the key.
func Decode(store map[string][]byte) (*State, error) {
	st := &State{
		Packages:          map[string]manifest.Package{},
		UserCertificates:  map[string][]byte{},
		Secrets:           map[string]Secret{},
		PreviousSecrets:   map[string]Secret{},
		Activations:       map[string]uint64{},
		MonotonicCounters: map[string]uint64{},
	}
	for _, key := range slices.Sorted(maps.Keys(store)) {
		if err := st.decodeKey(key, store[key]); err != nil {
			var unknown *UnknownKeyError
			if errors.As(err, &unknown) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: store key %q: %v", ErrInvalid, clip(key), err)
		}
	}
	required := map[string][]byte{
		"state": nil, "manifest": st.Manifest, "manifestSignature": st.ManifestSignature,
		"certificate:coordinatorRootCert": st.RootCert, "certificate:coordinatorIntermediateCert": st.IntermediateCert,
		"certificate:marbleRootCert": st.MarbleRootCert, "privateKey:coordinatorRootKey": st.RootKey,
		"privateKey:coordinatorIntermediateKey": st.IntermediateKey,
	}
	for _, k := range slices.Sorted(maps.Keys(required)) {
		if _, ok := store[k]; !ok {
			return nil, fmt.Errorf("%w: the store key %q is missing", ErrInvalid, k)
		}
	}
	return st, nil
}

func (st *State) decodeKey(key string, v []byte) error {
	switch key {
	case "state":
		n, err := strconv.Atoi(string(v))
		if err != nil {
			return fmt.Errorf("not a decimal state: %q", clip(string(v)))
		}
		st.StateCode = n
	case "manifest":
		st.Manifest = v
	case "manifestSignature":
		st.ManifestSignature = v
	case "certificate:coordinatorRootCert":
		st.RootCert = v
	case "certificate:coordinatorIntermediateCert":
		st.IntermediateCert = v
	case "certificate:marbleRootCert":
		st.MarbleRootCert = v
	case "privateKey:coordinatorRootKey":
		st.RootKey = v
	case "privateKey:coordinatorIntermediateKey":
		st.IntermediateKey = v
	case "rootSecret":
		st.RootSecret = v
	case "previousRootSecret":
		st.PreviousRootSecret = v
	case "updateLog":
		st.UpdateLog = splitLog(v)
		for i, line := range st.UpdateLog {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(line), &obj); err != nil || obj == nil {
				return fmt.Errorf("line %d is not a JSON object", i+1)
			}
		}
	case "pendingUpdate":
		var p PendingUpdate
		if err := strictJSON(v, &p); err != nil {
			return err
		}
		st.Pending = &p
	default:
		prefix, name, ok := strings.Cut(key, ":")
		if !ok {
			return &UnknownKeyError{Key: key}
		}
		return st.decodeNamed(key, prefix, name, v)
	}
	return nil
}

func (st *State) decodeNamed(key, prefix, name string, v []byte) error {
	switch prefix {
	case "package":
		var p manifest.Package
		if err := strictJSON(v, &p); err != nil {
			return err
		}
		st.Packages[name] = p
	case "marble":
		return st.addName(&st.Marbles, v)(name)
	case "TLS":
		return st.addName(&st.TLS, v)(name)
	case "infrastructure":
		return st.addName(&st.Infrastructures, v)(name)
	case "user":
		var u struct {
			Name        string
			Certificate []byte
			Permissions map[string]json.RawMessage
		}
		if err := strictJSON(v, &u); err != nil {
			return err
		}
		if u.Name != name {
			return fmt.Errorf("the user's Name is %q", clip(u.Name))
		}
		st.Users = append(st.Users, name)
		st.UserCertificates[name] = u.Certificate
	case "secret", "previousSecret":
		var s Secret
		if err := strictJSON(v, &s); err != nil {
			return err
		}
		if prefix == "secret" {
			st.Secrets[name] = s
		} else {
			st.PreviousSecrets[name] = s
		}
	case "activations":
		n, err := strconv.ParseUint(string(v), 16, 64)
		if err != nil {
			return fmt.Errorf("not a hexadecimal count: %q", clip(string(v)))
		}
		st.Activations[name] = n
	case "monotonicCounter":
		if err := checkCounterKey(name); err != nil {
			return err
		}
		if len(v) != 8 {
			return fmt.Errorf("a counter has 8 bytes, not %d", len(v))
		}
		st.MonotonicCounters[name] = binary.LittleEndian.Uint64(v)
	default:
		return &UnknownKeyError{Key: key}
	}
	return nil
}

// addName checks that v is a JSON object and records name.
func (st *State) addName(list *[]string, v []byte) func(string) error {
	return func(name string) error {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err != nil || obj == nil {
			return errors.New("not a JSON object")
		}
		*list = append(*list, name)
		return nil
	}
}

// checkCounterKey checks "<b64 type>:<b64 16-byte uuid>:<b64 name>".
func checkCounterKey(id string) error {
	parts := strings.Split(id, ":")
	if len(parts) != 3 {
		return errors.New("a counter key has three base64 parts (type, UUID, name)")
	}
	for i, p := range parts {
		b, err := base64.StdEncoding.DecodeString(p)
		if err != nil || (i == 1 && len(b) != 16) {
			return fmt.Errorf("counter key part %d is not base64 (of a 16-byte UUID for part 2)", i+1)
		}
	}
	return nil
}

// splitLog splits MarbleRun's update log (newline-terminated JSON lines)
// as its API does.
func splitLog(v []byte) []string {
	t := strings.TrimSpace(string(v))
	if t == "" {
		return nil
	}
	return strings.Split(t, "\n")
}

// strictJSON decodes one JSON value into v, refusing unknown fields (a
// field Quarry does not know would otherwise be dropped).
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON value")
	}
	return nil
}
