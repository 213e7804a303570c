package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/quarry-cc/quarry/internal/attest/sigstruct/sigstructtest"
)

// cmdSHA256 is `sha256 FILE VAR`: VAR = the hex SHA-256 of FILE.
func cmdSHA256(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: sha256 FILE VAR")
	}
	sum := sha256.Sum256([]byte(ts.ReadFile(args[0])))
	ts.Setenv(args[1], hex.EncodeToString(sum[:]))
}

// The values of the SIGSTRUCTs that `sigstruct` writes.
var sigFields = sigstructtest.Fields{MRENCLAVE: [32]byte{'q', 'u', 'a', 'r', 'r', 'y', 31: 0x5a}, ISVProdID: 7, ISVSVN: 3}

// cmdSigstruct is `sigstruct KIND PATH`: an enclave signed with the test
// key, as a Gramine instance (PATH a directory with app.sig), an EGo binary
// (PATH an ELF file with .oeinfo), an Occlum instance (PATH a directory with
// the signed LibOS) or a Gramine .sig whose signature was broken (tampered).
// It sets SIG_MRENCLAVE and SIG_MRSIGNER (hex) and SIG_PRODID, SIG_SVN.
func cmdSigstruct(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: sigstruct gramine|ego|occlum|tampered PATH")
	}
	key := sigstructtest.TestKey()
	raw := key.Sign(sigFields)
	path := ts.MkAbs(args[1])
	write := func(p string, b []byte) {
		ts.Check(os.MkdirAll(filepath.Dir(p), 0o755))
		ts.Check(os.WriteFile(p, b, 0o644))
	}
	switch args[0] {
	case "gramine":
		write(filepath.Join(path, "app.sig"), raw)
		write(filepath.Join(path, "app.manifest.sgx"), []byte("[loader]\n"))
	case "ego":
		write(path, sigstructtest.ELF(sigstructtest.Section{Name: ".text", Data: []byte{0xc3}},
			sigstructtest.Section{Name: ".oeinfo", Data: append(make([]byte, 64), raw...)}))
	case "occlum":
		write(filepath.Join(path, "build/lib/libocclum-libos.signed.so"), sigstructtest.ELF(
			sigstructtest.Section{Name: ".note.sgxmeta", Note: true, Data: append([]byte("sgx_metadata\x00\x00\x00\x00"), raw...)}))
	case "tampered":
		raw[1026]++ // ISVSVN, a signed field
		write(path, raw)
	default:
		ts.Fatalf("unknown kind %q", args[0])
	}
	signer := key.MRSIGNER()
	ts.Setenv("SIG_MRENCLAVE", hex.EncodeToString(sigFields.MRENCLAVE[:]))
	ts.Setenv("SIG_MRSIGNER", hex.EncodeToString(signer[:]))
}
