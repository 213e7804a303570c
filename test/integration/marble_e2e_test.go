package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/marble"
)

// These tests run whole Marbles: the real quarry-premain activates at the
// real coordinator and execs the real testapp, which reports what it got
// (its files, environment and command line) or talks mutual TLS with
// another Marble. The gRPC-level checks of the Marble API are in
// marbleapi_*_test.go; these show that the pieces fit end to end.

// e2eAppArgv is the command line of the Marble "app" of the simulation
// tests: testapp reports these variables and files.
var e2eAppArgv = []string{"testapp",
	"-env", "GREETING,SHARED,MINE,EDG_MARBLE_TYPE,MARBLE_TTLS_CONFIG,MARBLE_PREDEFINED_*",
	"-out", "report.json",
	"conf/shared.hex", "conf/keys/mine.hex", "greeting.txt"}

// newE2ESetup starts a simulation coordinator with a manifest of the given
// Marbles (all of package "pkg") and TLS tags, the secrets "shared" (a
// shared 256-bit key) and "mine" (a per-Marble 256-bit key), the user
// "admin" who may read "shared", and monotonic counters enabled.
func newE2ESetup(t *testing.T, marbles, tlsTags map[string]any) *marbleSetup {
	t.Helper()
	c := startCoordinator(t, "")
	hc := c.client(nil, nil)
	root := fetchRoot(t, c, hc)
	admin, adminPEM := newUserCert(t, "admin")
	doc := map[string]any{
		"Packages": map[string]any{"pkg": map[string]any{"SignerID": hexA, "ProductID": 1, "SecurityVersion": 1}},
		"Marbles":  marbles,
		"Secrets": map[string]any{
			"shared": map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true},
			"mine":   map[string]any{"Type": "symmetric-key", "Size": 256},
		},
		"Users":  map[string]any{"admin": map[string]any{"Certificate": adminPEM, "Roles": []string{"reader"}}},
		"Roles":  map[string]any{"reader": map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"shared"}, "Actions": []string{"ReadSecret"}}},
		"Config": map[string]any{"FeatureGates": []string{"MonotonicCounter"}},
	}
	if tlsTags != nil {
		doc["TLS"] = tlsTags
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, setManifest(t, c, hc, raw), http.StatusOK, "success")
	return &marbleSetup{c: c, root: root, admin: admin}
}

// readUUIDFile returns the UUID a premain wrote.
func readUUIDFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the premain's UUID file: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// checkAppReport checks what the Marble "app" got: its command line as the
// manifest says, the rendered files (0600, in 0700 directories made for
// them) and environment, and a Marble certificate for its UUID and type.
// It returns its identity.
func checkAppReport(t *testing.T, r *testappReport, res marbleResult, uuid string) activated {
	t.Helper()
	if !slices.Equal(r.Argv, e2eAppArgv) {
		t.Errorf("argv %q, want the manifest's %q", r.Argv, e2eAppArgv)
	}
	if want, _ := filepath.EvalSymlinks(res.dir); r.Cwd != want && r.Cwd != res.dir {
		t.Errorf("testapp ran in %s, want the premain's directory %s", r.Cwd, res.dir)
	}
	for _, name := range []string{"conf/shared.hex", "conf/keys/mine.hex", "greeting.txt"} {
		if f := r.Files[name]; f.Error != "" || f.Mode != "0600" {
			t.Errorf("file %s: mode %q error %q, want 0600", name, f.Mode, f.Error)
		}
	}
	for _, dir := range []string{"conf", "conf/keys"} {
		fi, err := os.Stat(filepath.Join(res.dir, dir))
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("directory %s: %v %v, want a directory with mode 0700", dir, fi.Mode(), err)
		}
	}
	if got := string(r.Files["greeting.txt"].Data); got != "hello file" {
		t.Errorf("greeting.txt = %q", got)
	}
	if got := r.env(t, "GREETING"); got != "hello env" {
		t.Errorf("GREETING = %q", got)
	}
	if got := r.env(t, "EDG_MARBLE_TYPE"); got != "app" {
		t.Errorf("the premain's own environment is not passed on: EDG_MARBLE_TYPE = %q", got)
	}
	if v := r.Env["MARBLE_TTLS_CONFIG"]; v != nil {
		t.Errorf("MARBLE_TTLS_CONFIG without TLS tags: %q", *v)
	}
	for file, env := range map[string]string{"conf/shared.hex": "SHARED", "conf/keys/mine.hex": "MINE"} {
		if got, want := string(r.Files[file].Data), r.env(t, env); got != want || len(got) != 64 {
			t.Errorf("%s = %q, %s = %q: want the same 256-bit key in hex", file, got, env, want)
		}
	}
	a := r.activated(t)
	if a.leaf.Subject.CommonName != uuid {
		t.Errorf("the Marble certificate's CN is %q, want the UUID %s of the UUID file", a.leaf.Subject.CommonName, uuid)
	}
	if typ, ok := marbleType(a.leaf); !ok || typ != "app" {
		t.Errorf("the Marble certificate's type is %q %v, want app", typ, ok)
	}
	if err := a.leaf.CheckSignatureFrom(a.marbleRoot); err != nil {
		t.Errorf("the Marble certificate is not issued by MARBLE_PREDEFINED_ROOT_CA: %v", err)
	}
	return a
}

// TestMarbleE2ESimulation: a Marble activates through quarry-premain at a
// simulation coordinator and testapp sees its Files (0600 in 0700
// directories), Env and Argv as the manifest renders them; the shared key
// it gets is the one an admin reads over GET /api/v2/secrets; its
// per-Marble key stays the same for its UUID file across SIGKILL and a
// restart, and another UUID file gets another one. With the certificate
// and key of MARBLE_PREDEFINED_* the Marble sets a monotonic counter, which
// survives the SIGKILL too and belongs to its UUID.
func TestMarbleE2ESimulation(t *testing.T) {
	t.Parallel()
	s := newE2ESetup(t, map[string]any{
		"app": map[string]any{"Package": "pkg", "Parameters": map[string]any{
			"Files": map[string]any{
				"conf/shared.hex":    "{{hex .Secrets.shared.Private}}",
				"conf/keys/mine.hex": "{{hex .Secrets.mine.Private}}",
				"greeting.txt":       "hello file",
			},
			"Env": map[string]any{
				"GREETING": "hello env",
				"SHARED":   "{{hex .Secrets.shared.Private}}",
				"MINE":     "{{hex .Secrets.mine.Private}}",
			},
			"Argv": e2eAppArgv,
		}},
	}, nil)
	ids := t.TempDir()
	uuidA, uuidB := filepath.Join(ids, "a"), filepath.Join(ids, "b")
	runA := marbleRun{typ: "app", uuidFile: uuidA}

	r1, res1 := runA.mustRun(t, s.c)
	idA := readUUIDFile(t, uuidA)
	a1 := checkAppReport(t, r1, res1, idA)
	shared := getSecrets(t, s.c, s.adminClient(), "shared")["shared"]
	if got, want := r1.env(t, "SHARED"), hex.EncodeToString(shared.Private); got != want {
		t.Errorf("the Marble's shared key %s is not the one the admin reads, %s", got, want)
	}
	mineA := r1.env(t, "MINE")
	if got := s.setCounter(t, &a1.tls, "c", 5); got != 0 {
		t.Fatalf("first counter value: previous %d, want 0", got)
	}

	s.c.restart() // SIGKILL

	r2, res2 := runA.mustRun(t, s.c)
	a2 := checkAppReport(t, r2, res2, idA)
	if got := r2.env(t, "MINE"); got != mineA {
		t.Errorf("the per-Marble key of UUID %s changed across SIGKILL and restart: %s, before %s", idA, got, mineA)
	}
	if got := r2.env(t, "SHARED"); got != r1.env(t, "SHARED") {
		t.Errorf("the shared key changed across the restart")
	}
	if a2.leaf.Equal(a1.leaf) {
		t.Error("a new activation got the same Marble certificate")
	}
	// The counter survived; the first activation's certificate still
	// identifies the Marble, and the new one reaches the same counter.
	if got := s.setCounter(t, &a1.tls, "c", 7); got != 5 {
		t.Fatalf("counter after SIGKILL and restart: previous %d, want 5", got)
	}
	if got := s.setCounter(t, &a2.tls, "c", 8); got != 7 {
		t.Fatalf("counter through the new activation of the same UUID: previous %d, want 7", got)
	}

	r3, res3 := marbleRun{typ: "app", uuidFile: uuidB}.mustRun(t, s.c)
	idB := readUUIDFile(t, uuidB)
	if idB == idA {
		t.Fatalf("two UUID files hold the same UUID %s", idA)
	}
	a3 := checkAppReport(t, r3, res3, idB)
	if got := r3.env(t, "MINE"); got == mineA {
		t.Errorf("another UUID got the same per-Marble key %s", got)
	}
	if got := r3.env(t, "SHARED"); got != r1.env(t, "SHARED") {
		t.Errorf("another UUID got another shared key")
	}
	if got := s.setCounter(t, &a3.tls, "c", 1); got != 0 {
		t.Fatalf("another UUID's counter: previous %d, want 0", got)
	}
}

// TestMarbleE2EMaxActivationsAcrossSIGKILL: with MaxActivations 2, two
// Marbles activate through the premain; the coordinator is killed with
// SIGKILL right after the second has run; after the restart the third is
// refused: the premain exits 1 with the Coordinator's message and testapp
// never runs.
func TestMarbleE2EMaxActivationsAcrossSIGKILL(t *testing.T) {
	t.Parallel()
	s := newE2ESetup(t, map[string]any{
		"limited": map[string]any{"Package": "pkg", "MaxActivations": 2,
			"Parameters": map[string]any{"Argv": []string{"testapp", "-out", "report.json"}}},
	}, nil)
	limited := marbleRun{typ: "limited"} // each run: a new UUID in its own directory
	limited.mustRun(t, s.c)
	limited.mustRun(t, s.c)
	s.c.kill()
	s.c.start()
	limited.mustBeRefused(t, s.c, "gRPC PermissionDenied",
		`marble verification failed: reached max activations count (2) for marble type "limited"`)
}

// TestMarbleE2EMutualTLS: two Marbles reach each other over mutual TLS
// with what the Coordinator handed out, once with MARBLE_PREDEFINED_* and
// once with MARBLE_TTLS_CONFIG from TLS tags: the server verifies the
// client's certificate and sees the client's UUID as CN, the client
// verifies the server's and sees the server's UUID.
func TestMarbleE2EMutualTLS(t *testing.T) {
	t.Parallel()
	// The manifest names the ports, so they are chosen before the servers
	// listen (and the clients retry until they do).
	ports := freeLoopbackPorts(t, 2)
	predefined, ttls := "127.0.0.1:"+ports[0], "127.0.0.1:"+ports[1]
	argv := func(args ...string) map[string]any {
		return map[string]any{"Argv": append([]string{"testapp", "-timeout", "60s"}, args...)}
	}
	s := newE2ESetup(t, map[string]any{
		"server": map[string]any{"Package": "pkg", "Parameters": argv("-serve", predefined)},
		"client": map[string]any{"Package": "pkg", "Parameters": argv("-connect", predefined, "-message", "hello server", "-out", "report.json")},
		"ttls-server": map[string]any{"Package": "pkg", "TLS": []string{"in"},
			"Parameters": argv("-serve", ttls, "-tls", "ttls", "-env", "MARBLE_TTLS_CONFIG")},
		"ttls-client": map[string]any{"Package": "pkg", "TLS": []string{"out"},
			"Parameters": argv("-connect", ttls, "-tls", "ttls", "-message", "hello ttls", "-out", "report.json")},
	}, map[string]any{
		"in":  map[string]any{"Incoming": []any{map[string]any{"Port": ports[1]}}},
		"out": map[string]any{"Outgoing": []any{map[string]any{"Addr": "127.0.0.1", "Port": ports[1]}}},
	})

	for _, tc := range []struct {
		name, server, client, addr, message string
	}{
		{"MARBLE_PREDEFINED", "server", "client", predefined, "hello server"},
		{"MARBLE_TTLS_CONFIG", "ttls-server", "ttls-client", ttls, "hello ttls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := marbleRun{typ: tc.server}.startServer(t, s.c)
			if srv.report.Listen != tc.addr {
				t.Fatalf("the server listens on %s, want %s", srv.report.Listen, tc.addr)
			}
			if tc.server == "ttls-server" {
				var cfg struct {
					TLS struct {
						Incoming map[string]struct {
							ClientAuth bool `json:"clientAuth"`
						}
					} `json:"tls"`
				}
				if err := json.Unmarshal([]byte(srv.report.env(t, "MARBLE_TTLS_CONFIG")), &cfg); err != nil {
					t.Fatal(err)
				}
				if e, ok := cfg.TLS.Incoming["*:"+ports[1]]; !ok || !e.ClientAuth {
					t.Fatalf("MARBLE_TTLS_CONFIG Incoming: %+v, want *:%s with clientAuth", cfg.TLS.Incoming, ports[1])
				}
			}
			cli, res := marbleRun{typ: tc.client}.mustRun(t, s.c)
			acc := srv.accepted(t)
			srv.wait(t)

			serverID := readUUIDFile(t, filepath.Join(srv.cmd.Dir, "uuid"))
			clientID := readUUIDFile(t, filepath.Join(res.dir, "uuid"))
			if acc.Accepted.ClientCN != clientID || !acc.Accepted.ClientVerified || acc.Accepted.Message != tc.message {
				t.Errorf("the server accepted %+v, want the verified client %s saying %q", *acc.Accepted, clientID, tc.message)
			}
			if cli.Connect == nil {
				t.Fatal("the client reports no connection")
			}
			if cli.Connect.ServerCN != serverID || cli.Connect.Reply.ServerCN != serverID {
				t.Errorf("the client reached %q (reply %q), want the server %s", cli.Connect.ServerCN, cli.Connect.Reply.ServerCN, serverID)
			}
			if cli.Connect.Reply.ClientCN != clientID || cli.Connect.Reply.Message != tc.message {
				t.Errorf("the server answered %+v, want the client %s and its message", cli.Connect.Reply, clientID)
			}
		})
	}
}

// e2eEnclave is the Marble's enclave in the attested tests.
func e2eEnclave() dcaptest.Enclave {
	e := dcaptest.Enclave{ISVProdID: 9, ISVSVN: 4}
	copy(e.MRENCLAVE[:], "quarry e2e marble enclave")
	copy(e.MRSIGNER[:], "quarry e2e marble signer")
	return e
}

// startAttestedCoordinator starts a coordinator with Gramine attestation
// (its own quotes from a fake device) that verifies quotes of a synthetic
// SGX platform whose TCB level has status, and sets a manifest for
// e2eEnclave: "app" (SignerID, ProductID 9, SecurityVersion 4,
// MaxActivations 2), "exact" (UniqueID, in upper case) and "lenient" (as
// "app", also accepting OutOfDate).
func startAttestedCoordinator(t *testing.T, status string) (*sgxPlatform, *coordinator) {
	t.Helper()
	s := newSGXPlatform(t, status, nil)
	dev := s.quoteDevice(t, s.enclave, true) // the coordinator's own quotes
	c := startCoordinator(t, "", append(s.env(),
		"QUARRY_ATTESTATION=gramine", "QUARRY_GRAMINE_ATTESTATION_DIR="+dev.Dir)...)
	e := e2eEnclave()
	signed := map[string]any{"SignerID": hex.EncodeToString(e.MRSIGNER[:]), "ProductID": 9, "SecurityVersion": 4, "Debug": false}
	lenient := map[string]any{"AcceptedTCBStatuses": []string{"OutOfDate"}}
	for k, v := range signed {
		lenient[k] = v
	}
	params := map[string]any{"Env": map[string]any{"GREETING": "attested"},
		"Argv": []string{"testapp", "-env", "GREETING,MARBLE_PREDEFINED_*", "-out", "report.json"}}
	doc := map[string]any{
		"Packages": map[string]any{
			"signed":  signed,
			"exact":   map[string]any{"UniqueID": strings.ToUpper(hex.EncodeToString(e.MRENCLAVE[:]))},
			"lenient": lenient,
		},
		"Marbles": map[string]any{
			"app":     map[string]any{"Package": "signed", "MaxActivations": 2, "Parameters": params},
			"exact":   map[string]any{"Package": "exact", "Parameters": params},
			"lenient": map[string]any{"Package": "lenient", "Parameters": params},
		},
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	expect(t, setManifest(t, c, c.client(nil, nil), raw), http.StatusOK, "success")
	return s, c
}

// checkAttestedReport checks an attested Marble's report: its Env and a
// Marble certificate for its UUID (in the run's directory) and type.
func checkAttestedReport(t *testing.T, r *testappReport, res marbleResult, typ string) {
	t.Helper()
	if got := r.env(t, "GREETING"); got != "attested" {
		t.Errorf("GREETING = %q", got)
	}
	a := r.activated(t)
	if id := readUUIDFile(t, filepath.Join(res.dir, "uuid")); a.leaf.Subject.CommonName != id {
		t.Errorf("the Marble certificate's CN is %q, want the UUID %s", a.leaf.Subject.CommonName, id)
	}
	if got, _ := marbleType(a.leaf); got != typ {
		t.Errorf("the Marble certificate's type is %q, want %q", got, typ)
	}
}

// issuerFunc is a marble.Issuer.
type issuerFunc func(ctx context.Context, reportData [64]byte) ([]byte, error)

func (f issuerFunc) Issue(ctx context.Context, rd [64]byte) ([]byte, error) { return f(ctx, rd) }

// TestMarbleE2EGramine: a coordinator with Gramine attestation verifies
// the DCAP quotes of Marbles started with quarry-premain in Gramine mode
// (a fake attestation device serving synthetic quotes): the package's
// enclave is accepted, by SignerID/ProductID/SecurityVersion and by
// UniqueID; every mismatch is refused end to end (the premain exits 1 with
// the Coordinator's message naming the cause, testapp never runs); and no
// refusal changes the state: the Marble type with MaxActivations 2 that
// activated once before them activates exactly once more afterwards.
func TestMarbleE2EGramine(t *testing.T) {
	t.Parallel()
	s, c := startAttestedCoordinator(t, "UpToDate")
	good := e2eEnclave()

	dev := s.quoteDevice(t, good, true)
	r, res := marbleRun{typ: "app", gramineDir: dev.Dir}.mustRun(t, c)
	checkAttestedReport(t, r, res, "app")
	r, res = marbleRun{typ: "exact", gramineDir: dev.Dir}.mustRun(t, c)
	checkAttestedReport(t, r, res, "exact")
	checkDevice(t, dev, 2)
	if !strings.Contains(c.Logs(), `"attested":true`) {
		t.Fatalf("the coordinator did not log an attested activation:\n%s", c.Logs())
	}

	t.Run("refused", func(t *testing.T) {
		with := func(change func(e *dcaptest.Enclave)) dcaptest.Enclave {
			e := good
			change(&e)
			return e
		}
		const invalid = "gRPC PermissionDenied: marble verification failed: invalid quote: "
		for _, tc := range []struct {
			name    string
			typ     string
			enclave dcaptest.Enclave
			want    string
		}{
			{"wrong MRENCLAVE", "exact", with(func(e *dcaptest.Enclave) { e.MRENCLAVE[0] ^= 1 }),
				invalid + "policy: MRENCLAVE does not match UniqueID"},
			{"wrong MRSIGNER", "app", with(func(e *dcaptest.Enclave) { e.MRSIGNER[0] ^= 1 }),
				invalid + "policy: MRSIGNER does not match SignerID"},
			{"wrong ProductID", "app", with(func(e *dcaptest.Enclave) { e.ISVProdID = 8 }),
				invalid + "policy: ISVPRODID does not match ProductID: enclave 8, package 9"},
			{"SVN too low", "app", with(func(e *dcaptest.Enclave) { e.ISVSVN = 3 }),
				invalid + "policy: ISVSVN below SecurityVersion: enclave 3, package 4"},
			{"debug enclave", "app", with(func(e *dcaptest.Enclave) { e.Debug = true }),
				invalid + "policy: debug attribute does not match the package: enclave debug=true, package Debug=false"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				dev := s.quoteDevice(t, tc.enclave, true)
				marbleRun{typ: tc.typ, gramineDir: dev.Dir}.mustBeRefused(t, c, tc.want)
				checkDevice(t, dev, 1)
			})
		}
		t.Run("quote of another SGX platform", func(t *testing.T) {
			t.Parallel()
			other := newSGXPlatform(t, "UpToDate", nil)
			dev := other.quoteDevice(t, good, true)
			marbleRun{typ: "app", gramineDir: dev.Dir}.mustBeRefused(t, c, invalid, "untrusted root CA")
		})
		t.Run("no quote", func(t *testing.T) {
			t.Parallel()
			// The premain in simulation sends an empty quote.
			marbleRun{typ: "app"}.mustBeRefused(t, c, invalid+"the quote is empty")
		})
		// A quote over another certificate cannot leave the premain: its
		// Gramine issuer checks that the quote carries the report data it
		// wrote, and fails before asking the Coordinator.
		t.Run("device quotes other report data", func(t *testing.T) {
			t.Parallel()
			dev := s.quoteDevice(t, good, false)
			res := marbleRun{typ: "app", gramineDir: dev.Dir}.mustBeRefused(t, c,
				"marble: obtaining a quote: gramine: the quote from", "carries other report data than was written")
			if strings.Contains(res.stderr, "gRPC") {
				t.Errorf("the Coordinator was asked: %s", res.stderr)
			}
		})
		// So the Coordinator's own check is shown with Quarry's Marble
		// runtime in process, its issuer relaying a valid quote of the
		// enclave that was made for another certificate.
		t.Run("quote over another certificate", func(t *testing.T) {
			t.Parallel()
			otherCert := newTestMarble(t).cert.Certificate[0]
			relay := issuerFunc(func(_ context.Context, _ [64]byte) ([]byte, error) {
				e := good
				sum := sha256.Sum256(otherCert)
				copy(e.ReportData[:], sum[:])
				return s.pl.Quote(t, dcaptest.QuoteOptions{Enclave: e}), nil
			})
			_, err := marble.Activate(context.Background(), marble.Options{
				MarbleType: "app", CoordinatorAddr: c.meshAddr, UUIDFile: filepath.Join(t.TempDir(), "uuid"),
				Issuer: relay, Attempts: 1,
			})
			var ce *marble.CoordinatorError
			if !errors.As(err, &ce) || ce.Code != codes.PermissionDenied ||
				!strings.HasPrefix(ce.Message, "marble verification failed: invalid quote: ") ||
				!strings.Contains(ce.Message, "the quote is not bound to the TLS client certificate") {
				t.Fatalf("relayed quote: %v, want PermissionDenied: the quote is not bound to the TLS client certificate", err)
			}
		})
	})

	// None of the refusals counted: "app" (MaxActivations 2, one used)
	// activates once more (a higher SVN is accepted), then no more.
	higher := good
	higher.ISVSVN = 5
	dev = s.quoteDevice(t, higher, true)
	r, res = marbleRun{typ: "app", gramineDir: dev.Dir}.mustRun(t, c)
	checkAttestedReport(t, r, res, "app")
	marbleRun{typ: "app", gramineDir: dev.Dir}.mustBeRefused(t, c,
		`gRPC PermissionDenied: marble verification failed: reached max activations count (2) for marble type "app"`)
	checkDevice(t, dev, 2)
}

// TestMarbleE2EGramineTCBStatus: on a platform whose TCB level is
// OutOfDate, a package with the default accepted statuses refuses the
// Marble end to end; a package that accepts OutOfDate lets the same
// enclave in.
func TestMarbleE2EGramineTCBStatus(t *testing.T) {
	t.Parallel()
	s, c := startAttestedCoordinator(t, "OutOfDate")
	dev := s.quoteDevice(t, e2eEnclave(), true)
	marbleRun{typ: "app", gramineDir: dev.Dir}.mustBeRefused(t, c,
		"gRPC PermissionDenied: marble verification failed: invalid quote: policy: TCB status not accepted: OutOfDate")
	r, res := marbleRun{typ: "lenient", gramineDir: dev.Dir}.mustRun(t, c)
	checkAttestedReport(t, r, res, "lenient")
	checkDevice(t, dev, 2)
}
