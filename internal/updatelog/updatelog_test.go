package updatelog

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// testNow is a time with milliseconds.
var testNow = time.Date(2026, 11, 22, 7, 59, 18, 311_000_000, time.UTC)

// fp stands for a manifest fingerprint: SHA-256("abc") (FIPS 180-2 example).
const fp = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

func TestConstructors(t *testing.T) {
	// The expected lines are written by hand from MarbleRun's entries, not produced by the code.
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"manifest set", ManifestSet(testNow),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Initial manifest set"}`},
		{"package update", SecurityVersionIncreased(testNow, "admin", "backend", 5),
			`{"time":"2026-11-22T07:59:18.311Z","update":"SecurityVersion increased","user":"admin","package":"backend","new version":5}`},
		{"secret upload", SecretSet(testNow, "alice", "apiKey", "plain"),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Secret set","user":"alice","secret":"apiKey","type":"plain"}`},
		{"update initiated, applied at once", UpdateInitiatedApplied(testNow, "alice", fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest update initiated by user. No further acknowledgements required","user":"alice","manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"update initiated, waiting", UpdateInitiatedWaiting(testNow, "alice", 1, []string{"admin"}, fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest update initiated by user. Waiting for acknowledgments to apply the update","user":"alice","missingAcknowledgments":1,"missingUsers":["admin"],"manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"update initiated, waiting for two", UpdateInitiatedWaiting(testNow, "alice", 2, []string{"bob", "carol"}, fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest update initiated by user. Waiting for acknowledgments to apply the update","user":"alice","missingAcknowledgments":2,"missingUsers":["bob","carol"],"manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"acknowledged, none missing (nil list)", UpdateAcknowledged(testNow, "admin", 0, nil, fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest update acknowledged by user","user":"admin","missingAcknowledgments":0,"missingUsers":[],"manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"acknowledged, one missing", UpdateAcknowledged(testNow, "admin", 1, []string{"carol"}, fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest update acknowledged by user","user":"admin","missingAcknowledgments":1,"missingUsers":["carol"],"manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"waiting, empty list", UpdateInitiatedWaiting(testNow, "alice", 0, []string{}, fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest update initiated by user. Waiting for acknowledgments to apply the update","user":"alice","missingAcknowledgments":0,"missingUsers":[],"manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"applied", UpdateApplied(testNow, fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest updated","manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"cancelled by user", UpdateCancelled(testNow, "alice", fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest update cancelled by user","user":"alice","manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"cancelled on failure", UpdateCancelledOnFailure(testNow, fp),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Complete Manifest update cancelled due to error during apply","manifestFingerprint":"ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}`},
		{"odd names are escaped", SecretSet(testNow, "a\"b\\c<d>&\n\té\u2028", "s\x01", "plain"),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Secret set","user":"a\"b\\c<d>&\n\té\u2028","secret":"s\u0001","type":"plain"}`},
		{"invalid UTF-8 is replaced", SecretSet(testNow, "u\xff", "s", "plain"),
			`{"time":"2026-11-22T07:59:18.311Z","update":"Secret set","user":"u\ufffd","secret":"s","type":"plain"}`},
		{"largest version", SecurityVersionIncreased(testNow, "u", "p", math.MaxUint64),
			`{"time":"2026-11-22T07:59:18.311Z","update":"SecurityVersion increased","user":"u","package":"p","new version":18446744073709551615}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got  %s\nwant %s", tt.got, tt.want)
			}
			if !json.Valid([]byte(tt.got)) {
				t.Errorf("not valid JSON: %s", tt.got)
			}
			if strings.ContainsAny(tt.got, "\n\r") {
				t.Errorf("entry is not one line: %q", tt.got)
			}
		})
	}
}

// keys returns the top-level keys of a JSON object in order.
func keys(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %s", line)
	}
	var out []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestKeyOrder(t *testing.T) {
	tests := []struct {
		line string
		want []string
	}{
		{ManifestSet(testNow), []string{"time", "update"}},
		{SecurityVersionIncreased(testNow, "u", "p", 1), []string{"time", "update", "user", "package", "new version"}},
		{SecretSet(testNow, "u", "s", "plain"), []string{"time", "update", "user", "secret", "type"}},
		{UpdateInitiatedApplied(testNow, "u", fp), []string{"time", "update", "user", "manifestFingerprint"}},
		{UpdateInitiatedWaiting(testNow, "u", 1, []string{"v"}, fp), []string{"time", "update", "user", "missingAcknowledgments", "missingUsers", "manifestFingerprint"}},
		{UpdateAcknowledged(testNow, "u", 0, nil, fp), []string{"time", "update", "user", "missingAcknowledgments", "missingUsers", "manifestFingerprint"}},
		{UpdateApplied(testNow, fp), []string{"time", "update", "manifestFingerprint"}},
		{UpdateCancelled(testNow, "u", fp), []string{"time", "update", "user", "manifestFingerprint"}},
		{UpdateCancelledOnFailure(testNow, fp), []string{"time", "update", "manifestFingerprint"}},
	}
	for _, tt := range tests {
		if got := keys(t, tt.line); strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("%s: keys %v, want %v", tt.line, got, tt.want)
		}
	}
	// The package-update entry decodes to the types the marblerun CLI expects.
	var e struct {
		Time       time.Time `json:"time"`
		Update     string    `json:"update"`
		Package    string    `json:"package"`
		NewVersion uint      `json:"new version"`
	}
	if err := json.Unmarshal([]byte(SecurityVersionIncreased(testNow, "u", "backend", 7)), &e); err != nil {
		t.Fatal(err)
	}
	if !e.Time.Equal(testNow) || e.Update != MsgSecurityVersion || e.Package != "backend" || e.NewVersion != 7 {
		t.Errorf("decoded %+v", e)
	}
}

func TestEntry(t *testing.T) {
	cet := time.FixedZone("CET", 3600)
	tests := []struct {
		name    string
		now     time.Time
		update  string
		fields  []Field
		want    string
		wantErr bool
	}{
		{"converted to UTC", time.Date(2026, 11, 22, 8, 59, 18, 311_000_000, cet), "x", nil,
			`{"time":"2026-11-22T07:59:18.311Z","update":"x"}`, false},
		{"milliseconds truncated, zeros kept", time.Date(2026, 1, 2, 3, 4, 5, 999_999, time.UTC), "x", nil,
			`{"time":"2026-01-02T03:04:05.000Z","update":"x"}`, false},
		{"fields in the given order", testNow, "x",
			[]Field{{"z", 1}, {"a", true}, {"m", nil}, {"list", []int{1, 2}}, {"obj", map[string]string{"k": "v"}}},
			`{"time":"2026-11-22T07:59:18.311Z","update":"x","z":1,"a":true,"m":null,"list":[1,2],"obj":{"k":"v"}}`, false},
		{"odd key escaped", testNow, "x", []Field{{"a\"b", "c"}},
			`{"time":"2026-11-22T07:59:18.311Z","update":"x","a\"b":"c"}`, false},
		{"empty key", testNow, "x", []Field{{"", 1}}, "", true},
		{"repeated key", testNow, "x", []Field{{"user", "a"}, {"user", "b"}}, "", true},
		{"time key taken", testNow, "x", []Field{{"time", "a"}}, "", true},
		{"update key taken", testNow, "x", []Field{{"update", "a"}}, "", true},
		{"value JSON cannot encode", testNow, "x", []Field{{"f", func() {}}}, "", true},
		{"NaN", testNow, "x", []Field{{"f", math.NaN()}}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Entry(tt.now, tt.update, tt.fields...)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidField) {
					t.Errorf("Entry = %q, %v; want ErrInvalidField", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Entry = %s, %v\nwant    %s", got, err, tt.want)
			}
		})
	}
}

func TestFingerprint(t *testing.T) {
	if got := Fingerprint([]byte("abc")); got != fp {
		t.Errorf("Fingerprint(abc) = %s", got)
	}
	if got, want := Fingerprint(nil), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"; got != want {
		t.Errorf("Fingerprint(nil) = %s", got)
	}
}

func TestText(t *testing.T) {
	a := ManifestSet(testNow)
	b := UpdateApplied(testNow, fp)
	tests := []struct {
		log  []string
		want string
	}{
		{nil, ""},
		{[]string{a}, a + "\n"},
		{[]string{a, b}, a + "\n" + b + "\n"},
	}
	for _, tt := range tests {
		got := Text(tt.log)
		if got != tt.want {
			t.Errorf("Text = %q, want %q", got, tt.want)
		}
		// v2 readers split the trimmed text back into the entries.
		if len(tt.log) > 0 {
			if lines := strings.Split(strings.TrimSpace(got), "\n"); strings.Join(lines, "|") != strings.Join(tt.log, "|") {
				t.Errorf("split = %q", lines)
			}
		}
	}
	// Entries never contain a newline, so the split is exact.
	if bytes.ContainsRune([]byte(SecretSet(testNow, "a\nb", "s", "t")), '\n') {
		t.Error("newline in an entry")
	}
}
