package manifest

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Duplicate keys. encoding/json lets the last of two equal keys win, merges
// two objects given for one key, and matches struct field names without
// regard to case: {"Packages":{…},"packages":{…}} is one manifest to Go and
// another to a case-sensitive parser (or to a reader who sees only the first
// key). Parse therefore refuses every object that names a member twice:
//
//   - members that decode into a struct field (the sections, every field of a
//     package, marble, secret, certificate template, …) are the same member
//     when encoding/json would put them into the same field: equal after
//     Unicode simple case folding, as bytes.EqualFold compares;
//   - members of objects that decode into a Go map (package, marble, secret,
//     user, role, recovery key, TLS tag and infrastructure names, Files and
//     Env) and of all other objects (unknown members, values of interface
//     type) are the same member only when their decoded names are equal.
//
// The walk follows the bytes that json.Unmarshal has already accepted, in
// step with the Go type each value decodes into, so it costs time linear in
// the size of the document.

// checkDuplicateKeys reports the first object in raw, a valid JSON document,
// that has two members for one key of a Manifest.
func checkDuplicateKeys(raw []byte) error {
	w := &dupWalker{data: raw}
	return w.value(manifestShape())
}

// duplicateKeyError names a repeated key and where it is.
type duplicateKeyError struct {
	first, second string // the two spellings, in document order
	path          string // JSON-path-like location of the object
}

func (e *duplicateKeyError) Error() string {
	if e.first == e.second {
		return fmt.Sprintf("duplicate key %s at %s", quoteClipped(e.first), e.path)
	}
	return fmt.Sprintf("duplicate key %s (also spelled %s) at %s", quoteClipped(e.first), quoteClipped(e.second), e.path)
}

// errBadJSON is returned if the walk meets bytes that are not valid JSON;
// Parse only walks documents json.Unmarshal accepted.
var errBadJSON = errors.New("malformed JSON")

// Message limits: keys and paths are shortened, not repeated in full.
const (
	maxQuotedKey = 64
	maxPathText  = 512
)

// quoteClipped quotes a key, shortened to maxQuotedKey bytes.
func quoteClipped(s string) string {
	if len(s) <= maxQuotedKey {
		return strconv.Quote(s)
	}
	cut := maxQuotedKey
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}

// shapeKind says how encoding/json decodes a JSON value into a Go type.
type shapeKind int

const (
	shapeAny    shapeKind = iota // interface, custom decoder, scalar: keys compare exactly, children are shapeAny
	shapeStruct                  // struct: keys resolve to fields case-insensitively
	shapeMap                     // map: keys compare exactly
	shapeList                    // slice or array
)

// shape is the decoding plan of one Go type.
type shape struct {
	kind   shapeKind
	fields *structFields // shapeStruct
	elem   *shape        // shapeMap values, shapeList elements
}

var anyShape = &shape{kind: shapeAny}

// manifestShape is the shape of Manifest. It depends only on the types, so
// it is built once, like encoding/json's own field cache.
var manifestShape = sync.OnceValue(func() *shape {
	return shapeOf(reflect.TypeFor[Manifest](), make(map[reflect.Type]*shape))
})

// plainSecret has Secret's fields without its UnmarshalJSON, which decodes
// exactly these fields (and bounds the certificate template's numbers).
type plainSecret Secret

// decodesAs maps the types with an UnmarshalJSON method of this package to
// the plain type whose members they accept. File takes a string or an
// object of fileJSON's fields.
var decodesAs = map[reflect.Type]reflect.Type{
	reflect.TypeFor[Secret](): reflect.TypeFor[plainSecret](),
	reflect.TypeFor[File]():   reflect.TypeFor[fileJSON](),
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// shapeOf returns the shape of t; shapes holds those already built (types
// may be recursive).
func shapeOf(t reflect.Type, shapes map[reflect.Type]*shape) *shape {
	if s, ok := shapes[t]; ok {
		return s
	}
	if plain, ok := decodesAs[t]; ok {
		return shapeOf(plain, shapes)
	}
	if t.Kind() == reflect.Pointer {
		if _, ok := decodesAs[t.Elem()]; !ok && decodesItself(t) {
			return anyShape
		}
		shapes[t] = anyShape // until known; only a type like "type P *P" meets it
		s := shapeOf(t.Elem(), shapes)
		shapes[t] = s
		return s
	}
	if decodesItself(t) {
		return anyShape
	}
	s := &shape{kind: shapeAny}
	shapes[t] = s
	switch t.Kind() {
	case reflect.Struct:
		s.kind = shapeStruct
		s.fields = structFieldsOf(t)
		for i := range s.fields.list {
			s.fields.list[i].shape = shapeOf(s.fields.list[i].typ, shapes)
		}
	case reflect.Map:
		s.kind = shapeMap
		s.elem = shapeOf(t.Elem(), shapes)
	case reflect.Slice, reflect.Array:
		s.kind = shapeList
		s.elem = shapeOf(t.Elem(), shapes)
	}
	return s
}

// decodesItself reports whether encoding/json hands values of t to a method
// of t (UnmarshalJSON, or UnmarshalText for strings).
func decodesItself(t reflect.Type) bool {
	return t.Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(jsonUnmarshaler) ||
		t.Implements(textUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler)
}

// structField is a member name of a struct as encoding/json sees it.
type structField struct {
	name   string
	index  []int // field path through embedded structs
	typ    reflect.Type
	tagged bool // the name comes from a json tag
	shape  *shape
}

// structFields are the members of a struct and encoding/json's lookup: the
// exact name first, else the first field (in field order) whose name is
// equal under case folding.
type structFields struct {
	list   []structField
	exact  map[string]int
	folded map[string]int
}

// lookup returns the number of the field that key decodes into.
func (f *structFields) lookup(key string) (int, bool) {
	if i, ok := f.exact[key]; ok {
		return i, true
	}
	i, ok := f.folded[foldKey(key)]
	return i, ok
}

// structFieldsOf lists the JSON members of struct type t with encoding/json's
// rules: exported fields (and the fields of embedded structs, breadth first),
// named by a valid json tag or the Go name, "-" skipped; of fields with one
// name, the shallowest wins, then a tagged one, and a tie hides them all.
func structFieldsOf(t reflect.Type) *structFields {
	type embedded struct {
		typ   reflect.Type
		index []int
	}
	var found []structField
	visited := make(map[reflect.Type]bool)
	var count map[reflect.Type]int
	for level := []embedded{{typ: t}}; len(level) > 0; {
		var next []embedded
		nextCount := make(map[reflect.Type]int)
		for _, e := range level {
			if visited[e.typ] {
				continue
			}
			visited[e.typ] = true
			for i := range e.typ.NumField() {
				sf := e.typ.Field(i)
				ft := sf.Type
				if sf.Anonymous {
					inner := ft
					if inner.Kind() == reflect.Pointer {
						inner = inner.Elem()
					}
					if !sf.IsExported() && inner.Kind() != reflect.Struct {
						continue
					}
				} else if !sf.IsExported() {
					continue
				}
				tag := sf.Tag.Get("json")
				if tag == "-" {
					continue
				}
				name, _, _ := strings.Cut(tag, ",")
				if !validTagName(name) {
					name = ""
				}
				index := append(slices.Clip(e.index), i)
				if ft.Name() == "" && ft.Kind() == reflect.Pointer {
					ft = ft.Elem()
				}
				if name != "" || !sf.Anonymous || ft.Kind() != reflect.Struct {
					f := structField{name: name, index: index, typ: sf.Type, tagged: name != ""}
					if f.name == "" {
						f.name = sf.Name
					}
					found = append(found, f)
					if count[e.typ] > 1 {
						// The same struct embedded twice at this depth: its
						// fields hide each other.
						found = append(found, f)
					}
					continue
				}
				nextCount[ft]++
				if nextCount[ft] == 1 {
					next = append(next, embedded{typ: ft, index: index})
				}
			}
		}
		level, count = next, nextCount
	}

	slices.SortStableFunc(found, func(a, b structField) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		if c := len(a.index) - len(b.index); c != 0 {
			return c
		}
		if a.tagged != b.tagged {
			if a.tagged {
				return -1
			}
			return 1
		}
		return slices.Compare(a.index, b.index)
	})
	var kept []structField
	for i := 0; i < len(found); {
		j := i + 1
		for j < len(found) && found[j].name == found[i].name {
			j++
		}
		if j-i == 1 || len(found[i].index) != len(found[i+1].index) || found[i].tagged != found[i+1].tagged {
			kept = append(kept, found[i])
		}
		i = j
	}
	slices.SortFunc(kept, func(a, b structField) int { return slices.Compare(a.index, b.index) })

	fields := &structFields{list: kept, exact: make(map[string]int, len(kept)), folded: make(map[string]int, len(kept))}
	for i, f := range kept {
		fields.exact[f.name] = i
		if _, ok := fields.folded[foldKey(f.name)]; !ok {
			fields.folded[foldKey(f.name)] = i
		}
	}
	return fields
}

// validTagName reports whether encoding/json uses a json tag's name: not
// empty, and only letters, digits and some punctuation.
func validTagName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if !strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c) && !unicode.IsLetter(c) && !unicode.IsDigit(c) {
			return false
		}
	}
	return true
}

// foldKey maps every string to one representative of its class under
// Unicode simple case folding (the equivalence of bytes.EqualFold, which
// encoding/json uses for field names): ASCII letters to upper case, every
// other rune to the smallest rune of its folding orbit (so U+212A KELVIN SIGN
// becomes 'K' and U+017F LATIN SMALL LETTER LONG S becomes 'S').
func foldKey(s string) string {
	var b []byte
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			b = append(b, c)
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		b = utf8.AppendRune(b, smallestFold(r))
		i += n
	}
	return string(b)
}

// smallestFold returns the smallest rune that folds to r.
func smallestFold(r rune) rune {
	least := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		least = min(least, f)
	}
	return least
}

// dupWalker walks a valid JSON document and checks each object's keys.
type dupWalker struct {
	data []byte
	pos  int
	path []pathStep // where the walk is, for messages
}

// pathStep is one step of a location: an object key or an array index.
type pathStep struct {
	key   string
	index int // -1 for a key
}

// location renders the path as $.key.key[index]["odd key"], shortened in
// the middle if very long.
func (w *dupWalker) location() string {
	var sb strings.Builder
	sb.WriteByte('$')
	for _, st := range w.path {
		switch {
		case st.index >= 0:
			fmt.Fprintf(&sb, "[%d]", st.index)
		case isPathIdent(st.key):
			sb.WriteString("." + st.key)
		default:
			sb.WriteString("[" + quoteClipped(st.key) + "]")
		}
	}
	s := sb.String()
	if len(s) > maxPathText {
		head, tail := s[:maxPathText/4], s[len(s)-maxPathText/2:]
		for len(head) > 0 && !utf8.RuneStart(s[len(head)]) {
			head = head[:len(head)-1]
		}
		for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
			tail = tail[1:]
		}
		s = head + "…" + tail
	}
	return s
}

// isPathIdent reports whether a key can follow a dot in a location: an
// ASCII letter or '_', then letters, digits, '_' and '-'.
func isPathIdent(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && (c == '-' || '0' <= c && c <= '9'):
		default:
			return false
		}
	}
	return true
}

func (w *dupWalker) skipSpace() {
	for w.pos < len(w.data) {
		switch w.data[w.pos] {
		case ' ', '\t', '\r', '\n':
			w.pos++
		default:
			return
		}
	}
}

// peek returns the next byte after white space, or 0 at the end.
func (w *dupWalker) peek() byte {
	w.skipSpace()
	if w.pos >= len(w.data) {
		return 0
	}
	return w.data[w.pos]
}

// value walks one value that decodes into a Go value of shape s.
func (w *dupWalker) value(s *shape) error {
	switch w.peek() {
	case '{':
		return w.object(s)
	case '[':
		return w.array(s)
	case '"':
		_, err := w.str()
		return err
	case 0:
		return errBadJSON
	default:
		for w.pos < len(w.data) {
			switch w.data[w.pos] {
			case ',', ']', '}', ' ', '\t', '\r', '\n':
				return nil
			}
			w.pos++
		}
		return nil
	}
}

// str skips a string and returns its bytes, quotes included.
func (w *dupWalker) str() ([]byte, error) {
	start := w.pos
	w.pos++ // the opening quote
	for w.pos < len(w.data) {
		switch w.data[w.pos] {
		case '\\':
			w.pos += 2
		case '"':
			w.pos++
			return w.data[start:w.pos], nil
		default:
			w.pos++
		}
	}
	return nil, errBadJSON
}

// decodeKey returns the name a quoted key decodes to, as encoding/json
// decodes it (escapes resolved; invalid UTF-8 and lone surrogates become
// U+FFFD).
func decodeKey(quoted []byte) (string, error) {
	inner := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	var key string
	if err := json.Unmarshal(quoted, &key); err != nil {
		return "", errBadJSON
	}
	return key, nil
}

// object walks an object whose members decode into shape s.
func (w *dupWalker) object(s *shape) error {
	w.pos++ // '{'
	if w.peek() == '}' {
		w.pos++
		return nil
	}
	var fieldSeen []string // first spelling per struct field
	var exact keySet
	if s.kind == shapeStruct {
		fieldSeen = make([]string, len(s.fields.list))
	}
	w.path = append(w.path, pathStep{index: -1})
	for {
		if w.peek() != '"' {
			return errBadJSON
		}
		quoted, err := w.str()
		if err != nil {
			return err
		}
		key, err := decodeKey(quoted)
		if err != nil {
			return err
		}
		child := anyShape
		switch s.kind {
		case shapeStruct:
			if i, ok := s.fields.lookup(key); ok {
				if fieldSeen[i] != "" {
					return w.duplicate(fieldSeen[i], key)
				}
				fieldSeen[i] = key
				child = s.fields.list[i].shape
				break
			}
			if exact.add(key) {
				return w.duplicate(key, key)
			}
		case shapeMap:
			child = s.elem
			if exact.add(key) {
				return w.duplicate(key, key)
			}
		default:
			if exact.add(key) {
				return w.duplicate(key, key)
			}
		}
		if w.peek() != ':' {
			return errBadJSON
		}
		w.pos++
		w.path[len(w.path)-1].key = key
		if err := w.value(child); err != nil {
			return err
		}
		switch w.peek() {
		case ',':
			w.pos++
		case '}':
			w.pos++
			w.path = w.path[:len(w.path)-1]
			return nil
		default:
			return errBadJSON
		}
	}
}

// duplicate returns the error for a key met twice in the current object.
func (w *dupWalker) duplicate(first, second string) error {
	w.path = w.path[:len(w.path)-1]
	return &duplicateKeyError{first: first, second: second, path: w.location()}
}

// array walks an array whose elements decode into s's element shape.
func (w *dupWalker) array(s *shape) error {
	w.pos++ // '['
	if w.peek() == ']' {
		w.pos++
		return nil
	}
	elem := anyShape
	if s.kind == shapeList {
		elem = s.elem
	}
	w.path = append(w.path, pathStep{})
	for i := 0; ; i++ {
		w.path[len(w.path)-1].index = i
		if err := w.value(elem); err != nil {
			return err
		}
		switch w.peek() {
		case ',':
			w.pos++
		case ']':
			w.pos++
			w.path = w.path[:len(w.path)-1]
			return nil
		default:
			return errBadJSON
		}
	}
}

// keySet holds the keys of one object: a slice while small, then a map.
type keySet struct {
	few  []string
	many map[string]struct{}
}

const keySetSlice = 8

// add records key and reports whether it was already there.
func (s *keySet) add(key string) bool {
	if s.many != nil {
		if _, ok := s.many[key]; ok {
			return true
		}
		s.many[key] = struct{}{}
		return false
	}
	if slices.Contains(s.few, key) {
		return true
	}
	if len(s.few) < keySetSlice {
		s.few = append(s.few, key)
		return false
	}
	s.many = make(map[string]struct{}, 2*keySetSlice)
	for _, k := range s.few {
		s.many[k] = struct{}{}
	}
	s.many[key] = struct{}{}
	s.few = nil
	return false
}
