package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestParseDuplicateKeys(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  string // the cause, after "unmarshaling manifest: "
	}{
		{"top-level section twice", `{"Packages":{"a":{}},"Packages":{"b":{}}}`,
			`duplicate key "Packages" at $`},
		{"section in two cases", `{"Packages":{"a":{}},"packages":{"b":{}}}`,
			`duplicate key "Packages" (also spelled "packages") at $`},
		{"section null and object", `{"Config":null,"CONFIG":{"SealMode":"Disabled"}}`,
			`duplicate key "Config" (also spelled "CONFIG") at $`},
		{"package field in two cases", `{"Packages":{"backend":{"SignerID":"aa","signerid":"bb"}}}`,
			`duplicate key "SignerID" (also spelled "signerid") at $.Packages.backend`},
		{"Kelvin sign folds to k", `{"Packages":{"p":{}},"Pac` + "\u212a" + `ages":{}}`,
			`duplicate key "Packages" (also spelled "Pac` + "\u212a" + `ages") at $`},
		{"long s folds to s", `{"Secrets":{"x":{"Shared":true,"` + "\u017f" + `hared":false}}}`,
			`duplicate key "Shared" (also spelled "` + "\u017f" + `hared") at $.Secrets.x`},
		{"escaped spelling", `{"Packages":{},"P\u0061ckages":{}}`,
			`duplicate key "Packages" at $`},
		{"exact duplicate in a map", `{"Packages":{"p":{},"p":{"Debug":true}}}`,
			`duplicate key "p" at $.Packages`},
		{"escaped duplicate in a map", `{"Marbles":{"m":{},"\u006d":{}}}`,
			`duplicate key "m" at $.Marbles`},
		{"invalid UTF-8 decodes to the same map key", "{\"Users\":{\"\xff\":{},\"\xfe\":{}}}",
			"duplicate key \"\ufffd\" at $.Users"},
		{"lone surrogates decode to the same map key", `{"Roles":{"\ud800":{},"\udc00":{}}}`,
			"duplicate key \"\ufffd\" at $.Roles"},
		{"marble name duplicate", `{"Marbles":{"a":{"Package":"p"},"b":{},"a":{}}}`,
			`duplicate key "a" at $.Marbles`},
		{"file path duplicate", `{"Marbles":{"m":{"Parameters":{"Files":{"/etc/a":"x","/etc/a":"y"}}}}}`,
			`duplicate key "/etc/a" at $.Marbles.m.Parameters.Files`},
		{"env duplicate", `{"Marbles":{"m":{"Parameters":{"Env":{"A":"x","A":"y"}}}}}`,
			`duplicate key "A" at $.Marbles.m.Parameters.Env`},
		{"file object field", `{"Marbles":{"m":{"Parameters":{"Files":{"f":{"Data":"x","data":"y"}}}}}}`,
			`duplicate key "Data" (also spelled "data") at $.Marbles.m.Parameters.Files.f`},
		{"parameters twice", `{"Marbles":{"m":{"Parameters":{},"parameters":{}}}}`,
			`duplicate key "Parameters" (also spelled "parameters") at $.Marbles.m`},
		{"secret field", `{"Secrets":{"s":{"Type":"plain","TYPE":"symmetric-key"}}}`,
			`duplicate key "Type" (also spelled "TYPE") at $.Secrets.s`},
		{"certificate template field", `{"Secrets":{"s":{"Cert":{"IsCA":true,"isca":false}}}}`,
			`duplicate key "IsCA" (also spelled "isca") at $.Secrets.s.Cert`},
		{"certificate subject field", `{"Secrets":{"s":{"Cert":{"Subject":{"CommonName":"a","commonName":"b"}}}}}`,
			`duplicate key "CommonName" (also spelled "commonName") at $.Secrets.s.Cert.Subject`},
		{"inside an interface value", `{"Secrets":{"s":{"Cert":{"PublicKey":{"a":1,"a":2}}}}}`,
			`duplicate key "a" at $.Secrets.s.Cert.PublicKey`},
		{"interface keys are case-sensitive but exact duplicates are not", `{"Secrets":{"s":{"Cert":{"PublicKey":{"a":1,"A":2,"b":[{"x":1,"x":1}]}}}}}`,
			`duplicate key "x" at $.Secrets.s.Cert.PublicKey.b[0]`},
		{"array element", `{"TLS":{"t":{"Incoming":[{"Port":"1"},{"Port":"2","port":"3"}]}}}`,
			`duplicate key "Port" (also spelled "port") at $.TLS.t.Incoming[1]`},
		{"unknown member twice", `{"Color":1,"Color":2}`,
			`duplicate key "Color" at $`},
		{"inside an unknown member", `{"Extra":{"a":{"b":1,"b":2}}}`,
			`duplicate key "b" at $.Extra.a`},
		{"config field", `{"Config":{"FeatureGates":[],"featureGates":["SignQuoteEndpoint"]}}`,
			`duplicate key "FeatureGates" (also spelled "featureGates") at $.Config`},
		{"recovery key", `{"RecoveryKeys":{"k":"a","k":"b"}}`,
			`duplicate key "k" at $.RecoveryKeys`},
		{"infrastructure field", `{"Infrastructures":{"i":{"QESVN":1,"qesvn":2}}}`,
			`duplicate key "QESVN" (also spelled "qesvn") at $.Infrastructures.i`},
		{"user field", `{"Users":{"u":{"Roles":[],"roles":["r"]}}}`,
			`duplicate key "Roles" (also spelled "roles") at $.Users.u`},
		{"role field", `{"Roles":{"r":{"Actions":[],"actions":["ReadSecret"]}}}`,
			`duplicate key "Actions" (also spelled "actions") at $.Roles.r`},
		{"key that needs quoting in the path", `{"Marbles":{"my app":{"Parameters":{"Files":{"/a b":{"Data":"","DATA":""}}}}}}`,
			`duplicate key "Data" (also spelled "DATA") at $.Marbles["my app"].Parameters.Files["/a b"]`},
		{"long key is shortened", `{"Packages":{"` + strings.Repeat("k", 300) + `":{},"` + strings.Repeat("k", 300) + `":{}}}`,
			`duplicate key "` + strings.Repeat("k", 64) + `"… at $.Packages`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { expectParseError(t, tt.input, tt.want) })
	}
}

// TestParseAcceptsDistinctKeys lists documents without duplicates that Parse
// must keep accepting.
func TestParseAcceptsDistinctKeys(t *testing.T) {
	tests := []struct {
		name  string
		input string
	}{
		{"map keys differ in case", `{"Packages":{"app":{},"App":{},"APP":{}},"Secrets":{"k":{},"K":{},"` + "\u212a" + `":{}}}`},
		{"one lower-case spelling", `{"packages":{"p":{"signerid":"aa"}},"marbles":{"m":{"package":"p"}}}`},
		{"one odd spelling", `{"PACKAGES":{"p":{}},"Pac` + "\u212a" + `ages2":{}}`},
		{"unknown members differing in case", `{"Color":1,"color":2,"COLOR":3}`},
		{"interface values are case-sensitive", `{"Secrets":{"s":{"Cert":{"PublicKey":{"a":1,"A":2}}}}}`},
		{"same key in sibling objects", `{"Packages":{"a":{"Debug":true},"b":{"Debug":true}},"Marbles":{"a":{},"b":{}}}`},
		{"same key at different depths", `{"Config":{"Config":{"Config":1}}}`},
		{"env names differ in case", `{"Marbles":{"m":{"Parameters":{"Env":{"path":"a","PATH":"b"}}}}}`},
		{"array of objects", `{"TLS":{"t":{"Incoming":[{"Port":"1"},{"Port":"2"}]}}}`},
		{"empty objects and arrays", `{"Packages":{},"Marbles":{"m":{"TLS":[],"Parameters":{"Files":{},"Argv":[]}}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Parse([]byte(tt.input)); err != nil {
				t.Fatalf("Parse: %v", err)
			}
		})
	}
	for _, name := range []string{"manifest.json", "minimal.json"} {
		loadFixture(t, name)
	}
}

// Types for TestFieldResolution: every field is a string, so which field a
// key reached shows in the decoded value.
type (
	resolveInner struct {
		Name  string
		Inner string
		Both  string
	}
	// ResolveOther is exported: encoding/json cannot allocate an embedded
	// pointer to an unexported type.
	ResolveOther struct {
		Both  string
		Other string
	}
	resolveTagged struct {
		Tagged string `json:"Both"`
	}
	resolveTarget struct {
		Plain   string
		Renamed string `json:"alias"`
		Dashed  string `json:"x-y"`
		Skipped string `json:"-"`
		//lint:ignore SA5008 the tags the decoder must read as encoding/json does, odd ones included
		Dash string `json:"-,"`
		//lint:ignore SA5008 as above: a tag encoding/json ignores as invalid
		BadTag   string `json:"a\"b"`
		OmitOnly string `json:",omitempty"`
		Kelvin   string
		Ident    string
		IDENT    string
		//lint:ignore U1000 an unexported field, which the decoder must skip
		unexported string
		Ptr        *string
		resolveInner
		*ResolveOther
	}
	resolveDominated struct {
		resolveTagged
		ResolveOther
	}
	resolveViaA  struct{ resolveInner }
	resolveViaB  struct{ resolveInner }
	resolveTwice struct {
		resolveViaA
		resolveViaB
		Inner string // shallower: wins
	}
)

// TestFieldResolution checks the duplicate-key walker's view of which struct
// field a key reaches against encoding/json itself, key by key.
func TestFieldResolution(t *testing.T) {
	keys := []string{
		"Plain", "plain", "PLAIN", "pla\u212an", "Renamed", "renamed", "alias", "ALIAS",
		"x-y", "X-Y", "xy", "Skipped", "skipped", "-", "Dash", "BadTag", "badtag", "a\"b",
		"OmitOnly", "omitonly", "Kelvin", "\u212aelvin", "kelvin", "Ident", "IDENT", "ident", "iDeNt",
		"unexported", "Ptr", "ptr", "Name", "NAME", "Inner", "Both", "both", "Other", "other",
		"resolveInner", "ResolveOther", "Tagged", "\u017ftrange", "\u0130dent",
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[resolveTarget](), reflect.TypeFor[resolveDominated](), reflect.TypeFor[resolveTwice]()} {
		fields := structFieldsOf(typ)
		for _, key := range keys {
			want := decodedField(t, typ, key)
			got := ""
			if i, ok := fields.lookup(key); ok {
				got = fmt.Sprint(fields.list[i].index)
			}
			if got != want {
				t.Errorf("%v: key %q reaches field %q, encoding/json says %q", typ, key, got, want)
			}
		}
	}
}

// decodedField decodes {key: "marker"} into a new value of typ and returns
// the index path of the string field that received the marker, or "".
func decodedField(t *testing.T, typ reflect.Type, key string) string {
	t.Helper()
	raw, err := json.Marshal(map[string]string{key: "marker"})
	if err != nil {
		t.Fatal(err)
	}
	v := reflect.New(typ)
	if err := json.Unmarshal(raw, v.Interface()); err != nil {
		t.Fatalf("Unmarshal(%s): %v", raw, err)
	}
	var found string
	var walk func(v reflect.Value, index []int)
	walk = func(v reflect.Value, index []int) {
		switch v.Kind() {
		case reflect.Pointer:
			if !v.IsNil() {
				walk(v.Elem(), index)
			}
		case reflect.Struct:
			for i := range v.NumField() {
				walk(v.Field(i), append(index[:len(index):len(index)], i))
			}
		case reflect.String:
			if v.String() == "marker" {
				found = fmt.Sprint(index)
			}
		}
	}
	walk(v.Elem(), nil)
	return found
}

// hasExactDuplicate reports whether some JSON object in raw (valid JSON) has
// two members with the same decoded name. It is a slow, simple reference for
// the fuzz test, built on json.Decoder.Token.
func hasExactDuplicate(raw []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   map[string]bool
		expect bool // the next token in this object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.object && top.expect {
			if key, ok := tok.(string); ok {
				if top.keys[key] {
					return true
				}
				top.keys[key] = true
				top.expect = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{object: true, keys: map[string]bool{}, expect: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].expect = true
		}
	}
}

func TestHasExactDuplicate(t *testing.T) {
	for input, want := range map[string]bool{
		`{}`: false, `{"a":1,"b":{"a":1}}`: false, `{"a":1,"a":2}`: true, `[{"a":[{"b":1,"b":1}]}]`: true,
		`{"a":{"x":1},"b":{"x":1}}`: false, `{"a":[1,{"c":1}],"c":1}`: false, `{"a":[1,{"c":1}],"a":1}`: true,
	} {
		if got := hasExactDuplicate([]byte(input)); got != want {
			t.Errorf("hasExactDuplicate(%s) = %v, want %v", input, got, want)
		}
	}
}

// BenchmarkDuplicateKeys measures the walk on large documents of the shapes
// an attacker would choose: many tiny tokens, many keys, deep nesting.
func BenchmarkDuplicateKeys(b *testing.B) {
	const size = 8 << 20
	docs := map[string]string{
		"numbers": `{"Extra":[` + strings.Repeat(`0,`, size/2) + `0]}`,
		"keys":    `{"Extra":{` + manyKeys(size/12) + `}}`,
		"escaped": `{"Packages":{` + manyEscapedKeys(size/16) + `}}`,
		"nested":  strings.Repeat(`{"a":`, 9999) + `1` + strings.Repeat(`}`, 9999),
	}
	for name, doc := range docs {
		raw := []byte(doc)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if err := checkDuplicateKeys(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func manyKeys(n int) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"%x":0`, i)
	}
	return sb.String()
}

func manyEscapedKeys(n int) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `"\u0041%x":{}`, i)
	}
	return sb.String()
}
