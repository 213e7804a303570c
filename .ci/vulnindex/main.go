// Command vulnindex makes the vulnerability database govulncheck reads
// with -db file://DIR from a directory of the Go vulnerability database's
// OSV reports (golang.org/x/vulndb's data/osv): DIR/index/db.json (when the
// newest report changed), DIR/index/modules.json (which reports name each
// module) and DIR/ID, the reports themselves (a link to the directory).
//
// golang.org/x/vulndb's own cmd/indexdb does the same, and more (compressed
// copies, each module's latest fixed version, checks of every report), but
// building it compiles go-git, an OpenPGP library and their dependencies:
// about a CPU-minute of each CI run, on two cores. This index leaves out the
// fixed versions, which govulncheck reads only to skip reports early: it
// then reads every report of a module the build uses and checks each
// report's ranges itself, so its verdict is the same.
//
//	go run ./.ci/vulnindex -vulns DIR/data/osv -out DB
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// report holds the fields of an OSV report the index needs.
type report struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Affected []struct {
		Package struct {
			Name string `json:"name"`
		} `json:"package"`
	} `json:"affected"`
}

type moduleVuln struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
}

type module struct {
	Path  string       `json:"path"`
	Vulns []moduleVuln `json:"vulns"`
}

func main() {
	vulns := flag.String("vulns", "", "directory of OSV reports (GO-YYYY-NNNN.json)")
	out := flag.String("out", "", "directory to write the database to (must not exist)")
	flag.Parse()
	if *vulns == "" || *out == "" {
		log.Fatal("vulnindex: -vulns and -out are required")
	}
	if err := run(*vulns, *out); err != nil {
		log.Fatalf("vulnindex: %v", err)
	}
}

func run(vulns, out string) error {
	vulns, err := filepath.Abs(vulns)
	if err != nil {
		return err
	}
	names, err := filepath.Glob(filepath.Join(vulns, "GO-*.json"))
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("no reports (GO-*.json) in %s", vulns)
	}
	modules := map[string]*module{}
	var newest time.Time
	for _, name := range names {
		raw, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		var r report
		if err := json.Unmarshal(raw, &r); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if r.ID+".json" != filepath.Base(name) {
			return fmt.Errorf("%s: the report's id is %q", name, r.ID)
		}
		if r.Modified.After(newest) {
			newest = r.Modified
		}
		seen := map[string]bool{}
		for _, a := range r.Affected {
			path := a.Package.Name
			if path == "" || seen[path] {
				continue
			}
			seen[path] = true
			m := modules[path]
			if m == nil {
				m = &module{Path: path}
				modules[path] = m
			}
			m.Vulns = append(m.Vulns, moduleVuln{ID: r.ID, Modified: r.Modified})
		}
	}
	index := make([]*module, 0, len(modules))
	for _, m := range modules {
		slices.SortFunc(m.Vulns, func(a, b moduleVuln) int { return strings.Compare(a.ID, b.ID) })
		index = append(index, m)
	}
	slices.SortFunc(index, func(a, b *module) int { return strings.Compare(a.Path, b.Path) })

	if err := os.MkdirAll(filepath.Join(out, "index"), 0o755); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(out, "index", "modules.json"), index); err != nil {
		return err
	}
	if err := writeJSON(filepath.Join(out, "index", "db.json"), struct {
		Modified time.Time `json:"modified"`
	}{newest}); err != nil {
		return err
	}
	return os.Symlink(vulns, filepath.Join(out, "ID"))
}

func writeJSON(path string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}
