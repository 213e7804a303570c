package core

// The data key is bound to its key ID, which the sealed state's header
// names: a commit that keeps the key writes sealed_data alone
// (docs/sealing.md, "The commit").

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

// saves names what the stores were given since Arm: "key" for a key file,
// "data" for a sealed state.
func (e *faultEnv) saves() []string {
	var out []string
	for _, b := range e.faults.Saved() {
		switch {
		case bytes.HasPrefix(b, []byte(seal.KeyFileMagic)):
			out = append(out, "key")
		case bytes.HasPrefix(b, []byte(seal.Magic)):
			out = append(out, "data")
		default:
			out = append(out, "other")
		}
	}
	return out
}

// watch starts counting the stores' Saves (a fault that never fires).
func (e *faultEnv) watch() { e.faults.Arm(1<<30, storetest.FailBefore, false) }

// Uploads and updates that keep the data key write sealed_data alone; an
// update that changes the recovery keys (a new data key) writes sealed_key
// first, and the commit after it rewrites sealed_key once more without
// the replaced key. (Before key IDs every commit wrote both.)
func TestCommitsThatKeepTheKeyWriteOnlySealedData(t *testing.T) {
	for sname, sealer := range map[string]func() seal.KeySealer{
		"simulation": func() seal.KeySealer { return seal.SimulationKeySealer{} },
		"gramine":    func() seal.KeySealer { return cpu(t) },
	} {
		t.Run(sname, func(t *testing.T) {
			w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 2)}
			e := &faultEnv{w: w, dir: t.TempDir(), sealer: sealer()}
			e.open(t)
			ctx := context.Background()
			upload := func(v string) error {
				return e.c.SetSecrets(ctx, w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: []byte(v)}})
			}
			steps := []struct {
				name string
				op   func() error
				want string
			}{
				{"first manifest", func() error {
					_, err := e.c.SetManifest(ctx, w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1}))
					return err
				}, "[key data]"},
				{"upload", func() error { return upload("1") }, "[data]"},
				{"upload after a restart", func() error { e.open(t); e.watch(); return upload("2") }, "[data]"},
				{"update keeping the key", func() error {
					_, err := e.c.Update(ctx, w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 1, extraSecret: true}))
					return err
				}, "[data]"},
				{"update with new recovery keys", func() error {
					_, err := e.c.Update(ctx, w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{1}, threshold: 1, extraSecret: true}))
					return err
				}, "[key data]"},
				{"upload dropping the replaced key", func() error { return upload("3") }, "[key data]"},
				{"upload", func() error { return upload("4") }, "[data]"},
			}
			for _, s := range steps {
				e.watch()
				if err := s.op(); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if got := fmt.Sprint(e.saves()); got != s.want {
					t.Errorf("%s saves %s, want %s", s.name, got, s.want)
				}
				if mem, disk := describe(e.c), describe(e.fresh(t)); mem != disk {
					t.Fatalf("%s: a restart opens %q, not %q", s.name, disk, mem)
				}
			}
		})
	}
}

// toOldFormat rewrites the stored pair as a Coordinator before key IDs
// wrote it: a header that names no key, and a key file of version 1 with
// the key bound to the blob.
func (e *faultEnv) toOldFormat(t *testing.T) {
	t.Helper()
	blob, _ := e.files(t)
	hdrRaw, pt, err := seal.Open(e.c.dek, blob)
	if err != nil {
		t.Fatal(err)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(hdrRaw, &hdr); err != nil {
		t.Fatal(err)
	}
	if _, ok := hdr[seal.HeaderKeyIDField]; !ok {
		t.Fatal("the header names no data key")
	}
	delete(hdr, seal.HeaderKeyIDField)
	hdrRaw, _ = json.Marshal(hdr)
	old, err := seal.Seal(nil, e.c.dek, hdrRaw, pt)
	if err != nil {
		t.Fatal(err)
	}
	b := seal.Binding(old)
	sk, err := e.keySealer().SealKey(e.c.dek, b[:], "")
	if err != nil {
		t.Fatal(err)
	}
	kf, err := seal.EncodeKeyFile([]seal.KeyEntry{{Binding: b, Sealed: sk}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.dir, "sealed_data"), old, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.dir, "sealed_key"), kf, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A seal directory written before key IDs opens; the first upload converts
// its key file (the new entry bound to the key ID, the old one to the old
// blob), and a crash or failure at every write step of that conversion,
// and of the commit after it, leaves a pair that opens: the state before
// or after the upload.
func TestOldKeyFileIsConvertedAtEveryCrashPoint(t *testing.T) {
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: rsaKeys(t, 2)}
	ctx := context.Background()
	for _, uploads := range []int{1, 2} {
		for _, mode := range []storetest.FaultMode{storetest.FailBefore, storetest.FailAfter, storetest.CrashBefore, storetest.CrashAfter} {
			for k := 1; ; k++ {
				e := &faultEnv{w: w, dir: t.TempDir(), sealer: cpu(t)}
				e.open(t)
				e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 1})
				e.toOldFormat(t)
				e.open(t)
				before := describe(e.c)
				if before != describe(e.fresh(t)) || e.c.Status() != StateAcceptingMarbles {
					t.Fatal("the old pair does not open")
				}
				for i := 1; i < uploads; i++ {
					if err := e.c.SetSecrets(ctx, w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: []byte("first")}}); err != nil {
						t.Fatal(err)
					}
					before = describe(e.c)
				}
				e.faults.Arm(k, mode, false)
				opErr := e.c.SetSecrets(ctx, w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: []byte("converted")}})
				e.faults.Disarm()
				if !e.faults.Fired() {
					if opErr != nil {
						t.Fatal(opErr)
					}
					// The key file, and the blob: staged beside it, then
					// put in place.
					if k != 4 {
						t.Errorf("upload %d after the old pair: %d write steps, want 3", uploads, k-1)
					}
					break
				}
				fresh := e.fresh(t)
				got := describe(fresh)
				if fresh.Status() != StateAcceptingMarbles {
					t.Fatalf("upload %d, %s at step %d: a restart is in state %d", uploads, mode, k, fresh.Status())
				}
				uploaded := string(fresh.snap.Load().persisted.Secrets["uploaded"].Private)
				switch {
				case got == before:
					if opErr == nil {
						t.Fatalf("upload %d, %s at step %d: answered success, a restart opens the old state", uploads, mode, k)
					}
				case uploaded != "converted":
					t.Fatalf("upload %d, %s at step %d: a restart opens a third state %q (uploaded %q)", uploads, mode, k, got, uploaded)
				}
			}
		}
	}
}
