package marble

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/google/uuid"
)

// maxUUIDFileSize bounds the UUID file read; a UUID in any form google/uuid
// accepts is at most 45 bytes.
const maxUUIDFileSize = 1 << 10

// loadOrCreateUUID returns the Marble's UUID in canonical form: the one in
// path, or a new random one written to path (mode 0600) if path does not
// exist. Surrounding white space in the file is ignored.
func loadOrCreateUUID(path string) (string, error) {
	id, err := readUUID(path)
	if !errors.Is(err, fs.ErrNotExist) {
		return id, err
	}
	u, err := uuid.NewRandom()
	if err != nil {
		return "", fmt.Errorf("marble: generating a UUID: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Another process of the same Marble was quicker.
		return readUUID(path)
	}
	if err != nil {
		return "", fmt.Errorf("marble: creating the UUID file: %w", err)
	}
	_, werr := f.WriteString(u.String())
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		os.Remove(path) // an empty or partial UUID file would fail every later start
		return "", fmt.Errorf("marble: writing the UUID file: %w", werr)
	}
	return u.String(), nil
}

// readUUID reads the UUID in path; the error matches fs.ErrNotExist if
// there is no such file.
func readUUID(path string) (string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err != nil {
		return "", fmt.Errorf("marble: reading the UUID file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxUUIDFileSize+1))
	if err != nil {
		return "", fmt.Errorf("marble: reading the UUID file: %w", err)
	}
	if len(b) > maxUUIDFileSize {
		return "", fmt.Errorf("marble: UUID file %s: larger than %d bytes", path, maxUUIDFileSize)
	}
	u, err := uuid.Parse(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("marble: UUID file %s: %w", path, err)
	}
	return u.String(), nil
}
