package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeReports writes OSV reports (file name → contents) into a new
// directory and returns it.
func writeReports(t *testing.T, reports map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range reports {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestIndex: the modules index names every module of every report once per
// report, sorted by path and each module's reports by ID, with each report's
// modification time; db.json holds the newest; ID/ leads to the reports.
func TestIndex(t *testing.T) {
	vulns := writeReports(t, map[string]string{
		"GO-2022-0002.json": `{"id":"GO-2022-0002","modified":"2023-05-01T10:00:00Z","affected":[
			{"package":{"name":"stdlib","ecosystem":"Go"}},
			{"package":{"name":"golang.org/x/text","ecosystem":"Go"}},
			{"package":{"name":"stdlib","ecosystem":"Go"}}]}`,
		"GO-2021-0001.json": `{"id":"GO-2021-0001","modified":"2024-01-02T03:04:05Z","summary":"ignored","affected":[
			{"package":{"name":"stdlib","ecosystem":"Go"}}]}`,
		"GO-2023-0003.json": `{"id":"GO-2023-0003","modified":"2022-01-01T00:00:00Z","affected":[
			{"package":{"name":"example.com/a","ecosystem":"Go"}},
			{"package":{"name":"","ecosystem":"Go"}}]}`,
		"README.md": "not a report",
	})
	out := filepath.Join(t.TempDir(), "db")
	if err := run(vulns, out); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(out, "index", "modules.json"))
	if err != nil {
		t.Fatal(err)
	}
	var modules []struct {
		Path  string `json:"path"`
		Vulns []struct {
			ID       string    `json:"id"`
			Modified time.Time `json:"modified"`
		} `json:"vulns"`
	}
	if err := json.Unmarshal(raw, &modules); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range modules {
		var ids []string
		for _, v := range m.Vulns {
			ids = append(ids, v.ID+"@"+v.Modified.Format(time.DateOnly))
		}
		got = append(got, m.Path+": "+strings.Join(ids, " "))
	}
	want := []string{
		"example.com/a: GO-2023-0003@2022-01-01",
		"golang.org/x/text: GO-2022-0002@2023-05-01",
		"stdlib: GO-2021-0001@2024-01-02 GO-2022-0002@2023-05-01",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("modules.json:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	raw, err = os.ReadFile(filepath.Join(out, "index", "db.json"))
	if err != nil {
		t.Fatal(err)
	}
	var db struct {
		Modified time.Time `json:"modified"`
	}
	if err := json.Unmarshal(raw, &db); err != nil {
		t.Fatal(err)
	}
	if !db.Modified.Equal(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("db.json modified %v, want the newest report's", db.Modified)
	}

	report, err := os.ReadFile(filepath.Join(out, "ID", "GO-2021-0001.json"))
	if err != nil || !strings.Contains(string(report), `"summary":"ignored"`) {
		t.Errorf("ID/GO-2021-0001.json: %q, %v", report, err)
	}
}

// TestIndexRefuses: no reports, a report whose id is not its file name, and
// a report that is not JSON are errors, not an empty or partial index.
func TestIndexRefuses(t *testing.T) {
	for name, reports := range map[string]map[string]string{
		"no reports":   {"README.md": "x"},
		"id mismatch":  {"GO-2022-0001.json": `{"id":"GO-2022-0002","modified":"2023-01-01T00:00:00Z"}`},
		"not JSON":     {"GO-2022-0001.json": `{"id":`},
		"bad modified": {"GO-2022-0001.json": `{"id":"GO-2022-0001","modified":"yesterday"}`},
	} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "db")
			if err := run(writeReports(t, reports), out); err == nil {
				t.Fatal("indexed")
			}
			if _, err := os.Stat(filepath.Join(out, "index", "modules.json")); err == nil {
				t.Error("an index was written")
			}
		})
	}
}
