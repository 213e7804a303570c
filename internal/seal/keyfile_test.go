package seal

import (
	"bytes"
	"errors"
	"testing"
)

func TestKeyFileRoundTrip(t *testing.T) {
	a, b := Binding([]byte("blob a")), Binding([]byte("blob b"))
	for _, entries := range [][]KeyEntry{
		{{Binding: a, Sealed: bytes.Repeat([]byte{1}, KeySize)}},
		{{Binding: a, Sealed: bytes.Repeat([]byte{1}, KeySize)}, {Binding: b, Sealed: []byte("a longer sealed key with a header")}},
	} {
		raw, err := EncodeKeyFile(entries)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(raw, []byte(KeyFileMagic)) {
			t.Fatalf("no magic: %x", raw[:8])
		}
		got, err := DecodeKeyFile(raw)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(entries) {
			t.Fatalf("%d entries, want %d", len(got), len(entries))
		}
		for i := range got {
			if got[i].Binding != entries[i].Binding || !bytes.Equal(got[i].Sealed, entries[i].Sealed) || got[i].Legacy {
				t.Errorf("entry %d = %+v, want %+v", i, got[i], entries[i])
			}
		}
	}
}

func TestKeyFileEncodeRefuses(t *testing.T) {
	e := KeyEntry{Sealed: []byte("k")}
	for _, entries := range [][]KeyEntry{nil, {e, e, e}, {{Sealed: nil}}, {{Legacy: true, Sealed: []byte("k")}}} {
		if _, err := EncodeKeyFile(entries); err == nil {
			t.Errorf("EncodeKeyFile(%d entries) accepted", len(entries))
		}
	}
}

func TestKeyFileLegacyAndFind(t *testing.T) {
	raw := bytes.Repeat([]byte{7}, KeySize)
	entries, err := DecodeKeyFile(raw)
	if err != nil || len(entries) != 1 || !entries[0].Legacy || !bytes.Equal(entries[0].Sealed, raw) {
		t.Fatalf("legacy key file = %+v, %v", entries, err)
	}
	if e, ok := Find(entries, []byte("any blob")); !ok || !e.Legacy {
		t.Fatal("a legacy entry is not found for a blob")
	}
	blobA, blobB := []byte("a"), []byte("b")
	entries = []KeyEntry{{Binding: Binding(blobA), Sealed: []byte("ka")}, {Binding: Binding(blobB), Sealed: []byte("kb")}}
	if e, ok := Find(entries, blobB); !ok || string(e.Sealed) != "kb" {
		t.Fatalf("Find(b) = %q, %v", e.Sealed, ok)
	}
	if _, ok := Find(entries, []byte("c")); ok {
		t.Fatal("an entry is found for a blob nobody is bound to")
	}
}

func TestKeyFileMalformed(t *testing.T) {
	good, err := EncodeKeyFile([]KeyEntry{{Binding: Binding([]byte("x")), Sealed: bytes.Repeat([]byte{1}, KeySize)}})
	if err != nil {
		t.Fatal(err)
	}
	// Every truncation (except the legacy length) and every extension fails.
	for n := 0; n < len(good); n++ {
		if n == KeySize {
			continue
		}
		if _, err := DecodeKeyFile(good[:n]); !errors.Is(err, ErrKeyFile) {
			t.Errorf("truncated to %d bytes: %v", n, err)
		}
	}
	if _, err := DecodeKeyFile(append(append([]byte{}, good...), 0)); !errors.Is(err, ErrKeyFile) {
		t.Errorf("trailing byte: %v", err)
	}
	for name, mutate := range map[string]func(b []byte){
		"version": func(b []byte) { b[len(KeyFileMagic)] = 2 },
		"count 0": func(b []byte) { b[len(KeyFileMagic)+2] = 0 },
		"count 3": func(b []byte) { b[len(KeyFileMagic)+2] = 3 },
		"length":  func(b []byte) { b[len(KeyFileMagic)+3+32] = 0xff },
		"magic":   func(b []byte) { b[0] = 'X' },
	} {
		b := append([]byte{}, good...)
		mutate(b)
		if _, err := DecodeKeyFile(b); !errors.Is(err, ErrKeyFile) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzDecodeKeyFile(f *testing.F) {
	good, _ := EncodeKeyFile([]KeyEntry{{Binding: Binding([]byte("x")), Sealed: []byte("0123456789abcdef0123456789abcdef")}, {Sealed: []byte("y")}})
	f.Add(good)
	v3, _ := EncodeKeyFile([]KeyEntry{{Binding: KeyID(make([]byte, KeySize)), ByKeyID: true, Sealed: []byte("k")}, {Sealed: []byte("y")}})
	f.Add(v3)
	f.Add(make([]byte, KeySize))
	f.Add([]byte(KeyFileMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := DecodeKeyFile(b)
		if err != nil {
			return
		}
		if len(b) == KeySize {
			return
		}
		again, err := EncodeKeyFile(entries)
		if err != nil {
			t.Fatalf("decoded entries do not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("decode/encode is not the identity")
		}
	})
}

// namedBlob seals a blob whose JSON header names dek's key ID.
func namedBlob(t testing.TB, dek []byte, extra string) []byte {
	t.Helper()
	b, err := Seal(nil, dek, []byte(`{"a":1,"`+HeaderKeyIDField+`":"`+KeyIDText(dek)+`"`+extra+`}`), []byte("state"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestKeyFileVersion3(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, KeySize), bytes.Repeat([]byte{2}, KeySize)
	old := []byte("a blob that names no key")
	entries := []KeyEntry{{Binding: KeyID(k1), ByKeyID: true, Sealed: k1}, {Binding: Binding(old), Sealed: k2}}
	raw, err := EncodeKeyFile(entries)
	if err != nil {
		t.Fatal(err)
	}
	if v := raw[len(KeyFileMagic)]; v != KeyFileVersionKeyID {
		t.Fatalf("version %d, want %d", v, KeyFileVersionKeyID)
	}
	got, err := DecodeKeyFile(raw)
	if err != nil || len(got) != 2 || !got[0].ByKeyID || got[1].ByKeyID || got[0].Binding != entries[0].Binding || got[1].Binding != entries[1].Binding {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	// Only blob-bound entries: version 1, as before key IDs.
	v1, _ := EncodeKeyFile(entries[1:])
	if v := v1[len(KeyFileMagic)]; v != KeyFileVersion {
		t.Fatalf("blob-bound entries encode as version %d", v)
	}
	if e, ok := Find(got, namedBlob(t, k1, "")); !ok || !e.ByKeyID || !e.Holds(k1) || e.Holds(k2) {
		t.Fatalf("Find(blob naming k1) = %+v, %v", e, ok)
	}
	if e, ok := Find(got, old); !ok || e.ByKeyID {
		t.Fatalf("Find(old blob) = %+v, %v", e, ok)
	}
	if _, ok := Find(got, namedBlob(t, k2, "")); ok {
		t.Fatal("an entry is found for a blob naming another key")
	}
	for n := 0; n < len(raw); n++ {
		if n == KeySize {
			continue
		}
		if _, err := DecodeKeyFile(raw[:n]); !errors.Is(err, ErrKeyFile) {
			t.Errorf("truncated to %d bytes: %v", n, err)
		}
	}
	bad := append([]byte{}, raw...)
	bad[len(KeyFileMagic)+3] = 9 // the first entry's kind
	if _, err := DecodeKeyFile(bad); !errors.Is(err, ErrKeyFile) {
		t.Errorf("unknown kind: %v", err)
	}
}

func TestBlobKeyID(t *testing.T) {
	k := bytes.Repeat([]byte{5}, KeySize)
	if id, ok := BlobKeyID(namedBlob(t, k, "")); !ok || id != KeyID(k) {
		t.Fatalf("BlobKeyID = %x, %v", id, ok)
	}
	for name, blob := range map[string][]byte{
		"no blob":   []byte("opaque"),
		"not JSON":  func() []byte { b, _ := Seal(nil, k, []byte("header"), nil); return b }(),
		"no field":  func() []byte { b, _ := Seal(nil, k, []byte(`{"a":1}`), nil); return b }(),
		"not hex":   func() []byte { b, _ := Seal(nil, k, []byte(`{"dataKeyID":"zz"}`), nil); return b }(),
		"not text":  func() []byte { b, _ := Seal(nil, k, []byte(`{"dataKeyID":7}`), nil); return b }(),
		"too short": func() []byte { b, _ := Seal(nil, k, []byte(`{"dataKeyID":"abcd"}`), nil); return b }(),
	} {
		if _, ok := BlobKeyID(blob); ok {
			t.Errorf("%s: a key ID is read", name)
		}
	}
}
