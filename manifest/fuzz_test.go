package manifest

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseValidate checks that no input makes Parse, Validate or the
// helpers panic, and that their errors keep their contract.
func FuzzParseValidate(f *testing.F) {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil || len(files) == 0 {
		f.Fatalf("no fixtures: %v", err)
	}
	for _, name := range files {
		raw, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	for _, seed := range []string{
		``, `null`, `{}`, `[]`, `{"Packages":{"p":{}}} x`,
		`{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p","Parameters":{"Files":{"a":"{{range .Secrets}}{{.}}{{end}}","b":{"Data":"e3s=","Encoding":"base64"}},"Env":{"E":{"Data":"6869","Encoding":"hex","NoTemplates":true}}}}}}`,
		`{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p","Parameters":{"Files":{"a":"{{if 1}}{{else if 2}}{{end}}{{printf \"%08x\" 1}}"}}}}}`,
		`{"Secrets":{"s":{"Type":"cert-rsa","Size":2048,"Cert":{"SerialNumber":1,"Policies":["1.2.3"],"IPAddresses":["::1"],"URIs":[{"Scheme":"https"}],"PublicKey":{"a":[1,"b",null]},"Subject":{"Names":[{"Type":[2,5,4,3],"Value":"x"}]}}}}}`,
		`{"Users":{"u":{"Certificate":"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n","Roles":["r"]}},"Roles":{"r":{"ResourceType":"Manifest","Actions":["UpdateManifest"]}},"Config":{"UpdateThreshold":1}}`,
		`{"RecoveryKeys":{"k":"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"},"Config":{"RecoveryThreshold":1}}`,
		`{"TLS":{"t":{"Incoming":[{"Port":"1","Cert":"c","DisableClientAuth":true}],"Outgoing":[{}]}}}`,
		// Duplicate and near-duplicate keys.
		`{"Packages":{"p":{}},"packages":{"q":{}}}`, `{"Packages":{"p":{},"p":{}}}`, `{"Packages":{"p":{},"P":{}}}`,
		`{"Packages":{"p":{"SignerID":"aa","signerid":"bb"}}}`, "{\"Pac\u212aages\":{},\"Packages\":{}}",
		`{"Secrets":{"s":{"Cert":{"Subject":{"CommonName":"a","commonname":"b"},"PublicKey":{"a":[{"x":1,"x":2}]}}}}}`,
		`{"Marbles":{"m":{"Parameters":{"Files":{"f":{"Data":"a","DATA":"b"}},"Env":{"e":"1","e":"2"}}}}}`,
		`{"Users":{"\ud800":{},"\udc00":{}},"X":[{"a":1},{"a":1,"b":{"c":1,"c":1}}]}`,
		// Values the stricter rules refuse.
		`{"Packages":{"":{"SignerID":"zz","ProductID":65536,"SecurityVersion":70000,"AcceptedTCBStatuses":["Fine"]}},"Marbles":{"a\u0000":{"Package":""}}}`,
		`{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p","Parameters":{"Files":{"a":"{{if false}}{{.Secrets.nope}}{{index .Previous.Secrets \"x\"}}{{end}}{{with .Secrets}}{{.y}}{{end}}{{$ = 1}}{{$.Z}}"}}}},"Config":{"FeatureGates":["monotoniccounter"]}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, err := Parse(raw)
		if err == nil && hasExactDuplicate(raw) {
			t.Fatalf("Parse accepted a document with a repeated key: %q", raw)
		}
		if err != nil {
			if m != nil || !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), "unmarshaling manifest: ") {
				t.Fatalf("Parse error breaks its contract: %v (manifest %v)", err, m)
			}
			return
		}
		if m == nil {
			t.Fatal("Parse returned neither a manifest nor an error")
		}
		if err := m.Validate(); err != nil {
			var verr *ValidationError
			if !errors.As(err, &verr) || !errors.Is(err, ErrInvalid) || verr.Message == "" {
				t.Fatalf("Validate error breaks its contract: %#v", err)
			}
			if again := m.Validate(); again == nil || again.Error() != err.Error() {
				t.Fatalf("Validate is not deterministic: %v, then %v", err, again)
			}
		}
		m.IsPackageUpdate()
		m.UpdateManifestUsers()
		m.FeatureEnabled(FeatureSignQuoteEndpoint)
		if err := m.ValidatePackageUpdate(m.Packages); err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("ValidatePackageUpdate error does not wrap ErrInvalid: %v", err)
		}
		if RecoveryKeysChanged(m, m) {
			t.Fatal("a manifest changes its own recovery keys")
		}
		for _, marble := range m.Marbles {
			for _, files := range []map[string]File{marble.Parameters.Files, marble.Parameters.Env} {
				for _, file := range files {
					checkFileRoundTrip(t, file)
					if !file.NoTemplates {
						checkNestingBound(t, file.Data)
					}
				}
			}
		}
		_, _ = json.Marshal(m) // must not panic; errors (e.g. odd certificate templates) are fine
	})
}

// checkFileRoundTrip checks that a parsed File marshals and parses back to
// itself.
func checkFileRoundTrip(t *testing.T, file File) {
	t.Helper()
	raw, err := json.Marshal(file)
	if err != nil {
		t.Fatalf("Marshal(%#v): %v", file, err)
	}
	var back File
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatalf("Unmarshal(%s): %v", raw, err)
	}
	// JSON strings cannot carry invalid UTF-8: encoding "string" replaces it.
	if back != file && (file.Encoding != EncodingString || strings.ToValidUTF8(file.Data, "\uFFFD") == file.Data) {
		t.Fatalf("round trip of %#v gave %#v", file, back)
	}
}

// FuzzTemplate checks the template nesting estimate against the real parser,
// that rendering any template neither panics nor escapes its budget, and
// that a text without an action renders as text/template renders it.
func FuzzTemplate(f *testing.F) {
	for _, seed := range []string{
		"", "plain {text} }} \x00", "{{if 1}}{{else if 2}}{{end}}", `{{print "}}{{if 1}}"}}`, "{{/* {{if */}}", "{{`}}`}}{{with 1}}{{end}}",
		`{{define "a"}}{{range 3}}{{template "a"}}{{end}}{{end}}{{template "a"}}`,
		`{{printf "%08x|%s" (raw .Secrets.sym) .Secrets}}`, `{{pem .Secrets.cert.Cert}}{{hex .Secrets.plain}}`,
		"{{- if 1 -}}{{- range $i, $x := .Secrets -}}{{$i}}{{- end -}}{{- end -}}",
		`{{if 0}}{{.Secrets.nope.Type}}{{$.Previous.Secrets.x}}{{index $.Secrets "y"}}{{(.MarbleRun).Z}}{{end}}`,
		`{{with .Secrets}}{{.nope}}{{else with .MarbleRun}}{{.RootCA.Cert.X}}{{end}}{{$ := 1}}{{$.Secrets.q}}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		checkNestingBound(t, text)
		if !strings.Contains(text, "{{") {
			samePlainRendering(t, text, maxTemplateOutput)
		}
		data := testTemplateData()
		for _, strict := range []bool{false, true} {
			r := newRenderer(data, newBudget(), false)
			if strict { // as in the dry run
				r.defined = func(name string) bool { _, ok := data.Secrets[name]; return ok }
			}
			_, _ = r.file("/f", File{Data: text})
			_, _ = r.env("E", File{Data: text})
			if r.b.work < -1<<30 || r.b.out < -1<<30 {
				t.Fatalf("budget overspent: %+v", *r.b)
			}
		}
	})
}
