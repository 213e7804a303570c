package manifest

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"text/template"
)

// TemplateData is the data root of File and Env templates:
// {{.Secrets.<name>}}, {{.Previous.Secrets.<name>}} and {{.MarbleRun.<cert>}}.
type TemplateData struct {
	MarbleRun TemplateMarbleRun
	Secrets   map[string]TemplateSecret
	Previous  TemplatePrevious
}

// TemplateMarbleRun holds the Coordinator's certificates and the activated
// Marble's own certificate and key as templates see them.
type TemplateMarbleRun struct {
	RootCA                  TemplateSecret // the Marble Root certificate (Cert only)
	MarbleCert              TemplateSecret // the Marble's leaf: Cert, Public, Private
	CoordinatorRoot         TemplateSecret // Cert only
	CoordinatorIntermediate TemplateSecret // Cert only
}

// TemplatePrevious holds the secret values from before the last full update
// or root-secret rotation.
type TemplatePrevious struct {
	Secrets map[string]TemplateSecret
}

// TemplateSecret is a secret as templates see it. The byte fields have
// distinct types so that the pem function knows which PEM type to write.
type TemplateSecret struct {
	Type        string
	Size        uint
	Shared      bool
	UserDefined bool
	ValidFor    uint
	Cert        CertDER
	Private     PrivateKey
	Public      PublicKey
}

// CertDER is a DER-encoded certificate; pem writes it as "CERTIFICATE".
type CertDER []byte

// PrivateKey is a PKCS#8 DER private key, or the key or data itself for
// symmetric-key and plain secrets; pem writes it as "PRIVATE KEY".
type PrivateKey []byte

// PublicKey is a PKIX DER public key, or the key or data itself for
// symmetric-key and plain secrets; pem writes it as "PUBLIC KEY".
type PublicKey []byte

// RenderedParameters are a Marble's parameters after template execution.
type RenderedParameters struct {
	Files map[string][]byte
	Env   map[string][]byte
	Argv  []string
}

// Render executes the File and Env templates of p against data, in sorted
// key order, and returns the results; Argv is copied unchanged. Entries with
// NoTemplates are delivered as they are. Env values must not contain NUL.
// Errors name the entry: "file <path>: <cause>", "env variable <name>:
// <cause>", or "env variable: <name>: content contains null bytes".
//
// Execution is bounded: templates may nest at most 100 levels, loops and
// template calls share a work budget, and the output of one call to Render
// is limited to 64 MiB.
func (p Parameters) Render(data *TemplateData) (*RenderedParameters, error) {
	if data == nil {
		data = &TemplateData{}
	}
	r := newRenderer(data, newBudget(), true)
	out := &RenderedParameters{Argv: slices.Clone(p.Argv)}
	if len(p.Files) > 0 {
		out.Files = make(map[string][]byte, len(p.Files))
	}
	for _, path := range slices.Sorted(maps.Keys(p.Files)) {
		b, err := r.file(path, p.Files[path])
		if err != nil {
			return nil, err
		}
		out.Files[path] = b
	}
	if len(p.Env) > 0 {
		out.Env = make(map[string][]byte, len(p.Env))
	}
	for _, name := range slices.Sorted(maps.Keys(p.Env)) {
		b, err := r.env(name, p.Env[name])
		if err != nil {
			return nil, err
		}
		out.Env[name] = b
	}
	return out, nil
}

// Errors of the encoding functions, with MarbleRun's texts.
var (
	errSecretMissing = errors.New("secret does not exist")
	errSecretEmpty   = errors.New("tried to parse secret with empty value")
	errPemType       = errors.New("invalid secret type for pem encoding")
	errStringType    = errors.New("only secrets of type plain are allowed to use string encoding for environment variables")
	errStringNUL     = errors.New("secret contains null bytes")
	errContentNUL    = errors.New("content contains null bytes")
)

// renderer executes templates against one TemplateData with one budget.
// The dry run shares a renderer between all Marbles of a manifest, so the
// budget bounds the whole manifest.
type renderer struct {
	data     *TemplateData
	b        *budget
	keep     bool // keep the output; the dry run only counts it
	fileFunc template.FuncMap
	envFunc  template.FuncMap
	// defined, if set (the dry run), reports whether the manifest defines
	// a secret: templates must not name others (see checkReferences), and
	// a missing map entry fails execution instead of rendering as nothing.
	defined func(name string) bool
}

// newRenderer returns a renderer that keeps its output, or only counts it
// (for the dry run).
func newRenderer(data *TemplateData, b *budget, keep bool) *renderer {
	r := &renderer{data: data, b: b, keep: keep}
	common := b.funcs()
	r.fileFunc = template.FuncMap{
		"pem":    b.charged(encodePEM),
		"raw":    b.charged(encodeRaw),
		"hex":    b.charged(encodeHex),
		"base64": b.charged(encodeBase64),
	}
	r.envFunc = template.FuncMap{
		"pem":    b.charged(encodePEM),
		"hex":    b.charged(encodeHex),
		"base64": b.charged(encodeBase64),
		"string": b.charged(encodeString),
	}
	maps.Copy(r.fileFunc, common)
	maps.Copy(r.envFunc, common)
	return r
}

// file renders one file.
func (r *renderer) file(path string, f File) ([]byte, error) {
	if f.NoTemplates {
		return []byte(f.Data), nil
	}
	out, _, err := r.execute(path, f.Data, r.fileFunc)
	if err != nil {
		return nil, fmt.Errorf("file %s: %w", path, err)
	}
	return out, nil
}

// env renders one environment variable. The value must not contain NUL,
// neither before nor after rendering.
func (r *renderer) env(name string, f File) ([]byte, error) {
	if strings.IndexByte(f.Data, 0) >= 0 {
		return nil, fmt.Errorf("env variable: %s: %w", name, errContentNUL)
	}
	if f.NoTemplates {
		return []byte(f.Data), nil
	}
	out, nul, err := r.execute(name, f.Data, r.envFunc)
	if err != nil {
		return nil, fmt.Errorf("env variable %s: %w", name, err)
	}
	if nul {
		return nil, fmt.Errorf("env variable: %s: %w", name, errContentNUL)
	}
	return out, nil
}

// execute renders text, as a template named name, within the renderer's
// budget. It returns the output (unless the renderer only counts it) and
// whether the output contains a NUL byte.
func (r *renderer) execute(name, text string, funcs template.FuncMap) ([]byte, bool, error) {
	if !strings.Contains(text, "{{") {
		return r.plain(text)
	}
	return r.executeTemplate(name, text, funcs)
}

// executeTemplate parses text as a template named name and runs it (see
// execute).
func (r *renderer) executeTemplate(name, text string, funcs template.FuncMap) ([]byte, bool, error) {
	if d := templateNesting(text); d > maxTemplateNesting {
		return nil, false, fmt.Errorf("template: %s: actions nested %d deep, more than %d levels", name, d, maxTemplateNesting)
	}
	if strings.Contains(name, "%") {
		// text/template formats parse errors with the name as part of the
		// format string: a '%' would print the parser's internals.
		name = "template"
	}
	t := template.New(name).Funcs(funcs)
	if r.defined != nil {
		t.Option("missingkey=error") // before Parse: defined templates copy it
	}
	t, err := t.Parse(text)
	if err != nil {
		return nil, false, explainUndefined(err, funcs)
	}
	if r.defined != nil {
		if err := checkReferences(t.Tree, r.defined); err != nil {
			return nil, false, err
		}
	}
	if err := r.b.instrument(t); err != nil {
		return nil, false, fmt.Errorf("template: %s: %w", name, err)
	}
	w := &limitedWriter{b: r.b, keep: r.keep}
	r.b.calls = 0
	if err := t.Execute(w, r.data); err != nil {
		return nil, false, err
	}
	return w.output()
}

// plain renders a text without an action: text/template starts an action
// only at "{{", so such a text renders as itself. Building a template for
// it (the functions checked, the text parsed) costs far more than its
// output, and most Env values and many files have no action. The output
// is charged to the budget as Execute would write it.
func (r *renderer) plain(text string) ([]byte, bool, error) {
	w := &limitedWriter{b: r.b, keep: r.keep}
	if text != "" {
		if _, err := w.Write([]byte(text)); err != nil {
			return nil, false, err
		}
	}
	return w.output()
}

// secretBytes resolves the argument of raw, hex and base64: bytes of any of
// the secret types, or a whole secret, which stands for its Public value.
func secretBytes(v any, encoding string) ([]byte, error) {
	var b []byte
	switch v := v.(type) {
	case nil:
		return nil, errSecretMissing
	case *TemplateSecret:
		if v == nil {
			return nil, errSecretMissing
		}
		b = v.Public
	case TemplateSecret:
		b = v.Public
	case CertDER:
		b = v
	case PrivateKey:
		b = v
	case PublicKey:
		b = v
	case []byte:
		b = v
	default:
		return nil, fmt.Errorf("invalid secret type for %s encoding", encoding)
	}
	if len(b) == 0 {
		return nil, errSecretEmpty
	}
	return b, nil
}

// encodePEM writes a certificate, public or private key as PEM.
func encodePEM(v any) (string, error) {
	var typ string
	var b []byte
	switch v := v.(type) {
	case nil:
		return "", errSecretMissing
	case CertDER:
		typ, b = "CERTIFICATE", v
	case PublicKey:
		typ, b = "PUBLIC KEY", v
	case PrivateKey:
		typ, b = "PRIVATE KEY", v
	default:
		return "", errPemType
	}
	if len(b) == 0 {
		return "", errSecretEmpty
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b})), nil
}

func encodeRaw(v any) (string, error) {
	b, err := secretBytes(v, "raw")
	return string(b), err
}

func encodeHex(v any) (string, error) {
	b, err := secretBytes(v, "hex")
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func encodeBase64(v any) (string, error) {
	b, err := secretBytes(v, "base64")
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

// encodeString returns the data of a plain secret (Env only).
func encodeString(v any) (string, error) {
	var s TemplateSecret
	switch v := v.(type) {
	case nil:
		return "", errSecretMissing
	case *TemplateSecret:
		if v == nil {
			return "", errSecretMissing
		}
		s = *v
	case TemplateSecret:
		s = v
	default:
		return "", errStringType
	}
	if s.Type != SecretTypePlain {
		return "", errStringType
	}
	if len(s.Public) == 0 {
		return "", errSecretEmpty
	}
	if slices.Contains(s.Public, 0) {
		return "", errStringNUL
	}
	return string(s.Public), nil
}

// encodingFuncs are the template functions of docs/marbles.md by where
// they are allowed.
var (
	fileEncodings = []string{"pem", "raw", "hex", "base64"}
	envEncodings  = []string{"pem", "string", "hex", "base64"}
)

// undefinedFunc matches text/template's parse error for a function that
// is not in the template's function map.
var undefinedFunc = regexp.MustCompile(`function "([^"]*)" not defined$`)

// explainUndefined adds to a parse error for an undefined function which
// functions the entry (a File or an Env variable) allows instead.
func explainUndefined(err error, funcs template.FuncMap) error {
	m := undefinedFunc.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	allowed, where := fileEncodings, "Files"
	if _, ok := funcs["string"]; ok {
		allowed, where = envEncodings, "Env"
	}
	hint := ""
	switch m[1] {
	case "raw":
		hint = `; for a plain secret in Env use "string"`
	case "string":
		hint = `; for a secret's bytes in Files use "raw"`
	}
	return fmt.Errorf("%w (%s allow %s, and print, printf, println, html, js, urlquery, len, index, slice and the other built-ins of Go's text/template%s; see docs/marbles.md)",
		err, where, strings.Join(allowed, ", "), hint)
}
