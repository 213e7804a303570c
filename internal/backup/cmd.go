package backup

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

// Exit codes of `coordinator backup` and `coordinator restore`
// (docs/backup.md).
const (
	ExitOK = 0
	// ExitFailure: anything else (I/O errors, ...).
	ExitFailure = 1
	// ExitUsage: bad flags or arguments.
	ExitUsage = 2
	// ExitInUse: restore found a running Coordinator on the directory.
	ExitInUse = 3
	// ExitExists: restore found another sealed state and no --force.
	ExitExists = 4
	// ExitInvalid: the backup file is truncated, corrupt or not a backup.
	ExitInvalid = 5
	// ExitNoState: backup found no sealed state in the directory.
	ExitNoState = 6
	// ExitInconsistent: backup found no consistent pair of files.
	ExitInconsistent = 7
)

// defaultSealDirName is the Coordinator's default seal directory under
// EDG_CWD (config.DefaultSealDirName; a test keeps them equal).
const defaultSealDirName = "marblerun-coordinator-data"

// DefaultSealDir is the seal directory the Coordinator uses with the same
// environment: EDG_COORDINATOR_SEAL_DIR, else marblerun-coordinator-data
// under EDG_CWD or the working directory.
func DefaultSealDir(getenv func(string) string) string {
	if d := getenv("EDG_COORDINATOR_SEAL_DIR"); d != "" {
		return d
	}
	cwd := getenv("EDG_CWD")
	if cwd == "" {
		cwd = "."
	}
	return filepath.Join(cwd, defaultSealDirName)
}

// IsCommand reports whether the coordinator's first argument names one of
// this package's subcommands.
func IsCommand(arg string) bool { return arg == "backup" || arg == "restore" }

// Main runs `coordinator backup` or `coordinator restore` (name) with the
// remaining arguments and returns the exit code. Messages go to stderr;
// stdout carries the backup when --out is "-".
func Main(name string, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx := context.Background()
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "coordinator %s: "+format+"\n", append([]any{name}, a...)...)
		return code
	}
	fsFlags := flag.NewFlagSet("coordinator "+name, flag.ContinueOnError)
	fsFlags.SetOutput(stderr)
	dir := fsFlags.String("seal-dir", DefaultSealDir(getenv),
		"the Coordinator's seal directory [default: EDG_COORDINATOR_SEAL_DIR, else marblerun-coordinator-data under EDG_CWD or the working directory]")
	var out, in *string
	var force *bool
	switch name {
	case "backup":
		out = fsFlags.String("out", "", "backup file to write (must not exist); - writes to standard output")
		fsFlags.Usage = func() {
			fmt.Fprint(stderr, "Usage: coordinator backup [--seal-dir DIR] --out FILE\n\n"+
				"Writes a consistent copy of the sealed state (sealed_data, sealed_key, and the\n"+
				"update log segments in updatelog/) to FILE,\n"+
				"also while a Coordinator runs on DIR. Nothing in it is decrypted.\n\n"+
				"Exit codes: 0 written, 1 failure, 2 usage, 6 no sealed state in DIR,\n"+
				"7 no consistent pair of files (recovery mode, or the state kept changing).\n\nFlags:\n")
			fsFlags.PrintDefaults()
		}
	case "restore":
		in = fsFlags.String("in", "", "backup file to restore; - reads standard input")
		force = fsFlags.Bool("force", false, "replace another sealed state in DIR (its files are kept as sealed_*.before-restore-<time>)")
		fsFlags.Usage = func() {
			fmt.Fprint(stderr, "Usage: coordinator restore [--seal-dir DIR] --in FILE [--force]\n\n"+
				"Puts the sealed state of a backup back into DIR while no Coordinator runs on it.\n"+
				"Another state in DIR is replaced only with --force, and kept beside it.\n\n"+
				"Exit codes: 0 restored (or already in place), 1 failure, 2 usage,\n"+
				"3 a Coordinator holds DIR, 4 DIR holds another state (use --force),\n"+
				"5 the backup file is truncated, corrupt or not a backup.\n\nFlags:\n")
			fsFlags.PrintDefaults()
		}
	default:
		return fail(ExitUsage, "unknown command")
	}
	if err := fsFlags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if fsFlags.NArg() > 0 {
		return fail(ExitUsage, "unexpected argument %q", fsFlags.Arg(0))
	}
	if *dir == "" {
		return fail(ExitUsage, "--seal-dir must not be empty")
	}

	if name == "backup" {
		if *out == "" {
			return fail(ExitUsage, "--out FILE is required (- for standard output)")
		}
		a, info, err := Take(ctx, *dir, TakeOptions{})
		switch {
		case errors.Is(err, ErrNoState):
			return fail(ExitNoState, "%v", err)
		case errors.Is(err, ErrInconsistent):
			return fail(ExitInconsistent, "%v", err)
		case err != nil:
			return fail(ExitFailure, "%v", err)
		}
		if err := writeBackup(*out, a, stdout); err != nil {
			return fail(ExitFailure, "%v", err)
		}
		for _, sk := range info.Skipped {
			fmt.Fprintf(stderr, "coordinator backup: warning: left out %s (not a sealed update log segment; no state references it unless the disk damaged it)\n", sk)
		}
		how := "no Coordinator was running; the directory was locked while reading"
		if !info.Locked {
			how = fmt.Sprintf("read without the directory lock (a Coordinator runs on it), consistent after %d attempt(s)", info.Attempts)
		}
		fmt.Fprintf(stderr, "coordinator backup: wrote the sealed state of %s to %s (sealed_data %d bytes, SHA-256 %s; %d update log segment(s); %s)\n",
			*dir, displayName(*out), len(a.Data), sum(a.Data), len(a.Segments), how)
		return ExitOK
	}

	if *in == "" {
		return fail(ExitUsage, "--in FILE is required (- for standard input)")
	}
	a, err := readBackup(*in, stdin)
	switch {
	case errors.Is(err, ErrInvalid):
		return fail(ExitInvalid, "%s: %v", displayName(*in), err)
	case err != nil:
		return fail(ExitFailure, "%v", err)
	}
	res, err := Restore(ctx, *dir, a, *force, nil)
	var exists *ExistingStateError
	var segs *ExistingSegmentsError
	switch {
	case errors.Is(err, ErrInUse):
		return fail(ExitInUse, "%v; stop the Coordinator first", err)
	case errors.As(err, &exists), errors.As(err, &segs):
		return fail(ExitExists, "%v", err)
	case errors.Is(err, ErrInvalid):
		return fail(ExitInvalid, "%s: %v", displayName(*in), err)
	case err != nil:
		return fail(ExitFailure, "%v", err)
	}
	if res.Unchanged {
		fmt.Fprintf(stderr, "coordinator restore: %s holds this backup's state already; nothing changed\n", *dir)
		return ExitOK
	}
	fmt.Fprintf(stderr, "coordinator restore: restored the backup of %s into %s (%d update log segment(s) written)\n", a.Created.Format(time.RFC3339), *dir, res.Segments)
	for _, p := range res.Aside {
		fmt.Fprintf(stderr, "coordinator restore: kept the replaced file as %s\n", p)
	}
	if res.Marker != nil {
		fmt.Fprintf(stderr, "coordinator restore: %s\n", describeRestore(res))
	}
	return ExitOK
}

// describeRestore says what a restore that replaced the state does to the
// signed update log (docs/update-log.md, "Restores").
func describeRestore(res RestoreResult) string {
	m := res.Marker
	var b strings.Builder
	if res.Restored != nil {
		fmt.Fprintf(&b, "the update log goes back to the backup's %d entries", res.Restored.Count)
	} else {
		b.WriteString("the update log goes back to where the backup was taken (its length is not in the backup's header: an earlier version's state)")
	}
	switch {
	case m.Replaced != nil && res.Restored != nil && m.Replaced.Count > res.Restored.Count:
		fmt.Fprintf(&b, "; the state replaced had %d (head %s): entries %d to %d leave the signed history, and new ones will be signed in their place",
			m.Replaced.Count, m.Replaced.Head, res.Restored.Count+1, m.Replaced.Count)
	case m.Replaced != nil:
		fmt.Fprintf(&b, "; the state replaced had %d (head %s)", m.Replaced.Count, m.Replaced.Head)
	case m.ReplacedState == logchain.ReplacedNone:
		b.WriteString("; the directory held no state")
	default:
		b.WriteString("; what the replaced state's log held is not known (its header has no checkpoint: an earlier version's or MarbleRun's state)")
	}
	fmt.Fprintf(&b, ". The Coordinator records this restore in its update log when it next opens the state (the marker %s), so that a client holding a later checkpoint is told of the restore", updatelog.RestoreMarkerFile)
	return b.String()
}

func displayName(path string) string {
	if path == "-" {
		return "standard output/input"
	}
	return path
}

// writeBackup writes the archive to path ("-": w): to <path>.tmp, synced,
// then renamed into place. An existing file at path is never replaced.
func writeBackup(path string, a *Archive, w io.Writer) (err error) {
	if path == "-" {
		bw := bufio.NewWriter(w)
		if err := a.Encode(bw); err != nil {
			return err
		}
		return bw.Flush()
	}
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%s exists; choose another name (a backup is never overwritten)", path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriter(f)
	if err = a.Encode(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	// A hard link never replaces path; without hard links, check then
	// rename.
	if lerr := os.Link(tmp, path); lerr == nil {
		os.Remove(tmp)
	} else if errors.Is(lerr, fs.ErrExist) {
		err = fmt.Errorf("%s exists; choose another name (a backup is never overwritten)", path)
		return err
	} else if _, serr := os.Lstat(path); serr == nil {
		err = fmt.Errorf("%s exists; choose another name (a backup is never overwritten)", path)
		return err
	} else if err = os.Rename(tmp, path); err != nil {
		return err
	}
	if d, derr := os.Open(filepath.Dir(path)); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// readBackup reads and verifies a backup file ("-": r).
func readBackup(path string, r io.Reader) (*Archive, error) {
	if path == "-" {
		return Decode(bufio.NewReader(r))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Decode(bufio.NewReader(f))
}
