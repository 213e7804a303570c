package vault

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/quarry-cc/quarry/internal/seal"
)

// On etcd the sealed state is not one blob (docs/ha.md, "What is stored
// where"): every write of a whole state would cost etcd the whole state,
// and a state over etcd's request limit could not be written at all. The
// state's JSON is split instead:
//
//   - each top-level field of sealedState larger than inlineMax is cut into
//     chunks at content-defined boundaries (a gear hash keyed by the data
//     key), so that a change rewrites only the chunks whose bytes it
//     changes;
//   - each chunk is sealed under a key derived from the data key and named
//     by a keyed hash of its content (the same content, the same name);
//   - a field of more than maxTopRefs chunks gets index chunks that list
//     the names of the level below (as many levels as needed);
//   - the head — the small fields inline and, per chunked field, its size
//     and the names of its top level — is sealed under the data key with
//     the state's header, exactly like the single blob on the file store,
//     and is what sealed_data holds and the key records bind.
//
// The head thus binds every chunk: it is authenticated under the data key
// and names each chunk by a MAC of its content, which a reader checks.

const (
	// chunkLayoutVersion marks a head (stateHead.Version).
	chunkLayoutVersion = 1
	// inlineMax is the largest field kept in the head.
	inlineMax = 512
	// Chunk sizes of the content-defined cut: at least chunkMin bytes
	// (unless the field ends), at most chunkMax; a boundary after a byte
	// where the gear hash's top chunkBits bits are zero (on average every
	// 2^chunkBits bytes past chunkMin).
	chunkMin  = 1 << 10
	chunkMax  = 16 << 10
	chunkBits = 12
	// maxTopRefs is the most chunk names a field lists in the head; index
	// chunks hold indexMin to indexMax names.
	maxTopRefs = 64
	indexMin   = 16
	indexMax   = 256
)

// chunkRefSize is the size of a chunk's name in the head and in index
// chunks (an HMAC-SHA256).
const chunkRefSize = sha256.Size

// stateHead is the plaintext of a head.
type stateHead struct {
	// Version is chunkLayoutVersion; a full sealedState has no such field.
	Version int `json:"quarryChunkedState"`
	// Inline are the small fields of the state's JSON, as they are.
	Inline map[string]json.RawMessage `json:"inline"`
	// Fields are the chunked fields.
	Fields map[string]chunkTree `json:"chunked"`
}

// chunkTree is one chunked field: its JSON is the concatenation of the
// data chunks that Refs name (Depth 0), or that the index chunks Refs name
// list (Depth > 0, recursively).
type chunkTree struct {
	Size  int    `json:"size"`
	Depth int    `json:"depth"`
	Refs  []byte `json:"refs"`
}

// IsChunkedHead reports whether a decrypted plaintext is a head (a state
// kept in chunks) rather than a whole state.
func IsChunkedHead(plaintext []byte) bool {
	var probe struct {
		Version int `json:"quarryChunkedState"`
	}
	return json.Unmarshal(plaintext, &probe) == nil && probe.Version != 0
}

// chunkKeys are the keys of one data key's chunks.
type chunkKeys struct {
	// id names the data key in chunk names (not secret: a hash of it).
	id string
	// seal seals chunks; mac names them; gear is the keyed gear table of
	// the content-defined cut.
	seal, mac []byte
	gear      [256]uint64
}

func deriveChunkKeys(dek []byte) *chunkKeys {
	derive := func(label string) []byte {
		m := hmac.New(sha256.New, dek)
		m.Write([]byte("quarry state chunks v1 " + label))
		return m.Sum(nil)
	}
	k := &chunkKeys{id: hex.EncodeToString(derive("id")[:8]), seal: derive("seal"), mac: derive("name")}
	g := derive("gear")
	for i := range k.gear {
		m := hmac.New(sha256.New, g)
		m.Write([]byte{byte(i)})
		k.gear[i] = binary.LittleEndian.Uint64(m.Sum(nil))
	}
	return k
}

// ref returns the name of a chunk at depth with content plain.
func (k *chunkKeys) ref(depth int, plain []byte) [chunkRefSize]byte {
	m := hmac.New(sha256.New, k.mac)
	m.Write([]byte{byte(depth)})
	m.Write(plain)
	var r [chunkRefSize]byte
	m.Sum(r[:0])
	return r
}

// name is a chunk's key name in the store: the data key's id and the ref.
func (k *chunkKeys) name(ref []byte) string { return k.id + "." + hex.EncodeToString(ref) }

// cut splits data at content-defined boundaries.
func (k *chunkKeys) cut(data []byte) [][]byte {
	var out [][]byte
	for len(data) > 0 {
		n := k.boundary(data)
		out = append(out, data[:n])
		data = data[n:]
	}
	return out
}

func (k *chunkKeys) boundary(data []byte) int {
	if len(data) <= chunkMin {
		return len(data)
	}
	end := min(len(data), chunkMax)
	var h uint64
	for i := chunkMin - 64; i < end; i++ {
		h = h<<1 + k.gear[data[i]]
		if i >= chunkMin-1 && h>>(64-chunkBits) == 0 {
			return i + 1
		}
	}
	return end
}

// Layout is one state in chunks: every chunk its head references,
// by store name, in plaintext.
type Layout struct {
	keys   *chunkKeys
	chunks map[string][]byte
}

// PlainBytes is the size of all chunks.
func (l *Layout) PlainBytes() int {
	n := 0
	for _, c := range l.chunks {
		n += len(c)
	}
	return n
}

// splitState cuts a state's JSON into a head's plaintext and its chunks.
func splitState(k *chunkKeys, plaintext []byte) ([]byte, *Layout, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(plaintext, &fields); err != nil {
		return nil, nil, fmt.Errorf("splitting the state: %w", err)
	}
	head := stateHead{Version: chunkLayoutVersion, Inline: map[string]json.RawMessage{}, Fields: map[string]chunkTree{}}
	l := &Layout{keys: k, chunks: map[string][]byte{}}
	for name, raw := range fields {
		if len(raw) <= inlineMax {
			head.Inline[name] = raw
			continue
		}
		tree := chunkTree{Size: len(raw)}
		var refs []byte
		for _, c := range k.cut(raw) {
			r := k.ref(0, c)
			refs = append(refs, r[:]...)
			l.chunks[k.name(r[:])] = c
		}
		for len(refs) > maxTopRefs*chunkRefSize {
			tree.Depth++
			var up []byte
			for _, c := range cutRefs(refs) {
				r := k.ref(tree.Depth, c)
				up = append(up, r[:]...)
				l.chunks[k.name(r[:])] = c
			}
			refs = up
		}
		tree.Refs = refs
		head.Fields[name] = tree
	}
	out, err := json.Marshal(head)
	if err != nil {
		return nil, nil, err
	}
	return out, l, nil
}

// cutRefs groups chunk names into index chunks: a boundary after a name
// whose first byte is a multiple of 64 (names are MACs: on average every
// 64 names), at least indexMin and at most indexMax names each.
func cutRefs(refs []byte) [][]byte {
	var out [][]byte
	start := 0
	for i := 0; i < len(refs); i += chunkRefSize {
		n := (i-start)/chunkRefSize + 1
		if (n >= indexMin && refs[i]%64 == 0) || n == indexMax {
			out = append(out, refs[start:i+chunkRefSize])
			start = i + chunkRefSize
		}
	}
	if start < len(refs) {
		out = append(out, refs[start:])
	}
	return out
}

// ErrChunks: a chunk the head references is missing or does not open (a
// damaged or tampered store).
var ErrChunks = errors.New("a chunk of the sealed state is missing or damaged")

// chunkFetcher returns the plaintexts of the chunks named (each checked
// against its name), or an error wrapping ErrChunks for one that is
// missing or damaged, or another error when the store cannot be read.
type chunkFetcher func(depth int, names []string) (map[string][]byte, error)

// joinState reads a head's chunks and returns the state's JSON and its
// layout.
func joinState(k *chunkKeys, headPlain []byte, fetch chunkFetcher) ([]byte, *Layout, error) {
	var head stateHead
	if err := seal.DecodeJSON(headPlain, &head); err != nil {
		return nil, nil, fmt.Errorf("the state's head is invalid: %w", err)
	}
	if head.Version != chunkLayoutVersion {
		return nil, nil, fmt.Errorf("the state's head has layout version %d (this Coordinator reads %d)", head.Version, chunkLayoutVersion)
	}
	l := &Layout{keys: k, chunks: map[string][]byte{}}
	fields := maps.Clone(head.Inline)
	if fields == nil {
		fields = map[string]json.RawMessage{}
	}
	for name, tree := range head.Fields {
		if _, dup := fields[name]; dup {
			return nil, nil, fmt.Errorf("the state's head holds field %s twice", name)
		}
		refs := tree.Refs
		for depth := tree.Depth; ; depth-- {
			if len(refs)%chunkRefSize != 0 || depth < 0 || depth > 8 {
				return nil, nil, fmt.Errorf("the state's head is invalid: field %s", name)
			}
			names := make([]string, 0, len(refs)/chunkRefSize)
			for r := range slices.Chunk(refs, chunkRefSize) {
				names = append(names, k.name(r))
			}
			got, err := fetch(depth, names)
			if err != nil {
				return nil, nil, err
			}
			var next []byte
			for _, n := range names {
				next = append(next, got[n]...)
				l.chunks[n] = got[n]
			}
			refs = next
			if depth == 0 {
				break
			}
		}
		if len(refs) != tree.Size {
			return nil, nil, fmt.Errorf("%w: field %s has %d bytes, the head says %d", ErrChunks, name, len(refs), tree.Size)
		}
		fields[name] = refs
	}
	out, err := json.Marshal(fields)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrChunks, err)
	}
	return out, l, nil
}

// chunkHeader is the public header of a sealed chunk.
type chunkHeader struct {
	Chunk string `json:"stateChunk"`
}

// sealChunk seals the chunk plain named name.
func (k *chunkKeys) sealChunk(rand io.Reader, name string, plain []byte) ([]byte, error) {
	hdr, err := json.Marshal(chunkHeader{Chunk: name})
	if err != nil {
		return nil, err
	}
	return seal.Seal(rand, k.seal, hdr, plain)
}

// openChunk opens the sealed chunk named name at depth and checks it.
func (k *chunkKeys) openChunk(depth int, name string, blob []byte) ([]byte, error) {
	hdr, plain, err := seal.Open(k.seal, blob)
	if err != nil {
		return nil, fmt.Errorf("%w: chunk %s: %v", ErrChunks, name, err)
	}
	var h chunkHeader
	if err := json.Unmarshal(hdr, &h); err != nil || h.Chunk != name {
		return nil, fmt.Errorf("%w: chunk %s is stored under another name", ErrChunks, name)
	}
	if r := k.ref(depth, plain); k.name(r[:]) != name {
		return nil, fmt.Errorf("%w: chunk %s does not match its name", ErrChunks, name)
	}
	return plain, nil
}
