package integration

import (
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The crash-torture test (docs/sealing.md, "How it is tested") is bounded by these flags; whichever of
// kills and duration is reached first ends it. The defaults keep it short
// enough for every CI run; a long run:
//
//	go test ./test/integration -run Torture -torture.kills=1000 -torture.duration=30m -count=1 -v
var (
	tortureKills     = flag.Int("torture.kills", 15, "crash-torture test: number of SIGKILLs")
	tortureDuration  = flag.Duration("torture.duration", 20*time.Second, "crash-torture test: longest run (ends after the kill in progress)")
	tortureMaxDelay  = flag.Duration("torture.maxdelay", 300*time.Millisecond, "crash-torture test: a kill lands at a random moment up to this long after the writes start")
	tortureKeyChange = flag.Bool("torture.keychange", true, "crash-torture test: the manifest updates change the recovery keys (a change of the data key); false: they keep them")
	tortureSeed      = flag.Uint64("torture.seed", 0, "crash-torture test: seed of the kill delays (0: random, logged)")
)

const (
	tortureUser   = "alice"
	tortureSecret = "plain"
	// Every tortureUpdateEvery-th write is a full manifest update instead
	// of a secret upload.
	tortureUpdateEvery = 10
)

// tortureWrite is one acknowledged-or-not write of the torture test.
type tortureWrite struct {
	seq    uint64 // strictly increasing over the whole test
	update bool
	// A secret upload sets the plain secret to the decimal seq.
	// A full update makes raw (generation gen, recovery key set keySet)
	// the manifest.
	gen    int
	keySet int
	raw    []byte
	fp     string
}

func (w tortureWrite) String() string {
	if !w.update {
		return fmt.Sprintf("write %d: secret upload %s=%d", w.seq, tortureSecret, w.seq)
	}
	return fmt.Sprintf("write %d: full manifest update to generation %d, recovery key set %d (fingerprint %.12s)", w.seq, w.gen, w.keySet, w.fp)
}

// logEntries is what the write adds to the update log once applied.
func (w tortureWrite) logEntries() []tortureLogEntry {
	if !w.update {
		return []tortureLogEntry{tortureLogSecretSet(tortureUser, tortureSecret)}
	}
	return tortureLogUpdate(tortureUser, w.fp)
}

// tortureAck is an acknowledged write and its answer.
type tortureAck struct {
	w               tortureWrite
	recoverySecrets map[string][]byte // encrypted, as answered
}

// tortureResult is what one writer goroutine saw until the process died.
type tortureResult struct {
	acked []tortureAck
	// inFlight is the write whose answer never came (the kill): it may
	// or may not have been applied.
	inFlight *tortureWrite
	cause    error // why inFlight has no answer
	// unexpected is an answer other than 200 while the process lived.
	unexpected error
}

// tortureState is what the test knows must be in the sealed state.
type tortureState struct {
	secret  uint64 // the plain secret's counter (0: never set)
	gen     int
	keySet  int
	raw     []byte
	fp      string
	log     []tortureLogEntry
	secrets map[string][]byte // plaintext recovery secrets of the data key; nil: unknown
}

// torture holds the test's fixed inputs and running figures.
type torture struct {
	base    []byte                       // manifest generation 0 without recovery keys
	keySets []map[string]*rsa.PrivateKey // the two alternating recovery key sets
	pems    []map[string]any             // their public keys for the manifest
	alice   tls.Certificate              // the single admin
	root    *x509.Certificate            // pinned root
	nextSeq uint64                       // next write's seq (writer goroutine only while it runs)
	nextGen int                          // next manifest generation (idem)
	stats   tortureStats
}

// tortureStats are the figures the test reports.
type tortureStats struct {
	acked, ackedSecrets, ackedUpdates, keyChanges int // acknowledged writes
	inFlight, landed, notSent                     int // writes in flight at a kill
	inFlightKeyChanges, landedKeyChanges          int // of those, changes of the data key
}

// manifest returns the manifest of generation gen with recovery key set
// keySet: generation 0 of the fixture with the generation in an Env value
// of a Marble, so that every update has its own fingerprint.
func (tt *torture) manifest(gen, keySet int) ([]byte, error) {
	var tree map[string]any
	if err := json.Unmarshal(tt.base, &tree); err != nil {
		return nil, err
	}
	f := &fixture{tree: tree}
	f.set("Marbles.frontend.Parameters.Env.TORTURE_GENERATION", strconv.Itoa(gen))
	f.set("RecoveryKeys", tt.pems[keySet])
	return json.MarshalIndent(f.tree, "", "  ")
}

// writer sends writes one after the other until one gets no answer (the
// process was killed) or an unexpected one; keySet is the recovery key set
// of the current manifest. It runs in its own goroutine and must not touch
// t.
func (tt *torture) writer(hc *http.Client, c *coordinator, keySet int) tortureResult {
	var res tortureResult
	for {
		w := tortureWrite{seq: tt.nextSeq}
		tt.nextSeq++
		var r response
		var err error
		if w.seq%tortureUpdateEvery == 0 {
			w.update, w.gen = true, tt.nextGen
			tt.nextGen++
			if *tortureKeyChange {
				keySet = 1 - keySet
			}
			w.keySet = keySet
			if w.raw, err = tt.manifest(w.gen, w.keySet); err != nil {
				res.unexpected = err
				return res
			}
			w.fp = tortureFingerprint(w.raw)
			r, err = tortureDo(hc, http.MethodPost, c.url("/api/v2/update"), map[string][]byte{"manifest": w.raw})
		} else {
			r, err = tortureDo(hc, http.MethodPost, c.url("/api/v2/secrets"),
				map[string]any{"secrets": map[string]any{tortureSecret: map[string]any{"key": []byte(strconv.FormatUint(w.seq, 10))}}})
		}
		if err != nil {
			res.inFlight, res.cause = &w, err
			return res
		}
		if r.HTTPStatus != http.StatusOK || r.Status != "success" {
			res.unexpected = fmt.Errorf("%s: HTTP %d: %s", w, r.HTTPStatus, r.Raw)
			return res
		}
		ack := tortureAck{w: w}
		if w.update {
			var d updateData
			if err := json.Unmarshal(r.Data, &d); err != nil {
				res.unexpected = fmt.Errorf("%s: answer %s: %w", w, r.Data, err)
				return res
			}
			if d.MissingAcknowledgments != 0 {
				res.unexpected = fmt.Errorf("%s: not applied at once: %s", w, r.Data)
				return res
			}
			ack.recoverySecrets = d.RecoverySecrets
		}
		res.acked = append(res.acked, ack)
	}
}

// tortureFingerprint is the manifestFingerprint of raw.
func tortureFingerprint(raw []byte) string {
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

func TestTortureKillDuringWrites(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("crash torture: skipped with -short")
	}
	seed := *tortureSeed
	if seed == 0 {
		seed = rand.Uint64()
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	t.Logf("crash torture: up to %d kills or %v, kill delay 0-%v, key changes %v, seed %d",
		*tortureKills, *tortureDuration, *tortureMaxDelay, *tortureKeyChange, seed)

	// The manifest: the fixture with a user-defined plain secret, alice as
	// the single admin (bob only reads) who applies updates alone, and
	// recovery key set 0.
	keys := recoveryKeys(t, 3)
	tt := &torture{
		keySets: []map[string]*rsa.PrivateKey{{"torture-a": keys[0]}, {"torture-b1": keys[1], "torture-b2": keys[2]}},
	}
	for _, set := range tt.keySets {
		pems := map[string]any{}
		for name, k := range set {
			pems[name] = publicKeyPEM(t, k)
		}
		tt.pems = append(tt.pems, pems)
	}
	f := newFixture(t)
	f.set("Secrets."+tortureSecret, map[string]any{"Type": "plain", "UserDefined": true})
	f.set("Roles.reader.ResourceNames", []string{"symkey", "cert", "userkey", tortureSecret})
	f.set("Roles.writer.ResourceNames", []string{"userkey", tortureSecret})
	f.set("Users.bob.Roles", []string{"reader"})
	f.set("Config.UpdateThreshold", 1)
	tt.base = f.bytes(t)
	tt.alice = f.users[tortureUser].cert

	c := startRaceCoordinator(t, "")
	_, tt.root = getChain(t, c, c.client(nil, nil))
	raw, err := tt.manifest(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := setManifest(t, c, c.client(tt.root, nil), raw)
	expect(t, r, http.StatusOK, "success")
	var set struct {
		RecoverySecrets map[string][]byte `json:"RecoverySecrets"`
	}
	decode(t, r, &set)
	state := tortureState{raw: raw, fp: tortureFingerprint(raw), log: []tortureLogEntry{tortureLogManifestSet()}}
	if state.secrets, err = tortureDecrypt(set.RecoverySecrets, tt.keySets[0]); err != nil {
		t.Fatal(err)
	}
	tt.nextSeq, tt.nextGen = 1, 1

	start := time.Now()
	kills := 0
	procStart := 0 // offset in c.Logs() where the current process's log starts
	for kills < *tortureKills && time.Since(start) < *tortureDuration {
		hc := c.client(tt.root, &tt.alice)
		done := make(chan tortureResult, 1)
		keySet := state.keySet
		go func() { done <- tt.writer(hc, c, keySet) }()
		time.Sleep(time.Duration(rng.Int64N(int64(*tortureMaxDelay) + 1)))
		c.kill()
		kills++
		res := <-done
		hc.CloseIdleConnections()
		if res.unexpected != nil {
			t.Fatalf("kill %d: unexpected answer before the kill: %v\n%s", kills, res.unexpected, c.Logs()[procStart:])
		}
		if res.inFlight == nil {
			t.Fatalf("kill %d: the writer stopped without a write in flight", kills)
		}

		// What was acknowledged must be there after the restart.
		for _, a := range res.acked {
			tt.stats.acked++
			state.log = append(state.log, a.w.logEntries()...)
			if !a.w.update {
				tt.stats.ackedSecrets++
				state.secret = a.w.seq
				continue
			}
			tt.stats.ackedUpdates++
			changed := a.w.keySet != state.keySet
			state.gen, state.keySet, state.raw, state.fp = a.w.gen, a.w.keySet, a.w.raw, a.w.fp
			switch {
			case changed:
				tt.stats.keyChanges++
				if state.secrets, err = tortureDecrypt(a.recoverySecrets, tt.keySets[a.w.keySet]); err != nil {
					t.Fatalf("kill %d: %s: %v", kills, a.w, err)
				}
			case len(a.recoverySecrets) != 0:
				t.Fatalf("kill %d: %s kept the recovery keys but answered %d recovery secrets", kills, a.w, len(a.recoverySecrets))
			}
		}

		logStart := len(c.Logs())
		c.start()
		tt.check(t, c, kills, &state, len(res.acked), *res.inFlight, res.cause, c.Logs()[procStart:logStart], logStart)
		procStart = logStart
		if kills%100 == 0 {
			t.Logf("%d kills in %v: %d writes acknowledged, none lost", kills, time.Since(start).Round(time.Second), tt.stats.acked)
		}
	}
	s := tt.stats
	t.Logf("crash torture done: %d kills in %v, %d restarts opened in state 3; %d writes acknowledged (%d secret uploads, %d full updates of which %d changed the data key), 0 lost; "+
		"%d writes in flight at a kill: %d applied, %d not applied (%d of them never reached the process), %d of them data-key changes (%d applied); final secret %d, manifest generation %d, update log %d entries",
		kills, time.Since(start).Round(time.Millisecond), kills, s.acked, s.ackedSecrets, s.ackedUpdates, s.keyChanges,
		s.inFlight, s.landed, s.inFlight-s.landed, s.notSent, s.inFlightKeyChanges, s.landedKeyChanges, state.secret, state.gen, len(state.log))
	if strings.Contains(c.Logs(), "DATA RACE") {
		t.Fatal("the race detector reported a data race in the coordinator")
	}
}

// check verifies the restarted coordinator against the state that must be
// durable (every acknowledged write, acked of them since the last restart)
// and the write in flight at the kill, and folds the in-flight write into
// state if it was applied. killedLog is the log of the killed process; newLog
// is where the new process's log starts.
func (tt *torture) check(t *testing.T, c *coordinator, kill int, state *tortureState, acked int, inFlight tortureWrite, cause error, killedLog string, newLog int) {
	t.Helper()
	tt.stats.inFlight++
	keyChange := inFlight.update && inFlight.keySet != state.keySet
	if keyChange {
		tt.stats.inFlightKeyChanges++
	}
	anon := c.client(nil, nil)
	defer anon.CloseIdleConnections()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("kill %d, in flight %s (%v): %s\nseal directory: %s\n--- log of the killed process ---\n%s--- log of the restarted process ---\n%s",
			kill, inFlight, cause, fmt.Sprintf(format, args...), tortureSealDir(c.sealDir), killedLog, c.Logs()[newLog:])
	}
	st := getStatus(t, c, anon)
	switch st.Code {
	case 3:
	case 1:
		fail("the coordinator came up in recovery mode (state 1), a torn sealed state; %s", tt.tryRecover(t, c, *state, inFlight))
	default:
		fail("the coordinator came up in state %d (%q), want 3", st.Code, st.Message)
	}
	if _, root := getChain(t, c, anon); !root.Equal(tt.root) {
		fail("the root certificate changed")
	}
	pinned := c.client(tt.root, &tt.alice)
	defer pinned.CloseIdleConnections()

	// The manifest: the last acknowledged one or the one in flight.
	fp, err := tortureReadFingerprint(pinned, c)
	if err != nil {
		fail("%v", err)
	}
	landed := false
	switch {
	case fp == state.fp:
	case inFlight.update && fp == inFlight.fp:
		landed = true
	default:
		fail("manifest fingerprint %.12s is neither the last acknowledged %.12s (generation %d) nor the one in flight", fp, state.fp, state.gen)
	}
	// The secret: the last acknowledged value or the one in flight.
	v, err := tortureReadCounter(pinned, c, tortureSecret)
	if err != nil {
		fail("%v", err)
	}
	switch {
	case v == state.secret:
	case !inFlight.update && v == inFlight.seq:
		landed = true
	case v < state.secret:
		fail("lost write: the secret is %d, but %d was acknowledged (%d writes acknowledged since the last restart)", v, state.secret, acked)
	default:
		fail("the secret is %d, want the last acknowledged %d or the one in flight", v, state.secret)
	}
	if errors.Is(cause, syscall.ECONNREFUSED) {
		tt.stats.notSent++ // the kill came between two writes
	}
	if landed {
		tt.stats.landed++
		if keyChange {
			tt.stats.landedKeyChanges++
		}
		state.log = append(state.log, inFlight.logEntries()...)
		if inFlight.update {
			state.gen, state.keySet, state.raw, state.fp = inFlight.gen, inFlight.keySet, inFlight.raw, inFlight.fp
			if keyChange {
				state.secrets = nil // its answer, with the recovery secrets, never came
			}
		} else {
			state.secret = inFlight.seq
		}
	}
	checkManifest(t, c, c.client(tt.root, nil), tt.root, state.raw)

	// The update log: every acknowledged write once, in order, plus the
	// write in flight exactly when it was applied; nothing else.
	got, err := tortureFetchLog(pinned, c)
	if err != nil {
		fail("%v", err)
	}
	if d := tortureCompareLog(got, state.log); d != "" {
		fail("update log: %s", d)
	}
	r, err := tortureDo(pinned, http.MethodGet, c.url("/api/v2/update-manifest"), nil)
	if err != nil || r.HTTPStatus != http.StatusNotFound {
		fail("a pending update after the restart: %v %s", err, r.Raw)
	}
}

// tryRecover is the diagnosis of a coordinator in recovery mode: it uploads
// the recovery secrets of the last data key known to be applied and says
// whether that recovered the state, and which state.
func (tt *torture) tryRecover(t *testing.T, c *coordinator, state tortureState, inFlight tortureWrite) string {
	t.Helper()
	var b strings.Builder
	if inFlight.update && inFlight.keySet != state.keySet {
		b.WriteString("the write in flight changed the data key (a kill between writing sealed_key and sealed_data?); ")
	}
	if state.secrets == nil {
		b.WriteString("recovery not tried: the recovery secrets of the last applied data key are unknown (its update was applied without an answer)")
		return b.String()
	}
	anon := c.client(nil, nil)
	defer anon.CloseIdleConnections()
	keys := tt.keySets[state.keySet]
	names := make([]string, 0, len(keys))
	for name := range keys {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		secret := state.secrets[name]
		r, err := tortureDo(anon, http.MethodPost, c.url("/api/v2/recover"),
			map[string][]byte{"recoverySecret": secret, "recoverySecretSignature": sign(t, keys[name], secret)})
		if err != nil || r.HTTPStatus != http.StatusOK {
			fmt.Fprintf(&b, "recovery with the secrets of the last acknowledged key set %d did NOT work: %s: %v %s", state.keySet, name, err, r.Raw)
			return b.String()
		}
	}
	r, err := tortureDo(anon, http.MethodGet, c.url("/api/v2/status"), nil)
	var s statusData
	if err == nil {
		err = json.Unmarshal(r.Data, &s)
	}
	if err != nil || s.Code != 3 {
		fmt.Fprintf(&b, "recovery with the secrets of the last acknowledged key set %d did NOT work: state %d after the uploads (%v)", state.keySet, s.Code, err)
		return b.String()
	}
	fmt.Fprintf(&b, "recovery with the secrets of the last acknowledged key set %d WORKED", state.keySet)
	pinned := c.client(tt.root, &tt.alice)
	defer pinned.CloseIdleConnections()
	fp, err1 := tortureReadFingerprint(pinned, c)
	v, err2 := tortureReadCounter(pinned, c, tortureSecret)
	which := "neither the last acknowledged nor the one in flight"
	switch {
	case fp == state.fp:
		which = "the last acknowledged"
	case inFlight.update && fp == inFlight.fp:
		which = "the one in flight"
	}
	fmt.Fprintf(&b, ": recovered manifest %.12s (%s), secret %d (last acknowledged %d) %v %v", fp, which, v, state.secret, err1, err2)
	return b.String()
}
