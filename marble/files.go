package marble

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Errors of WriteFiles (docs/trust.md); each is wrapped with the file's
// path.
var (
	// ErrFilePath is a path that is empty, contains NUL or a ".."
	// component, or names a directory.
	ErrFilePath = errors.New("the path cannot name a manifest file")
	// ErrFileOutsideRoots is an absolute path under none of the file roots.
	ErrFileOutsideRoots = errors.New("the path is outside the declared file roots")
	// ErrFileSymlink is a symbolic link found as the file or as one of the
	// directories leading to it, beneath the working directory or the file
	// root.
	ErrFileSymlink = errors.New("manifest files are not written through symbolic links")
)

// WriteFiles writes each file with mode 0600, creating missing directories
// on the way with mode 0700 (docs/trust.md):
//
//   - a relative path is written beneath the working directory;
//   - an absolute path is written beneath the longest of FileRoots that
//     contains it; one under none of them is refused (ErrFileOutsideRoots);
//   - a path that is empty, contains NUL or a ".." component, or names a
//     directory is refused (ErrFilePath);
//   - no symbolic link is followed beneath the working directory or the
//     file root: a symbolic link as the file or as any directory on the
//     way is refused (ErrFileSymlink). The working directory and the file
//     roots themselves are opened as named, symbolic links included, and
//     nothing outside them is ever written (os.Root).
//
// An existing regular file is replaced in place and its mode set to 0600;
// anything else at the path is refused. Every path is checked before any
// file is written; files are then written in path order, and the first
// failure ends WriteFiles (files written before it stay).
func (p *Parameters) WriteFiles() error {
	if err := checkFileRoots(p.FileRoots); err != nil {
		return fmt.Errorf("marble: FileRoots: %w", err)
	}
	paths := slices.Sorted(maps.Keys(p.Files))
	targets := make([]target, 0, len(paths))
	for _, path := range paths {
		t, err := place(path, p.FileRoots)
		if err != nil {
			return fmt.Errorf("marble: writing file %q: %w", path, err)
		}
		targets = append(targets, t)
	}
	roots := map[string]*os.Root{}
	defer func() {
		for _, r := range roots {
			r.Close()
		}
	}()
	for _, t := range targets {
		r, ok := roots[t.root]
		if !ok {
			dir := t.root
			if dir == "" {
				dir = "."
			}
			var err error
			if r, err = os.OpenRoot(dir); err != nil {
				return fmt.Errorf("marble: writing file %q: opening its root directory: %w", t.path, err)
			}
			roots[t.root] = r
		}
		if err := writeBeneath(r, t.root, t.rel, p.Files[t.path]); err != nil {
			return fmt.Errorf("marble: writing file %q: %w", t.path, err)
		}
	}
	return nil
}

// target is where one file goes: rel (clean, relative, without "..")
// beneath root ("" for the working directory).
type target struct {
	path, root, rel string
}

// place checks path and finds its root.
func place(path string, roots []string) (target, error) {
	switch {
	case path == "":
		return target{}, fmt.Errorf("%w: it is empty", ErrFilePath)
	case strings.ContainsRune(path, 0):
		return target{}, fmt.Errorf("%w: it contains NUL", ErrFilePath)
	case slices.Contains(strings.Split(filepath.ToSlash(path), "/"), ".."):
		return target{}, fmt.Errorf("%w: it contains \"..\"; give the file's path without \"..\"", ErrFilePath)
	case strings.HasSuffix(path, "/") || strings.HasSuffix(path, string(filepath.Separator)):
		return target{}, fmt.Errorf("%w: it ends in a slash and so names a directory", ErrFilePath)
	}
	clean := filepath.Clean(path)
	if !filepath.IsAbs(clean) {
		if clean == "." {
			return target{}, fmt.Errorf("%w: it names the working directory", ErrFilePath)
		}
		return target{path: path, rel: clean}, nil
	}
	best := ""
	for _, r := range roots {
		r = filepath.Clean(r)
		if beneath(clean, r) && len(r) > len(best) {
			best = r
		}
	}
	if best == "" {
		if len(roots) == 0 {
			return target{}, fmt.Errorf("%w: it is absolute, and no file roots are declared; a Marble that does not pin the Coordinator writes relative paths only, unless its operator declares the directories (Options.FileRoots; QUARRY_FILE_ROOTS of quarry-premain) or pins the Coordinator (docs/trust.md)", ErrFileOutsideRoots)
		}
		return target{}, fmt.Errorf("%w %s", ErrFileOutsideRoots, strings.Join(roots, ", "))
	}
	rel, err := filepath.Rel(best, clean)
	if err != nil {
		return target{}, fmt.Errorf("%w: %v", ErrFilePath, err)
	}
	return target{path: path, root: best, rel: rel}, nil
}

// beneath reports whether the clean absolute path p lies strictly beneath
// the clean absolute directory dir.
func beneath(p, dir string) bool {
	if dir == string(filepath.Separator) {
		return p != dir
	}
	return strings.HasPrefix(p, dir+string(filepath.Separator))
}

// checkFileRoots checks that every root is an absolute path.
func checkFileRoots(roots []string) error {
	for _, r := range roots {
		if !filepath.IsAbs(r) {
			return fmt.Errorf("%q is not an absolute path; a file root is an absolute directory", r)
		}
	}
	return nil
}

// writeBeneath writes data to rel beneath r (whose name, for messages, is
// rootName), creating missing directories and following no symbolic link.
//
// Each step looks at the entry with Lstat, refuses a symbolic link, and
// then opens it and checks that what it opened is what it looked at, so a
// directory replaced by a link in between is refused too; os.Root keeps
// every open inside r whatever happens meanwhile.
func writeBeneath(r *os.Root, rootName, rel string, data []byte) error {
	parts := strings.Split(rel, string(filepath.Separator))
	shown := func(i int) string { return filepath.Join(append([]string{rootName}, parts[:i+1]...)...) }
	dir := r
	defer func() {
		if dir != r {
			dir.Close()
		}
	}()
	for i, name := range parts[:len(parts)-1] {
		sub, err := openDir(dir, name, shown(i))
		if err != nil {
			return err
		}
		if dir != r {
			dir.Close()
		}
		dir = sub
	}
	return writeFile(dir, parts[len(parts)-1], shown(len(parts)-1), data)
}

// openDir opens the directory name in dir, creating it (0700) if it does
// not exist.
func openDir(dir *os.Root, name, shown string) (*os.Root, error) {
	fi, err := dir.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		if err := dir.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		fi, err = dir.Lstat(name)
	}
	switch {
	case err != nil:
		return nil, err
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil, fmt.Errorf("%w: %s is a symbolic link", ErrFileSymlink, shown)
	case !fi.IsDir():
		return nil, fmt.Errorf("%s is not a directory", shown)
	}
	sub, err := dir.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	if st, err := sub.Stat("."); err != nil || !os.SameFile(fi, st) {
		sub.Close()
		return nil, fmt.Errorf("%w: %s changed while it was opened", ErrFileSymlink, shown)
	}
	return sub, nil
}

// writeFile writes data to the file name in dir with mode 0600: a new file
// is created exclusively (which never follows a link), an existing regular
// file is opened, checked to be the one looked at, and truncated.
func writeFile(dir *os.Root, name, shown string, data []byte) error {
	fi, err := dir.Lstat(name)
	var f *os.File
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if f, err = dir.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
			return err
		}
	case err != nil:
		return err
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link", ErrFileSymlink, shown)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s exists and is not a regular file (%s)", shown, fi.Mode().Type())
	default:
		if f, err = dir.OpenFile(name, os.O_WRONLY, 0); err != nil {
			return err
		}
		st, err := f.Stat()
		if err == nil && !os.SameFile(fi, st) {
			err = fmt.Errorf("%w: %s changed while it was opened", ErrFileSymlink, shown)
		}
		if err == nil && st.Size() > 0 {
			err = f.Truncate(0)
		}
		if err != nil {
			f.Close()
			return err
		}
	}
	err = f.Chmod(0o600)
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
