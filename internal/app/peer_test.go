package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/gramine/graminetest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/peer"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

const peerTestManifest = `{"Packages":{"p":{"Debug":true}},"Marbles":{"m":{"Package":"p"}}}`

// sgxWorld is one synthetic SGX platform (DCAP PKI, collateral valid now)
// and the Coordinator's enclave, shared by the instances of a test; each
// instance is another CPU (its own Gramine sealing keys).
type sgxWorld struct {
	pl             *dcaptest.Platform
	enclave        dcaptest.Enclave
	collateralFile string
	rootFile       string
	verifier       *dcap.Verifier
	endpoints      []string
	prefix         string
}

func newSGXWorld(t *testing.T, cluster *etcdtest.Cluster) *sgxWorld {
	t.Helper()
	p := dcaptest.NewPKI(t)
	pl := p.NewPlatform(t, dcaptest.DefaultExtension())
	now := time.Now()
	col := pl.Collateral(t, dcaptest.CollateralOptions{IssueDate: now.Add(-24 * time.Hour), NextUpdate: now.Add(30 * 24 * time.Hour)})
	dir := t.TempDir()
	w := &sgxWorld{pl: pl, enclave: dcaptest.Enclave{ISVProdID: 7, ISVSVN: 4},
		collateralFile: filepath.Join(dir, "collateral.json"), rootFile: filepath.Join(dir, "root.pem"),
		verifier:  &dcap.Verifier{Collateral: collateral.Static{Collateral: col}, RootCA: p.Root},
		endpoints: cluster.Endpoints(), prefix: "/peer-" + rand.Text()[:8] + "/"}
	copy(w.enclave.MRENCLAVE[:], "coordinator enclave")
	copy(w.enclave.MRSIGNER[:], "coordinator signer")
	if err := os.WriteFile(w.collateralFile, dcaptest.QVLJSON(t, col), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(w.rootFile, dcaptest.PEM(p.Root), 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

// quoteAs quotes rd as enclave e on the platform.
func (w *sgxWorld) quoteAs(t testing.TB, e dcaptest.Enclave, rd [64]byte) []byte {
	e.ReportData = rd
	return w.pl.Quote(t, dcaptest.QuoteOptions{Enclave: e})
}

// instance is one Coordinator (the App) running on its own CPU.
type instance struct {
	a    *App
	logs *logBuffer
	stop func()
}

// start runs an App under the Gramine fake on a new CPU of the world,
// with a peer key server.
func (w *sgxWorld) start(t *testing.T) *instance {
	t.Helper()
	dev := graminetest.NewDevice(t, func(rd [64]byte) []byte { return w.quoteAs(t, w.enclave, rd) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peerAddr := ln.Addr().String()
	ln.Close()
	cfg := testConfig(t, map[string]string{
		"QUARRY_ATTESTATION": "gramine", "QUARRY_GRAMINE_ATTESTATION_DIR": dev.Dir,
		"QUARRY_COLLATERAL_FILE": w.collateralFile, "QUARRY_SGX_ROOT_CA": w.rootFile,
		"QUARRY_STORE": "etcd", "QUARRY_ETCD_ENDPOINTS": strings.Join(w.endpoints, ","), "QUARRY_ETCD_PREFIX": w.prefix,
		"QUARRY_PEER_ADDR": peerAddr,
	})
	in := &instance{logs: &logBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	in.a, err = New(ctx, cfg, slog.New(slog.NewJSONHandler(in.logs, nil)))
	if err != nil {
		cancel()
		t.Fatalf("start: %v\n%s", err, in.logs.buf.String())
	}
	done := make(chan error, 1)
	go func() { done <- in.a.Run(ctx) }()
	in.logs.addr(t, "peer key server listening")
	in.stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(in.stop)
	return in
}

func (in *instance) log() string {
	in.logs.mu.Lock()
	defer in.logs.mu.Unlock()
	return in.logs.buf.String()
}

// waitStatus waits until the instance's Core is in state s.
func waitStatus(t *testing.T, in *instance, s core.State, what string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if in.a.core.Status() == s {
			return
		}
	}
	t.Fatalf("%s: state %d, want %d\n%s", what, in.a.core.Status(), s, in.log())
}

// rootOf is the root certificate an instance serves (its Client API's
// TLS certificate).
func rootOf(in *instance) []byte { return in.a.core.TLSCertificate().Leaf.Raw }

// attacker can write etcd under the prefix and run servers: it made a
// state of its own (the same manifest, so the same fingerprint, but its
// own root and secrets) under its own data key, and runs peer key servers
// that hand that key out.
type attacker struct {
	blob, keyFile []byte
	core          *core.Core
	cli           *etcdstore.Client
}

func (w *sgxWorld) newAttacker(t *testing.T) *attacker {
	t.Helper()
	// Its own Coordinator on a prefix of its own makes a well-formed
	// state and key file (key record under its data key).
	cli := connectEtcd(t, w.endpoints, "/attacker-"+rand.Text()[:8]+"/")
	data, key := storesOf(t, cli)
	var id seal.InstanceID
	rand.Read(id[:])
	c, err := core.New(t.Context(), core.Options{Data: data, Key: key, KeySealer: seal.SimulationKeySealer{}, InstanceID: &id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetManifest(t.Context(), []byte(peerTestManifest)); err != nil {
		t.Fatal(err)
	}
	at := &attacker{core: c, cli: connectEtcd(t, w.endpoints, w.prefix)}
	at.blob, _, at.keyFile, _, err = data.LoadPair(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return at
}

func connectEtcd(t *testing.T, endpoints []string, prefix string) *etcdstore.Client {
	t.Helper()
	cli, err := etcdstore.Connect(t.Context(), etcdstore.Options{Endpoints: endpoints, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func storesOf(t *testing.T, cli *etcdstore.Client) (*etcdstore.Store, *etcdstore.Store) {
	t.Helper()
	data, err := cli.Store(SealedDataFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := cli.Store(SealedKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return data, key
}

// replace writes blob and key file over whatever the prefix holds.
func replace(t *testing.T, cli *etcdstore.Client, blob, keyFile []byte) {
	t.Helper()
	data, key := storesOf(t, cli)
	_, drev, _, krev, err := data.LoadPair(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := data.SavePair(t.Context(), blob, drev, key, keyFile, krev); err != nil {
		t.Fatal(err)
	}
}

// register adds a members/ entry like the genuine ones (so that new
// instances start beside it) but with the impostor's peer address.
func (at *attacker) register(t *testing.T, w *sgxWorld, peerAddr string) {
	t.Helper()
	members, err := at.cli.Members(t.Context())
	if err != nil || len(members) == 0 {
		t.Fatalf("members: %d, %v", len(members), err)
	}
	var m identity
	if err := json.Unmarshal(members[0], &m); err != nil {
		t.Fatal(err)
	}
	m.Instance, m.PeerAddr = hex.EncodeToString([]byte(rand.Text()[:16])), peerAddr
	raw, _ := json.Marshal(m)
	reg := connectEtcd(t, w.endpoints, w.prefix)
	if _, err := reg.Join(t.Context(), raw, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// serveImpostor runs s (the real peer key server) on loopback.
func serveImpostor(t *testing.T, s *peer.Server) string {
	t.Helper()
	cert, err := peer.NewCertificate()
	if err != nil {
		t.Fatal(err)
	}
	s.Certificate = cert
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(ln) }()
	t.Cleanup(func() { ln.Close(); s.Close(); <-done })
	return ln.Addr().String()
}

type issuerFunc func(context.Context, [64]byte) ([]byte, error)

func (f issuerFunc) Issue(ctx context.Context, rd [64]byte) ([]byte, error) { return f(ctx, rd) }

// TestPeerJoinImpostor: someone who can write etcd plants a state and key
// file under a data key of its own choosing (the same manifest, so the
// same fingerprint) and registers members/ entries pointing at its own
// peer key servers: one hands the key to anyone without a quote, one
// quotes as an enclave of another signer on a genuine CPU. A new instance
// refuses both and starts in recovery mode saying why; the running
// instances, following the change, do not adopt the planted state either.
// A genuine join works before, and after the genuine state is back.
func TestPeerJoinImpostor(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	w := newSGXWorld(t, cluster)

	a := w.start(t)
	if _, err := a.a.core.SetManifest(t.Context(), []byte(peerTestManifest)); err != nil {
		t.Fatal(err)
	}
	genuineRoot := rootOf(a)
	b := w.start(t) // another CPU: joins through a, both quoting
	waitStatus(t, b, core.StateAcceptingMarbles, "b joining through a")
	if !strings.Contains(b.log(), "its quote shows the same enclave") || string(rootOf(b)) != string(genuineRoot) {
		t.Fatalf("b did not join through a's verified quote:\n%s", b.log())
	}
	data, key := storesOf(t, connectEtcd(t, w.endpoints, w.prefix))
	genuineBlob, _, genuineKey, _, err := data.LoadPair(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}

	at := w.newAttacker(t)
	attackerRoot := at.core.TLSCertificate().Leaf.Raw
	// Impostor 1: the real server without an enclave, trusting anyone.
	at.register(t, w, serveImpostor(t, &peer.Server{Keys: at.core, InsecureTrust: true}))
	// Impostor 2: an enclave of another signer on a genuine CPU; it
	// accepts the joiner (its Self copies the victim's identity) and
	// quotes itself, correctly bound to the session.
	other := w.enclave
	copy(other.MRSIGNER[:], "attacker signer")
	victim, err := sgxquote.Parse(w.quoteAs(t, w.enclave, [64]byte{}))
	if err != nil {
		t.Fatal(err)
	}
	at.register(t, w, serveImpostor(t, &peer.Server{Keys: at.core, Verifier: w.verifier, Self: &victim.Body,
		Issuer: issuerFunc(func(_ context.Context, rd [64]byte) ([]byte, error) { return w.quoteAs(t, other, rd), nil })}))

	replace(t, at.cli, at.blob, at.keyFile)

	// The running instances follow the change: they cannot open the
	// planted entries, and refuse the impostors' key.
	for name, in := range map[string]*instance{"a": a, "b": b} {
		waitStatus(t, in, core.StateRecovery, name+" following the planted state")
		if string(rootOf(in)) == string(attackerRoot) {
			t.Fatalf("%s serves the attacker's root", name)
		}
	}
	// A new instance refuses the impostors and says why.
	c := w.start(t)
	if c.a.core.Status() != core.StateRecovery || string(rootOf(c)) == string(attackerRoot) {
		t.Fatalf("a new instance adopted the planted state: state %d\n%s", c.a.core.Status(), c.log())
	}
	for _, want := range []string{"no running instance gave the data key", "the peer sent the key without a quote", "the peer is not the same enclave"} {
		if !strings.Contains(c.log(), want) {
			t.Errorf("the new instance's log does not say %q:\n%s", want, c.log())
		}
	}

	// The genuine state back: a and b open it with their own entries, and
	// c (no entry of its own) joins through a genuine peer.
	replace(t, at.cli, genuineBlob, genuineKey)
	for name, in := range map[string]*instance{"a": a, "b": b, "c": c} {
		waitStatus(t, in, core.StateAcceptingMarbles, name+" following the genuine state back")
		if string(rootOf(in)) != string(genuineRoot) {
			t.Fatalf("%s does not serve the genuine root", name)
		}
	}
	if !strings.Contains(c.log(), "its quote shows the same enclave") {
		t.Fatalf("c did not join through a genuine peer:\n%s", c.log())
	}
}
