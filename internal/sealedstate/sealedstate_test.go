package sealedstate

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/seal"
)

// The files in testdata/ were written by the Coordinator before these
// types left internal/core (json.MarshalIndent of a state with every field
// set, and of a header with every field set): what is stored today.

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sameJSON re-indents got and compares it with the stored bytes.
func sameJSON(t *testing.T, name string, got []byte) {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Indent(&buf, got, "", "  "); err != nil {
		t.Fatal(err)
	}
	buf.WriteByte('\n')
	if want := readFile(t, name); !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("%s: the encoding changed:\n%s\nstored:\n%s", name, buf.Bytes(), want)
	}
}

// TestStoredStatesRoundTrip: every field of a stored state decodes (none
// is left at its zero value) and encodes to the same bytes.
func TestStoredStatesRoundTrip(t *testing.T) {
	for _, name := range []string{"state-format1.json", "state-minimal.json"} {
		t.Run(name, func(t *testing.T) {
			st, err := Decode(readFile(t, name))
			if err != nil {
				t.Fatal(err)
			}
			b, err := Encode(st)
			if err != nil {
				t.Fatal(err)
			}
			sameJSON(t, name, b)
		})
	}
	st, err := Decode(readFile(t, "state-format1.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []reflect.Value{reflect.ValueOf(*st), reflect.ValueOf(*st.Log), reflect.ValueOf(*st.Pending), reflect.ValueOf(st.CA)} {
		for i := range v.NumField() {
			if v.Field(i).IsZero() {
				t.Errorf("%s.%s did not decode from the stored state", v.Type().Name(), v.Type().Field(i).Name)
			}
		}
	}
	if st.State != Running || st.Format != Format {
		t.Errorf("state %d format %d, want %d and %d", st.State, st.Format, Running, Format)
	}
}

func TestStoredHeaderRoundTrip(t *testing.T) {
	h, err := ParseHeader(readFile(t, "header-format1.json"))
	if err != nil {
		t.Fatal(err)
	}
	if h.Format != Format || h.Recovery.Mode != recovery.ModeXOR || h.Recovery.Threshold != 2 || h.Recovery.Keys["a"].ShareHash != "ab" ||
		!slices.Equal(h.MarbleRunShares, []string{"h1", "h2"}) || h.UpdateLog == nil || h.UpdateLog.Count != 5 {
		t.Errorf("the stored header decoded as %+v", h)
	}
	b, err := EncodeHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "header-format1.json", b)
}

func TestReadHeaderFromBlob(t *testing.T) {
	key := bytes.Repeat([]byte{7}, seal.KeySize)
	hdr, err := EncodeHeader(Header{Format: Format, Recovery: recovery.Public{Mode: recovery.ModeNone}, MarbleRunShares: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	blob, err := seal.Seal(nil, key, hdr, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := ReadHeader(blob)
	if err != nil || !slices.Equal(h.MarbleRunShares, []string{"x"}) {
		t.Fatalf("ReadHeader = %+v, %v", h, err)
	}
	bad, err := seal.Seal(nil, key, []byte("not json"), []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadHeader(bad); !errors.Is(err, seal.ErrCorrupt) {
		t.Errorf("a header that is not JSON: %v, want seal.ErrCorrupt", err)
	}
}

func TestDecodeRefusesOtherFormats(t *testing.T) {
	for _, in := range []string{`{"Format":2,"State":3}`, `{"Format":0,"State":3}`, `{"State":3}`} {
		if _, err := Decode([]byte(in)); !errors.Is(err, ErrFormat) {
			t.Errorf("Decode(%s) = %v, want ErrFormat", in, err)
		}
	}
	if _, err := Decode([]byte(`{"Format":1`)); err == nil || errors.Is(err, ErrFormat) {
		t.Errorf("truncated JSON: %v, want a decoding error", err)
	}
}

func TestPendingUpdateCounts(t *testing.T) {
	p := &PendingUpdate{RequiredUsers: []string{"a", "b", "c"}, Acknowledged: []string{"b"}, Needed: 2}
	if p.MissingAcknowledgments() != 1 || !slices.Equal(p.MissingUsers(), []string{"a", "c"}) {
		t.Errorf("missing %d %v, want 1 [a c]", p.MissingAcknowledgments(), p.MissingUsers())
	}
	p.Acknowledged = []string{"a", "b", "c"}
	if p.MissingAcknowledgments() != 0 || p.MissingUsers() != nil {
		t.Errorf("all acknowledged: missing %d %v", p.MissingAcknowledgments(), p.MissingUsers())
	}
}

func TestLogCounted(t *testing.T) {
	var none *Log
	if none.Counted() != nil {
		t.Error("Counted of no log is not nil")
	}
	l := &Log{CounterIncrements: 4}
	if n := l.Counted(); n.CounterIncrements != 5 || l.CounterIncrements != 4 {
		t.Errorf("Counted: %d (original %d), want 5 (4)", n.CounterIncrements, l.CounterIncrements)
	}
}

// The header's DataKeyID is the field seal reads to find the key file
// entry of a blob (seal.HeaderKeyIDField); a header without it (written
// before key IDs) encodes as before.
func TestHeaderNamesTheDataKey(t *testing.T) {
	dek := bytes.Repeat([]byte{9}, seal.KeySize)
	hdr, err := EncodeHeader(Header{Format: Format, Recovery: recovery.Public{Mode: recovery.ModeNone}, DataKeyID: seal.KeyIDText(dek)})
	if err != nil {
		t.Fatal(err)
	}
	blob, err := seal.Seal(nil, dek, hdr, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := seal.BlobKeyID(blob); !ok || id != seal.KeyID(dek) {
		t.Fatalf("seal.BlobKeyID of a header with DataKeyID = %x, %v", id, ok)
	}
	h, err := ReadHeader(blob)
	if err != nil || h.DataKeyID != seal.KeyIDText(dek) {
		t.Fatalf("ReadHeader = %+v, %v", h, err)
	}
	plain, _ := EncodeHeader(Header{Format: Format})
	if bytes.Contains(plain, []byte(seal.HeaderKeyIDField)) {
		t.Fatalf("a header without a key ID names one: %s", plain)
	}
}
