package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/marblerun"
	"github.com/quarry-cc/quarry/internal/recovery"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

// unchanged checks that the stores still hold exactly data and key.
func unchanged(t *testing.T, s stores, data, key []byte) {
	t.Helper()
	if !bytes.Equal(load(t, s.data), data) {
		t.Error("sealed_data was changed")
	}
	if !bytes.Equal(load(t, s.key), key) {
		t.Error("sealed_key was changed")
	}
}

func TestMigrateDamagedSealedData(t *testing.T) {
	v := readVector(t, "single")
	flipped := bytes.Clone(v.data)
	flipped[len(flipped)-40] ^= 1
	for name, data := range map[string][]byte{
		"truncated in the ciphertext": v.data[:len(v.data)-100],
		"truncated in the header":     v.data[:3],
		"truncated after the header":  v.data[:10],
		"bit flipped":                 flipped,
		"length prefix flipped":       append([]byte{0xff, 0xff, 0xff, 0x7f}, v.data[4:]...),
	} {
		t.Run(name, func(t *testing.T) {
			s := newStores()
			ctx := context.Background()
			s.data.Save(ctx, data, "")
			s.key.Save(ctx, v.key, "")
			c, err := migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			if c.Status() != StateRecovery {
				t.Fatalf("state %d, want recovery mode", c.Status())
			}
			unchanged(t, s, data, v.key)
			// The vector's recovery secret does not help: the data is bad.
			k := v.recoveryOrder()[0]
			if _, err := c.Recover(ctx, v.recSecrets[k], v.sign(t, k, v.recSecrets[k])); err == nil {
				t.Fatal("recovered a damaged state")
			}
			unchanged(t, s, data, v.key)
		})
	}
}

func TestMigrateWrongRecoverySecret(t *testing.T) {
	for _, name := range vectorNames {
		t.Run(name, func(t *testing.T) {
			v := readVector(t, name)
			s := v.stores(false)
			c, err := migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			k := v.recoveryOrder()[0]
			wrong := bytes.Clone(v.recSecrets[k])
			wrong[0] ^= 1
			_, err = c.Recover(context.Background(), wrong, v.sign(t, k, wrong))
			if !errors.Is(err, ErrInvalidRequest) || !errors.Is(err, recovery.ErrUnknownSecret) {
				t.Fatalf("wrong secret: %v", err)
			}
			unchanged(t, s, v.data, nil)
			// The round is not poisoned: the right secrets still work.
			for _, k := range v.recoveryOrder() {
				if _, err := c.Recover(context.Background(), v.recSecrets[k], v.sign(t, k, v.recSecrets[k])); err != nil {
					t.Fatal(err)
				}
			}
			checkMigrated(t, c, v)
		})
	}
}

// TestMigrateSharesOfAnotherDeployment: multiparty's shares on threshold's
// state (and the other way round) are refused at once.
func TestMigrateSharesOfAnotherDeployment(t *testing.T) {
	for _, pair := range [][2]string{{"threshold", "multiparty"}, {"multiparty", "threshold"}, {"single", "multiparty"}} {
		t.Run(pair[1]+" on "+pair[0], func(t *testing.T) {
			v, other := readVector(t, pair[0]), readVector(t, pair[1])
			s := v.stores(false)
			c, err := migrateCore(t, s)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range other.recoveryOrder() {
				_, err := c.Recover(context.Background(), other.recSecrets[k], other.sign(t, k, other.recSecrets[k]))
				if !errors.Is(err, ErrInvalidRequest) {
					t.Fatalf("share %s of %s: %v", k, pair[1], err)
				}
			}
			if c.Status() != StateRecovery {
				t.Fatal("left recovery mode")
			}
			unchanged(t, s, v.data, nil)
		})
	}
}

// TestMigrateBadSignatureFoundAtTheEnd: before the migration the recovery
// keys are inside the encrypted manifest, so a share's signature is checked
// when the state decrypts; a bad one refuses the recovery and writes
// nothing.
func TestMigrateBadSignatureFoundAtTheEnd(t *testing.T) {
	v := readVector(t, "multiparty")
	s := v.stores(false)
	c, err := migrateCore(t, s)
	if err != nil {
		t.Fatal(err)
	}
	order := v.recoveryOrder()
	ctx := context.Background()
	if _, err := c.Recover(ctx, v.recSecrets[order[0]], v.sign(t, order[0], []byte("not this"))); err != nil {
		t.Fatal(err)
	}
	_, err = c.Recover(ctx, v.recSecrets[order[1]], v.sign(t, order[1], v.recSecrets[order[1]]))
	if !errors.Is(err, ErrInvalidRequest) || !errors.Is(err, recovery.ErrBadSignature) {
		t.Fatalf("bad signature: %v", err)
	}
	unchanged(t, s, v.data, nil)
	for _, k := range order {
		if _, err := c.Recover(ctx, v.recSecrets[k], v.sign(t, k, v.recSecrets[k])); err != nil {
			t.Fatal(err)
		}
	}
	checkMigrated(t, c, v)
}

func TestMigrateUnknownStoreKey(t *testing.T) {
	v := readVector(t, "multiparty")
	sd, kv := vectorStore(t, v)
	kv["frobnicator:x"] = []byte("{}")
	data := reseal(t, v, sd, kv)
	s := newStores()
	s.data.Save(context.Background(), data, "")
	s.key.Save(context.Background(), v.key, "")
	_, err := migrateCore(t, s)
	var unknown *marblerun.UnknownKeyError
	if !errors.As(err, &unknown) || unknown.Key != "frobnicator:x" || !errors.Is(err, ErrMigration) || !strings.Contains(err.Error(), `"frobnicator:x"`) {
		t.Fatalf("unknown key: %v", err)
	}
	unchanged(t, s, data, v.key)
	if _, ok := s.data.Aside("memory:marblerun-" + testStamp); ok {
		t.Error("a copy was made although nothing was migrated")
	}
}

func TestMigrateBothFormats(t *testing.T) {
	v := readVector(t, "single")
	// A Quarry state's key file beside MarbleRun's sealed_data.
	q := newStores()
	qc := newCore(t, q)
	if _, err := qc.SetManifest(context.Background(), []byte(minimalManifest)); err != nil {
		t.Fatal(err)
	}
	s := newStores()
	s.data.Save(context.Background(), v.data, "")
	quarryKey := load(t, q.key)
	s.key.Save(context.Background(), quarryKey, "")
	_, err := migrateCore(t, s)
	if !errors.Is(err, ErrMixedFormats) {
		t.Fatalf("both formats: %v", err)
	}
	unchanged(t, s, v.data, quarryKey)
	if _, err := InspectMigration(context.Background(), s.data, s.key, seal.SimulationKeySealer{}, MigrateMarbleRunAuto); !errors.Is(err, ErrMixedFormats) {
		t.Fatalf("dry run: %v", err)
	}
}

// TestMigrateManifestFailingQuarryRules: a manifest MarbleRun accepted but
// Quarry's validation refuses is migrated as is, with a warning naming the
// rule.
func TestMigrateManifestFailingQuarryRules(t *testing.T) {
	v := readVector(t, "multiparty")
	sd, kv := vectorStore(t, v)
	// An unreferenced package with a SignerID that is not 64 hex digits
	// (MarbleRun checks neither), and a duplicate key (MarbleRun takes
	// the last).
	raw := bytes.Replace(kv["manifest"], []byte(`"Packages": {`), []byte(`"Packages": {"unused": {"SignerID": "abc", "ProductID": 1, "SecurityVersion": 1}, `), 1)
	raw = bytes.Replace(raw, []byte(`"Marbles":`), []byte(`"Roles": {}, "Marbles":`), 1)
	if bytes.Equal(raw, kv["manifest"]) {
		t.Fatal("manifest not changed")
	}
	kv["manifest"] = raw
	kv["package:unused"] = []byte(`{"SignerID":"abc","ProductID":1,"SecurityVersion":1}`)
	data := reseal(t, v, sd, kv)
	s := newStores()
	s.data.Save(context.Background(), data, "")
	s.key.Save(context.Background(), v.key, "")
	var logs bytes.Buffer
	opts := testOptions(s)
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Manifest()
	if err != nil || !bytes.Equal(m.Raw, raw) {
		t.Fatalf("manifest not migrated as is: %v", err)
	}
	out := logs.String()
	if n := strings.Count(out, "the manifest breaks a rule MarbleRun does not enforce"); n != 2 {
		t.Errorf("%d warnings, want 2 (duplicate key, SignerID):\n%s", n, out)
	}
	if !strings.Contains(out, "SignerID") || !strings.Contains(out, "Roles") {
		t.Errorf("the warnings do not name the findings:\n%s", out)
	}
}

// TestMigrateProductionTDXPackageWithoutKernel: the rule that a TDX package
// that is not Debug pins RTMR1, RTMR2 and TDAttributes besides MRTD is
// Quarry's own, so a migrated manifest that breaks it is migrated as is,
// with a warning naming the field.
func TestMigrateProductionTDXPackageWithoutKernel(t *testing.T) {
	v := readVector(t, "multiparty")
	sd, kv := vectorStore(t, v)
	mrtd := strings.Repeat("5a", 48)
	raw := bytes.Replace(kv["manifest"], []byte(`"Packages": {`), []byte(`"Packages": {"vm": {"MRTD": "`+mrtd+`"}, `), 1)
	if bytes.Equal(raw, kv["manifest"]) {
		t.Fatal("manifest not changed")
	}
	kv["manifest"] = raw
	kv["package:vm"] = []byte(`{"MRTD":"` + mrtd + `"}`)
	data := reseal(t, v, sd, kv)
	s := newStores()
	s.data.Save(context.Background(), data, "")
	s.key.Save(context.Background(), v.key, "")
	var logs bytes.Buffer
	opts := testOptions(s)
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("the migration is refused: %v", err)
	}
	m, err := c.Manifest()
	if err != nil || !bytes.Equal(m.Raw, raw) {
		t.Fatalf("manifest not migrated as is: %v", err)
	}
	out := logs.String()
	if n := strings.Count(out, "the manifest breaks a rule MarbleRun does not enforce"); n != 1 {
		t.Errorf("%d warnings, want 1 (RTMR1 of package vm):\n%s", n, out)
	}
	if !strings.Contains(out, "RTMR1") || !strings.Contains(out, "vm") {
		t.Errorf("the warning does not name the package and field:\n%s", out)
	}
}

func TestInspectMigration(t *testing.T) {
	v := readVector(t, "single")
	s := v.stores(true)
	rep, err := InspectMigration(context.Background(), s.data, s.key, seal.SimulationKeySealer{}, MigrateMarbleRunAuto)
	if err != nil {
		t.Fatal(err)
	}
	_, kv := vectorStore(t, v)
	var secrets, users int
	for k := range kv {
		if strings.HasPrefix(k, "secret:") {
			secrets++
		}
		if strings.HasPrefix(k, "user:") {
			users++
		}
	}
	if rep.NeedsRecovery || rep.Secrets != secrets || rep.Users != users || rep.UpdateLogEntries != len(v.expected.UpdateLog.UpdateLog) ||
		rep.MonotonicCounters != 2 || rep.Activations != 1 || rep.RecoveryMode != "single" {
		t.Errorf("report %+v", rep)
	}
	unchanged(t, s, v.data, v.key)
	s = v.stores(false)
	if rep, err = InspectMigration(context.Background(), s.data, s.key, seal.SimulationKeySealer{}, MigrateMarbleRunAuto); err != nil || !rep.NeedsRecovery {
		t.Errorf("without a key: %+v, %v", rep, err)
	}
}

// TestMigrateFaults injects a failure or a crash at each write step of the
// migration (copy sealed_data aside, copy sealed_key aside, write the key
// file, write the blob). Afterwards a fresh Coordinator on the same stores
// must come up with the vector's state (migrated again, or the Quarry state
// written), never in recovery mode, and MarbleRun's files must be kept.
func TestMigrateFaults(t *testing.T) {
	v := readVector(t, "single")
	for _, mode := range []storetest.FaultMode{storetest.FailBefore, storetest.FailAfter, storetest.CrashBefore, storetest.CrashAfter} {
		for step := 1; step <= 4; step++ {
			t.Run(fmt.Sprintf("%s at %d", mode, step), func(t *testing.T) {
				s := v.stores(true)
				var f storetest.Faults
				f.Arm(step, mode, false)
				opts := testOptions(s)
				opts.Data, opts.Key = f.Wrap(s.data), f.Wrap(s.key)
				c, err := New(context.Background(), opts)
				if !f.Fired() {
					t.Fatal("the fault did not fire")
				}
				if err == nil && c.Status() == StateAcceptingMarbles {
					// The Coordinator may go on only with the state on disk.
					checkMigrated(t, c, v)
				}
				c2, err := migrateCore(t, s)
				if err != nil {
					t.Fatal(err)
				}
				checkMigrated(t, c2, v)
				checkKept(t, s, v)
			})
		}
	}
	// A crash after the key file, before the blob: the key file's entry
	// bound to MarbleRun's blob lets the next start migrate again.
	t.Run("key file written, blob not", func(t *testing.T) {
		s := v.stores(true)
		var f storetest.Faults
		f.Arm(4, storetest.CrashBefore, false)
		opts := testOptions(s)
		opts.Data, opts.Key = f.Wrap(s.data), f.Wrap(s.key)
		New(context.Background(), opts)
		if !bytes.Equal(load(t, s.data), v.data) || bytes.Equal(load(t, s.key), v.key) {
			t.Fatal("not the expected intermediate state")
		}
		c, err := migrateCore(t, s)
		if err != nil {
			t.Fatal(err)
		}
		checkMigrated(t, c, v)
	})
}

// checkKept: MarbleRun's two files exist byte-identical somewhere (in
// place, or copied aside).
func checkKept(t *testing.T, s stores, v *mrVector) {
	t.Helper()
	found := func(st *memstore.Store, want []byte) bool {
		if bytes.Equal(load(t, st), want) {
			return true
		}
		for i := range 3 {
			where := "memory:marblerun-" + testStamp
			if i > 0 {
				where += fmt.Sprintf(".%d", i)
			}
			if b, ok := st.Aside(where); ok && bytes.Equal(b, want) {
				return true
			}
		}
		return false
	}
	if !found(s.data, v.data) {
		t.Error("MarbleRun's sealed_data is lost")
	}
	if !found(s.key, v.key) {
		t.Error("MarbleRun's sealed_key is lost")
	}
}

var _ store.Store = (*memstore.Store)(nil)
