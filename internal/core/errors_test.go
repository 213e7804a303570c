package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// notRequestClasses are the package's exported errors that a request never
// ends with, and why: they are not in ErrorClasses, so no transport maps them.
var notRequestClasses = map[string]string{
	"ErrStoreUnavailable": "returned by CheckStore for the readiness probes only",
	"ErrLogDamaged":       "a damaged stored update log is a failure of the service (500 by design)",
	"ErrMixedFormats":     "stops a start; never a request",
	"ErrMigration":        "stops a start; never a request",
	"ErrNoMarbleRunState": "the migration dry run's answer; never a request",
	"ErrMigrationOff":     "a start-time condition; a recovery upload carries it only inside ErrConflict (409)",
}

// TestErrorClassesNameEveryExportedError reads the package's source and
// checks that each exported error variable is in ErrorClasses or listed in
// notRequestClasses with a reason: a new class cannot be added without
// deciding how the transports answer it (their tests range over
// ErrorClasses).
func TestErrorClassesNameEveryExportedError(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	inList := map[error]bool{}
	for _, e := range ErrorClasses() {
		inList[e] = true
	}
	byName := map[string]error{
		"ErrWrongState": ErrWrongState, "ErrInvalidRequest": ErrInvalidRequest, "ErrUnauthenticated": ErrUnauthenticated,
		"ErrForbidden": ErrForbidden, "ErrNotFound": ErrNotFound, "ErrConflict": ErrConflict, "ErrUnavailable": ErrUnavailable,
		"ErrTooLarge": ErrTooLarge,
	}
	var found []string
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !id.IsExported() || !strings.HasPrefix(id.Name, "Err") || i >= len(vs.Values) {
						continue
					}
					call, ok := vs.Values[i].(*ast.CallExpr)
					if !ok {
						continue
					}
					if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "New" {
						continue
					}
					found = append(found, id.Name)
				}
			}
		}
	}
	if len(found) < len(byName) {
		t.Fatalf("found only %v in the source; the parser missed declarations", found)
	}
	for _, name := range found {
		if _, ok := notRequestClasses[name]; ok {
			continue
		}
		e, ok := byName[name]
		if !ok {
			t.Errorf("%s is an exported error of package core in neither ErrorClasses nor notRequestClasses: add it to ErrorClasses (and map it in every transport) or say here why no request ends with it", name)
			continue
		}
		if !inList[e] {
			t.Errorf("%s is not in ErrorClasses()", name)
		}
	}
	for name := range byName {
		if !slices.Contains(found, name) {
			t.Errorf("%s was not found in the source", name)
		}
	}
	if len(ErrorClasses()) != len(byName) {
		t.Errorf("ErrorClasses() has %d classes, the test knows %d", len(ErrorClasses()), len(byName))
	}
}
