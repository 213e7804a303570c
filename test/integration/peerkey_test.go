package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/peer"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

// freeLoopbackAddr returns a loopback address with a port free right now
// (the peer address must be known before the start, to be advertised).
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestPeerKeyTransfer (docs/ha.md, "The data key"): two Coordinator processes under the
// Gramine fake with different sealing keys (two CPUs) on one etcd. The
// second cannot open the first's key entry, obtains the data key from the
// first after it verified the second's quote, and serves the state; with
// the first SIGKILLed it still serves and restarts alone (its own entry).
// A third CPU with no live peer goes to recovery mode; recovery on it
// restores the state, which the second CPU, started again, opens.
func TestPeerKeyTransfer(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	prefix := newPrefix()
	s := newSGXPlatform(t, "UpToDate", nil)
	quote := func(rd [64]byte) []byte { return s.quote(t, rd) }
	envOn := func(dev *graminetest.Device) []string {
		return append(s.env(), "QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir,
			"QUARRY_STORE=etcd", "QUARRY_ETCD_ENDPOINTS="+strings.Join(cluster.Endpoints(), ","), "QUARRY_ETCD_PREFIX="+prefix,
			"QUARRY_PEER_ADDR="+freeLoopbackAddr(t))
	}
	devA, devB, devC := graminetest.NewDevice(t, quote), graminetest.NewDevice(t, quote), graminetest.NewDevice(t, quote)

	// A sets the manifest (one recovery key: its secret is the data key).
	rs := newRecoverySetupEnv(t, envOn(devA), func(f *fixture) {})
	a := rs.c
	if !strings.Contains(a.Logs(), "peer key server listening") {
		t.Fatalf("A has no peer key server:\n%s", a.Logs())
	}

	// B on another CPU joins through A.
	b := startCoordinator(t, "", envOn(devB)...)
	expectState(t, b, b.client(nil, nil), 3, msgRunning)
	checkManifest(t, b, b.client(rs.root, nil), rs.root, rs.raw)
	if !strings.Contains(b.Logs(), "obtained the data key from a running instance") {
		t.Fatalf("B did not obtain the key from A:\n%s", b.Logs())
	}
	if !strings.Contains(a.Logs(), "gave the data key to an attested instance of the same enclave") {
		t.Fatalf("A does not log the transfer:\n%s", a.Logs())
	}
	if strings.Contains(a.Logs()+b.Logs(), "INSECURE") {
		t.Fatal("an INSECURE warning under Gramine")
	}

	// A dies; B serves, and restarts alone with its own entry.
	a.kill()
	expectState(t, b, b.client(nil, nil), 3, msgRunning)
	b.restart()
	expectState(t, b, b.client(nil, nil), 3, msgRunning)
	checkManifest(t, b, b.client(rs.root, nil), rs.root, rs.raw)
	if n := strings.Count(b.Logs(), "asking a running instance for the data key"); n != 1 {
		t.Fatalf("B asked a peer %d times over two starts, want once (the restart uses its own entry)", n)
	}

	// B dies too: a third CPU finds no live peer with the key.
	b.kill()
	c := startCoordinator(t, "", envOn(devC)...)
	expectState(t, c, c.client(nil, nil), 1, msgRecovery)
	if !strings.Contains(c.Logs(), "no running instance gave the data key") {
		t.Fatalf("C does not say why it is in recovery mode:\n%s", c.Logs())
	}
	// Recovery on C restores the state...
	r := postRecover(t, c, rs.secrets["key1"], sign(t, rs.keys["key1"], rs.secrets["key1"]))
	expect(t, r, http.StatusOK, "success")
	expectState(t, c, c.client(nil, nil), 3, msgRunning)
	checkManifest(t, c, c.client(rs.root, nil), rs.root, rs.raw)
	// ...for every instance: the data key did not change, so C's commit
	// kept B's entry, and B opens the recovered state alone.
	b.start()
	expectState(t, b, b.client(nil, nil), 3, msgRunning)
	checkManifest(t, b, b.client(rs.root, nil), rs.root, rs.raw)
	if n := strings.Count(b.Logs(), "asking a running instance for the data key"); n != 1 {
		t.Fatalf("B asked a peer %d times over three starts, want once", n)
	}
}

// TestPeerKeyImpostor: someone who can write etcd (and run a server) makes
// a state of its own under a data key of its choosing, with the same
// manifest (so the same fingerprint), writes it and its key file over the
// prefix, and registers a members/ entry pointing at its own peer key
// server, which hands that key to anyone. The running instance, following
// the change, and a new instance on another CPU refuse the key (no quote)
// and go to recovery mode saying why; neither serves the attacker's root.
// With the genuine state written back, the running instance opens it again
// and the new one joins through it.
func TestPeerKeyImpostor(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	prefix := newPrefix()
	s := newSGXPlatform(t, "UpToDate", nil)
	quote := func(rd [64]byte) []byte { return s.quote(t, rd) }
	envOn := func(dev *graminetest.Device) []string {
		return append(s.env(), "QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir,
			"QUARRY_STORE=etcd", "QUARRY_ETCD_ENDPOINTS="+strings.Join(cluster.Endpoints(), ","), "QUARRY_ETCD_PREFIX="+prefix,
			"QUARRY_PEER_ADDR="+freeLoopbackAddr(t))
	}
	a := startCoordinator(t, "", envOn(graminetest.NewDevice(t, quote))...)
	f := newFixture(t)
	raw := f.bytes(t)
	expect(t, setManifest(t, a, a.client(nil, nil), raw), http.StatusOK, "success")
	root := fetchRoot(t, a, a.client(nil, nil))
	d, k := etcdStores(t, cluster.Endpoints(), prefix)
	genuineBlob, _, genuineKey, _, err := d.LoadPair(t.Context(), k)
	if err != nil {
		t.Fatal(err)
	}

	// The attacker's state: its own Coordinator on its own prefix.
	ad, ak := etcdStores(t, cluster.Endpoints(), "/attacker"+prefix)
	var id seal.InstanceID
	rand.Read(id[:])
	fake, err := core.New(t.Context(), core.Options{Data: ad, Key: ak, KeySealer: seal.SimulationKeySealer{}, InstanceID: &id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fake.SetManifest(t.Context(), raw); err != nil {
		t.Fatal(err)
	}
	attackerRoot := fake.TLSCertificate().Leaf
	blob, _, keyFile, _, err := ad.LoadPair(t.Context(), ak)
	if err != nil {
		t.Fatal(err)
	}
	// Its peer key server: the real one, without an enclave, trusting
	// anyone.
	impostor := &peer.Server{Keys: fake, InsecureTrust: true}
	if impostor.Certificate, err = peer.NewCertificate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go impostor.Serve(ln)
	t.Cleanup(func() { ln.Close(); impostor.Close() })
	// Its members/ entry: a copy of the genuine one (so that new
	// instances start beside it) with the impostor's address.
	reg, err := etcdstore.Connect(t.Context(), etcdstore.Options{Endpoints: cluster.Endpoints(), Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	members, err := reg.Members(t.Context())
	if err != nil || len(members) != 1 {
		t.Fatalf("members: %d, %v", len(members), err)
	}
	var m map[string]any
	if err := json.Unmarshal(members[0], &m); err != nil {
		t.Fatal(err)
	}
	m["instance"], m["peerAddr"] = hex.EncodeToString(id[:]), ln.Addr().String()
	entry, _ := json.Marshal(m)
	if _, err := reg.Join(t.Context(), entry, time.Minute); err != nil {
		t.Fatal(err)
	}
	overwrite := func(blob, keyFile []byte) {
		t.Helper()
		_, drev, _, krev, err := d.LoadPair(t.Context(), k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.SavePair(t.Context(), blob, drev, k, keyFile, krev); err != nil {
			t.Fatal(err)
		}
	}
	overwrite(blob, keyFile)

	// The running instance follows the change (the status request syncs).
	expectState(t, a, a.client(nil, nil), 1, msgRecovery)
	if fetchRoot(t, a, a.client(nil, nil)).Equal(attackerRoot) {
		t.Fatal("the running instance serves the attacker's root")
	}
	// A new instance on another CPU.
	c := startCoordinator(t, "", envOn(graminetest.NewDevice(t, quote))...)
	expectState(t, c, c.client(nil, nil), 1, msgRecovery)
	if fetchRoot(t, c, c.client(nil, nil)).Equal(attackerRoot) {
		t.Fatal("the new instance serves the attacker's root")
	}
	for _, in := range []*coordinator{a, c} {
		for _, want := range []string{"no running instance gave the data key", "the peer sent the key without a quote"} {
			if !strings.Contains(in.Logs(), want) {
				t.Errorf("the log does not say %q:\n%s", want, in.Logs())
			}
		}
	}

	// The genuine state back.
	overwrite(genuineBlob, genuineKey)
	expectState(t, a, a.client(nil, nil), 3, msgRunning)
	expectState(t, c, c.client(nil, nil), 3, msgRunning)
	for _, in := range []*coordinator{a, c} {
		if got := fetchRoot(t, in, in.client(nil, nil)); !bytes.Equal(got.Raw, root.Raw) {
			t.Fatal("an instance does not serve the genuine root after the genuine state is back")
		}
	}
	if !strings.Contains(c.Logs(), "its quote shows the same enclave") {
		t.Fatalf("the new instance did not join through the genuine one:\n%s", c.Logs())
	}
}
