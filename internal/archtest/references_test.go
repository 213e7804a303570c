package archtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// Every reference in the code and the documentation must be followable from
// a clone (docs/design/architecture.md, "House style"): no path to a
// document beside the repository, no design document that is not in it, no
// decision number without its page, no issue number, and every
// docs/...#anchor must name a heading or an <a id> of an existing page.

var (
	// A path into the documents kept beside the repository.
	reSharedPath = regexp.MustCompile(`\.\./shared\b|\bshared/(spec|design|testdata|hooks)\b`)
	// The design documents by name, with whatever path precedes them.
	reDesignDoc = regexp.MustCompile(`([\w./-]*?)\b((?:behaviou?r|decisions|attestation|architecture|client-api)\.md)\b`)
	// A decision number: "D14", "decision D6".
	reDecision = regexp.MustCompile(`\bD([0-9]{1,2})\b`)
	// An issue number: "issue 12", "Issue #3".
	reIssue = regexp.MustCompile(`\b[Ii]ssues? #?[0-9]+`)
	// A section sign after a design document, or alone ("§5.1") where no
	// public standard is named on the line.
	reSection  = regexp.MustCompile(`§\s*[0-9]`)
	reStandard = regexp.MustCompile(`\b(RFC|FIPS|SDM|SP 800|ISO|X\.509|ITU|Intel|NIST)\b`)
	// docs/...#anchor in Go code, relative links in Markdown.
	reGoAnchor = regexp.MustCompile(`\b(docs/[\w./-]+\.md)#([\w-]+)`)
	reMDLink   = regexp.MustCompile(`\]\(([^)#\s]*\.md)#([^)\s]+)\)`)
)

// referenceProblems returns what is wrong with the references in one file:
// rel is its path from the repository root (slash-separated), src its
// content, exists reports whether a repository path exists, anchors returns
// the anchors of a repository Markdown file (nil if it has none or does not
// exist).
func referenceProblems(rel string, src []byte, exists func(string) bool, anchors func(string) map[string]bool) []string {
	isMD := strings.HasSuffix(rel, ".md")
	// The decisions page defines the numbers; its index names them.
	definesDecisions := rel == "docs/design/decisions.md" || rel == "docs/design/README.md"
	var problems []string
	report := func(line int, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: %s", rel, line, fmt.Sprintf(format, args...)))
	}
	// resolve turns a cited path into a repository path: Go code cites
	// docs/... from the module root, Markdown links relative to the page.
	// A page may also name a path from the root in prose (`docs/...`).
	resolve := func(p string) string {
		if isMD {
			if rp := filepath.ToSlash(filepath.Join(filepath.Dir(rel), p)); exists(rp) || !strings.HasPrefix(p, "docs/") {
				return rp
			}
		}
		return filepath.ToSlash(filepath.Clean(p))
	}
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := reSharedPath.FindString(line); m != "" {
			report(n, "cites %q, a document beside the repository that a clone does not have; cite docs/ instead", m)
		}
		for _, m := range reDesignDoc.FindAllStringSubmatch(line, -1) {
			target := resolve(m[1] + m[2])
			if !strings.HasPrefix(target, "docs/") || !exists(target) {
				report(n, "cites %q, which is not a page of this repository; cite docs/design/%s (from the module root in Go code)", m[1]+m[2], m[2])
			}
		}
		if !definesDecisions {
			for _, m := range reDecision.FindAllStringSubmatch(line, -1) {
				if !strings.Contains(strings.ToLower(line), "decisions.md#d"+m[1]) {
					report(n, "names decision D%s without its page; cite docs/design/decisions.md#d%s", m[1], m[1])
				}
			}
		}
		if m := reIssue.FindString(line); m != "" {
			report(n, "cites %q; an issue tracker is not part of a clone: state the reason or cite docs/", m)
		}
		if reSection.MatchString(line) && !reStandard.MatchString(line) {
			report(n, "cites a numbered section (§) of no named standard; cite a docs/ page and its anchor")
		}
		var links [][]string
		if isMD {
			links = reMDLink.FindAllStringSubmatch(line, -1)
		} else {
			links = reGoAnchor.FindAllStringSubmatch(line, -1)
		}
		for _, m := range links {
			if strings.Contains(m[1], "://") {
				continue
			}
			target := resolve(m[1])
			a := anchors(target)
			if a == nil {
				report(n, "links to %s, which does not exist", m[1])
			} else if !a[strings.ToLower(m[2])] {
				report(n, "links to %s#%s, which has no such heading or anchor", m[1], m[2])
			}
		}
	}
	return problems
}

var reAnchorTag = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)

// markdownAnchors returns the anchors of a Markdown page as a Markdown
// renderer on the web makes them from headings (lower case; letters, digits,
// '-' and '_' kept; a space becomes '-'; everything else dropped; repeats get
// "-1", "-2"), plus explicit <a id="..."> anchors.
func markdownAnchors(src []byte) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		for _, m := range reAnchorTag.FindAllStringSubmatch(line, -1) {
			out[strings.ToLower(m[1])] = true
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		if k := seen[slug]; k > 0 {
			out[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// TestReferencesStayInTheRepository checks every Go file and every Markdown
// page of the repository (outside testdata directories).
func TestReferencesStayInTheRepository(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	exists := func(rel string) bool {
		_, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
		return err == nil
	}
	cache := map[string]map[string]bool{}
	anchors := func(rel string) map[string]bool {
		if a, ok := cache[rel]; ok {
			return a
		}
		src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		var a map[string]bool
		if err == nil {
			a = markdownAnchors(src)
		}
		cache[rel] = a
		return a
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", ".cache", "node_modules": // node_modules: npm's, not ours (api/typescript)
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, ".md") {
			return nil
		}
		if rel == "internal/archtest/references_test.go" { // the rules' own examples
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for _, p := range referenceProblems(rel, src, exists, anchors) {
			t.Error(p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked only %d files; the walk did not find the repository", checked)
	}
}

// TestReferenceProblems holds each rule against a line that breaks it and a
// line that keeps it.
func TestReferenceProblems(t *testing.T) {
	pages := map[string]map[string]bool{
		"docs/design/decisions.md": {"d14": true},
		"docs/design/behaviour.md": {"states": true},
		"docs/http.md":             {"answers": true},
	}
	exists := func(rel string) bool { _, ok := pages[rel]; return ok }
	anchors := func(rel string) map[string]bool { return pages[rel] }
	for _, tc := range []struct {
		file, line string
		bad        bool
	}{
		{"a/b.go", `const root = "../../../shared/testdata/sgx"`, true},
		{"a/b.go", `// see shared/spec/client-api.md`, true},
		{"a/b.go", `// The state codes (behaviour.md §2).`, true},
		{"a/b.go", `// The rules of design/architecture.md.`, true},
		{"a/b.go", `// As attestation.md says.`, true},
		{"a/b.go", `// Only the leaf counts (decision D14).`, true},
		{"a/b.go", `// state before body (D16)`, true},
		{"a/b.go", `// The crash test (issue 12).`, true},
		{"a/b.go", `// Issue #7: fixed.`, true},
		{"a/b.go", `// Defaults of §1.5.1.`, true},
		{"a/b.go", `// see docs/design/behaviour.md#no-such-section`, true},
		{"a/b.go", `// see docs/missing.md#x`, true},
		{"docs/x.md", `Read [the decisions](design/decisions.md#d15).`, true},
		{"docs/x.md", `Read [it](../../shared/design/decisions.md).`, true},

		{"a/b.go", `// The state codes (docs/design/behaviour.md#states).`, false},
		{"a/b.go", `// Only the leaf counts (docs/design/decisions.md#d14).`, false},
		{"a/b.go", `// the TLS exporter (RFC 8446 §7.5)`, false},
		{"a/b.go", `// GF(2^8) as in FIPS 197 §4.2`, false},
		{"a/b.go", `x := 0xD1 // a byte`, false},
		{"a/b.go", `// see docs/http.md#answers`, false},
		{"docs/x.md", `Read [the decisions](design/decisions.md#d14) and [states](design/behaviour.md#states).`, false},
		{"docs/design/y.md", `See [D14](decisions.md#d14) and [answers](../http.md#answers).`, false},
		{"docs/design/decisions.md", `### D14. Only the leaf identifies`, false},
	} {
		got := referenceProblems(tc.file, []byte(tc.line), exists, anchors)
		if (len(got) > 0) != tc.bad {
			t.Errorf("%s: %q: problems %q, want bad=%v", tc.file, tc.line, got, tc.bad)
		}
	}
}

// TestMarkdownAnchors checks the heading anchors against ones a web
// renderer makes.
func TestMarkdownAnchors(t *testing.T) {
	a := markdownAnchors([]byte("# Title\n## v1 `POST /recover`\n## Order of checks: cheap checks before the body\n" +
		"### Tightening (ProductKey → UniqueKey)\n## Limits\n## Limits\n```\n# not a heading\n```\n<a id=\"d7\"></a>\n"))
	for _, want := range []string{"title", "v1-post-recover", "order-of-checks-cheap-checks-before-the-body",
		"tightening-productkey--uniquekey", "limits", "limits-1", "d7"} {
		if !a[want] {
			t.Errorf("anchor %q missing from %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a line in a code block became an anchor")
	}
}
