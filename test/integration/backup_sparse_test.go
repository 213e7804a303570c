package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// ustarBlock is a ustar header block with its checksum.
func ustarBlock(name string, typ byte, size int) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:108], "0000600\x00")
	copy(b[108:116], "0000000\x00")
	copy(b[116:124], "0000000\x00")
	copy(b[124:136], fmt.Sprintf("%011o\x00", size))
	copy(b[136:148], fmt.Sprintf("%011o\x00", 1767225600))
	b[156] = typ
	copy(b[257:263], "ustar\x00")
	copy(b[263:265], "00")
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// tarEntry is a header block of type typ and the content padded to blocks.
func tarEntry(name string, typ byte, content []byte) []byte {
	out := append(ustarBlock(name, typ, len(content)), content...)
	if r := len(content) % 512; r != 0 {
		out = append(out, make([]byte, 512-r)...)
	}
	return out
}

// paxRecord is one POSIX pax record, its length counting itself.
func paxRecord(key, value string) string {
	rec := " " + key + "=" + value + "\n"
	n := len(rec) + 1
	for len(strconv.Itoa(n))+len(rec) != n {
		n++
	}
	return strconv.Itoa(n) + rec
}

// sparseBackupFile is a backup file of a few KiB whose sealed_data is a PAX
// sparse file (GNU.sparse 1.0) of realSize bytes: one data byte at the end,
// the rest a hole the tar reader fills with zeros. Its descriptor declares
// that size (with a hash it does not match).
func sparseBackupFile(realSize int) []byte {
	key := bytes.Repeat([]byte{7}, 32)
	desc := fmt.Sprintf(`{"format":"quarry-seal-backup","version":2,"created":"2026-01-02T03:04:05Z","files":[`+
		`{"name":"sealed_data","size":%d,"sha256":%q},{"name":"sealed_key","size":%d,"sha256":%q}]}`,
		realSize, strings.Repeat("0", 64), len(key), strings.Repeat("0", 64))
	out := tarEntry("quarry-backup.json", '0', []byte(desc))
	pax := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", "sealed_data") + paxRecord("GNU.sparse.realsize", strconv.Itoa(realSize))
	out = append(out, tarEntry("PaxHeaders/sealed_data", 'x', []byte(pax))...)
	sparseMap := make([]byte, 512) // one entry: the last byte holds data
	copy(sparseMap, "1\n"+strconv.Itoa(realSize-1)+"\n1\n")
	out = append(out, tarEntry("GNUSparseFile.0/sealed_data", '0', append(sparseMap, 'x'))...)
	out = append(out, tarEntry("sealed_key", '0', key)...)
	return append(out, make([]byte, 1024)...)
}

// TestRestoreRefusesSparseBackup: coordinator restore refuses a backup of
// a few KiB whose sealed_data is a sparse file of 512 MiB (exit 5, naming
// the sparse file) without expanding it: the process's peak resident size
// stays far below the size the file claims, and the seal directory is
// untouched.
func TestRestoreRefusesSparseBackup(t *testing.T) {
	// Not parallel: the child's peak RSS from wait4 starts at the test process's own, which parallel tests raise.
	const claimed = 512 << 20
	raw := sparseBackupFile(claimed)
	work := t.TempDir()
	file, dir := filepath.Join(work, "sparse.qbk"), filepath.Join(work, "seal")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(coordinatorBin, "restore", "--seal-dir", dir, "--in", file)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Fatalf("no resource usage for the process (%T)", cmd.ProcessState.SysUsage())
	}
	peak := int64(ru.Maxrss) << 10 // KiB on Linux
	t.Logf("%d-byte backup claiming %d MiB: exit %d, peak RSS %d MiB\n%s", len(raw), claimed>>20, cmd.ProcessState.ExitCode(), peak>>20, stderr.String())
	if code := cmd.ProcessState.ExitCode(); code != 5 || !strings.Contains(stderr.String(), "sealed_data is a sparse file") {
		t.Fatalf("exit %d, want 5 with a message naming sealed_data as a sparse file\n%s", code, stderr.String())
	}
	// About 25 MiB (56 MiB built with the race detector), against the
	// 1.25 GB it took when the 512 MiB were expanded; the bound leaves
	// room for the runtime and stays far below the claimed size.
	if limit := int64(192 << 20); peak > limit {
		t.Fatalf("peak RSS %d MiB, want below %d MiB", peak>>20, limit>>20)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("the refused restore wrote into the seal directory: %v", entries)
	}
}
