package core

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
)

var (
	testKeysOnce sync.Once
	testKeys     []*rsa.PrivateKey
)

func rsaKeys(t *testing.T, n int) []*rsa.PrivateKey {
	t.Helper()
	testKeysOnce.Do(func() {
		for i := 0; i < 4; i++ {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			testKeys = append(testKeys, k)
		}
	})
	return testKeys[:n]
}

// recoverable sets a manifest with n recovery keys, breaks the sealed key
// and returns a Coordinator in recovery mode with the plain secrets.
func recoverable(t *testing.T, n int, now func() time.Time, ttl time.Duration) (*Core, stores, map[string][]byte, map[string]*rsa.PrivateKey) {
	t.Helper()
	keys := map[string]*rsa.PrivateKey{}
	pems := map[string]string{}
	for i, k := range rsaKeys(t, n) {
		der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
		name := fmt.Sprintf("k%d", i)
		keys[name] = k
		pems[name] = string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	}
	doc, _ := json.Marshal(map[string]any{
		"Packages":     map[string]any{"p": map[string]any{"Debug": true}},
		"Marbles":      map[string]any{"m": map[string]any{"Package": "p"}},
		"RecoveryKeys": pems,
	})
	s := newStores()
	enc, err := newCore(t, s).SetManifest(context.Background(), doc)
	if err != nil {
		t.Fatal(err)
	}
	plain := map[string][]byte{}
	for name, ct := range enc {
		if plain[name], err = rsa.DecryptOAEP(sha256.New(), nil, keys[name], ct, nil); err != nil {
			t.Fatal(err)
		}
	}
	_, rev, _ := s.key.Load(context.Background())
	s.key.Save(context.Background(), make([]byte, 32), rev) // wrong key
	c, err := New(context.Background(), Options{Data: s.data, Key: s.key, KeySealer: seal.SimulationKeySealer{},
		Now: now, RecoveryTimeout: ttl, EphemeralKeyBits: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if c.Status() != StateRecovery {
		t.Fatalf("state %d", c.Status())
	}
	return c, s, plain, keys
}

func signSecret(k *rsa.PrivateKey, secret []byte) []byte {
	sum := sha256.Sum256(secret)
	sig, _ := rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:])
	return sig
}

func TestConcurrentRecoveryUploads(t *testing.T) {
	c, s, plain, keys := recoverable(t, 4, nil, 0)
	var wg sync.WaitGroup
	results := make(chan int, 4)
	for name := range plain {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Recover(context.Background(), plain[name], signSecret(keys[name], plain[name]))
			if err != nil {
				t.Error(err)
				return
			}
			results <- res.Remaining
		}()
	}
	wg.Wait()
	close(results)
	seen := map[int]bool{}
	for r := range results {
		seen[r] = true
	}
	for want := 0; want < 4; want++ {
		if !seen[want] {
			t.Errorf("no upload reported remaining %d (uploads were not serialised): %v", want, seen)
		}
	}
	if c.Status() != StateAcceptingMarbles {
		t.Fatal("not recovered")
	}
	if newCore(t, s).Status() != StateAcceptingMarbles {
		t.Fatal("a restart after recovery needs recovery again")
	}
}

func TestRecoveryRoundExpires(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	c, _, plain, keys := recoverable(t, 2, clock, time.Minute)
	res, err := c.Recover(context.Background(), plain["k0"], signSecret(keys["k0"], plain["k0"]))
	if err != nil || res.Remaining != 1 {
		t.Fatalf("first upload: %+v, %v", res, err)
	}
	now = now.Add(2 * time.Minute) // the round expires
	res, err = c.Recover(context.Background(), plain["k1"], signSecret(keys["k1"], plain["k1"]))
	if err != nil || res.Remaining != 1 {
		t.Fatalf("upload after expiry: %+v, %v (want a new round with 1 remaining)", res, err)
	}
	res, err = c.Recover(context.Background(), plain["k0"], signSecret(keys["k0"], plain["k0"]))
	if err != nil || res.Remaining != 0 || c.Status() != StateAcceptingMarbles {
		t.Fatalf("completing upload: %+v, %v, state %d", res, err, c.Status())
	}
}

func TestRecoveryErrorsAreClassified(t *testing.T) {
	c, _, plain, keys := recoverable(t, 2, nil, 0)
	_, err := c.Recover(context.Background(), plain["k0"], signSecret(keys["k1"], plain["k0"]))
	if !errors.Is(err, ErrInvalidRequest) || !errors.Is(err, recovery.ErrBadSignature) {
		t.Fatalf("wrong signature: %v", err)
	}
	if _, err := c.Recover(context.Background(), make([]byte, 100), []byte("sig")); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("ciphertext without ephemeral key: %v", err)
	}
	pub, err := c.RecoveryPublicKey(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	k, _ := x509.ParsePKIXPublicKey(pub)
	ct, _ := rsa.EncryptOAEP(sha256.New(), rand.Reader, k.(*rsa.PublicKey), plain["k0"], nil)
	if res, err := c.Recover(context.Background(), ct, signSecret(keys["k0"], plain["k0"])); err != nil || res.Remaining != 1 {
		t.Fatalf("ephemeral upload: %+v, %v", res, err)
	}
	if _, err := c.Recover(context.Background(), []byte("garbage ciphertext that is long enough"), []byte("s")); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("undecryptable ciphertext: %v", err)
	}
}

// flakyStore fails every Save while fail is set.
type flakyStore struct {
	*memstore.Store
	fail bool
}

func (f *flakyStore) Save(ctx context.Context, blob []byte, prev store.Revision) (store.Revision, error) {
	if f.fail {
		return "", errors.New("disk full")
	}
	return f.Store.Save(ctx, blob, prev)
}

func TestFailedResetKeepsRecoveryPossible(t *testing.T) {
	_, s, plain, keys := recoverable(t, 1, nil, 0)
	data := &flakyStore{Store: s.data, fail: true}
	c, err := New(context.Background(), Options{Data: data, Key: s.key, KeySealer: seal.SimulationKeySealer{}})
	if err != nil || c.Status() != StateRecovery {
		t.Fatalf("state %d, %v", c.Status(), err)
	}
	// A new manifest whose write fails: an error, still recovery mode.
	if _, err := c.SetManifest(context.Background(), []byte(minimalManifest)); err == nil {
		t.Fatal("SetManifest succeeded although the store failed")
	}
	if c.Status() != StateRecovery {
		t.Fatalf("state %d after a failed reset", c.Status())
	}
	// The old state (moved aside, and still held) can still be recovered.
	data.fail = false
	res, err := c.Recover(context.Background(), plain["k0"], signSecret(keys["k0"], plain["k0"]))
	if err != nil || res.Remaining != 0 || c.Status() != StateAcceptingMarbles {
		t.Fatalf("recover after a failed reset: %+v, %v, state %d", res, err, c.Status())
	}
}
