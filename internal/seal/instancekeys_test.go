package seal

import (
	"bytes"
	"errors"
	"testing"
)

func sampleInstanceKeyFile() *InstanceKeyFile {
	dek := bytes.Repeat([]byte{7}, KeySize)
	rec := NewKeyRecord(dek, Binding([]byte("blob")))
	return &InstanceKeyFile{
		Records: []KeyRecord{rec},
		Entries: []InstanceEntry{
			{Instance: InstanceID{1}, KeyID: rec.KeyID, Sealed: []byte("sealed by one")},
			{Instance: InstanceID{2}, KeyID: rec.KeyID, Sealed: []byte("sealed by two")},
		},
	}
}

func TestInstanceKeyFileRoundTrip(t *testing.T) {
	f := sampleInstanceKeyFile()
	raw, err := f.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !IsInstanceKeyFile(raw) {
		t.Fatal("IsInstanceKeyFile is false for an encoded file")
	}
	if _, err := DecodeKeyFile(raw); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("the version 1 decoder accepts version 2: %v", err)
	}
	got, err := DecodeInstanceKeyFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	again, err := got.Encode()
	if err != nil || !bytes.Equal(again, raw) {
		t.Fatalf("re-encoded differs: %v", err)
	}
	if _, ok := got.Record([]byte("blob")); !ok {
		t.Fatal("no record for the blob")
	}
	if _, ok := got.Record([]byte("other blob")); ok {
		t.Fatal("a record for another blob")
	}
	if e, ok := got.Entry(InstanceID{2}, f.Records[0].KeyID); !ok || string(e.Sealed) != "sealed by two" {
		t.Fatal("entry of instance 2 not found")
	}
}

func TestKeyRecordVerify(t *testing.T) {
	dek := bytes.Repeat([]byte{7}, KeySize)
	other := bytes.Repeat([]byte{8}, KeySize)
	r := NewKeyRecord(dek, Binding([]byte("blob")))
	if !r.Verify(dek) {
		t.Fatal("the record's own key does not verify")
	}
	if r.Verify(other) {
		t.Fatal("another key verifies")
	}
	moved := r
	moved.Binding = Binding([]byte("newer blob"))
	if moved.Verify(dek) {
		t.Fatal("a record whose binding was changed without the key verifies")
	}
}

func TestInstanceKeyFileRefused(t *testing.T) {
	f := sampleInstanceKeyFile()
	good, _ := f.Encode()
	for n := range len(good) {
		if _, err := DecodeInstanceKeyFile(good[:n]); !errors.Is(err, ErrKeyFile) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	if _, err := DecodeInstanceKeyFile(append(append([]byte{}, good...), 0)); !errors.Is(err, ErrKeyFile) {
		t.Fatal("trailing byte accepted")
	}
	bad := []*InstanceKeyFile{
		{Entries: f.Entries}, // no record
		{Records: f.Records}, // no entry
		{Records: f.Records, Entries: []InstanceEntry{f.Entries[0], f.Entries[0]}},                           // repeated
		{Records: f.Records, Entries: []InstanceEntry{{Instance: InstanceID{3}, Sealed: []byte("x")}}},       // key without record
		{Records: f.Records, Entries: []InstanceEntry{{Instance: InstanceID{3}, KeyID: f.Records[0].KeyID}}}, // empty sealed
	}
	for i, b := range bad {
		if _, err := b.Encode(); err == nil {
			t.Errorf("bad file %d encoded", i)
		}
	}
	many := &InstanceKeyFile{Records: f.Records}
	for i := range MaxInstanceEntries + 1 {
		many.Entries = append(many.Entries, InstanceEntry{Instance: InstanceID{byte(i), byte(i >> 8)}, KeyID: f.Records[0].KeyID, Sealed: []byte("x")})
	}
	if _, err := many.Encode(); err == nil {
		t.Error("more than MaxInstanceEntries encoded")
	}
}

func FuzzDecodeInstanceKeyFile(f *testing.F) {
	good, _ := sampleInstanceKeyFile().Encode()
	f.Add(good)
	f.Add([]byte(KeyFileMagic + "\x02\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		kf, err := DecodeInstanceKeyFile(b)
		if err != nil {
			if !errors.Is(err, ErrKeyFile) {
				t.Fatalf("error not ErrKeyFile: %v", err)
			}
			return
		}
		again, err := kf.Encode()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("decoded file does not re-encode to itself: %v", err)
		}
	})
}
