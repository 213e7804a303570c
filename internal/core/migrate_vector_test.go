package core

import (
	"bytes"
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/marblerun"
	"github.com/quarry-cc/quarry/internal/marblerun/marbleruntest"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

// vectorRoot is the MarbleRun state vectors' directory at the module root.
const vectorRoot = "../../testdata/marblerun-state"

var vectorNames = marbleruntest.VectorNames

// mrVector is one MarbleRun state vector with what a migration must
// reproduce.
type mrVector struct {
	*marbleruntest.Vector
	name       string
	data, key  []byte
	manifest   []byte
	admin      *x509.Certificate
	recKeys    map[string]*rsa.PrivateKey
	recSecrets map[string][]byte
	expected   marbleruntest.Expected
}

func readVector(t testing.TB, name string) *mrVector {
	t.Helper()
	v := marbleruntest.ReadVector(t, vectorRoot, name)
	blk, _ := pem.Decode(v.AdminCertPEM)
	admin, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return &mrVector{Vector: v, name: v.Name, data: v.Data, key: v.Key, manifest: v.Manifest, admin: admin,
		recKeys: v.RecoveryKeys, recSecrets: v.RecoverySecrets, expected: v.Expected}
}

func (v *mrVector) sign(t testing.TB, key string, secret []byte) []byte {
	return v.Sign(t, key, secret)
}

func (v *mrVector) recoveryOrder() []string { return v.RecoveryOrder("") }

// stores returns memory stores holding the vector's files (key omitted if
// withKey is false).
func (v *mrVector) stores(withKey bool) stores {
	s := newStores()
	ctx := context.Background()
	if _, err := s.data.Save(ctx, v.data, ""); err != nil {
		panic(err)
	}
	if withKey {
		if _, err := s.key.Save(ctx, v.key, ""); err != nil {
			panic(err)
		}
	}
	return s
}

func pemDER(t testing.TB, text string) []byte {
	t.Helper()
	b, _ := pem.Decode([]byte(text))
	if b == nil {
		t.Fatal("no PEM block")
	}
	return b.Bytes
}

// checkMigrated compares everything the API shows with the vector.
func checkMigrated(t *testing.T, c *Core, v *mrVector) {
	t.Helper()
	if c.Status() != StateAcceptingMarbles {
		t.Fatalf("state %d, want 3", c.Status())
	}
	m, err := c.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	wantRaw, _ := base64.StdEncoding.DecodeString(v.expected.Manifest.Manifest)
	wantSig, _ := base64.StdEncoding.DecodeString(v.expected.Manifest.Signature)
	if !bytes.Equal(m.Raw, wantRaw) || !bytes.Equal(m.Raw, v.manifest) || m.Fingerprint != v.expected.Manifest.Fingerprint || !bytes.Equal(m.Signature, wantSig) {
		t.Errorf("manifest, fingerprint or signature differ: %s vs %s", m.Fingerprint, v.expected.Manifest.Fingerprint)
	}
	q, err := c.Quote(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := v.expected.Certificates.Intermediate + v.expected.Certificates.Root; string(q.ChainPEM) != want {
		t.Errorf("quote chain differs:\n%s\nwant\n%s", q.ChainPEM, want)
	}
	// The Marble API presents its serving certificate, then the Marble Root.
	if got := c.MarbleTLSCertificate().Certificate; len(got) != 4 || !bytes.Equal(got[1], pemDER(t, v.expected.Certificates.MarbleRoot)) {
		t.Error("the Marble Root differs from the vector's marbleRootPEM")
	}
	if got := c.TLSCertificate().Certificate[0]; !bytes.Equal(got, pemDER(t, v.expected.Certificates.Root)) {
		t.Error("the Client API certificate is not the vector's root")
	}
	got, err := c.Secrets(context.Background(), []*x509.Certificate{v.admin}, v.expected.SecretsQuery)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(v.expected.SecretsResponse.Secrets) {
		t.Errorf("%d secrets, want %d", len(got), len(v.expected.SecretsResponse.Secrets))
	}
	for name, w := range v.expected.SecretsResponse.Secrets {
		g := got[name]
		if g.Type != w.Type || g.Size != w.Size || g.Shared != w.Shared || g.UserDefined != w.UserDefined || g.ValidFor != w.ValidFor ||
			!bytes.Equal(g.Cert, w.Cert) || !bytes.Equal(g.Private, w.Private) || !bytes.Equal(g.Public, w.Public) {
			t.Errorf("secret %s differs: %+v", name, g)
		}
	}
	log, err := c.UpdateLog(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(log, v.expected.UpdateLog.UpdateLog) {
		t.Errorf("update log %q, want %q", log, v.expected.UpdateLog.UpdateLog)
	}
}

// checkAside checks that the MarbleRun files were kept byte-identical.
func checkAside(t *testing.T, s stores, v *mrVector, withKey bool) {
	t.Helper()
	if d, ok := s.data.Aside("memory:marblerun-" + testStamp); !ok || !bytes.Equal(d, v.data) {
		t.Error("MarbleRun's sealed_data was not kept byte-identical")
	}
	if withKey {
		if k, ok := s.key.Aside("memory:marblerun-" + testStamp); !ok || !bytes.Equal(k, v.key) {
			t.Error("MarbleRun's sealed_key was not kept byte-identical")
		}
	}
	if b := load(t, s.data); !bytes.HasPrefix(b, []byte("QRYSEAL")) {
		t.Error("sealed_data is not Quarry's after the migration")
	}
}

const testStamp = "20270101T000000Z"

func migrateCore(t *testing.T, s stores) (*Core, error) {
	t.Helper()
	return New(context.Background(), testOptions(s))
}

func TestMigrateVectorsDirect(t *testing.T) {
	for _, name := range vectorNames {
		t.Run(name, func(t *testing.T) {
			v := readVector(t, name)
			s := v.stores(true)
			c, err := migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			checkMigrated(t, c, v)
			checkAside(t, s, v, true)
			// A second start opens the Quarry state.
			c2, err := migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			checkMigrated(t, c2, v)
		})
	}
}

func TestMigrateVectorsThroughRecovery(t *testing.T) {
	for _, name := range vectorNames {
		t.Run(name, func(t *testing.T) {
			v := readVector(t, name)
			s := v.stores(false)
			c, err := migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			if c.Status() != StateRecovery {
				t.Fatalf("state %d, want recovery mode", c.Status())
			}
			order := v.recoveryOrder()
			for i, k := range order {
				res, err := c.Recover(context.Background(), v.recSecrets[k], v.sign(t, k, v.recSecrets[k]))
				if err != nil {
					t.Fatalf("upload %s: %v", k, err)
				}
				if last := i == len(order)-1; last != (res.Remaining == 0) {
					t.Fatalf("upload %s: remaining %d", k, res.Remaining)
				}
			}
			checkMigrated(t, c, v)
			if d, ok := s.data.Aside("memory:marblerun-" + testStamp); !ok || !bytes.Equal(d, v.data) {
				t.Error("MarbleRun's sealed_data was not kept byte-identical")
			}
			c2, err := migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			checkMigrated(t, c2, v)
		})
	}
}

// TestMigratedStateRecoversWithMarbleRunSecrets: after the migration the
// manifest's recovery keys (MarbleRun's recovery secrets) recover Quarry's
// own state; a share's signature is checked on arrival.
func TestMigratedStateRecoversWithMarbleRunSecrets(t *testing.T) {
	for _, name := range vectorNames {
		t.Run(name, func(t *testing.T) {
			v := readVector(t, name)
			s := v.stores(true)
			if _, err := migrateCore(t, s); err != nil {
				t.Fatal(err)
			}
			if _, err := s.key.MoveAside(context.Background(), "lost"); err != nil {
				t.Fatal(err)
			}
			c, err := migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			if c.Status() != StateRecovery {
				t.Fatalf("state %d, want recovery mode", c.Status())
			}
			order := v.recoveryOrder()
			// A correct share signed by another recovery key is refused at
			// once (single key: by the only key's check).
			if len(order) > 1 {
				_, err := c.Recover(context.Background(), v.recSecrets[order[0]], v.sign(t, order[1], []byte("other")))
				if !errorsIsInvalid(err) {
					t.Fatalf("badly signed share: %v", err)
				}
			}
			for _, k := range order {
				if _, err := c.Recover(context.Background(), v.recSecrets[k], v.sign(t, k, v.recSecrets[k])); err != nil {
					t.Fatalf("upload %s: %v", k, err)
				}
			}
			checkMigrated(t, c, v)
		})
	}
}

func errorsIsInvalid(err error) bool { return errors.Is(err, ErrInvalidRequest) }

// testOptions are the options of a Coordinator on s at a fixed time (so the
// names of files put aside are known).
func testOptions(s stores) Options {
	return Options{Data: s.data, Key: s.key, KeySealer: seal.SimulationKeySealer{}, EphemeralKeyBits: 2048,
		Now: func() time.Time { return time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC) }}
}

// vectorStore decrypts a vector's store for crafting states.
func vectorStore(t *testing.T, v *mrVector) (*marblerun.SealedData, map[string][]byte) {
	t.Helper()
	sd, err := marblerun.ParseSealedData(v.data)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := sd.Open(v.key)
	if err != nil {
		t.Fatal(err)
	}
	return sd, kv
}

// reseal writes a crafted store under the vector's key.
func reseal(t *testing.T, v *mrVector, sd *marblerun.SealedData, kv map[string][]byte) []byte {
	t.Helper()
	b, err := marbleruntest.Seal(v.key, sd.RecoveryData, kv)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var _ = memstore.New
