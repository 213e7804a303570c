package vault

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
)

// TestSplitJoinState: a state cut into a head and chunks joins back to
// the same JSON; a large field gets index chunks; a change of one entry
// changes few chunks.
func TestSplitJoinState(t *testing.T) {
	k := deriveChunkKeys(bytes.Repeat([]byte{7}, 32))
	big := map[string]string{}
	for i := range 5000 {
		b := make([]byte, 40)
		rand.Read(b)
		big[fmt.Sprintf("s%05d", i)] = hex.EncodeToString(b)
	}
	state := func() []byte {
		raw, _ := json.Marshal(map[string]any{"Small": 1, "Big": big, "Text": "short"})
		return raw
	}
	plain := state()
	head, l, err := splitState(k, plain)
	if err != nil {
		t.Fatal(err)
	}
	if len(head) > 4<<10 {
		t.Fatalf("head of %d bytes for a %d-byte state", len(head), len(plain))
	}
	var h stateHead
	if err := json.Unmarshal(head, &h); err != nil || h.Fields["Big"].Depth != 1 {
		t.Fatalf("the big field has depth %d (%v), want index chunks", h.Fields["Big"].Depth, err)
	}
	for _, c := range l.chunks {
		if len(c) > chunkMax && len(c) > indexMax*chunkRefSize {
			t.Fatalf("a chunk of %d bytes", len(c))
		}
	}
	fetch := func(depth int, names []string) (map[string][]byte, error) {
		out := map[string][]byte{}
		for _, n := range names {
			blob, err := k.sealChunk(nil, n, l.chunks[n])
			if err != nil {
				return nil, err
			}
			if out[n], err = k.openChunk(depth, n, blob); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	joined, _, err := joinState(k, head, fetch)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	json.Unmarshal(plain, &a)
	json.Unmarshal(joined, &b)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatal("the joined state differs")
	}
	big["s02500"] = "changed"
	_, l2, err := splitState(k, state())
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for n := range l2.chunks {
		if _, ok := l.chunks[n]; !ok {
			changed++
		}
	}
	if changed > 4 {
		t.Fatalf("one changed entry changed %d of %d chunks", changed, len(l2.chunks))
	}
}

// TestOpenChunkChecks: a chunk opens only under its own name, with its
// content's MAC, sealed under this data key.
func TestOpenChunkChecks(t *testing.T) {
	k := deriveChunkKeys(bytes.Repeat([]byte{7}, 32))
	content := []byte("content")
	r := k.ref(0, content)
	name := k.name(r[:])
	blob, err := k.sealChunk(nil, name, content)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := k.openChunk(0, name, blob); err != nil || string(got) != "content" {
		t.Fatalf("%q, %v", got, err)
	}
	// Sealed under the right name but with other content: the MAC differs.
	forged, _ := k.sealChunk(nil, name, []byte("other"))
	// At another depth the same content has another name.
	other := deriveChunkKeys(bytes.Repeat([]byte{8}, 32))
	foreign, _ := other.sealChunk(nil, name, content)
	r2 := k.ref(1, content)
	for what, tc := range map[string]struct {
		depth int
		name  string
		blob  []byte
	}{
		"other content":     {0, name, forged},
		"another key":       {0, name, foreign},
		"another depth":     {1, name, blob},
		"another name":      {1, k.name(r2[:]), blob},
		"not a sealed blob": {0, name, []byte("x")},
	} {
		if _, err := k.openChunk(tc.depth, tc.name, tc.blob); !errors.Is(err, ErrChunks) {
			t.Errorf("%s: %v", what, err)
		}
	}
}
