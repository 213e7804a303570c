// Command vulngate reads govulncheck's JSON output (-format json) on stdin
// and decides the gate: it fails (exit status 1) on every vulnerability the
// code reaches (a finding with a called function), except one in the
// standard library that a Go release no newer than -release-go fixes, in
// that release's line (the standard library of a release build, whose
// minimum Go the README names; govulncheck itself analyses the standard
// library of the Go it runs with, here an older patch release).
//
//	govulncheck -format json ./... | go run ./.ci/vulngate -release-go v1.26.10
package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

type frame struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Package  string `json:"package"`
	Function string `json:"function"`
	Receiver string `json:"receiver"`
}

type finding struct {
	OSV          string  `json:"osv"`
	FixedVersion string  `json:"fixed_version"`
	Trace        []frame `json:"trace"`
}

type message struct {
	Finding *finding `json:"finding"`
}

func main() {
	release := flag.String("release-go", "", "the oldest Go release for release builds, e.g. v1.26.10")
	flag.Parse()
	accepted, failed, err := gate(os.Stdin, *release)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulngate:", err)
		os.Exit(2)
	}
	for _, a := range accepted {
		fmt.Println("fixed in the release build's Go:", a)
	}
	for _, f := range failed {
		fmt.Println("REACHED:", f)
	}
	if len(failed) > 0 {
		fmt.Printf("vulngate: the code reaches %d known vulnerabilities that a release build with Go %s still has\n", len(failed), *release)
		os.Exit(1)
	}
	fmt.Printf("vulngate: no reached vulnerability in a release build with Go %s (%d fixed there)\n", *release, len(accepted))
}

// gate reads the JSON stream and returns the reached vulnerabilities it
// accepts and those it does not, one line each.
func gate(r io.Reader, release string) (accepted, failed []string, err error) {
	rel, ok := goVersion(release)
	if !ok {
		return nil, nil, fmt.Errorf("-release-go %q is not a Go release like v1.26.10", release)
	}
	dec := json.NewDecoder(r)
	seen := map[string]bool{}
	for {
		var m message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, nil, fmt.Errorf("reading govulncheck's output: %w", err)
		}
		f := m.Finding
		if f == nil || len(f.Trace) == 0 || f.Trace[0].Function == "" {
			continue // not a finding, or one the code does not call
		}
		top := f.Trace[0]
		fixed, ok := goVersion(f.FixedVersion)
		if top.Module == "stdlib" && ok && fixed[0] == rel[0] && fixed[1] == rel[1] && fixed[2] <= rel[2] {
			// One line per vulnerability (govulncheck reports each
			// function that reaches it).
			line := fmt.Sprintf("%s in the standard library %s, fixed in %s", f.OSV, top.Version, f.FixedVersion)
			if !seen[line] {
				seen[line] = true
				accepted = append(accepted, line)
			}
			continue
		}
		line := fmt.Sprintf("%s in %s %s (%s.%s), fixed in %s", f.OSV, top.Module, top.Version, top.Package, top.Function, cmp.Or(f.FixedVersion, "no release"))
		if !seen[line] {
			seen[line] = true
			failed = append(failed, line)
		}
	}
	slices.Sort(accepted)
	slices.Sort(failed)
	return accepted, failed, nil
}

// goVersion parses a Go release as govulncheck writes it (v1.26.10).
func goVersion(v string) ([3]int, bool) {
	var out [3]int
	parts := strings.Split(strings.TrimPrefix(v, "v"), ".")
	if !strings.HasPrefix(v, "v") || len(parts) != 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}
