package container_test

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/config"
)

// The Dockerfile is read by the small reader below rather than by BuildKit's
// parser: that module would bring a container runtime's dependencies into
// go.mod for one test. The reader understands the subset the Dockerfile
// uses (instructions one per logical line, backslash continuations,
// comments, JSON arrays, ENV key=value, ARG defaults in FROM) and fails on
// anything else (another instruction, a heredoc, an escape directive,
// quotes or shell syntax in a go build line), so a change it cannot read
// fails this test instead of passing unchecked.

const repoRoot = "../.."

type instruction struct {
	cmd  string // upper case
	args string
	line int
}

type stage struct {
	image, name string
	ins         []instruction
	env         map[string]string
	args        map[string]string // the stage's ARGs and their defaults
}

func (s *stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// one returns the stage's only instruction cmd.
func (s *stage) one(t *testing.T, cmd string) instruction {
	t.Helper()
	all := s.all(cmd)
	if len(all) != 1 {
		t.Fatalf("stage %s has %d %s instructions, want 1", s.name, len(all), cmd)
	}
	return all[0]
}

var known = map[string]bool{"ARG": true, "FROM": true, "WORKDIR": true, "COPY": true, "RUN": true, "ENV": true,
	"USER": true, "VOLUME": true, "EXPOSE": true, "ENTRYPOINT": true, "LABEL": true, "CMD": true}

// parseDockerfile returns the global ARG defaults and the stages.
func parseDockerfile(text string) (map[string]string, []*stage, error) {
	args := map[string]string{}
	var stages []*stage
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		start := i + 1
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "#") {
			if regexp.MustCompile(`^#\s*escape\s*=`).MatchString(l) {
				return nil, nil, fmt.Errorf("Dockerfile:%d: escape directive not supported by this reader", start)
			}
			continue
		}
		if l == "" {
			continue
		}
		// Continuations; comment lines inside them are dropped, as
		// Docker does.
		for strings.HasSuffix(l, `\`) {
			l = strings.TrimSuffix(l, `\`)
			i++
			for i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "#") {
				i++
			}
			if i >= len(lines) {
				return nil, nil, fmt.Errorf("Dockerfile:%d: continuation at the end of the file", start)
			}
			l += " " + strings.TrimSpace(lines[i])
		}
		cmd, rest, _ := strings.Cut(l, " ")
		cmd = strings.ToUpper(cmd)
		rest = strings.TrimSpace(rest)
		if !known[cmd] {
			return nil, nil, fmt.Errorf("Dockerfile:%d: instruction %s not understood by this reader", start, cmd)
		}
		if strings.Contains(rest, "<<") {
			return nil, nil, fmt.Errorf("Dockerfile:%d: heredocs not supported by this reader", start)
		}
		in := instruction{cmd, rest, start}
		switch {
		case cmd == "FROM":
			f := strings.Fields(rest)
			st := &stage{env: map[string]string{}, args: map[string]string{}}
			switch {
			case len(f) == 1:
				st.image = f[0]
			case len(f) == 3 && strings.EqualFold(f[1], "AS"):
				st.image, st.name = f[0], f[2]
			default:
				return nil, nil, fmt.Errorf("Dockerfile:%d: FROM %s", start, rest)
			}
			st.image = os.Expand(st.image, func(k string) string { return args[k] })
			stages = append(stages, st)
		case len(stages) == 0 && cmd == "ARG":
			k, v, _ := strings.Cut(rest, "=")
			args[k] = v
		case len(stages) == 0:
			return nil, nil, fmt.Errorf("Dockerfile:%d: %s before FROM", start, cmd)
		default:
			st := stages[len(stages)-1]
			st.ins = append(st.ins, in)
			if cmd == "ARG" {
				k, v, _ := strings.Cut(rest, "=")
				st.args[k] = v
			}
			if cmd == "ENV" {
				for _, kv := range strings.Fields(rest) {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || strings.ContainsAny(v, `"'$`) {
						return nil, nil, fmt.Errorf("Dockerfile:%d: ENV %q: this reader takes unquoted key=value pairs", start, kv)
					}
					st.env[k] = v
				}
			}
		}
	}
	return args, stages, nil
}

// jsonArray parses the exec (JSON) form.
func jsonArray(t *testing.T, in instruction) []string {
	t.Helper()
	var out []string
	if err := json.Unmarshal([]byte(in.args), &out); err != nil {
		t.Fatalf("Dockerfile:%d: %s must use the JSON form: %v", in.line, in.cmd, err)
	}
	return out
}

// goBuild is one go build line of the build stage.
type goBuild struct {
	args   []string // after "go"
	out    string   // the -o path
	pkg    string
	inline map[string]string // VAR=value before "go"
}

// shellWords splits a go build line the way the build's shell does, for
// the little syntax it may use: words separated by blanks, double quotes
// around a word or part of it, and ${NAME} for a build argument of the
// stage (replaced by vars[NAME]). Anything else a shell would interpret
// is refused, so that this test runs exactly what the build runs.
func shellWords(line string, st *stage, vars map[string]string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '"':
			quoted, inWord = !quoted, true
		case c == '$':
			end := strings.IndexByte(line[i:], '}')
			if !strings.HasPrefix(line[i:], "${") || end < 0 {
				return nil, fmt.Errorf("$ other than ${NAME} in %s", line)
			}
			name := line[i+2 : i+end]
			if _, ok := st.args[name]; !ok {
				return nil, fmt.Errorf("${%s} is not an ARG of stage %s", name, st.name)
			}
			cur.WriteString(vars[name])
			inWord = true
			i += end
		case strings.IndexByte("'`;&|<>()\\*?", c) >= 0:
			return nil, fmt.Errorf("shell syntax %q in %s", c, line)
		case (c == ' ' || c == '\t') && !quoted:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %s", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// goBuilds returns the stage's go build lines with the build arguments
// set to vars.
func goBuilds(st *stage, vars map[string]string) ([]goBuild, error) {
	var out []goBuild
	for _, in := range st.all("RUN") {
		if !strings.Contains(in.args, "go build") {
			continue
		}
		f, err := shellWords(in.args, st, vars)
		if err != nil {
			return nil, fmt.Errorf("Dockerfile:%d: the go build line must be a plain command (words, double quotes, ${ARG}) so this test runs exactly it: %v", in.line, err)
		}
		b := goBuild{inline: map[string]string{}}
		for len(f) > 0 && strings.Contains(f[0], "=") {
			k, v, _ := strings.Cut(f[0], "=")
			b.inline[k] = v
			f = f[1:]
		}
		if len(f) < 2 || f[0] != "go" || f[1] != "build" {
			return nil, fmt.Errorf("Dockerfile:%d: not a go build line: %s", in.line, in.args)
		}
		b.args = f[1:]
		for i, a := range b.args {
			if a == "-o" && i+1 < len(b.args) {
				b.out = b.args[i+1]
			}
		}
		b.pkg = b.args[len(b.args)-1]
		if b.out == "" {
			return nil, fmt.Errorf("Dockerfile:%d: go build without -o", in.line)
		}
		out = append(out, b)
	}
	return out, nil
}

func readDockerfile(t *testing.T) (map[string]string, map[string]*stage, []*stage) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	args, stages, err := parseDockerfile(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*stage{}
	for _, s := range stages {
		byName[s.name] = s
	}
	return args, byName, stages
}

// copyFrom returns the COPY --from=build sources of a stage by destination.
func copyFrom(t *testing.T, st *stage) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, in := range st.all("COPY") {
		f := strings.Fields(in.args)
		var from string
		var rest []string
		for _, a := range f {
			if v, ok := strings.CutPrefix(a, "--from="); ok {
				from = v
			} else if !strings.HasPrefix(a, "--") {
				rest = append(rest, a)
			}
		}
		if from != "build" || len(rest) != 2 {
			t.Fatalf("Dockerfile:%d: COPY %s: want COPY --from=build SRC DST", in.line, in.args)
		}
		out[rest[1]] = rest[0]
	}
	return out
}

func TestDockerfile(t *testing.T) {
	args, stages, order := readDockerfile(t)
	build, coord, cli, inj := stages["build"], stages["coordinator"], stages["cli"], stages["marble-injector"]
	if build == nil || coord == nil || cli == nil || inj == nil {
		t.Fatalf("stages %v, want build, cli, marble-injector and coordinator", stages)
	}
	// docker build without --target builds the last stage: the Coordinator.
	if order[len(order)-1] != coord {
		t.Error("the Coordinator is not the last (default) stage")
	}

	// The build stage's Go is the go.mod's version.
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil || !strings.HasPrefix(build.image, "golang:"+string(m[1])) {
		t.Errorf("build stage image %s (GO_VERSION %q), go.mod says go %s", build.image, args["GO_VERSION"], m[1])
	}

	// Run the exact go build lines with the stage's environment, into a
	// temporary root standing for the stage's file system.
	if build.env["CGO_ENABLED"] != "0" {
		t.Fatalf("the build stage does not set CGO_ENABLED=0: %v", build.env)
	}
	builds, err := goBuilds(build, stampArgs)
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string]string{} // package → -o path in the image
	tmp := t.TempDir()
	for _, b := range builds {
		if !slices.Contains(b.args, "-trimpath") {
			t.Errorf("go build %s without -trimpath", b.pkg)
		}
		args := slices.Clone(b.args)
		for i := range args {
			if args[i] == b.out {
				args[i] = filepath.Join(tmp, b.out)
			}
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "GOFLAGS=")
		for k, v := range build.env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		for k, v := range b.inline {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(b.args, " "), err, out)
		}
		outs[b.pkg] = b.out
		checkStatic(t, filepath.Join(tmp, b.out))
		checkStripped(t, filepath.Join(tmp, b.out))
	}
	checkStamped(t, tmp, outs)

	for _, c := range []struct {
		st       *stage
		pkg      string
		helpWant string
	}{
		{coord, "./cmd/coordinator", "Usage: coordinator"},
		{cli, "./cmd/quarry", "quarry"},
		{inj, "./cmd/marble-injector", "Usage: marble-injector"},
	} {
		t.Run(c.st.name, func(t *testing.T) {
			if !strings.HasPrefix(c.st.image, "gcr.io/distroless/static") && c.st.image != "scratch" {
				t.Errorf("base image %s, want distroless static or scratch", c.st.image)
			}
			checkUser(t, c.st)
			entry := jsonArray(t, c.st.one(t, "ENTRYPOINT"))
			src, ok := copyFrom(t, c.st)[entry[0]]
			if len(entry) != 1 || !ok || outs[c.pkg] == "" || src != outs[c.pkg] {
				t.Fatalf("ENTRYPOINT %v is not the binary built from %s (%s)", entry, c.pkg, outs[c.pkg])
			}
			// The binary starts: --help, exit 0.
			out, err := exec.Command(filepath.Join(tmp, src), "--help").CombinedOutput()
			if err != nil || !strings.Contains(string(out), c.helpWant) {
				t.Fatalf("%s --help: %v\n%s", entry[0], err, out)
			}
		})
	}

	// The Coordinator's settings: the image's ENV as config.Load reads it.
	cfg, err := config.Load(func(k string) string { return coord.env[k] }, nil, &bytes.Buffer{})
	if err != nil {
		t.Fatalf("the image's environment is not a valid configuration: %v", err)
	}
	vol := jsonArray(t, coord.one(t, "VOLUME"))
	if len(vol) != 1 || vol[0] != cfg.SealDir {
		t.Errorf("VOLUME %v, the seal directory is %s", vol, cfg.SealDir)
	}
	if copyFrom(t, coord)[cfg.SealDir] == "" {
		t.Errorf("the seal directory %s is not created in the image (with the non-root owner)", cfg.SealDir)
	}
	var want []string
	for _, addr := range []string{cfg.ClientAddr, cfg.MeshAddr, cfg.PrometheusAddr} {
		_, port, err := net.SplitHostPort(addr)
		if err != nil || port == "0" {
			t.Fatalf("address %q has no fixed port", addr)
		}
		want = append(want, port)
	}
	var exposed []string
	for _, in := range coord.all("EXPOSE") {
		for _, p := range strings.Fields(in.args) {
			exposed = append(exposed, strings.TrimSuffix(p, "/tcp"))
		}
	}
	slices.Sort(want)
	slices.Sort(exposed)
	if !slices.Equal(want, exposed) {
		t.Errorf("EXPOSE %v, the settings listen on %v", exposed, want)
	}
}

// checkUser: the stage's last USER is a non-root numeric user (Kubernetes'
// runAsNonRoot can only verify a numeric one).
func checkUser(t *testing.T, st *stage) {
	t.Helper()
	users := st.all("USER")
	if len(users) == 0 {
		t.Fatalf("stage %s has no USER (runs as root)", st.name)
	}
	uid, _, _ := strings.Cut(users[len(users)-1].args, ":")
	n, err := strconv.Atoi(uid)
	if err != nil || n == 0 {
		t.Fatalf("stage %s: USER %s, want a numeric non-root user", st.name, users[len(users)-1].args)
	}
}

// checkStatic: no program interpreter, no dynamic section, no libraries.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s: program header %v: not a static binary", filepath.Base(path), p.Type)
		}
	}
	if s := f.Section(".dynamic"); s != nil {
		t.Errorf("%s has a .dynamic section", filepath.Base(path))
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s links %v", filepath.Base(path), libs)
	}
}

// The reader refuses what it does not understand.
func TestDockerfileReaderRefuses(t *testing.T) {
	for bad, want := range map[string]string{
		"FROM x AS a\nHEALTHCHECK CMD true\n":     "HEALTHCHECK not understood",
		"# escape=`\nFROM x\n":                    "escape directive",
		"FROM x AS a\nRUN <<EOF\ngo build\nEOF\n": "heredocs",
		"RUN true\n":                   "before FROM",
		"FROM x AS a\nENV A=\"b c\"\n": "unquoted",
		"FROM x AS a\nRUN a \\":        "continuation at the end",
	} {
		if _, _, err := parseDockerfile(bad); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error saying %q", bad, err, want)
		}
	}
	for _, bad := range []string{"CGO_ENABLED=0 go build -o $OUT ./cmd/x", "go build -o ${NOPE} ./cmd/x", "go build -o x ./cmd/x; rm -rf /",
		`go build -ldflags="-s -o x ./cmd/x`, "go build -o `x` ./cmd/x"} {
		st := &stage{name: "b", args: map[string]string{"V": ""}, ins: []instruction{{cmd: "RUN", args: bad, line: 1}}}
		if _, err := goBuilds(st, nil); err == nil {
			t.Errorf("go build line %q accepted", bad)
		}
	}
	st := &stage{name: "b", args: map[string]string{"V": ""}, ins: []instruction{{cmd: "RUN", args: `go build -ldflags="-s -w -X a.b=${V}" -o /x ./cmd/x`, line: 1}}}
	if b, err := goBuilds(st, map[string]string{"V": "v1"}); err != nil || len(b) != 1 || !slices.Equal(b[0].args, []string{"build", "-ldflags=-s -w -X a.b=v1", "-o", "/x", "./cmd/x"}) {
		t.Errorf("quoted ldflags: %v %v", b, err)
	}
}

// stampArgs are the build arguments the test builds with, standing for a
// release build's --build-arg VERSION=... --build-arg COMMIT=....
var stampArgs = map[string]string{"VERSION": "v9.8.7-stamp", "COMMIT": "0123456789abcdef0123456789abcdef01234567"}

// checkStripped: -s -w leave no symbol table and no DWARF.
func checkStripped(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, s := range f.Sections {
		if s.Name == ".symtab" || strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
			t.Errorf("%s has section %s: not stripped (-ldflags -s -w)", filepath.Base(path), s.Name)
		}
	}
}

// checkStamped: the binaries report the build arguments' version and
// commit: coordinator --version, quarry version, marble-injector -version
// and the coordinator_version_info metric of a running Coordinator.
func checkStamped(t *testing.T, dir string, outs map[string]string) {
	t.Helper()
	v, c := stampArgs["VERSION"], stampArgs["COMMIT"]
	for pkg, args := range map[string][]string{"./cmd/coordinator": {"--version"}, "./cmd/quarry": {"version"}, "./cmd/marble-injector": {"-version"}} {
		out, err := exec.Command(filepath.Join(dir, outs[pkg]), args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), v) || !strings.Contains(string(out), c) {
			t.Errorf("%s %v: %v\n%s; want version %s and commit %s", pkg, args, err, out, v, c)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(filepath.Join(dir, outs["./cmd/coordinator"]))
	cmd.Env = append(os.Environ(), "EDG_COORDINATOR_SEAL_DIR="+t.TempDir(), "EDG_COORDINATOR_CLIENT_ADDR=127.0.0.1:0",
		"EDG_COORDINATOR_MESH_ADDR=127.0.0.1:0", "EDG_COORDINATOR_PROMETHEUS_ADDR="+addr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	want := fmt.Sprintf(`coordinator_version_info{commit=%q,version=%q} 0`, c, v)
	deadline := time.Now().Add(20 * time.Second)
	var body []byte
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if bytes.Contains(body, []byte("coordinator_version_info")) {
				break
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !bytes.Contains(body, []byte(want)) {
		t.Errorf("metrics lack %s:\n%s", want, body)
	}
}
