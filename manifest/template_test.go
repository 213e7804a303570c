package manifest

import (
	"bytes"
	"encoding/pem"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"text/template/parse"
)

// testTemplateData has distinct values everywhere, so outputs show which
// value a template reached.
func testTemplateData() *TemplateData {
	secrets := map[string]TemplateSecret{
		"cert": {Type: SecretTypeCertECDSA, Size: 256, Shared: true, ValidFor: 365,
			Cert: CertDER("cert-der"), Private: PrivateKey("cert-priv"), Public: PublicKey("cert-pub")},
		"sym":       {Type: SecretTypeSymmetric, Size: 16, Private: PrivateKey("0123456789abcdef"), Public: PublicKey("0123456789abcdef")},
		"plain":     {Type: SecretTypePlain, UserDefined: true, Private: PrivateKey("hunter2"), Public: PublicKey("hunter2")},
		"plainNUL":  {Type: SecretTypePlain, UserDefined: true, Private: PrivateKey("a\x00b"), Public: PublicKey("a\x00b")},
		"notLoaded": {Type: SecretTypePlain, UserDefined: true},
	}
	previous := map[string]TemplateSecret{
		"sym": {Type: SecretTypeSymmetric, Size: 16, Private: PrivateKey("fedcba9876543210"), Public: PublicKey("fedcba9876543210")},
	}
	return &TemplateData{
		MarbleRun: TemplateMarbleRun{
			RootCA:                  TemplateSecret{Cert: CertDER("root-ca")},
			MarbleCert:              TemplateSecret{Cert: CertDER("marble-cert"), Private: PrivateKey("marble-priv"), Public: PublicKey("marble-pub")},
			CoordinatorRoot:         TemplateSecret{Cert: CertDER("coord-root")},
			CoordinatorIntermediate: TemplateSecret{Cert: CertDER("coord-int")},
		},
		Secrets:  secrets,
		Previous: TemplatePrevious{Secrets: previous},
	}
}

func pemText(typ, data string) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: []byte(data)}))
}

func TestRenderFiles(t *testing.T) {
	tests := []struct {
		name, template, want string
	}{
		{"text only", "hello", "hello"},
		{"empty", "", ""},
		{"pem of certificate", "{{pem .Secrets.cert.Cert}}", pemText("CERTIFICATE", "cert-der")},
		{"pem of public key", "{{pem .Secrets.cert.Public}}", pemText("PUBLIC KEY", "cert-pub")},
		{"pem of private key", "{{pem .Secrets.cert.Private}}", pemText("PRIVATE KEY", "cert-priv")},
		{"pem of symmetric key", "{{pem .Secrets.sym.Private}}", pemText("PRIVATE KEY", "0123456789abcdef")},
		{"raw of whole secret is Public", "{{raw .Secrets.cert}}", "cert-pub"},
		{"raw of certificate is DER", "{{raw .Secrets.cert.Cert}}", "cert-der"},
		{"raw of symmetric key", "{{raw .Secrets.sym}}", "0123456789abcdef"},
		{"hex", "{{hex .Secrets.sym.Private}}", "30313233343536373839616263646566"},
		{"hex of whole secret", "{{hex .Secrets.plain}}", "68756e74657232"},
		{"base64", "{{base64 .Secrets.cert.Cert}}", "Y2VydC1kZXI="},
		{"plain fields", "{{.Secrets.cert.Type}} {{.Secrets.cert.Size}} {{.Secrets.cert.Shared}} {{.Secrets.cert.UserDefined}} {{.Secrets.cert.ValidFor}}", "cert-ecdsa 256 true false 365"},
		{"previous secrets", "{{raw .Previous.Secrets.sym}}", "fedcba9876543210"},
		{"Coordinator certificates", "{{raw .MarbleRun.RootCA.Cert}}|{{raw .MarbleRun.CoordinatorRoot.Cert}}|{{raw .MarbleRun.CoordinatorIntermediate.Cert}}", "root-ca|coord-root|coord-int"},
		{"Marble certificate", "{{raw .MarbleRun.MarbleCert.Cert}}|{{raw .MarbleRun.MarbleCert.Public}}|{{raw .MarbleRun.MarbleCert.Private}}", "marble-cert|marble-pub|marble-priv"},
		{"builtins", `{{printf "%s=%d" "n" (len .Secrets)}} {{index .Secrets "sym" | hex}} {{if eq .Secrets.sym.Type "symmetric-key"}}yes{{end}}`, "n=5 30313233343536373839616263646566 yes"},
		{"range over secrets", `{{range $name, $s := .Secrets}}{{$name}},{{end}}`, "cert,notLoaded,plain,plainNUL,sym,"},
		{"defined templates", `{{define "x"}}<{{.}}>{{end}}{{template "x" 1}}{{template "x" 2}}`, "<1><2>"},
		{"raw may write NUL into a file", "{{raw .Secrets.plainNUL}}", "a\x00b"},
		{"print and println", `{{print 1 2 "a"}}{{println "b" 3}}`, "1 2ab 3\n"},
		{"escapers", `{{html "<a>"}} {{js "'"}} {{urlquery "a b"}}`, `&lt;a&gt; \' a+b`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Parameters{Files: map[string]File{"/f": {Data: tt.template}}}
			got, err := p.Render(testTemplateData())
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if string(got.Files["/f"]) != tt.want {
				t.Errorf("got %q, want %q", got.Files["/f"], tt.want)
			}
		})
	}
}

func TestRenderEnv(t *testing.T) {
	tests := []struct {
		name, template, want string
	}{
		{"string of plain secret", "{{string .Secrets.plain}}", "hunter2"},
		{"pem", "{{pem .MarbleRun.MarbleCert.Cert}}", pemText("CERTIFICATE", "marble-cert")},
		{"hex", "{{hex .Secrets.sym}}", "30313233343536373839616263646566"},
		{"base64", "{{base64 .Secrets.plain}}", "aHVudGVyMg=="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Parameters{Env: map[string]File{"E": {Data: tt.template}}}
			got, err := p.Render(testTemplateData())
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if string(got.Env["E"]) != tt.want {
				t.Errorf("got %q, want %q", got.Env["E"], tt.want)
			}
		})
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		name   string
		params Parameters
		want   string
	}{
		{"missing secret", Parameters{Files: map[string]File{"/f": {Data: "{{raw .Secrets.nope}}"}}},
			`file /f: template: /f:1:2: executing "/f" at <raw .Secrets.nope>: error calling raw: secret does not exist`},
		{"nil secret", Parameters{Files: map[string]File{"/f": {Data: "{{hex nil}}"}}},
			`file /f: template: /f:1:2: executing "/f" at <hex nil>: error calling hex: secret does not exist`},
		{"nil pem", Parameters{Files: map[string]File{"/f": {Data: "{{pem nil}}"}}},
			`file /f: template: /f:1:2: executing "/f" at <pem nil>: error calling pem: secret does not exist`},
		{"raw of a string", Parameters{Files: map[string]File{"/f": {Data: `{{raw "x"}}`}}},
			`file /f: template: /f:1:2: executing "/f" at <raw "x">: error calling raw: invalid secret type for raw encoding`},
		{"user-defined secret not uploaded", Parameters{Files: map[string]File{"/f": {Data: "{{base64 .Secrets.notLoaded}}"}}},
			`file /f: template: /f:1:2: executing "/f" at <base64 .Secrets.notLoaded>: error calling base64: tried to parse secret with empty value`},
		{"pem of bytes of a whole secret", Parameters{Files: map[string]File{"/f": {Data: "{{pem .Secrets.sym}}"}}},
			`file /f: template: /f:1:2: executing "/f" at <pem .Secrets.sym>: error calling pem: invalid secret type for pem encoding`},
		{"string in files", Parameters{Files: map[string]File{"/f": {Data: "{{string .Secrets.plain}}"}}},
			`file /f: template: /f:1: function "string" not defined (Files allow pem, raw, hex, base64, and print, printf, println, html, js, urlquery, len, index, slice and the other built-ins of Go's text/template; for a secret's bytes in Files use "raw"; see docs/marbles.md)`},
		{"raw in env", Parameters{Env: map[string]File{"E": {Data: "{{raw .Secrets.plain}}"}}},
			`env variable E: template: E:1: function "raw" not defined (Env allow pem, string, hex, base64, and print, printf, println, html, js, urlquery, len, index, slice and the other built-ins of Go's text/template; for a plain secret in Env use "string"; see docs/marbles.md)`},
		{"unknown function in env", Parameters{Env: map[string]File{"E": {Data: "{{upper .Secrets.plain}}"}}},
			`env variable E: template: E:1: function "upper" not defined (Env allow pem, string, hex, base64, and print, printf, println, html, js, urlquery, len, index, slice and the other built-ins of Go's text/template; see docs/marbles.md)`},
		{"string of symmetric key", Parameters{Env: map[string]File{"E": {Data: "{{string .Secrets.sym}}"}}},
			`env variable E: template: E:1:2: executing "E" at <string .Secrets.sym>: error calling string: only secrets of type plain are allowed to use string encoding for environment variables`},
		{"string of key bytes", Parameters{Env: map[string]File{"E": {Data: "{{string .Secrets.plain.Private}}"}}},
			`env variable E: template: E:1:2: executing "E" at <string .Secrets.plain.Private>: error calling string: only secrets of type plain are allowed to use string encoding for environment variables`},
		{"string with NUL", Parameters{Env: map[string]File{"E": {Data: "{{string .Secrets.plainNUL}}"}}},
			`env variable E: template: E:1:2: executing "E" at <string .Secrets.plainNUL>: error calling string: secret contains null bytes`},
		{"string not uploaded", Parameters{Env: map[string]File{"E": {Data: "{{string .Secrets.notLoaded}}"}}},
			`env variable E: template: E:1:2: executing "E" at <string .Secrets.notLoaded>: error calling string: tried to parse secret with empty value`},
		{"string of nil", Parameters{Env: map[string]File{"E": {Data: "{{string nil}}"}}},
			`env variable E: template: E:1:2: executing "E" at <string nil>: error calling string: secret does not exist`},
		{"NUL in env data", Parameters{Env: map[string]File{"E": {Data: "a\x00", NoTemplates: true}}},
			`env variable: E: content contains null bytes`},
		{"NUL from hex-decoded env template", Parameters{Env: map[string]File{"E": {Data: "\x00{{1}}", Encoding: EncodingHex}}},
			`env variable: E: content contains null bytes`},
		{"unknown field", Parameters{Files: map[string]File{"/f": {Data: "{{.Nope}}"}}},
			`file /f: template: /f:1:2: executing "/f" at <.Nope>: can't evaluate field Nope in type *manifest.TemplateData`},
		{"first file in sorted order", Parameters{Files: map[string]File{"/b": {Data: "{{"}, "/a": {Data: "{{raw nil}}"}}},
			`file /a: template: /a:1:2: executing "/a" at <raw nil>: error calling raw: secret does not exist`},
		{"percent in a file name", Parameters{Files: map[string]File{"/%s%d": {Data: "{{end}}"}}},
			`file /%s%d: template: template:1: unexpected {{end}}`},
		{"files before env", Parameters{Files: map[string]File{"/z": {Data: "{{"}}, Env: map[string]File{"A": {Data: "{{"}}},
			`file /z: template: /z:1: unclosed action`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.params.Render(testTemplateData())
			if err == nil {
				t.Fatalf("Render succeeded: %+v", got)
			}
			if err.Error() != tt.want {
				t.Errorf("error:\n got %q\nwant %q", err, tt.want)
			}
		})
	}
}

func TestRenderParameters(t *testing.T) {
	p := Parameters{
		Files: map[string]File{
			"/t": {Data: "{{hex .Secrets.sym}}"},
			"/n": {Data: "{{hex .Secrets.sym}}", NoTemplates: true},
			"/e": {Data: ""},
		},
		Env:  map[string]File{"T": {Data: "{{string .Secrets.plain}}"}, "N": {Data: "{{x", NoTemplates: true}},
		Argv: []string{"./app", "{{not a template}}"},
	}
	got, err := p.Render(testTemplateData())
	if err != nil {
		t.Fatal(err)
	}
	want := &RenderedParameters{
		Files: map[string][]byte{"/t": []byte("30313233343536373839616263646566"), "/n": []byte("{{hex .Secrets.sym}}"), "/e": {}},
		Env:   map[string][]byte{"T": []byte("hunter2"), "N": []byte("{{x")},
		Argv:  []string{"./app", "{{not a template}}"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	got.Argv[0] = "changed"
	if p.Argv[0] != "./app" {
		t.Error("Render shares Argv with its input")
	}

	empty, err := Parameters{}.Render(nil)
	if err != nil || empty.Files != nil || empty.Env != nil || empty.Argv != nil {
		t.Errorf("Render of empty parameters = %+v, %v", empty, err)
	}
}

func TestSecretBytes(t *testing.T) {
	for _, v := range []any{[]byte("x"), CertDER("x"), PrivateKey("x"), PublicKey("x"), TemplateSecret{Public: PublicKey("x")}, &TemplateSecret{Public: PublicKey("x")}} {
		if b, err := secretBytes(v, "raw"); err != nil || string(b) != "x" {
			t.Errorf("secretBytes(%#v) = %q, %v", v, b, err)
		}
	}
	if _, err := secretBytes((*TemplateSecret)(nil), "raw"); !errors.Is(err, errSecretMissing) {
		t.Errorf("nil *TemplateSecret: %v", err)
	}
	if _, err := secretBytes([]byte{}, "raw"); !errors.Is(err, errSecretEmpty) {
		t.Errorf("empty bytes: %v", err)
	}
	if s, err := encodeString(&TemplateSecret{Type: SecretTypePlain, Public: PublicKey("p")}); err != nil || s != "p" {
		t.Errorf("encodeString(*TemplateSecret) = %q, %v", s, err)
	}
}

// TestRenderLimits checks that hostile templates fail fast instead of
// exhausting the Coordinator.
func TestRenderLimits(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("{{if 1}}", n) + "x" + strings.Repeat("{{end}}", n) }
	tests := []struct {
		name, template string
		want           string // a substring of the error; "" means success
	}{
		{"nesting at the limit", nest(maxTemplateNesting), ""},
		{"nesting above the limit", nest(maxTemplateNesting + 1), "actions nested 101 deep, more than 100 levels"},
		{"deep nesting that would overflow the parser", nest(1 << 20), "more than 100 levels"},
		{"long else-if chain", "{{if 0}}" + strings.Repeat("{{else if 0}}", 1000) + "{{end}}", "more than 100 levels"},
		{"endless range", "{{range 1000000000}}{{end}}", "exceeds its work budget"},
		{"exponential template calls", `{{define "a"}}{{template "b"}}{{template "b"}}{{end}}{{define "b"}}{{range 1000}}{{end}}{{end}}{{range 100000}}{{template "a"}}{{end}}`, "exceeds its work budget"},
		{"recursive template", `{{define "a"}}{{template "a"}}{{end}}{{template "a"}}`, "template calls nested more than 16 deep"},
		{"recursion in nested loops", `{{define "a"}}` + strings.Repeat("{{range 1}}", 99) + `{{template "a"}}` + strings.Repeat("{{end}}", 99) + `{{end}}{{template "a"}}`, "template calls nested more than 16 deep"},
		{"template calls at the limit", `{{define "a"}}{{if lt (len $) 15}}{{template "a" (printf "%sx" $)}}{{end}}{{end}}{{template "a" ""}}`, ""},
		{"template calls above the limit", `{{define "a"}}{{if lt (len $) 16}}{{template "a" (printf "%sx" $)}}{{end}}{{end}}{{template "a" ""}}`, "template calls nested more than 16 deep"},
		{"sequential template calls", `{{define "a"}}x{{end}}{{range 100}}{{template "a"}}{{end}}`, ""},
		{"budget functions are private", `{{quarryTemplateReturn}}`, `function "quarryTemplateReturn" not defined`},
		{"budget functions are private in pipelines", `{{1 | quarryTemplateBudget}}`, `function "quarryTemplateBudget" not defined`},
		{"budget functions are private in parentheses", `{{print (quarryTemplateCall 0)}}`, `function "quarryTemplateCall" not defined`},
		{"printf width", `{{printf "%01000000d" 1}}`, "result would exceed 262144 bytes"},
		{"printf star width", `{{printf "%*d" 1000000 1}}`, "result would exceed 262144 bytes"},
		{"doubling string", `{{$x := "ab"}}{{range 100}}{{$x = printf "%s%s" $x $x}}{{end}}`, "result would exceed 262144 bytes"},
		{"doubling print", `{{$x := "ab"}}{{range 100}}{{$x = print $x $x}}{{end}}`, "result would exceed 262144 bytes"},
		{"doubling js", `{{$x := "\\\\"}}{{range 100}}{{$x = js $x}}{{end}}`, "result would exceed 262144 bytes"},
		{"long string constant", `{{"` + strings.Repeat("a", maxTemplateLiteral+1) + `"}}`, "string constant longer than 65536 bytes"},
		{"long raw string constant", "{{len `" + strings.Repeat("a", maxTemplateLiteral+1) + "`}}", "string constant longer than 65536 bytes"},
		{"a normal loop", `{{range $i, $x := .Secrets}}{{range 100}}{{printf "%08d" $i}}{{end}}{{end}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRenderer(testTemplateData(), newBudget(), false)
			_, err := r.file("/f", File{Data: tt.template})
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestRenderOutputLimit(t *testing.T) {
	r := newRenderer(testTemplateData(), &budget{work: maxTemplateWork, out: 10}, true)
	if _, err := r.file("/a", File{Data: "{{hex .Secrets.sym}}"}); err == nil || !strings.Contains(err.Error(), "template output exceeds") {
		t.Errorf("error %v, want the output limit", err)
	}
	r = newRenderer(testTemplateData(), &budget{work: maxTemplateWork, out: 10}, true)
	if _, err := r.file("/a", File{Data: "0123456789"}); err != nil {
		t.Errorf("output at the limit: %v", err)
	}
}

// TestDryRunBudgetIsShared checks that one budget covers all Marbles of a
// manifest: many Marbles that each loop a little must not add up to a lot.
func TestDryRunBudgetIsShared(t *testing.T) {
	m := loadFixture(t, "minimal.json")
	for i := range 100 {
		m.Marbles[strings.Repeat("m", i+1)] = Marble{Package: "app", Parameters: Parameters{
			Files: map[string]File{"/f": {Data: "{{range 1000}}{{range 100}}{{end}}{{end}}"}},
		}}
	}
	err := m.Validate()
	if err == nil || !strings.Contains(err.Error(), "exceeds its work budget") {
		t.Fatalf("Validate = %v, want a work budget error", err)
	}
}

func TestPrintfEstimate(t *testing.T) {
	tests := []struct {
		format string
		args   []any
		atMost int64
	}{
		{"plain", nil, 5},
		{"%d", []any{1}, 200},
		{"%10d", []any{1}, 300},
		{"%.3f", []any{1.5}, 300},
		{"%x", []any{[]byte("abc")}, 200},
		{"%%", nil, 10},
	}
	for _, tt := range tests {
		est := printfEstimate(tt.format, tt.args)
		got := int64(len(fmt.Sprintf(tt.format, tt.args...)))
		if est < got {
			t.Errorf("printfEstimate(%q) = %d, below the real length %d", tt.format, est, got)
		}
		if est > tt.atMost {
			t.Errorf("printfEstimate(%q) = %d, want at most %d", tt.format, est, tt.atMost)
		}
	}
	if est := printfEstimate("%[1]*d", []any{5, 1}); est <= maxTemplateValue {
		t.Errorf("a '*' width must exceed the value limit, got %d", est)
	}
	if est := printfEstimate("%08d", []any{make([]int, 1000)}); est < 8*1000 {
		t.Errorf("a width applies to every element, got %d", est)
	}
}

func TestTemplateNesting(t *testing.T) {
	tests := []struct {
		text string
		want int
	}{
		{"", 0},
		{"no actions {", 0},
		{"{{.}}", 0},
		{"{{if 1}}{{end}}", 1},
		{"{{if 1}}{{range .}}{{with .}}{{end}}{{end}}{{end}}", 3},
		{"{{if 1}}{{end}}{{if 1}}{{end}}", 1},
		{"{{if 1}}{{else if 2}}{{else if 3}}{{end}}", 3},
		{"{{if 1}}{{else if 2}}{{end}}{{if 1}}{{end}}", 2},
		{"{{with 1}}{{else with 2}}{{end}}", 2},
		{"{{range 1}}{{else}}{{end}}", 1},
		{"{{- if 1 -}} {{- end -}}", 1},
		{"{{\tif\n1}}{{end}}", 1},
		{`{{define "a"}}{{if 1}}{{end}}{{end}}`, 2},
		{`{{block "a" .}}{{if 1}}{{end}}{{end}}`, 2},
		{`{{"{{if 1}}"}}`, 0},
		{"{{`{{if 1}}`}}", 0},
		{`{{print "}}{{if 1}}"}}`, 0},
		{`{{print "\"}}{{if 1}}"}}`, 0},
		{"{{print `}}`}}{{if 1}}{{end}}", 1},
		{`{{print '}'}}{{if 1}}{{end}}`, 1},
		{"{{/* {{if 1}} */}}", 0},
		{"{{- /* }} {{if 1}} */ -}}{{if 1}}{{end}}", 1},
		{"{{end}}{{end}}{{if 1}}{{end}}", 1},
		{"{{ifx}}", 0},
		{"{{if}}", 1},
		{"{{if 1}}{{if 1}}", 2},
	}
	for _, tt := range tests {
		if got := templateNesting(tt.text); got != tt.want {
			t.Errorf("templateNesting(%q) = %d, want %d", tt.text, got, tt.want)
		}
		checkNestingBound(t, tt.text)
	}
}

// checkNestingBound checks that templateNesting does not under-estimate the
// depth of the tree text/template parses from text.
func checkNestingBound(t testing.TB, text string) {
	t.Helper()
	est := templateNesting(text)
	if est > maxTemplateNesting {
		return // never given to the parser
	}
	trees := make(map[string]*parse.Tree)
	tr := parse.New("t")
	tr.Mode = parse.SkipFuncCheck
	if _, err := tr.Parse(text, "", "", trees); err != nil {
		return
	}
	for name, tree := range trees {
		depth := listDepth(tree.Root)
		if name != "t" {
			depth++ // the define or block itself
		}
		if depth > est {
			t.Fatalf("templateNesting(%q) = %d, but the parsed tree %q is %d deep", text, est, name, depth)
		}
	}
}

func listDepth(l *parse.ListNode) int {
	if l == nil {
		return 0
	}
	deepest := 0
	for _, n := range l.Nodes {
		var b *parse.BranchNode
		switch n := n.(type) {
		case *parse.IfNode:
			b = &n.BranchNode
		case *parse.RangeNode:
			b = &n.BranchNode
		case *parse.WithNode:
			b = &n.BranchNode
		default:
			continue
		}
		deepest = max(deepest, 1+max(listDepth(b.List), listDepth(b.ElseList)))
	}
	return deepest
}

// samePlainRendering checks that a text without an action renders, on the
// shortcut execute takes, exactly as text/template renders it: the same
// output, the same NUL report, the same error, the same budget charged.
func samePlainRendering(t *testing.T, text string, outBudget int64) {
	t.Helper()
	for _, keep := range []bool{true, false} {
		fast := newRenderer(testTemplateData(), newBudget(), keep)
		slow := newRenderer(testTemplateData(), newBudget(), keep)
		fast.b.out, slow.b.out = outBudget, outBudget
		gotOut, gotNUL, gotErr := fast.execute("E", text, fast.envFunc)
		wantOut, wantNUL, wantErr := slow.executeTemplate("E", text, slow.envFunc)
		if !bytes.Equal(gotOut, wantOut) || (gotOut == nil) != (wantOut == nil) || gotNUL != wantNUL || !sameError(gotErr, wantErr) {
			t.Fatalf("keep=%v, %q: the shortcut gives (%q, nul %v, %v), text/template (%q, nul %v, %v)", keep, text, gotOut, gotNUL, gotErr, wantOut, wantNUL, wantErr)
		}
		if fast.b.out != slow.b.out || fast.b.work != slow.b.work {
			t.Fatalf("keep=%v, %q: the shortcut leaves the budget at out %d, work %d; text/template at %d, %d", keep, text, fast.b.out, fast.b.work, slow.b.out, slow.b.work)
		}
	}
}

// TestPlainTextRendersAsItself: a text with no "{{" is not parsed as a
// template; what it renders to must not change because of that.
func TestPlainTextRendersAsItself(t *testing.T) {
	for _, text := range []string{
		"", "production", "8080", "{", "}", "}}", "{ {", "a{b}c", "{}{", "%s %v %!", "line 1\nline 2\r\n",
		"nul\x00inside", "\x00", "ünïcödé ✓",
		strings.Repeat("x", 1<<16),
	} {
		samePlainRendering(t, text, maxTemplateOutput)
	}
	// The output budget runs out the same way.
	samePlainRendering(t, "0123456789", 9)
	samePlainRendering(t, "0123456789", 10)
	samePlainRendering(t, "", 0)
}

// sameError: both nil, or one wraps the other.
func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return errors.Is(a, b) || errors.Is(b, a)
}
