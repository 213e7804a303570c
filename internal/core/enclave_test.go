package core

// What a host that can write the stores (the seal directory, etcd) can
// plant for a Coordinator whose key sealer protects the data key (an
// enclave; docs/threat-model.md): a MarbleRun state with a raw data key of
// its choosing, a Quarry state with a key in clear, unsigned recovery
// secrets checked only against what it wrote. None of it may be adopted.

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/marblerun/marbleruntest"
	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

// recordingIssuer is a quote issuer that remembers every report data it
// was asked to quote; its quote is the report data itself.
type recordingIssuer struct {
	mu  sync.Mutex
	rds [][attest.ReportDataSize]byte
}

func (r *recordingIssuer) Issue(_ context.Context, rd [attest.ReportDataSize]byte) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rds = append(r.rds, rd)
	return append([]byte("quote:"), rd[:]...), nil
}

// quoted reports whether a quote was ever issued for the root rootDER.
func (r *recordingIssuer) quoted(rootDER []byte) bool {
	want := attest.ReportData(rootDER, nil)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rd := range r.rds {
		if rd == want {
			return true
		}
	}
	return false
}

// planted is a MarbleRun state someone who can write the stores made: the
// deployment's own manifest byte for byte (the fingerprint does not
// change), the vector's root and secrets, encrypted under a key of their
// choosing that they write raw into sealed_key.
type planted struct {
	v         *mrVector
	data, key []byte
	rootDER   []byte
	rootPEM   string
}

func plantMarbleRun(t *testing.T) *planted {
	t.Helper()
	v := readVector(t, "single")
	sd, kv := vectorStore(t, v)
	key := make([]byte, 32)
	rand.Read(key)
	data, err := marbleruntest.Seal(key, sd.RecoveryData, kv)
	if err != nil {
		t.Fatal(err)
	}
	return &planted{v: v, data: data, key: key,
		rootDER: pemDER(t, v.expected.Certificates.Root), rootPEM: v.expected.Certificates.Root}
}

// enclaveCore starts a Coordinator with sealer and policy on s.
func enclaveCore(t *testing.T, s stores, sealer seal.KeySealer, policy MarbleRunMigration, issuer attest.Issuer) *Core {
	t.Helper()
	o := testOptions(s)
	o.KeySealer, o.MigrateMarbleRun, o.Issuer = sealer, policy, issuer
	c, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkNotServed checks that the Coordinator serves, quotes and signs with
// nothing of the planted root.
func checkNotServed(t *testing.T, c *Core, issuer *recordingIssuer, rootDER []byte, rootPEM string) {
	t.Helper()
	if c.Status() != StateRecovery {
		t.Fatalf("state %d, want 1 (recovery mode)", c.Status())
	}
	q, err := c.Quote(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(q.ChainPEM), strings.TrimSpace(rootPEM)) {
		t.Error("the quote's chain holds the planted root")
	}
	for _, der := range c.TLSCertificate().Certificate {
		if bytes.Equal(der, rootDER) {
			t.Error("the Client API serves the planted root")
		}
	}
	if issuer != nil && issuer.quoted(rootDER) {
		t.Error("the enclave issued a quote for the planted root")
	}
}

// TestEnclaveRefusesPlantedMarbleRunState: a planted MarbleRun state with a
// raw key is never adopted by a Coordinator in an enclave, whatever the
// migration setting: recovery mode, both files untouched, no copy made, no
// quote for the planted root. Without the opt-in the recovery is refused
// naming the setting; with it, the planted key is refused unsigned and with
// a signature by a key that is not the manifest's.
func TestEnclaveRefusesPlantedMarbleRunState(t *testing.T) {
	p := plantMarbleRun(t)
	attacker, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, policy := range []MarbleRunMigration{MigrateMarbleRunAuto, MigrateMarbleRunOff, MigrateMarbleRunOn} {
		t.Run("migrate="+policy.String(), func(t *testing.T) {
			ctx := context.Background()
			s := newStores()
			s.data.Save(ctx, p.data, "")
			s.key.Save(ctx, p.key, "")
			issuer := &recordingIssuer{}
			c := enclaveCore(t, s, cpu(t), policy, issuer)
			checkNotServed(t, c, issuer, p.rootDER, p.rootPEM)
			unchanged(t, s, p.data, p.key)

			// The planted key as a recovery secret: unsigned, and signed
			// by a key that is not in the manifest.
			_, err := c.RecoverUnsigned(ctx, p.key)
			switch policy {
			case MigrateMarbleRunOn:
				if !errors.Is(err, ErrForbidden) || !strings.Contains(err.Error(), "/api/v2/recover") {
					t.Errorf("unsigned upload: %v", err)
				}
			default:
				checkNamesSetting(t, err)
			}
			sum := sha256.Sum256(p.key)
			sig, _ := rsa.SignPKCS1v15(rand.Reader, attacker, crypto.SHA256, sum[:])
			_, err = c.Recover(ctx, p.key, sig)
			switch policy {
			case MigrateMarbleRunOn:
				if !errors.Is(err, ErrInvalidRequest) || !errors.Is(err, recovery.ErrBadSignature) {
					t.Errorf("upload signed by a key not in the manifest: %v", err)
				}
			default:
				checkNamesSetting(t, err)
			}
			checkNotServed(t, c, issuer, p.rootDER, p.rootPEM)
			unchanged(t, s, p.data, p.key)
			if _, ok := s.data.Aside("memory:marblerun-" + testStamp); ok {
				t.Error("sealed_data was copied aside: a migration began")
			}
			// A restart does the same.
			c = enclaveCore(t, s, cpu(t), policy, issuer)
			checkNotServed(t, c, issuer, p.rootDER, p.rootPEM)
			unchanged(t, s, p.data, p.key)
		})
	}
}

// checkNamesSetting: a refused recovery of a MarbleRun state with the
// migration off is a conflict whose message names the setting.
func checkNamesSetting(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("recovery with the migration off: %v, want a conflict", err)
	}
	checkOffError(t, err)
}

// checkOffError: err says the migration is off and names the setting.
func checkOffError(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, ErrMigrationOff) {
		t.Fatalf("got %v, want the migration refused as off", err)
	}
	for _, want := range []string{"--migrate-marblerun=1", "QUARRY_MIGRATE_MARBLERUN=1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not name %s: %v", want, err)
		}
	}
}

// TestEnclaveMigratesOnlyAfterSignedRecovery: with the opt-in, a genuine
// MarbleRun state beside its raw key is still not taken at start; MarbleRun's
// signed recovery migrates it, and the data key is then sealed by the
// enclave (a restart opens it without the raw key).
func TestEnclaveMigratesOnlyAfterSignedRecovery(t *testing.T) {
	for _, name := range vectorNames {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			v := readVector(t, name)
			s := v.stores(true)
			sealer := cpu(t)
			issuer := &recordingIssuer{}
			c := enclaveCore(t, s, sealer, MigrateMarbleRunOn, issuer)
			checkNotServed(t, c, issuer, pemDER(t, v.expected.Certificates.Root), v.expected.Certificates.Root)
			unchanged(t, s, v.data, v.key)
			order := v.recoveryOrder()
			if _, err := c.RecoverUnsigned(ctx, v.recSecrets[order[0]]); !errors.Is(err, ErrForbidden) {
				t.Fatalf("unsigned upload in an enclave: %v", err)
			}
			for _, k := range order {
				if _, err := c.Recover(ctx, v.recSecrets[k], v.sign(t, k, v.recSecrets[k])); err != nil {
					t.Fatalf("upload %s: %v", k, err)
				}
			}
			checkMigrated(t, c, v)
			if !issuer.quoted(pemDER(t, v.expected.Certificates.Root)) {
				t.Error("no quote for the recovered root")
			}
			key := load(t, s.key)
			if bytes.Contains(key, v.key) {
				t.Error("sealed_key holds the data key in clear after the migration")
			}
			entries, err := seal.DecodeKeyFile(key)
			if err != nil || len(entries) == 0 {
				t.Fatalf("sealed_key: %v", err)
			}
			for _, e := range entries {
				if !bytes.HasPrefix(e.Sealed, []byte("QRYGSK")) {
					t.Error("a key file entry is not sealed by the enclave")
				}
			}
			checkMigrated(t, enclaveCore(t, s, sealer, MigrateMarbleRunOn, issuer), v)
			// With the migration off again (the shipped enclave), the
			// migrated state is Quarry's and opens as usual.
			checkMigrated(t, enclaveCore(t, s, sealer, MigrateMarbleRunAuto, issuer), v)
		})
	}
}

// TestMarbleRunMigrationOffInSimulation: 0 turns the migration off without
// an enclave too: recovery mode with the files untouched, the recovery
// refused naming the setting, and a new manifest replaces the state with
// MarbleRun's files kept (docs/sealing.md: an unreadable state is kept for recovery).
func TestMarbleRunMigrationOffInSimulation(t *testing.T) {
	ctx := context.Background()
	v := readVector(t, "single")
	s := v.stores(true)
	c := enclaveCore(t, s, seal.SimulationKeySealer{}, MigrateMarbleRunOff, nil)
	if c.Status() != StateRecovery {
		t.Fatalf("state %d, want 1", c.Status())
	}
	unchanged(t, s, v.data, v.key)
	k := v.recoveryOrder()[0]
	_, err := c.Recover(ctx, v.recSecrets[k], v.sign(t, k, v.recSecrets[k]))
	checkNamesSetting(t, err)
	if !strings.Contains(err.Error(), "QUARRY_MIGRATE_MARBLERUN=0") {
		t.Errorf("the refusal does not say the setting is 0: %v", err)
	}
	unchanged(t, s, v.data, v.key)
	_, err = InspectMigration(ctx, s.data, s.key, seal.SimulationKeySealer{}, MigrateMarbleRunOff)
	checkOffError(t, err)

	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second")}
	if _, err := c.SetManifest(ctx, w.manifest(manifestOpts{threshold: 1})); err != nil {
		t.Fatal(err)
	}
	if kept, ok := s.data.Aside("memory:unrecovered-" + testStamp); !ok || !bytes.Equal(kept, v.data) {
		t.Error("MarbleRun's sealed_data was not kept aside")
	}
	if kept, ok := s.key.Aside("memory:unrecovered-" + testStamp); !ok || !bytes.Equal(kept, v.key) {
		t.Error("MarbleRun's sealed_key was not kept aside")
	}
	// 1 without an enclave is the default's direct migration.
	s = v.stores(true)
	checkMigrated(t, enclaveCore(t, s, seal.SimulationKeySealer{}, MigrateMarbleRunOn, nil), v)
}

// TestInspectMigrationInEnclave: the dry run says what a start in an
// enclave does: refuse (naming the setting), or a signed recovery.
func TestInspectMigrationInEnclave(t *testing.T) {
	ctx := context.Background()
	v := readVector(t, "single")
	s := v.stores(true)
	_, err := InspectMigration(ctx, s.data, s.key, cpu(t), MigrateMarbleRunAuto)
	checkOffError(t, err)
	if !strings.Contains(err.Error(), "enclave") {
		t.Errorf("the report does not say the default is off in an enclave: %v", err)
	}
	rep, err := InspectMigration(ctx, s.data, s.key, cpu(t), MigrateMarbleRunOn)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.NeedsRecovery || !rep.SignedRecoveryOnly || !strings.Contains(rep.Why, "raw data key") {
		t.Errorf("report %+v: want a signed recovery because the raw key is not taken", rep)
	}
	unchanged(t, s, v.data, v.key)
}

// quarryPlant is a Quarry state made by a Coordinator without an enclave
// (so whoever made it knows the data key) with the deployment's manifest:
// what a host plants by running its own Quarry, or restores from a backup
// of a simulation Coordinator.
func quarryPlant(t *testing.T) (w *faultWorld, data, key, dek []byte) {
	t.Helper()
	ctx := context.Background()
	w = &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 1)}
	s := newStores()
	c := enclaveCore(t, s, seal.SimulationKeySealer{}, MigrateMarbleRunAuto, nil)
	if _, err := c.SetManifest(ctx, w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1})); err != nil {
		t.Fatal(err)
	}
	data, key = load(t, s.data), load(t, s.key)
	entries, err := seal.DecodeKeyFile(key)
	if err != nil || len(entries) != 1 || len(entries[0].Sealed) != seal.KeySize {
		t.Fatalf("simulation key file: %v", err)
	}
	return w, data, key, entries[0].Sealed
}

// rawAcceptingSealer is an enclave sealer (it does not say it leaves the
// key unprotected) whose UnsealKey takes any 32 bytes: the refusal of a
// raw key must not depend on each sealer's format check.
type rawAcceptingSealer struct{ seal.KeySealer }

func (r rawAcceptingSealer) UnsealKey(sealed, binding []byte) ([]byte, error) {
	if len(sealed) == seal.KeySize {
		return bytes.Clone(sealed), nil
	}
	return r.KeySealer.UnsealKey(sealed, binding)
}

// TestEnclaveRefusesKeyInClear: a Quarry state whose key lies in clear (the
// legacy 32-byte key file, or a version 1 entry holding the raw key) opens
// to recovery mode in an enclave, files untouched; the data key its planter
// knows is refused as an unsigned recovery secret (the header it is checked
// against is the planter's too).
func TestEnclaveRefusesKeyInClear(t *testing.T) {
	ctx := context.Background()
	_, data, keyFile, dek := quarryPlant(t)
	for name, key := range map[string][]byte{"legacy 32-byte key file": dek, "key file entry in clear": keyFile} {
		for sname, sealer := range map[string]func() seal.KeySealer{
			"gramine":                   func() seal.KeySealer { return cpu(t) },
			"a sealer that takes bytes": func() seal.KeySealer { return rawAcceptingSealer{cpu(t)} },
		} {
			t.Run(name+"/"+sname, func(t *testing.T) {
				s := newStores()
				s.data.Save(ctx, data, "")
				s.key.Save(ctx, key, "")
				c := enclaveCore(t, s, sealer(), MigrateMarbleRunAuto, nil)
				if c.Status() != StateRecovery {
					t.Fatalf("state %d, want 1 (recovery mode)", c.Status())
				}
				if _, err := c.RecoverUnsigned(ctx, dek); !errors.Is(err, ErrForbidden) {
					t.Fatalf("unsigned upload of the planter's data key: %v", err)
				}
				if c.Status() != StateRecovery {
					t.Fatal("the planted state was adopted")
				}
				unchanged(t, s, data, key)
			})
		}
	}
	// Without an enclave the same files open (the host can read them
	// anyway).
	s := newStores()
	s.data.Save(ctx, data, "")
	s.key.Save(ctx, dek, "")
	if c := enclaveCore(t, s, seal.SimulationKeySealer{}, MigrateMarbleRunAuto, nil); c.Status() != StateAcceptingMarbles {
		t.Fatalf("simulation: state %d, want 3", c.Status())
	}
}

// TestEnclaveSignedRecoveryStillWorks: in an enclave the signed recovery of
// a genuine state whose key does not open (another CPU) restores it.
func TestEnclaveSignedRecoveryStillWorks(t *testing.T) {
	ctx := context.Background()
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 1)}
	s := newStores()
	c := enclaveCore(t, s, cpu(t), MigrateMarbleRunAuto, nil)
	enc, err := c.SetManifest(ctx, w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1}))
	if err != nil {
		t.Fatal(err)
	}
	secret, err := rsa.DecryptOAEP(sha256.New(), nil, w.rec[0], enc["r0"], nil)
	if err != nil {
		t.Fatal(err)
	}
	c = enclaveCore(t, s, cpu(t), MigrateMarbleRunAuto, nil) // another CPU
	if c.Status() != StateRecovery {
		t.Fatalf("state %d, want 1", c.Status())
	}
	if _, err := c.RecoverUnsigned(ctx, secret); !errors.Is(err, ErrForbidden) {
		t.Fatalf("unsigned: %v", err)
	}
	sum := sha256.Sum256(secret)
	sig, _ := rsa.SignPKCS1v15(rand.Reader, w.rec[0], crypto.SHA256, sum[:])
	if _, err := c.Recover(ctx, secret, sig); err != nil {
		t.Fatal(err)
	}
	if c.Status() != StateAcceptingMarbles {
		t.Fatalf("state %d after recovery, want 3", c.Status())
	}
}

// TestEnclaveOnEtcdRefusesPlantedMarbleRunState: the MarbleRun path runs on
// the etcd store too, at start and whenever an instance follows a change:
// an etcd writer's planted state is never adopted, and nothing is written
// to etcd.
func TestEnclaveOnEtcdRefusesPlantedMarbleRunState(t *testing.T) {
	p := plantMarbleRun(t)
	ctx := t.Context()
	e := newSharedEnv(t, etcdtest.Start(t, 1))
	plant := func() {
		data, key := e.stores()
		_, drev, err := data.Load(ctx)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		_, krev, err := key.Load(ctx)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		if _, err := key.Save(ctx, p.key, krev); err != nil {
			t.Fatal(err)
		}
		if _, err := data.Save(ctx, p.data, drev); err != nil {
			t.Fatal(err)
		}
	}
	stored := func() {
		t.Helper()
		data, key := e.stores()
		d, _, _ := data.Load(ctx)
		k, _, _ := key.Load(ctx)
		if !bytes.Equal(d, p.data) || !bytes.Equal(k, p.key) {
			t.Error("the planted values in etcd were changed")
		}
	}
	for _, policy := range []MarbleRunMigration{MigrateMarbleRunAuto, MigrateMarbleRunOn} {
		t.Run("migrate="+policy.String(), func(t *testing.T) {
			e.prefix += policy.String() + "/"
			sealer := cpu(t)
			issuer := &recordingIssuer{}
			open := func() *Core {
				data, key := e.stores()
				c, err := New(ctx, Options{Data: data, Key: key, KeySealer: sealer, InstanceID: newInstanceID(),
					MigrateMarbleRun: policy, Issuer: issuer, EphemeralKeyBits: 1024})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			// A running instance with a genuine state follows the plant.
			c := open()
			if _, err := c.SetManifest(ctx, e.w.manifest(manifestOpts{threshold: 1})); err != nil {
				t.Fatal(err)
			}
			plant()
			if err := c.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			checkNotServed(t, c, issuer, p.rootDER, p.rootPEM)
			stored()
			// A new instance starts on it.
			checkNotServed(t, open(), issuer, p.rootDER, p.rootPEM)
			stored()
		})
	}
}

// TestEnclaveMigrationThroughRecoveryFaults: the signed recovery is the only
// way a MarbleRun state enters an enclave, so its migration must survive a
// failure or crash at each write step (copy aside, key file, blob): a fresh
// Coordinator then opens the migrated state or migrates again (without the
// recovery secrets: the key file's entry for MarbleRun's blob is sealed by
// the enclave), or is in recovery mode as before; it always starts.
func TestEnclaveMigrationThroughRecoveryFaults(t *testing.T) {
	v := readVector(t, "single")
	k := v.recoveryOrder()[0]
	sealer := cpu(t)
	for _, mode := range []storetest.FaultMode{storetest.FailBefore, storetest.FailAfter, storetest.CrashBefore, storetest.CrashAfter} {
		for step := 1; ; step++ {
			s := v.stores(false)
			var f storetest.Faults
			opts := testOptions(s)
			opts.Data, opts.Key = f.Wrap(s.data), f.Wrap(s.key)
			opts.KeySealer, opts.MigrateMarbleRun = sealer, MigrateMarbleRunOn
			c, err := New(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			f.Arm(step, mode, false)
			_, rerr := c.Recover(context.Background(), v.recSecrets[k], v.sign(t, k, v.recSecrets[k]))
			if !f.Fired() {
				if step == 1 {
					t.Fatal("no write step")
				}
				break
			}
			t.Run(fmt.Sprintf("%s at %d", mode, step), func(t *testing.T) {
				if rerr == nil && c.Status() == StateAcceptingMarbles {
					checkMigrated(t, c, v)
				}
				c2 := enclaveCore(t, s, sealer, MigrateMarbleRunOn, nil)
				switch c2.Status() {
				case StateAcceptingMarbles:
					checkMigrated(t, c2, v)
				case StateRecovery:
					if rerr == nil {
						t.Fatal("the recovery answered success, but a restart is in recovery mode")
					}
				default:
					t.Fatalf("state %d", c2.Status())
				}
				if !bytes.Equal(load(t, s.data), v.data) {
					if d, ok := s.data.Aside("memory:marblerun-" + testStamp); !ok || !bytes.Equal(d, v.data) {
						t.Error("MarbleRun's sealed_data is lost")
					}
				}
			})
		}
	}
}
