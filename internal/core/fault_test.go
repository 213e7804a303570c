package core

// The fault-injection suite (docs/sealing.md; the commit's own suite is
// internal/vault's crash_test.go): every state-changing operation
// is run with a failure or a "crash" injected at each of its write steps in
// turn; afterwards a fresh Coordinator on the same files must open to the
// state before or the state after the operation — never recovery mode,
// never a third state — and to the state after whenever the operation
// answered success. When the process goes on after a failed write, its
// memory must agree with the disk and the next write must work.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/sealedstate"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/filestore"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

const faultSignerID = "1111111111111111111111111111111111111111111111111111111111111111"

// faultUser is a manifest user with its certificate.
type faultUser struct {
	name string
	cert *x509.Certificate
	pem  string
}

func newFaultUser(t *testing.T, name string) faultUser {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return faultUser{name: name, cert: c, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

func (u faultUser) peer() []*x509.Certificate { return []*x509.Certificate{u.cert} }

// faultWorld is what every case shares: users and recovery keys.
type faultWorld struct {
	admin, second faultUser
	rec           []*rsa.PrivateKey
}

// manifestOpts vary the suite's manifest.
type manifestOpts struct {
	recoveryKeys []int // indices into faultWorld.rec
	sealMode     string
	threshold    int // UpdateThreshold
	extraSecret  bool
}

func (w *faultWorld) manifest(o manifestOpts) []byte {
	rk := map[string]string{}
	for _, i := range o.recoveryKeys {
		der, _ := x509.MarshalPKIXPublicKey(&w.rec[i].PublicKey)
		rk[fmt.Sprintf("r%d", i)] = string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	}
	sec := map[string]any{
		"followup": map[string]any{"Type": "plain", "UserDefined": true},
		"uploaded": map[string]any{"Type": "plain", "UserDefined": true},
		"shared":   map[string]any{"Type": "symmetric-key", "Size": 128, "Shared": true},
		"cert":     map[string]any{"Type": "cert-ecdsa", "Size": 256, "Shared": true},
	}
	if o.extraSecret {
		sec["extra"] = map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true}
	}
	doc := map[string]any{
		"Packages": map[string]any{"p": map[string]any{"SignerID": faultSignerID, "ProductID": 1, "SecurityVersion": 1}},
		"Marbles":  map[string]any{"m": map[string]any{"Package": "p", "MaxActivations": 5}},
		"Secrets":  sec,
		"Users": map[string]any{
			"admin":  map[string]any{"Certificate": w.admin.pem, "Roles": []string{"secrets", "packages", "manifest"}},
			"second": map[string]any{"Certificate": w.second.pem, "Roles": []string{"manifest"}},
		},
		"Roles": map[string]any{
			"secrets":  map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"followup", "uploaded"}, "Actions": []string{"ReadSecret", "WriteSecret"}},
			"packages": map[string]any{"ResourceType": "Packages", "ResourceNames": []string{"p"}, "Actions": []string{"UpdateSecurityVersion"}},
			"manifest": map[string]any{"ResourceType": "Manifest", "Actions": []string{"UpdateManifest"}},
		},
		"Config": map[string]any{"SealMode": o.sealMode, "UpdateThreshold": o.threshold, "FeatureGates": []string{"MonotonicCounter"}},
	}
	if len(rk) > 0 {
		doc["RecoveryKeys"] = rk
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic(err)
	}
	return b
}

// faultCase is one operation of the suite.
type faultCase struct {
	name string
	// prepare brings a Coordinator on the files into the state before the
	// operation (no faults armed); it may restart it (reopen).
	prepare func(t *testing.T, e *faultEnv)
	// op is the operation; it returns the operation's error.
	op func(e *faultEnv) error
	// loosens marks a change from UniqueKey to ProductKey, which keeps the
	// data key: after a failed write the key file may hold it under
	// ProductKey while the stored state is still UniqueKey
	// (docs/sealing.md "SealMode changes").
	loosens bool
}

// faultEnv is one run: a seal directory, fault-injecting stores, and the
// Coordinator on them.
type faultEnv struct {
	w      *faultWorld
	dir    string
	faults *storetest.Faults
	c      *Core
	// plain holds the recovery secrets (plain) of the last manifest set.
	plain map[string][]byte
	// marble is the certificate of a Marble activated in prepare.
	marble []*x509.Certificate
	// sealer seals the data key (simulation unless set).
	sealer seal.KeySealer
}

func (e *faultEnv) keySealer() seal.KeySealer {
	if e.sealer == nil {
		return seal.SimulationKeySealer{}
	}
	return e.sealer
}

func (e *faultEnv) stores(t *testing.T) (store.Store, store.Store) {
	t.Helper()
	data, err := filestore.New(e.dir, "sealed_data")
	if err != nil {
		t.Fatal(err)
	}
	key, err := filestore.New(e.dir, "sealed_key")
	if err != nil {
		t.Fatal(err)
	}
	return data, key
}

// open starts a Coordinator on fault-injecting stores over the files.
func (e *faultEnv) open(t *testing.T) {
	t.Helper()
	e.faults = &storetest.Faults{}
	data, key := e.stores(t)
	c, err := New(context.Background(), Options{Data: e.faults.WrapLogged(data), Key: e.faults.WrapLogged(key),
		KeySealer: e.keySealer(), EphemeralKeyBits: 1024})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
}

// fresh starts a second Coordinator on the plain files, as a restart does.
func (e *faultEnv) fresh(t *testing.T) *Core {
	t.Helper()
	data, key := e.stores(t)
	c, err := New(context.Background(), Options{Data: data, Key: key, KeySealer: e.keySealer(), EphemeralKeyBits: 1024})
	if err != nil {
		t.Fatalf("a fresh Coordinator does not start: %v", err)
	}
	return c
}

func (e *faultEnv) set(t *testing.T, o manifestOpts) {
	t.Helper()
	enc, err := e.c.SetManifest(context.Background(), e.w.manifest(o))
	if err != nil {
		t.Fatal(err)
	}
	e.keepPlain(t, enc)
}

func (e *faultEnv) keepPlain(t *testing.T, enc map[string][]byte) {
	t.Helper()
	e.plain = map[string][]byte{}
	for name, ct := range enc {
		var i int
		fmt.Sscanf(name, "r%d", &i)
		p, err := rsa.DecryptOAEP(sha256.New(), nil, e.w.rec[i], ct, nil)
		if err != nil {
			t.Fatal(err)
		}
		e.plain[name] = p
	}
}

// breakKey makes the key file useless, so the next start is in recovery.
func (e *faultEnv) breakKey(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(e.dir, "sealed_key"), make([]byte, 32), 0o600); err != nil {
		t.Fatal(err)
	}
}

// describe names a Coordinator's state so that two can be compared:
// the state code and the persisted state (or, in recovery, the blob).
func describe(c *Core) string {
	s := c.snap.Load()
	switch s.state {
	case StateAcceptingMarbles:
		b, err := json.Marshal(s.persisted)
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(b)
		return "running " + hex.EncodeToString(sum[:8]) + " " + s.fingerprint[:8]
	case StateRecovery:
		sum := sha256.Sum256(c.unreadable)
		return "recovery " + hex.EncodeToString(sum[:8])
	}
	return fmt.Sprintf("state %d", s.state)
}

// describePlain names the state a sealed-state plaintext holds, as
// describe would name a Coordinator running it.
func describePlain(t *testing.T, plaintext []byte) string {
	t.Helper()
	st, err := sealedstate.Decode(plaintext)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(st)
	sum := sha256.Sum256(b)
	return "running " + hex.EncodeToString(sum[:8]) + " " + fingerprint(st.Manifest)[:8]
}

// attempted returns the states the operation may have stored: the state
// of the first blob passed to Save of the data store (the operation's own
// commit; later saves may only put the old blob back), and the stored
// blob opened with a key the operation bound to it, if any. Each blob is
// opened with a key bound to it (to the blob itself, or to the key ID its
// header names).
func (e *faultEnv) attempted(t *testing.T, keyFiles map[[32]byte][]byte, old []byte) []string {
	t.Helper()
	var out []string
	open := func(blob []byte) {
		dek, ok := keyFiles[seal.Binding(blob)]
		if !ok {
			id, named := seal.BlobKeyID(blob)
			if dek, ok = keyFiles[id]; !named || !ok {
				return
			}
		}
		_, pt, err := seal.Open(dek, blob)
		if err != nil {
			t.Fatalf("an attempted blob does not open with its key: %v", err)
		}
		out = append(out, describePlain(t, pt))
	}
	for _, b := range e.faults.Saved() {
		if _, err := seal.ReadHeader(b); err == nil {
			open(b)
			break
		}
	}
	if old != nil {
		open(old)
	}
	return out
}

func faultCases(w *faultWorld) []faultCase {
	withRec := manifestOpts{recoveryKeys: []int{0}, threshold: 1}
	noRec := manifestOpts{threshold: 1}
	setWith := func(o manifestOpts) func(t *testing.T, e *faultEnv) {
		return func(t *testing.T, e *faultEnv) { e.set(t, o) }
	}
	update := func(o manifestOpts) func(e *faultEnv) error {
		return func(e *faultEnv) error {
			_, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(o))
			return err
		}
	}
	recoveryMode := func(t *testing.T, e *faultEnv) {
		e.set(t, withRec)
		e.breakKey(t)
		e.open(t)
		if e.c.Status() != StateRecovery {
			t.Fatalf("prepare: state %d, want recovery", e.c.Status())
		}
	}
	return []faultCase{
		{name: "set manifest", op: func(e *faultEnv) error {
			_, err := e.c.SetManifest(context.Background(), w.manifest(withRec))
			return err
		}},
		{name: "set manifest without recovery keys", op: func(e *faultEnv) error {
			_, err := e.c.SetManifest(context.Background(), w.manifest(noRec))
			return err
		}},
		{name: "set manifest in recovery mode", prepare: recoveryMode, op: func(e *faultEnv) error {
			_, err := e.c.SetManifest(context.Background(), w.manifest(noRec))
			return err
		}},
		{name: "secret upload", prepare: setWith(noRec), op: func(e *faultEnv) error {
			return e.c.SetSecrets(context.Background(), w.admin.peer(), map[string]secrets.Upload{"uploaded": {Key: []byte("value")}})
		}},
		{name: "package update", prepare: setWith(noRec), op: func(e *faultEnv) error {
			_, err := e.c.Update(context.Background(), w.admin.peer(), []byte(`{"Packages":{"p":{"SecurityVersion":2}}}`))
			return err
		}},
		{name: "full update keeping recovery keys", prepare: setWith(withRec), op: update(manifestOpts{recoveryKeys: []int{0}, threshold: 1, extraSecret: true})},
		{name: "full update with new recovery keys", prepare: setWith(withRec), op: update(manifestOpts{recoveryKeys: []int{1}, threshold: 1})},
		{name: "full update adding recovery keys", prepare: setWith(noRec), op: update(withRec)},
		{name: "full update initiated (pending)", prepare: setWith(manifestOpts{threshold: 2}), op: update(manifestOpts{recoveryKeys: []int{1}, threshold: 2})},
		{name: "acknowledgement applying the update", prepare: func(t *testing.T, e *faultEnv) {
			e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 2})
			if _, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{1}, threshold: 2})); err != nil {
				t.Fatal(err)
			}
		}, op: func(e *faultEnv) error {
			_, err := e.c.AcknowledgeUpdate(context.Background(), w.second.peer(), w.manifest(manifestOpts{recoveryKeys: []int{1}, threshold: 2}))
			return err
		}},
		{name: "cancel", prepare: func(t *testing.T, e *faultEnv) {
			e.set(t, manifestOpts{threshold: 2})
			if _, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{threshold: 2, extraSecret: true})); err != nil {
				t.Fatal(err)
			}
		}, op: func(e *faultEnv) error { return e.c.CancelUpdate(context.Background(), w.second.peer()) }},
		{name: "recovery", prepare: recoveryMode, op: func(e *faultEnv) error {
			p := e.plain["r0"]
			_, err := e.c.Recover(context.Background(), p, signSecret(w.rec[0], p))
			return err
		}},
		{name: "activation counted (MaxActivations)", prepare: setWith(noRec), op: func(e *faultEnv) error {
			_, err := e.c.Activate(context.Background(), e.marbleRequest(nil))
			return err
		}},
		{name: "monotonic counter", prepare: func(t *testing.T, e *faultEnv) {
			e.set(t, noRec)
			e.activate(t)
		}, op: func(e *faultEnv) error {
			_, err := e.c.SetMonotonicCounter(context.Background(), e.marble, "c", 7)
			return err
		}},
		{name: "seal mode Disabled to ProductKey", prepare: setWith(manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: "Disabled"}),
			op: update(manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: "ProductKey"})},
		{name: "seal mode ProductKey to UniqueKey", prepare: setWith(withRec),
			op: update(manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: "UniqueKey"})},
		{name: "seal mode default to UniqueKey without recovery keys", prepare: setWith(noRec),
			op: update(manifestOpts{threshold: 1, sealMode: "UniqueKey"})},
		{name: "seal mode to UniqueKey with new recovery keys", prepare: setWith(withRec),
			op: update(manifestOpts{recoveryKeys: []int{1}, threshold: 1, sealMode: "UniqueKey"})},
		{name: "acknowledgement applying seal mode UniqueKey", prepare: func(t *testing.T, e *faultEnv) {
			e.set(t, manifestOpts{recoveryKeys: []int{0}, threshold: 2})
			if _, err := e.c.Update(context.Background(), w.admin.peer(), w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 2, sealMode: "UniqueKey"})); err != nil {
				t.Fatal(err)
			}
		}, op: func(e *faultEnv) error {
			_, err := e.c.AcknowledgeUpdate(context.Background(), w.second.peer(), w.manifest(manifestOpts{recoveryKeys: []int{0}, threshold: 2, sealMode: "UniqueKey"}))
			return err
		}},
		{name: "seal mode UniqueKey to ProductKey", prepare: setWith(manifestOpts{recoveryKeys: []int{0}, threshold: 1, sealMode: "UniqueKey"}),
			op: update(withRec), loosens: true},
	}
}

func TestFaultInjection(t *testing.T) {
	keys := rsaKeys(t, 2)
	w := &faultWorld{admin: newFaultUser(t, "admin"), second: newFaultUser(t, "second"), rec: keys}
	modes := []struct {
		mode       storetest.FaultMode
		persistent bool
	}{
		{storetest.FailBefore, false}, {storetest.FailAfter, false},
		{storetest.FailBefore, true}, {storetest.FailAfter, true},
		{storetest.CrashBefore, false}, {storetest.CrashAfter, false},
	}
	// With the Gramine sealer (a fake attestation directory), the cases
	// that change the data key or the seal mode run again.
	withGramine := map[string]bool{"set manifest": true, "full update with new recovery keys": true, "recovery": true,
		"seal mode Disabled to ProductKey": true, "seal mode ProductKey to UniqueKey": true, "secret upload": true,
		"seal mode default to UniqueKey without recovery keys": true, "seal mode to UniqueKey with new recovery keys": true,
		"acknowledgement applying seal mode UniqueKey": true, "seal mode UniqueKey to ProductKey": true}
	gramineDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(gramineDir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{seal.GramineMRSignerKey, seal.GramineMREnclaveKey} {
		if err := os.WriteFile(filepath.Join(gramineDir, filepath.FromSlash(name)), bytes.Repeat([]byte{byte(i + 1)}, 16), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	type run struct {
		tc     faultCase
		sealer seal.KeySealer
		name   string
	}
	var all []run
	for _, tc := range faultCases(w) {
		all = append(all, run{tc, nil, tc.name})
	}
	for _, tc := range faultCases(w) {
		if withGramine[tc.name] {
			all = append(all, run{tc, seal.GramineKeySealer{Dir: gramineDir}, "gramine " + tc.name})
		}
	}
	var runs atomic.Int64
	t.Cleanup(func() { t.Logf("%d runs", runs.Load()) })
	for _, r := range all {
		tc := r.tc
		t.Run(r.name, func(t *testing.T) {
			// Each case runs in directories of its own: the cases run
			// side by side.
			t.Parallel()
			for k := 1; ; k++ {
				fired := false
				for _, m := range modes {
					name := fmt.Sprintf("step %d %s", k, m.mode)
					if m.persistent {
						name += " persistent"
					}
					if runFault(t, name, w, tc, r.sealer, k, m.mode, m.persistent) {
						fired = true
					}
					runs.Add(1)
				}
				if !fired {
					if k == 1 {
						t.Fatal("the operation writes nothing")
					}
					t.Logf("%d write steps", k-1)
					return
				}
			}
		})
	}
}

// runFault runs one case with one fault and checks the outcome; it reports
// whether the fault fired (false: the operation has fewer than k steps).
func runFault(t *testing.T, name string, w *faultWorld, tc faultCase, sealer seal.KeySealer, k int, mode storetest.FaultMode, persistent bool) bool {
	t.Helper()
	e := &faultEnv{w: w, dir: t.TempDir(), sealer: sealer}
	e.open(t)
	if tc.prepare != nil {
		tc.prepare(t, e)
	}
	before := describe(e.fresh(t))
	old, _ := os.ReadFile(filepath.Join(e.dir, "sealed_data"))
	// Remember every key the operation binds, to open what it attempted.
	keyFiles := map[[32]byte][]byte{}
	e.faults.Arm(k, mode, persistent)
	opErr := tc.op(e)
	e.faults.Disarm()
	fired := e.faults.Fired()
	if !fired && opErr != nil {
		t.Fatalf("%s: the operation fails without a fault: %v", name, opErr)
	}
	if !fired {
		return false
	}
	// Every key the operation wrote, by the blob it is bound to.
	for _, b := range e.faults.Saved() {
		addKeys(e.keySealer(), b, keyFiles)
	}
	if raw, err := os.ReadFile(filepath.Join(e.dir, "sealed_key")); err == nil {
		addKeys(e.keySealer(), raw, keyFiles)
	}
	after := e.attempted(t, keyFiles, old)

	fresh := e.fresh(t)
	got := describe(fresh)
	if got != before && !contains(after, got) {
		t.Fatalf("%s: after the fault a restart opens a third state %q (before %q, attempted %v; operation error %v)", name, got, before, after, opErr)
	}
	if opErr == nil && (len(after) == 0 || got != after[0]) {
		t.Fatalf("%s: the operation answered success, but a restart opens %q, not the new state %v", name, got, after)
	}
	if fresh.Status() == StateRecovery && !stringsHasPrefix(before, "recovery") {
		t.Fatalf("%s: a restart is in recovery mode", name)
	}
	// Under Gramine, a stored UniqueKey state opens with no entry of the
	// key file for an enclave of the same signer with another MRENCLAVE,
	// whatever failed: a tightened seal mode has a new data key.
	if g, ok := sealer.(seal.GramineKeySealer); ok && !tc.loosens && fresh.Status() == StateAcceptingMarbles &&
		fresh.snap.Load().manifest.Config.SealMode == "UniqueKey" {
		blob, keyFile := e.files(t)
		if _, opened := opening(t, sameSignerOtherEnclave(t, g), keyFile, blob); opened != 0 {
			t.Fatalf("%s: an enclave of the same signer with another MRENCLAVE opens the stored UniqueKey state with %d entries of the key file", name, opened)
		}
	}
	if mode == storetest.CrashBefore || mode == storetest.CrashAfter {
		return true
	}
	// The process went on: its memory agrees with the disk, and the next
	// write works and is what a restart sees. With SealMode Disabled the
	// state lives in memory only and the disk holds nothing.
	if s := e.c.snap.Load(); s.manifest != nil && s.manifest.Config.SealMode == "Disabled" {
		if got != "state 2" {
			t.Fatalf("%s: SealMode Disabled, but a restart opens %q", name, got)
		}
		return true
	}
	if mem := describe(e.c); mem != got {
		t.Fatalf("%s: memory %q and disk %q disagree after a failed write (operation error %v)", name, mem, got, opErr)
	}
	if e.c.Status() == StateAcceptingMarbles {
		if err := e.c.SetSecrets(context.Background(), w.admin.peer(), map[string]secrets.Upload{"followup": {Key: []byte(name)}}); err != nil {
			t.Fatalf("%s: the next write fails: %v", name, err)
		}
		if mem, disk := describe(e.c), describe(e.fresh(t)); mem != disk {
			t.Fatalf("%s: after the next write memory %q and disk %q disagree", name, mem, disk)
		}
	}
	return true
}

// addKeys unseals the entries of a key file and adds the keys by the
// binding they are for, a blob's SHA-256 or a key ID (anything else is
// ignored).
func addKeys(sealer seal.KeySealer, keyFile []byte, into map[[32]byte][]byte) {
	entries, err := seal.DecodeKeyFile(keyFile)
	if err != nil {
		return
	}
	for _, en := range entries {
		if en.Legacy {
			continue
		}
		if dek, err := sealer.UnsealKey(en.Sealed, en.Binding[:]); err == nil && en.Holds(dek) {
			into[en.Binding] = dek
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func stringsHasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// marbleRequest is an activation of Marble "m" with a fresh self-signed
// client certificate and CSR (simulation: no quote).
func (e *faultEnv) marbleRequest(t *testing.T) ActivationRequest {
	k, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "marble"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		panic(err)
	}
	cert, _ := x509.ParseCertificate(der)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "marble"}}, k)
	if err != nil {
		panic(err)
	}
	return ActivationRequest{CSR: csr, MarbleType: "m", UUID: "0b3a5e1c-8f2d-4c6a-9e7b-1d2c3b4a5f60", Peer: []*x509.Certificate{cert}}
}

// activate activates Marble "m" and keeps its Marble certificate.
func (e *faultEnv) activate(t *testing.T) {
	t.Helper()
	act, err := e.c.Activate(context.Background(), e.marbleRequest(t))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(act.Env[EnvCertificateChain])
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	e.marble = []*x509.Certificate{leaf}
}
