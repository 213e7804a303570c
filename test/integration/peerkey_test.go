package integration

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
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

// TestPeerKeyTransfer (issue 15): two Coordinator processes under the
// Gramine fake with different sealing keys (two CPUs) on one etcd. The
// second cannot open the first's key entry, obtains the data key from the
// first after it verified the second's quote, and serves the state; with
// the first SIGKILLed it still serves and restarts alone (its own entry).
// A third CPU with no live peer goes to recovery mode; recovery on it
// restores the state, which the second CPU, started again, opens.
func TestPeerKeyTransfer(t *testing.T) {
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
