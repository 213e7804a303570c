// Package readme runs the documentation's walkthroughs as a new user would:
// the shell blocks between the walkthrough markers are extracted from the
// page each lives on (README.md, docs/client-api.md, docs/ha.md,
// docs/marbles.md; so the two cannot drift apart) and run with bash in a
// scratch directory, with freshly built coordinator and quarry binaries on
// PATH, against a real Coordinator on a free loopback port. It also checks
// that the flags and exit codes the documentation names are the ones the
// binaries have.
package readme

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/quarry-cc/quarry/internal/testpki"
	"github.com/quarry-cc/quarry/manifest"
)

var (
	repoRoot string // absolute path of the repository root
	binDir   string // holds the freshly built coordinator and quarry
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	repoRoot = root
	dir, err := os.MkdirTemp("", "quarry-readme-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binDir = dir
	// The README's build line, into a directory outside the repository;
	// static and -trimpath (GOFLAGS), as the Dockerfile builds, so that
	// the build cache of deploy/container's test serves both.
	build := exec.Command("go", "build", "-o", binDir+string(filepath.Separator), "./cmd/coordinator", "./cmd/quarry")
	build.Dir = repoRoot
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-trimpath")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building coordinator and quarry:", err)
		return 1
	}
	return m.Run()
}

// doc returns a page of the documentation, rel being its path from the
// repository root ("README.md", "docs/ha.md").
func doc(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// markdownPages returns the paths (from the repository root) of every
// Markdown page of the repository outside .git and testdata directories.
func markdownPages(t *testing.T) []string {
	t.Helper()
	var pages []string
	err := filepath.WalkDir(repoRoot, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "testdata" || name == ".cache" || name == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(repoRoot, path)
			pages = append(pages, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pages, "README.md") || !slices.Contains(pages, "docs/configuration.md") {
		t.Fatalf("found %v; the walk did not find the documentation", pages)
	}
	return pages
}

// between returns the text between the start and end markers, failing the
// test if either is missing or they appear more than once.
func between(t *testing.T, text, start, end string) string {
	t.Helper()
	if n := strings.Count(text, start); n != 1 {
		t.Fatalf("the document has %q %d times, want once", start, n)
	}
	_, after, _ := strings.Cut(text, start)
	inner, _, ok := strings.Cut(after, end)
	if !ok {
		t.Fatalf("the document has %q without %q after it", start, end)
	}
	return inner
}

// fencedBlocks returns the contents of the fenced code blocks with the given
// info string (e.g. "sh") in text, in order.
func fencedBlocks(text, lang string) []string {
	var blocks []string
	var cur []string
	in := false
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		switch {
		case !in && line == "```"+lang:
			in, cur = true, nil
		case in && line == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n")+"\n")
		case in:
			cur = append(cur, line)
		}
	}
	return blocks
}

// expectedOutput returns the comment lines that directly follow a command
// line in the blocks: the page shows there, verbatim, a line the command
// prints.
func expectedOutput(blocks []string) []string {
	var want []string
	for _, b := range blocks {
		prevIsCommand := false
		for line := range strings.Lines(b) {
			line = strings.TrimRight(line, "\n")
			trimmed := strings.TrimSpace(line)
			isComment := strings.HasPrefix(trimmed, "#")
			if isComment && prevIsCommand {
				want = append(want, strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " "))
			}
			prevIsCommand = trimmed != "" && !isComment
		}
	}
	return want
}

// checkInOrder fails the test unless every wanted line is a line of out, in
// the given order.
func checkInOrder(t *testing.T, out string, want []string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	i := 0
	for _, w := range want {
		j := slices.Index(lines[i:], w)
		if j < 0 {
			t.Errorf("output lacks (after line %d) the line the page shows:\n  %s", i, w)
			continue
		}
		i += j + 1
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// baseEnv is the test process's environment without the settings of the
// Coordinator and the CLI, so that a developer's own cannot change the run.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "EDG_") || strings.HasPrefix(name, "QUARRY_") ||
			name == "OE_SIMULATION" || name == "PATH" || name == "TMPDIR" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// walkthrough is one finished run of a walkthrough of the documentation.
type walkthrough struct {
	stdout, stderr string
	scratch        string // the directory the script made with mktemp -d
}

// runWalkthrough runs the blocks with bash (set -euo pipefail) from the
// repository root, as the pages say, against a Coordinator on a free
// loopback port. The script's process group is killed when it ends, so a
// Coordinator it leaves running does not outlive the test; whether it did is
// reported as a failure.
func runWalkthrough(t *testing.T, blocks []string, env ...string) walkthrough {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	tmp := t.TempDir()
	script := filepath.Join(t.TempDir(), "walkthrough.sh")
	body := "set -euo pipefail\n" + strings.Join(blocks, "\n")
	if err := os.WriteFile(script, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	before := rootEntries(t)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Dir = repoRoot
	cmd.Env = append(baseEnv(),
		"TMPDIR="+tmp,
		fmt.Sprintf("EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:%d", freePort(t)),
		"EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0",
	)
	cmd.Env = append(cmd.Env, env...) // later entries win
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Start()
	if err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	err = cmd.Wait()
	leftover := syscall.Kill(-pgid, 0) == nil
	syscall.Kill(-pgid, syscall.SIGKILL)

	w := walkthrough{stdout: stdout.String(), stderr: stderr.String()}
	if dirs, _ := filepath.Glob(filepath.Join(tmp, "tmp.*")); len(dirs) == 1 {
		w.scratch = dirs[0]
	}
	if errors.Is(err, exec.ErrWaitDelay) {
		t.Fatalf("the walkthrough ended but left a process running (the Coordinator?) that holds its output\n--- stdout\n%s", w.stdout)
	}
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(w.scratch, "coordinator.log"))
		t.Fatalf("walkthrough failed: %v\n--- script\n%s\n--- stdout\n%s\n--- stderr\n%s\n--- coordinator.log\n%s",
			err, body, w.stdout, w.stderr, log)
	}
	if leftover {
		t.Error("a process of the walkthrough (the Coordinator?) was still running after it ended")
	}
	if w.scratch == "" {
		t.Fatalf("the walkthrough made no single scratch directory (mktemp -d) under TMPDIR")
	}
	if after := rootEntries(t); !slices.Equal(before, after) {
		t.Errorf("the walkthrough changed the repository root:\nbefore %v\nafter  %v", before, after)
	}
	return w
}

// rootEntries lists the repository root.
func rootEntries(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCLIWalkthrough runs the README's CLI walkthrough: a fresh Coordinator
// in state 2, user and recovery keys from openssl, the example manifest,
// secrets, a package update, the update log, the SDK example, recovery after
// the sealing key is lost, and a graceful stop.
func TestCLIWalkthrough(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("openssl is not installed (.ci/run installs it)")
		}
		t.Skip("openssl is not installed")
	}
	blocks := fencedBlocks(between(t, doc(t, "README.md"), "<!-- walkthrough:start -->", "<!-- walkthrough:end -->"), "sh")
	if len(blocks) < 5 {
		t.Fatalf("found %d sh blocks in the walkthrough, want the whole walkthrough", len(blocks))
	}
	want := expectedOutput(blocks)
	w := runWalkthrough(t, blocks)

	// The README's comments are what the commands print, in that order; they
	// include the states 2, 3, 1 and 3 again.
	checkInOrder(t, w.stdout, want)
	var states []string
	for _, line := range want {
		if len(line) > 2 && line[1] == ':' && strings.ContainsRune("123", rune(line[0])) {
			states = append(states, line[:1])
		}
	}
	if got := strings.Join(states, ","); !strings.HasPrefix(got, "2,3") || !strings.Contains(got, "1,3") {
		t.Errorf("the walkthrough shows the states %s; want 2, then 3, and 3 after 1 (recovery)", got)
	}

	// The secret Bob read (before and after the recovery) is what Alice uploaded.
	uploaded := readFile(t, filepath.Join(w.scratch, "apikey.txt"))
	if len(bytes.TrimSpace(uploaded)) == 0 {
		t.Fatal("apikey.txt is empty")
	}
	for _, f := range []string{"out/apikey", "recovered/apikey"} {
		if got := readFile(t, filepath.Join(w.scratch, f)); !bytes.Equal(got, uploaded) {
			t.Errorf("%s = %q, want the uploaded %q", f, got, uploaded)
		}
	}
	// The SDK example printed it too.
	if !strings.Contains(w.stdout, "apikey (plain): "+hex.EncodeToString(uploaded)+"\n") {
		t.Errorf("the SDK example did not print the uploaded secret:\n%s", w.stdout)
	}

	// The update log has the three changes.
	type entry struct {
		Update     string `json:"update"`
		User       string `json:"user"`
		Secret     string `json:"secret"`
		Package    string `json:"package"`
		NewVersion int    `json:"new version"`
	}
	var log []entry
	for line := range strings.Lines(w.stdout) {
		var e entry
		if json.Unmarshal([]byte(line), &e) == nil && e.Update != "" {
			log = append(log, e)
		}
	}
	wantLog := []entry{
		{Update: "Initial manifest set"},
		{Update: "Secret set", User: "alice", Secret: "apikey"},
		{Update: "SecurityVersion increased", User: "alice", Package: "app", NewVersion: 2},
	}
	if !reflect.DeepEqual(log, wantLog) {
		t.Errorf("update log = %+v, want %+v", log, wantLog)
	}

	// The state lives in the scratch directory's fresh seal directory, and
	// the Coordinator stopped gracefully both times.
	if _, err := os.Stat(filepath.Join(w.scratch, "seal", "sealed_data")); err != nil {
		t.Errorf("no sealed state in the scratch directory: %v", err)
	}
	coordLog := string(readFile(t, filepath.Join(w.scratch, "coordinator.log")))
	if n := strings.Count(coordLog, `"msg":"stopped"`); n != 2 {
		t.Errorf("the Coordinator logged %d graceful stops, want 2:\n%s", n, coordLog)
	}
}

// TestCurlWalkthrough runs the curl walkthrough of docs/client-api.md.
func TestCurlWalkthrough(t *testing.T) {
	for _, tool := range []string{"curl", "jq", "base64"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	blocks := fencedBlocks(between(t, doc(t, "docs/client-api.md"), "<!-- curl-walkthrough:start -->", "<!-- curl-walkthrough:end -->"), "sh")
	if len(blocks) < 3 {
		t.Fatalf("found %d sh blocks in the curl walkthrough", len(blocks))
	}
	want := expectedOutput(blocks)
	if len(want) < 4 {
		t.Fatalf("the curl walkthrough shows %d outputs, want at least status, fail, set and status: %q", len(want), want)
	}
	w := runWalkthrough(t, blocks)
	checkInOrder(t, w.stdout, want)

	// GET /api/v2/manifest serves exactly the uploaded bytes and their SHA-256.
	raw := readFile(t, filepath.Join(w.scratch, "manifest.json"))
	sum := sha256.Sum256(raw)
	if !strings.Contains(w.stdout, `"manifestFingerprint": "`+hex.EncodeToString(sum[:])+`"`) {
		t.Errorf("the manifest's fingerprint is not the SHA-256 of manifest.json:\n%s", w.stdout)
	}
	coordLog := string(readFile(t, filepath.Join(w.scratch, "coordinator.log")))
	if n := strings.Count(coordLog, `"msg":"stopped"`); n != 1 {
		t.Errorf("the Coordinator logged %d graceful stops, want 1", n)
	}
}

// TestHAWalkthrough runs the high-availability walkthrough of docs/ha.md: it
// builds the binaries into its scratch directory, starts a three-member
// etcd (Debian's etcd-server) and three Coordinators, sets the example
// manifest through one instance and reads its status through another,
// SIGKILLs an instance, freezes an etcd member that does not lead and
// writes meanwhile, and stops everything.
func TestHAWalkthrough(t *testing.T) {
	for _, tool := range []string{"etcd", "etcdctl", "openssl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	blocks := fencedBlocks(between(t, doc(t, "docs/ha.md"), "<!-- ha-walkthrough:start -->", "<!-- ha-walkthrough:end -->"), "sh")
	if len(blocks) < 3 {
		t.Fatalf("found %d sh blocks in the HA walkthrough", len(blocks))
	}
	text := strings.Join(blocks, "\n")
	for _, bad := range []string{"sudo", "/tmp/"} {
		if strings.Contains(text, bad) {
			t.Errorf("the HA walkthrough uses %q", bad)
		}
	}
	want := expectedOutput(blocks)
	if len(want) < 4 {
		t.Fatalf("the HA walkthrough shows %d outputs, want status, upload, read and the upload while a member is frozen: %q", len(want), want)
	}
	w := runWalkthrough(t, blocks)
	checkInOrder(t, w.stdout, want)

	// Bob read, through another instance, what Alice uploaded through a third.
	uploaded := readFile(t, filepath.Join(w.scratch, "apikey.txt"))
	if got := readFile(t, filepath.Join(w.scratch, "out", "apikey")); !bytes.Equal(got, uploaded) {
		t.Errorf("out/apikey = %q, want the uploaded %q", got, uploaded)
	}
	// Three instances ran on etcd, and the two left stopped gracefully.
	stopped := 0
	for i := range 3 {
		log := string(readFile(t, filepath.Join(w.scratch, fmt.Sprintf("coordinator-%d.log", i))))
		if !strings.Contains(log, "client API listening") {
			t.Errorf("coordinator-%d.log: the instance never listened:\n%s", i, log)
		}
		stopped += strings.Count(log, `"msg":"stopped"`)
		if _, err := os.Stat(filepath.Join(w.scratch, fmt.Sprintf("etcd-m%d", i), "member")); err != nil {
			t.Errorf("etcd member %d kept no data in the scratch directory: %v", i, err)
		}
	}
	if stopped != 2 {
		t.Errorf("%d instances logged a graceful stop, want 2 (the third was SIGKILLed)", stopped)
	}
}

// TestSDKExampleInREADME checks that the Go program docs/sdk.md shows is
// examples/sdk/main.go, which the build and the walkthrough compile and run.
func TestSDKExampleInREADME(t *testing.T) {
	blocks := fencedBlocks(between(t, doc(t, "docs/sdk.md"), "<!-- sdk-example:start -->", "<!-- sdk-example:end -->"), "go")
	if len(blocks) != 1 {
		t.Fatalf("found %d go blocks between the sdk-example markers, want 1", len(blocks))
	}
	file := string(readFile(t, filepath.Join(repoRoot, "examples", "sdk", "main.go")))
	if blocks[0] != file {
		t.Errorf("docs/sdk.md's SDK example differs from examples/sdk/main.go; copy the file into docs/sdk.md")
	}
}

// helpFlags returns the long flags ("--name") and short flags ("-n") that a
// cobra help text lists.
var cobraFlag = regexp.MustCompile(`(?m)^\s+(?:(-[a-zA-Z]), )?(--[a-z0-9-]+)`)

// TestREADMEQuarryFlags checks every quarry command line in the sh blocks
// of every Markdown page: the command exists and has each flag the line
// uses, spelled as its --help prints it.
func TestREADMEQuarryFlags(t *testing.T) {
	quarry := filepath.Join(binDir, "quarry")
	total := 0
	for _, page := range markdownPages(t) {
		for _, block := range fencedBlocks(doc(t, page), "sh") {
			total += checkQuarryLines(t, quarry, page, block)
		}
	}
	// The pages that show many quarry commands: a parser that found none
	// of them would check nothing.
	for page, want := range map[string]int{"README.md": 10, "docs/cli.md": 15} {
		if n := countQuarryLines(doc(t, page)); n < want {
			t.Errorf("%s has %d quarry command lines in sh blocks, want at least %d", page, n, want)
		}
	}
	if total < 40 {
		t.Errorf("checked %d quarry command lines in all pages; the documentation has more", total)
	}
}

// countQuarryLines counts the quarry command lines in the sh blocks of text.
func countQuarryLines(text string) int {
	n := 0
	for _, block := range fencedBlocks(text, "sh") {
		for line := range strings.Lines(block) {
			if strings.HasPrefix(strings.TrimSpace(line), "quarry ") {
				n++
			}
		}
	}
	return n
}

// checkQuarryLines checks the quarry command lines of one sh block of page
// against quarry's --help and returns how many it checked.
func checkQuarryLines(t *testing.T, quarry, page, block string) int {
	t.Helper()
	checked := 0
	for line := range strings.Lines(block) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "quarry ") {
			continue
		}
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		var words, flags []string
		for _, f := range strings.Fields(line)[1:] {
			f = strings.Trim(f, "[]")
			switch {
			case strings.HasPrefix(f, "-"):
				name, _, _ := strings.Cut(f, "=")
				flags = append(flags, name)
			case len(flags) == 0 && f != "...":
				words = append(words, f)
			}
		}
		out, err := exec.Command(quarry, append(words, "--help")...).CombinedOutput()
		if err != nil {
			t.Errorf("%s line %q: quarry %s --help: %v\n%s", page, line, strings.Join(words, " "), err, out)
			continue
		}
		known := map[string]bool{}
		for _, m := range cobraFlag.FindAllStringSubmatch(string(out), -1) {
			known[m[2]] = true
			if m[1] != "" {
				known[m[1]] = true
			}
		}
		for _, f := range flags {
			if !known[f] {
				t.Errorf("%s line %q: quarry %s has no flag %s", page, line, strings.Join(words, " "), f)
			}
		}
		checked++
	}
	return checked
}

// coordinatorHelp returns the coordinator's flags (without dashes) with
// their descriptions, as --help prints them.
func coordinatorHelp(t *testing.T) map[string]string {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "coordinator"), "--help")
	cmd.Env = baseEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("coordinator --help: %v", err)
	}
	flags := map[string]string{}
	name := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	flagLine := regexp.MustCompile(`^  -([a-z0-9-]+)`)
	for sc.Scan() {
		if m := flagLine.FindStringSubmatch(sc.Text()); m != nil {
			name = m[1]
			flags[name] = ""
		} else if name != "" {
			flags[name] += sc.Text()
		}
	}
	if len(flags) < 10 {
		t.Fatalf("parsed %d flags from coordinator --help:\n%s", len(flags), out)
	}
	return flags
}

// TestREADMECoordinatorFlags checks the settings tables of every Markdown
// page (docs/configuration.md, docs/attestation.md, …): every flag exists in
// coordinator --help, and the environment variable the row names is the one
// --help names for that flag. Go's flag package accepts the tables' --name
// as well as the -name that --help prints.
func TestREADMECoordinatorFlags(t *testing.T) {
	help := coordinatorHelp(t)
	checked := map[string]int{}
	for _, page := range markdownPages(t) {
		checked[page] = checkCoordinatorFlagRows(t, help, page, doc(t, page))
	}
	for page, want := range map[string]int{"docs/configuration.md": 30, "docs/attestation.md": 5} {
		if checked[page] < want {
			t.Errorf("checked %d coordinator flags in %s; its tables have more", checked[page], page)
		}
	}
}

// checkCoordinatorFlagRows checks the rows of page's tables that start with
// coordinator flags and returns how many flags it checked.
func checkCoordinatorFlagRows(t *testing.T, help map[string]string, page, text string) int {
	t.Helper()
	row := regexp.MustCompile("^\\| ((?:`--[a-z0-9-]+`(?:, )?)+) \\| (?:`([A-Z0-9_]+)`)?")
	flagName := regexp.MustCompile("`--([a-z0-9-]+)`")
	checked := 0
	for line := range strings.Lines(text) {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		names := flagName.FindAllStringSubmatch(m[1], -1)
		for _, n := range names {
			desc, ok := help[n[1]]
			if !ok {
				t.Errorf("%s row %q: coordinator --help has no flag -%s", page, strings.TrimSpace(line), n[1])
				continue
			}
			if len(names) == 1 && m[2] != "" && !strings.Contains(desc, "["+m[2]) {
				t.Errorf("%s row %q: coordinator --help names another variable for -%s: %s", page, strings.TrimSpace(line), n[1], desc)
			}
			checked++
		}
	}
	return checked
}

// documentedExitCode returns the code of the row of the coordinator exit
// code table (docs/configuration.md) whose text contains key.
func documentedExitCode(t *testing.T, key string) int {
	t.Helper()
	table := between(t, doc(t, "docs/configuration.md"), "<!-- exit-codes:start -->", "<!-- exit-codes:end -->")
	row := regexp.MustCompile(`(?m)^\| (\d) \| (.*)\|$`)
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		if strings.Contains(m[2], key) {
			code, _ := strconv.Atoi(m[1])
			return code
		}
	}
	t.Fatalf("docs/configuration.md's coordinator exit code table has no row with %q:\n%s", key, table)
	return -1
}

// runCoordinator runs the coordinator until it exits (within 30 s) with env
// and returns its exit code and output.
func runCoordinator(t *testing.T, env ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "coordinator"))
	cmd.Dir = t.TempDir()
	cmd.Env = append(baseEnv(),
		"EDG_COORDINATOR_SEAL_DIR="+filepath.Join(t.TempDir(), "seal"),
		"EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0",
	)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit) && ctx.Err() == nil:
		return exit.ExitCode(), string(out)
	default:
		t.Fatalf("coordinator %v: %v\n%s", env, err, out)
		return -1, ""
	}
}

// TestREADMECoordinatorExitCodes checks that the coordinator exits with the
// codes the table of docs/configuration.md documents: a bad EDG_STARTUP_MANIFEST (missing,
// not a valid manifest), a bad setting, a listen address in use.
func TestREADMECoordinatorExitCodes(t *testing.T) {
	startup := documentedExitCode(t, "EDG_STARTUP_MANIFEST")
	invalidConfig := documentedExitCode(t, "invalid configuration")
	inUse := documentedExitCode(t, "already in use")

	invalid := filepath.Join(t.TempDir(), "invalid.json")
	if err := os.WriteFile(invalid, []byte(`{"Packages": {}, "Marbles": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	for _, tc := range []struct {
		name, env, log string
		want           int
	}{
		{"missing startup manifest", "EDG_STARTUP_MANIFEST=" + filepath.Join(t.TempDir(), "missing.json"), "reading startup manifest", startup},
		{"invalid startup manifest", "EDG_STARTUP_MANIFEST=" + invalid, "setting startup manifest", startup},
		{"bad setting", "EDG_COORDINATOR_CLIENT_ADDR=nonsense", "EDG_COORDINATOR_CLIENT_ADDR", invalidConfig},
		{"address in use", "EDG_COORDINATOR_CLIENT_ADDR=" + busy.Addr().String(), "address already in use", inUse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runCoordinator(t, tc.env)
			if code != tc.want {
				t.Errorf("exit code %d, docs/configuration.md says %d\n%s", code, tc.want, out)
			}
			if !strings.Contains(out, tc.log) {
				t.Errorf("output does not say %q:\n%s", tc.log, out)
			}
		})
	}
}

// fill runs examples/fill.awk on input in dir.
func fill(t *testing.T, dir, input string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command("awk", "-f", filepath.Join(repoRoot, "examples", "fill.awk"), input)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%w: %s", err, stderr.String())
	}
	return out, nil
}

// TestExampleManifests checks that examples/manifest.yaml and
// examples/manifest.json, filled with the same PEM files, are the same
// valid manifest.
func TestExampleManifests(t *testing.T) {
	if _, err := exec.LookPath("awk"); err != nil {
		t.Skip("awk is not installed")
	}
	dir := t.TempDir()
	for name, text := range testPEMs() {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	filledYAML, err := fill(t, dir, filepath.Join(repoRoot, "examples", "manifest.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := yaml.YAMLToJSON(filledYAML)
	if err != nil {
		t.Fatalf("filled manifest.yaml: %v\n%s", err, filledYAML)
	}
	fromJSON, err := fill(t, dir, filepath.Join(repoRoot, "examples", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var parsed [2]*manifest.Manifest
	for i, raw := range [][]byte{fromYAML, fromJSON} {
		m, err := manifest.Parse(raw)
		if err != nil {
			t.Fatalf("manifest %d: %v\n%s", i, err, raw)
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("manifest %d: %v", i, err)
		}
		parsed[i] = m
	}
	if !reflect.DeepEqual(parsed[0], parsed[1]) {
		t.Errorf("examples/manifest.yaml and examples/manifest.json differ:\nYAML %s\nJSON %s", fromYAML, fromJSON)
	}
	m := parsed[0]
	if m.Users["alice"].Certificate != testPEMs()["alice.crt"] || m.RecoveryKeys["recovery"] != testPEMs()["recovery.pub"] {
		t.Errorf("the filled manifest does not hold the PEM files exactly: %q", fromYAML)
	}

	update, err := manifest.Parse(mustYAMLToJSON(t, readFile(t, filepath.Join(repoRoot, "examples", "package-update.yaml"))))
	if err != nil {
		t.Fatal(err)
	}
	if err := update.ValidatePackageUpdate(m.Packages); err != nil {
		t.Errorf("examples/package-update.yaml is not a package update of the example manifest: %v", err)
	}
}

func mustYAMLToJSON(t *testing.T, y []byte) []byte {
	t.Helper()
	j, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// TestFillAWK checks examples/fill.awk on its own: indentation, JSON
// strings, text that is not a placeholder, and a missing file.
func TestFillAWK(t *testing.T) {
	if _, err := exec.LookPath("awk"); err != nil {
		t.Skip("awk is not installed")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.pem"), []byte("-----BEGIN X-----\nQUJD+/=\n-----END X-----\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "in"), []byte(
		"# a comment naming @a.pem@ stays\n"+
			"key: |\n"+
			"    @a.pem@\n"+
			`{"k": "@a.pem@", "e": "x@y@z", "n": 1}`+"\n"+
			"plain @a.pem@ text\n"), 0o600)
	got, err := fill(t, dir, "in")
	if err != nil {
		t.Fatal(err)
	}
	want := "# a comment naming @a.pem@ stays\n" +
		"key: |\n" +
		"    -----BEGIN X-----\n    QUJD+/=\n    -----END X-----\n" +
		`{"k": "-----BEGIN X-----\nQUJD+/=\n-----END X-----\n", "e": "x@y@z", "n": 1}` + "\n" +
		"plain @a.pem@ text\n"
	if string(got) != want {
		t.Errorf("fill.awk output:\n%s\nwant:\n%s", got, want)
	}

	os.WriteFile(filepath.Join(dir, "missing"), []byte("x:\n  @nothere.pem@\n"), 0o600)
	if _, err := fill(t, dir, "missing"); err == nil || !strings.Contains(err.Error(), "nothere.pem: missing or empty") {
		t.Errorf("fill.awk with a missing file: %v, want an error naming it", err)
	}
}

// testPEMs returns PEM texts for the example manifests' placeholders: a
// self-signed certificate for each user and an RSA-2048 recovery public key,
// made once per test binary.
var testPEMs = sync.OnceValue(func() map[string]string {
	pems := map[string]string{}
	for _, user := range []string{"alice", "bob"} {
		// A nil TB: a failure panics.
		pems[user+".crt"] = string(testpki.SelfSigned(nil, user, testpki.Serial(1)).CertPEM())
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	if err != nil {
		panic(err)
	}
	pems["recovery.pub"] = string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	return pems
})

// TestExamplesREADMEKeys checks that the openssl lines examples/README.md
// shows are the walkthrough's, which the walkthrough test runs.
func TestExamplesREADMEKeys(t *testing.T) {
	walk := between(t, doc(t, "README.md"), "<!-- walkthrough:start -->", "<!-- walkthrough:end -->")
	text := string(readFile(t, filepath.Join(repoRoot, "examples", "README.md")))
	n := 0
	for _, block := range fencedBlocks(text, "sh") {
		for line := range strings.Lines(block) {
			if strings.HasPrefix(strings.TrimSpace(line), "awk ") || strings.TrimSpace(line) == "" {
				continue
			}
			if !strings.Contains(walk, line) {
				t.Errorf("examples/README.md has %q, which the README's walkthrough does not", strings.TrimSpace(line))
			}
			n++
		}
	}
	if n == 0 {
		t.Error("examples/README.md shows no openssl lines")
	}
}

// TestMarblesWalkthrough runs the walkthrough of docs/marbles.md: the two
// example Marbles of examples/marbles, one started by quarry-premain and one
// activating itself with marble.Activate, against a real Coordinator: a
// refusal while a user-defined secret is missing, mutual TLS between them,
// the monotonic counter, a restart that keeps the per-Marble key, and the
// refusal past MaxActivations.
func TestMarblesWalkthrough(t *testing.T) {
	for _, tool := range []string{"openssl", "curl", "awk"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (.ci/run installs it)", tool)
			}
			t.Skipf("%s is not installed", tool)
		}
	}
	blocks := fencedBlocks(between(t, doc(t, "docs/marbles.md"), "<!-- marbles-walkthrough:start -->", "<!-- marbles-walkthrough:end -->"), "sh")
	if len(blocks) < 6 {
		t.Fatalf("found %d sh blocks in the Marble walkthrough", len(blocks))
	}
	want := expectedOutput(blocks)
	w := runWalkthrough(t, blocks,
		fmt.Sprintf("EDG_COORDINATOR_MESH_ADDR=127.0.0.1:%d", freePort(t)),
		fmt.Sprintf("BACKEND_ADDR=localhost:%d", freePort(t)))
	checkInOrder(t, w.stdout, want)
	// The outputs the document shows below the first line of a command.
	checkInOrder(t, w.stdout, []string{
		"frontend: the backend says: hello frontend", "frontend: the backend has the same shared key", "frontend: run 1",
		"The backend kept its per-Marble key.",
		"frontend: the backend says: hello frontend", "frontend: the backend has the same shared key", "frontend: run 2",
		"frontend: refused: frontend reached its MaxActivations", "exit status 3",
	})

	// The backend's two starts: one UUID, one per-Marble key.
	var keys []string
	for _, f := range []string{"backend-1.log", "backend-2.log"} {
		log := string(readFile(t, filepath.Join(w.scratch, f)))
		m := regexp.MustCompile(`per-Marble key ([0-9a-f]{12}) \(UUID ([0-9a-f-]{36})\)`).FindStringSubmatch(log)
		if m == nil {
			t.Fatalf("%s shows no per-Marble key:\n%s", f, log)
		}
		keys = append(keys, m[0])
		if strings.Contains(log, "quarry-premain:") {
			t.Errorf("%s: quarry-premain, pinned and given nothing it ignores, has something to say:\n%s", f, log)
		}
	}
	if keys[0] != keys[1] {
		t.Errorf("the backend's restart changed its key or UUID: %q, %q", keys[0], keys[1])
	}
	// The token file the frontend got is what Alice uploaded.
	token := readFile(t, filepath.Join(w.scratch, "token.txt"))
	if got := readFile(t, filepath.Join(w.scratch, "frontend", "token")); !bytes.Equal(got, token) || len(token) != 32 {
		t.Errorf("frontend/token = %q, want the uploaded %q", got, token)
	}
	// The Coordinator refused the first frontend for the missing secret
	// and the third for MaxActivations, and activated four Marbles.
	coordLog := string(readFile(t, filepath.Join(w.scratch, "coordinator.log")))
	if n := strings.Count(coordLog, `"msg":"marble activated"`); n != 4 {
		t.Errorf("the Coordinator logged %d activations, want 4 (two backends, two frontends)", n)
	}
	for _, reason := range []string{`"reason":"templates"`, `"reason":"max_activations"`} {
		if !strings.Contains(coordLog, reason) {
			t.Errorf("the Coordinator logged no refusal with %s", reason)
		}
	}
}
