package logverifier

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"go/parser"
	"go/token"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The verifier shares nothing with Quarry: its files import only the
// standard library.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no files: %v", err)
	}
	for _, f := range files {
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first := strings.SplitN(path, "/", 2)[0]; strings.Contains(first, ".") {
				t.Errorf("%s imports %s, which is not in the standard library", f, path)
			}
		}
	}
	if _, err := os.Stat("go.mod"); err == nil {
		t.Fatal("unexpected go.mod")
	}
}

// The test vectors of docs/update-log.md.
func TestDocumentedVectors(t *testing.T) {
	e1 := `{"time":"2026-01-01T00:00:00.000Z","update":"Initial manifest set"}`
	e2 := `{"time":"2026-01-01T00:00:01.000Z","update":"Secret set","user":"alice","secret":"café","type":"plain"}`
	h1 := ChainHash(Hash{}, 1, e1)
	h2 := ChainHash(h1, 2, e2)
	if h1.String() != "3342727169184defecc5cb2fcaa085fb5580bcfdfc03459742fa72e8bfb19c74" ||
		h2.String() != "e89bb0790426987b93e6bc257f1db967f3cea9fcd62cc15e9cbeb63f24ed06fd" {
		t.Fatalf("hash(1) %s, hash(2) %s", h1, h2)
	}
	sb := SignedBytes(Checkpoint{Count: 2, Head: h2.String(), Time: "2026-01-01T00:00:02.000Z"})
	d := sha256.Sum256(sb)
	if len(sb) != 140 || hex.EncodeToString(d[:]) != "345ebd74c90c27abda49b123b03f62b2a7e25f3ee6dd80b2cac368eb9f65a9be" {
		t.Fatalf("signed bytes %q (%d), digest %x", sb, len(sb), d)
	}
}

func testRoot(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "root"}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, k
}

func sign(t *testing.T, k *ecdsa.PrivateKey, cp Checkpoint) Checkpoint {
	t.Helper()
	d := sha256.Sum256(SignedBytes(cp))
	sig, err := ecdsa.SignASN1(rand.Reader, k, d[:])
	if err != nil {
		t.Fatal(err)
	}
	cp.Signature = sig
	return cp
}

// The verifier refuses what the documentation says must be refused.
func TestVerifyEntriesRefusesTampering(t *testing.T) {
	root, k := testRoot(t)
	var es []Entry
	h := Hash{}
	for i := 1; i <= 5; i++ {
		e := `{"time":"2026-01-01T00:00:0` + strconv.Itoa(i) + `.000Z","update":"Secret set","user":"alice","secret":"s","type":"plain"}`
		h = ChainHash(h, uint64(i), e)
		es = append(es, Entry{Seq: uint64(i), Entry: e, Hash: h.String()})
	}
	cp := sign(t, k, Checkpoint{Count: 5, Head: h.String(), Time: "2026-01-01T00:00:06.000Z"})
	if err := VerifyEntries(root, cp, es); err != nil {
		t.Fatal(err)
	}
	clone := func() []Entry { return append([]Entry(nil), es...) }
	altered := clone()
	altered[2].Entry = strings.Replace(altered[2].Entry, "alice", "alicf", 1)
	swapped := clone()
	swapped[1], swapped[2] = swapped[2], swapped[1]
	otherRoot, _ := testRoot(t)
	for name, tc := range map[string]struct {
		root *x509.Certificate
		cp   Checkpoint
		es   []Entry
		want error
	}{
		"entry altered":    {root, cp, altered, ErrChain},
		"entries swapped":  {root, cp, swapped, ErrChain},
		"entry dropped":    {root, cp, append(clone()[:2], es[3:]...), ErrHead},
		"another root":     {otherRoot, cp, es, ErrSignature},
		"count changed":    {root, Checkpoint{Count: 4, Head: cp.Head, Time: cp.Time, Signature: cp.Signature}, es[:4], ErrSignature},
		"time with offset": {root, sign(t, k, Checkpoint{Count: 5, Head: cp.Head, Time: "2026-01-01T01:00:06.000+01:00"}), es, ErrForm},
		"head uppercase":   {root, sign(t, k, Checkpoint{Count: 5, Head: strings.ToUpper(cp.Head), Time: cp.Time}), es, ErrForm},
	} {
		if err := VerifyEntries(tc.root, tc.cp, tc.es); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}
