package manifest

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// loadFixture parses a file of testdata/ afresh, so a test may change it.
func loadFixture(t testing.TB, name string) *Manifest {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(raw)
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return m
}

func TestParse(t *testing.T) {
	tests := []struct {
		name  string
		input string
		check func(t *testing.T, m *Manifest)
	}{
		{
			name:  "empty object",
			input: `{}`,
			check: func(t *testing.T, m *Manifest) {
				if !reflect.DeepEqual(*m, Manifest{}) {
					t.Errorf("got %+v, want zero manifest", *m)
				}
			},
		},
		{
			name:  "lower-case member names",
			input: `{"packages":{"p":{"debug":true,"securityversion":3}},"marbles":{"m":{"package":"p","parameters":{"argv":["a"]}}},"config":{"sealmode":"Disabled","featuregates":["MonotonicCounter"]}}`,
			check: func(t *testing.T, m *Manifest) {
				p := m.Packages["p"]
				if !p.Debug || p.SecurityVersion == nil || *p.SecurityVersion != 3 {
					t.Errorf("package = %+v", p)
				}
				if mb := m.Marbles["m"]; mb.Package != "p" || !reflect.DeepEqual(mb.Parameters.Argv, []string{"a"}) {
					t.Errorf("marble = %+v", mb)
				}
				if m.Config.SealMode != SealModeDisabled || !m.FeatureEnabled(FeatureMonotonicCounter) {
					t.Errorf("config = %+v", m.Config)
				}
			},
		},
		{
			name:  "map keys keep their case",
			input: `{"Packages":{"Backend":{},"backend":{"Debug":true}}}`,
			check: func(t *testing.T, m *Manifest) {
				if len(m.Packages) != 2 || !m.Packages["backend"].Debug || m.Packages["Backend"].Debug {
					t.Errorf("packages = %+v", m.Packages)
				}
			},
		},
		{
			name:  "unknown members are ignored",
			input: `{"FeatureFlags":["x"],"Packages":{"p":{"Debug":true,"Color":"blue"}},"Config":{"Nope":1}}`,
			check: func(t *testing.T, m *Manifest) {
				if len(m.Packages) != 1 || !m.Packages["p"].Debug || m.Config.FeatureGates != nil {
					t.Errorf("got %+v", *m)
				}
			},
		},
		{
			name:  "absent and zero ProductID differ",
			input: `{"Packages":{"a":{"ProductID":0},"b":{}}}`,
			check: func(t *testing.T, m *Manifest) {
				if m.Packages["a"].ProductID == nil || *m.Packages["a"].ProductID != 0 || m.Packages["b"].ProductID != nil {
					t.Errorf("packages = %+v", m.Packages)
				}
			},
		},
		{
			name: "file forms and encodings",
			input: `{"Marbles":{"m":{"Parameters":{"Files":{
				"plain": "{{.Secrets}}",
				"object": {"Data": "text"},
				"string": {"Data": "text", "Encoding": "STRING", "NoTemplates": true},
				"b64": {"Data": "aGVsbG8=", "Encoding": "base64"},
				"B64": {"data": "AAEC", "encoding": "Base64"},
				"hex": {"Data": "00ff41", "Encoding": "HEX"},
				"empty": {},
				"extra": {"Data": "x", "Unknown": [1, 2]}
			},"Env":{"E": {"Data": "6869", "Encoding": "hex", "NoTemplates": true}}}}}}`,
			check: func(t *testing.T, m *Manifest) {
				want := map[string]File{
					"plain":  {Data: "{{.Secrets}}", Encoding: EncodingString},
					"object": {Data: "text", Encoding: EncodingString},
					"string": {Data: "text", Encoding: EncodingString, NoTemplates: true},
					"b64":    {Data: "hello", Encoding: EncodingBase64},
					"B64":    {Data: "\x00\x01\x02", Encoding: EncodingBase64},
					"hex":    {Data: "\x00\xffA", Encoding: EncodingHex},
					"empty":  {Data: "", Encoding: EncodingString},
					"extra":  {Data: "x", Encoding: EncodingString},
				}
				params := m.Marbles["m"].Parameters
				if !reflect.DeepEqual(params.Files, want) {
					t.Errorf("Files = %#v\nwant %#v", params.Files, want)
				}
				if e := params.Env["E"]; e != (File{Data: "hi", Encoding: EncodingHex, NoTemplates: true}) {
					t.Errorf("Env = %#v", e)
				}
			},
		},
		{
			name:  "secret with certificate template",
			input: `{"Secrets":{"c":{"Type":"cert-ecdsa","Size":256,"ValidFor":3,"Cert":{"Subject":{"CommonName":"x","Organization":["o"]},"NotAfter":"2030-01-02T03:04:05Z","SerialNumber":123456789012345678901234567890,"DNSNames":[],"IPAddresses":["10.0.0.1"],"KeyUsage":5,"ExtKeyUsage":[1,2],"IsCA":true,"Policies":["1.2.3.4"]},"Private":"AQI="}}}`,
			check: func(t *testing.T, m *Manifest) {
				s := m.Secrets["c"]
				if s.Type != SecretTypeCertECDSA || s.Size != 256 || s.ValidFor != 3 || string(s.Private) != "\x01\x02" {
					t.Errorf("secret = %+v", s)
				}
				c := s.Cert
				if c.Subject.CommonName != "x" || c.Subject.Organization[0] != "o" || !c.IsCA || c.KeyUsage != 5 {
					t.Errorf("cert = %+v", c)
				}
				if !c.NotAfter.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) {
					t.Errorf("NotAfter = %v", c.NotAfter)
				}
				if c.SerialNumber.String() != "123456789012345678901234567890" {
					t.Errorf("SerialNumber = %v", c.SerialNumber)
				}
				if c.DNSNames == nil || len(c.DNSNames) != 0 {
					t.Errorf("DNSNames = %#v, want empty, not nil", c.DNSNames)
				}
				if len(c.IPAddresses) != 1 || c.IPAddresses[0].String() != "10.0.0.1" {
					t.Errorf("IPAddresses = %v", c.IPAddresses)
				}
				if len(c.Policies) != 1 || c.Policies[0].String() != "1.2.3.4" {
					t.Errorf("Policies = %v", c.Policies)
				}
			},
		},
		{
			name:  "secret case-insensitive with null certificate",
			input: `{"Secrets":{"s":{"type":"symmetric-key","size":128,"SHARED":true,"cert":null}}}`,
			check: func(t *testing.T, m *Manifest) {
				if s := m.Secrets["s"]; s.Type != SecretTypeSymmetric || s.Size != 128 || !s.Shared {
					t.Errorf("secret = %+v", s)
				}
			},
		},
		{
			name:  "whitespace around the document",
			input: " \n\t{\"Packages\":{\"p\":{}}}\r\n ",
			check: func(t *testing.T, m *Manifest) {
				if len(m.Packages) != 1 {
					t.Errorf("packages = %v", m.Packages)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse([]byte(tt.input))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tt.check(t, m)
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  string // the cause, after "unmarshaling manifest: "
	}{
		{"empty input", ``, "unexpected end of JSON input"},
		{"only whitespace", " \n", "unexpected end of JSON input"},
		{"null", `null`, "manifest is null"},
		{"null with whitespace", " null\n", "manifest is null"},
		{"array", `[]`, "json: cannot unmarshal array into Go value of type manifest.Manifest"},
		{"string", `"x"`, "json: cannot unmarshal string into Go value of type manifest.Manifest"},
		{"trailing data", `{} {}`, "invalid character '{' after top-level value"},
		{"trailing garbage", `{"Packages":{}}x`, "invalid character 'x' after top-level value"},
		{"truncated", `{"Packages":`, "unexpected end of JSON input"},
		{"wrong field type", `{"Marbles":{"m":{"MaxActivations":"1"}}}`, "json: cannot unmarshal string into Go struct field Marble.Marbles.MaxActivations of type uint"},
		{"negative size", `{"Secrets":{"s":{"Size":-1}}}`, "json: cannot unmarshal number -1 into Go struct field Manifest.Secrets.secret.Size of type uint"},
		{"unknown encoding", `{"Marbles":{"m":{"Parameters":{"Files":{"f":{"Data":"x","Encoding":"ROT13"}}}}}}`, "unknown encoding type: ROT13"},
		{"bad base64", `{"Marbles":{"m":{"Parameters":{"Files":{"f":{"Data":"YmFy=","Encoding":"base64"}}}}}}`, "illegal base64 data at input byte 4"},
		{"unpadded base64", `{"Marbles":{"m":{"Parameters":{"Env":{"E":{"Data":"YQ","Encoding":"base64"}}}}}}`, "illegal base64 data at input byte 0"},
		{"url base64", `{"Marbles":{"m":{"Parameters":{"Env":{"E":{"Data":"-_-_","Encoding":"base64"}}}}}}`, "illegal base64 data at input byte 0"},
		{"bad hex", `{"Marbles":{"m":{"Parameters":{"Files":{"f":{"Data":"zz","Encoding":"hex"}}}}}}`, "encoding/hex: invalid byte: U+007A 'z'"},
		{"odd hex", `{"Marbles":{"m":{"Parameters":{"Files":{"f":{"Data":"abc","Encoding":"hex"}}}}}}`, "encoding/hex: odd length hex string"},
		{"file null", `{"Marbles":{"m":{"Parameters":{"Files":{"f":null}}}}}`, "invalid file value: want a JSON string or object, got null"},
		{"file number", `{"Marbles":{"m":{"Parameters":{"Files":{"f":1}}}}}`, "invalid file value: want a JSON string or object, got number"},
		{"file array", `{"Marbles":{"m":{"Parameters":{"Env":{"E":["a"]}}}}}`, "invalid file value: want a JSON string or object, got array"},
		{"file bool", `{"Marbles":{"m":{"Parameters":{"Env":{"E":true}}}}}`, "invalid file value: want a JSON string or object, got boolean"},
		{"file data number", `{"Marbles":{"m":{"Parameters":{"Files":{"f":{"Data":1}}}}}}`, "json: cannot unmarshal number into Go struct field Parameters.Marbles.Parameters.Files.Data of type string"},
		{"file encoding number", `{"Marbles":{"m":{"Parameters":{"Files":{"f":{"Encoding":1}}}}}}`, "json: cannot unmarshal number into Go struct field Parameters.Marbles.Parameters.Files.Encoding of type string"},
		{"long serial number", `{"Secrets":{"s":{"Cert":{"SerialNumber":` + strings.Repeat("9", maxCertDigits+1) + `}}}}`, "certificate template contains a number with more than 1000 digits"},
		{"long escaped OID", `{"Secrets":{"s":{"Cert":{"Policies":["1.2.` + strings.Repeat(`\u0039`, maxCertDigits+1) + `"]}}}}`, "certificate template contains a number with more than 1000 digits"},
		{"bad certificate field", `{"Secrets":{"s":{"Cert":{"NotAfter":"tomorrow"}}}}`, `parsing time "tomorrow" as "2006-01-02T15:04:05Z07:00": cannot parse "tomorrow" as "2006"`},
		{"bad IP address", `{"Secrets":{"s":{"Cert":{"IPAddresses":["300.1.1.1"]}}}}`, "invalid IP address: 300.1.1.1"},
		{"bad private key", `{"Secrets":{"s":{"Private":"***"}}}`, "illegal base64 data at input byte 0"},
		{"recovery key not a string", `{"RecoveryKeys":{"k":{}}}`, "json: cannot unmarshal object into Go struct field Manifest.RecoveryKeys of type string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { expectParseError(t, tt.input, tt.want) })
	}
}

// expectParseError checks that Parse refuses input with no manifest, an
// error wrapping ErrInvalid, and the message "unmarshaling manifest: "+want.
func expectParseError(t *testing.T, input, want string) {
	t.Helper()
	m, err := Parse([]byte(input))
	if err == nil {
		t.Fatalf("Parse succeeded: %+v", m)
	}
	if m != nil {
		t.Error("Parse returned a manifest with its error")
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("error %v does not wrap ErrInvalid", err)
	}
	if want := "unmarshaling manifest: " + want; err.Error() != want {
		t.Errorf("error:\n got %q\nwant %q", err, want)
	}
}

func TestParseErrorUnwrapsCause(t *testing.T) {
	_, err := Parse([]byte(`{"Packages":`))
	var syntax *json.SyntaxError
	if !errors.As(err, &syntax) {
		t.Fatalf("error %v does not wrap a *json.SyntaxError", err)
	}
}

func TestFileMarshalJSON(t *testing.T) {
	tests := []struct {
		file File
		want string
	}{
		{File{Data: "a<b", Encoding: EncodingString}, `{"Data":"a\u003cb","Encoding":"string","NoTemplates":false}`},
		{File{Data: "plain"}, `{"Data":"plain","Encoding":"string","NoTemplates":false}`},
		{File{Data: "hello", Encoding: EncodingBase64, NoTemplates: true}, `{"Data":"aGVsbG8=","Encoding":"base64","NoTemplates":true}`},
		{File{Data: "\x00\xff", Encoding: EncodingHex}, `{"Data":"00ff","Encoding":"hex","NoTemplates":false}`},
		{File{Data: "x", Encoding: "HEX"}, `{"Data":"78","Encoding":"hex","NoTemplates":false}`},
	}
	for _, tt := range tests {
		got, err := json.Marshal(tt.file)
		if err != nil {
			t.Errorf("Marshal(%#v): %v", tt.file, err)
			continue
		}
		if string(got) != tt.want {
			t.Errorf("Marshal(%#v) = %s, want %s", tt.file, got, tt.want)
		}
		var back File
		if err := json.Unmarshal(got, &back); err != nil {
			t.Errorf("Unmarshal(%s): %v", got, err)
		}
		want := tt.file
		want.Encoding = strings.ToLower(want.Encoding)
		if want.Encoding == "" {
			want.Encoding = EncodingString
		}
		if back != want {
			t.Errorf("round trip of %#v gave %#v", tt.file, back)
		}
	}
	if _, err := json.Marshal(File{Data: "x", Encoding: "rot13"}); err == nil || !strings.Contains(err.Error(), "unknown encoding type: rot13") {
		t.Errorf("Marshal with an unknown encoding: err = %v", err)
	}
}

func TestManifestRoundTrip(t *testing.T) {
	m := loadFixture(t, "manifest.json")
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.Marbles, back.Marbles) {
		t.Errorf("Marbles changed in a round trip:\n%+v\n%+v", m.Marbles, back.Marbles)
	}
	if err := back.Validate(); err != nil {
		t.Errorf("round-tripped manifest is invalid: %v", err)
	}
}
