package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// maxInputBytes bounds a file read by quarry (manifests, keys, secrets).
const maxInputBytes = 64 << 20

// readFile reads a local input file; its problems are usage errors.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usageError{err}
	}
	defer f.Close()
	return readAllLimited(f, path)
}

func readAllLimited(r io.Reader, name string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxInputBytes+1))
	if err != nil {
		return nil, usagef("reading %s: %w", name, err)
	}
	if len(b) > maxInputBytes {
		return nil, usagef("%s is larger than %d bytes", name, maxInputBytes)
	}
	return b, nil
}

// readInput reads path, or standard input for "-".
func (a *app) readInput(path string) ([]byte, error) {
	if path == "-" {
		return readAllLimited(a.in, "standard input")
	}
	return readFile(path)
}

// loadManifest returns the bytes to upload for a manifest file: a JSON file
// verbatim, a YAML file converted once to compact JSON (duplicate keys are an
// error). The result must be a JSON object.
func (a *app) loadManifest(path string) ([]byte, error) {
	raw, err := a.readInput(path)
	if err != nil {
		return nil, err
	}
	return manifestJSON(raw, path)
}

func manifestJSON(raw []byte, name string) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, usagef("manifest %s is empty", name)
	}
	out := raw
	if !json.Valid(raw) {
		conv, err := yaml.YAMLToJSONStrict(raw)
		if err != nil {
			return nil, usagef("manifest %s is neither JSON nor valid YAML: %w", name, err)
		}
		out = conv
	}
	if t := bytes.TrimSpace(out); len(t) == 0 || t[0] != '{' {
		return nil, usagef("manifest %s is not a JSON object (or YAML mapping)", name)
	}
	return out, nil
}

// writeOutput writes data to path, or to standard output if path is empty
// or "-". Files are created with perm (0600 for secrets).
func (a *app) writeOutput(path string, data []byte, perm os.FileMode) error {
	if path == "" || path == "-" {
		_, err := a.out.Write(data)
		return err
	}
	return writeFile(path, data, perm)
}

// writeFile writes a file atomically enough for a CLI: a temporary file in
// the same directory renamed over the target.
func writeFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(perm); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// printJSON writes v as indented JSON to standard output.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// printf writes text to standard output.
func (a *app) printf(format string, args ...any) {
	fmt.Fprintf(a.out, format, args...)
}

// notef writes a note for humans to standard error.
func (a *app) notef(format string, args ...any) {
	fmt.Fprintf(a.errw, format, args...)
}
