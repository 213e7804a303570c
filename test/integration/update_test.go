package integration

import (
	"bytes"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

type updateData struct {
	MissingAcknowledgments int               `json:"missingAcknowledgments"`
	MissingUsers           []string          `json:"missingUsers"`
	RecoverySecrets        map[string][]byte `json:"recoverySecrets"`
	Message                string            `json:"message"`
	Manifest               []byte            `json:"manifest"`
}

// updateSetup runs a coordinator whose manifest has the admins alice, bob
// and the extra users given, with UpdateThreshold threshold.
type updateSetup struct {
	c       *coordinator
	f       *fixture
	raw     []byte
	clients map[string]*http.Client
}

func newUpdateSetup(t *testing.T, threshold int, extra ...string) *updateSetup {
	t.Helper()
	c := startCoordinator(t, "", "EDG_COORDINATOR_DNS_NAMES=localhost,10.9.8.7")
	f := newFixture(t)
	for _, name := range extra {
		role := "admin"
		if r, ok := strings.CutPrefix(name, "reader:"); ok {
			name, role = r, "reader"
		}
		cert, pemText := newUserCert(t, name)
		f.users[name] = userCred{pem: pemText, cert: cert}
		f.set("Users."+name, map[string]any{"Certificate": pemText, "Roles": []string{role}})
	}
	f.set("Config.UpdateThreshold", threshold)
	raw := f.bytes(t)
	expect(t, setManifest(t, c, c.client(nil, nil), raw), http.StatusOK, "success")
	s := &updateSetup{c: c, f: f, raw: raw, clients: map[string]*http.Client{}}
	for name, u := range f.users {
		cert := u.cert
		s.clients[name] = c.client(nil, &cert)
	}
	return s
}

func (s *updateSetup) post(t *testing.T, user, path string, raw []byte) response {
	t.Helper()
	return do(t, s.clients[user], http.MethodPost, s.c.url(path), map[string][]byte{"manifest": raw})
}

func (s *updateSetup) currentManifest(t *testing.T) []byte {
	t.Helper()
	r := do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/manifest"), nil)
	expect(t, r, http.StatusOK, "success")
	var m manifestData
	decode(t, r, &m)
	return m.Manifest
}

func packageUpdate(svn int) []byte {
	b, _ := json.Marshal(map[string]any{"Packages": map[string]any{"backend": map[string]any{"SecurityVersion": svn}}})
	return b
}

func TestPackageUpdate(t *testing.T) {
	t.Parallel()
	s := newUpdateSetup(t, 0)
	interBefore, root := getChain(t, s.c, s.c.client(nil, nil))
	certBefore := getSecrets(t, s.c, s.clients["alice"], "cert")["cert"]

	for _, tc := range []struct {
		name   string
		user   string
		body   []byte
		status int
		want   string
	}{
		{"raise", "alice", packageUpdate(3), http.StatusOK, ""},
		{"keep", "alice", packageUpdate(3), http.StatusOK, ""},
		{"lower", "alice", packageUpdate(2), http.StatusBadRequest, "downgrade"},
		{"unknown package", "alice", []byte(`{"Packages":{"nope":{"SecurityVersion":5}}}`), http.StatusNotFound, "nope"},
		{"without permission", "bob", packageUpdate(4), http.StatusForbidden, "bob"},
		{"unupdatable field", "alice", []byte(`{"Packages":{"backend":{"SecurityVersion":5,"SignerID":"` + hexB + `"}}}`), http.StatusBadRequest, "unupdatable"},
		{"no SecurityVersion", "alice", []byte(`{"Packages":{"backend":{}}}`), http.StatusBadRequest, "SecurityVersion"},
		{"not JSON", "alice", []byte(`nope`), http.StatusBadRequest, "unmarshaling manifest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := s.post(t, tc.user, "/api/v2/update", tc.body)
			if tc.status == http.StatusOK {
				expect(t, r, http.StatusOK, "success")
				var d updateData
				decode(t, r, &d)
				if d.MissingAcknowledgments != 0 || d.MissingUsers != nil || d.RecoverySecrets != nil {
					t.Errorf("package update response %s", r.Data)
				}
				return
			}
			expect(t, r, tc.status, "fail")
			if !strings.Contains(r.Message, tc.want) {
				t.Errorf("message %q lacks %q", r.Message, tc.want)
			}
		})
	}
	// No certificate.
	expect(t, do(t, s.c.client(nil, nil), http.MethodPost, s.c.url("/api/v2/update"), map[string][]byte{"manifest": packageUpdate(9)}), http.StatusUnauthorized, "fail")

	// The manifest bytes, fingerprint and signature are unchanged.
	checkManifest(t, s.c, s.c.client(root, nil), root, s.raw)
	// The intermediate is new, the root is not, every SAN is kept (docs/design/decisions.md#d8).
	interAfter, rootAfter := getChain(t, s.c, s.c.client(nil, nil))
	if !rootAfter.Equal(root) || interAfter.Equal(interBefore) {
		t.Fatal("package update must rotate the intermediate and keep the root")
	}
	if fmt.Sprint(interAfter.DNSNames) != fmt.Sprint(interBefore.DNSNames) || fmt.Sprint(interAfter.IPAddresses) != fmt.Sprint(interBefore.IPAddresses) {
		t.Fatalf("SANs changed: %v %v → %v %v", interBefore.DNSNames, interBefore.IPAddresses, interAfter.DNSNames, interAfter.IPAddresses)
	}
	if !strings.Contains(fmt.Sprint(interAfter.IPAddresses), "10.9.8.7") {
		t.Fatalf("IP SAN from EDG_COORDINATOR_DNS_NAMES dropped: %v", interAfter.IPAddresses)
	}
	// Shared certificates are re-issued under the new intermediate with the
	// same expiry.
	certAfter := getSecrets(t, s.c, s.clients["alice"], "cert")["cert"]
	before, _ := x509.ParseCertificate(certBefore.Cert)
	after, _ := x509.ParseCertificate(certAfter.Cert)
	if after.SerialNumber.Cmp(before.SerialNumber) == 0 || !after.NotAfter.Equal(before.NotAfter) {
		t.Fatalf("re-issued certificate: serial same %v, NotAfter %v vs %v", after.SerialNumber.Cmp(before.SerialNumber) == 0, before.NotAfter, after.NotAfter)
	}
	if err := after.CheckSignatureFrom(interAfter); err != nil {
		t.Fatalf("re-issued certificate is not signed by the new intermediate: %v", err)
	}
	// One log entry per applied package change, with the new version.
	r := do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/update"), nil)
	var d struct {
		UpdateLog []string `json:"updateLog"`
	}
	decode(t, r, &d)
	var svnEntries []map[string]any
	for _, line := range d.UpdateLog {
		var e map[string]any
		json.Unmarshal([]byte(line), &e)
		if e["update"] == "SecurityVersion increased" {
			svnEntries = append(svnEntries, e)
		}
	}
	if len(svnEntries) != 2 || svnEntries[0]["user"] != "alice" || svnEntries[0]["package"] != "backend" || svnEntries[0]["new version"] != float64(3) {
		t.Fatalf("log entries %v", svnEntries)
	}
	// The update survives a restart.
	s.c.restart()
	r = s.post(t, "alice", "/api/v2/update", packageUpdate(2))
	expect(t, r, http.StatusBadRequest, "fail")
}

// newManifest returns the current fixture changed into a valid new manifest.
func (s *updateSetup) newManifest(t *testing.T, change func(f *fixture)) []byte {
	t.Helper()
	var tree map[string]any
	json.Unmarshal(s.raw, &tree)
	f := &fixture{tree: tree, users: s.f.users}
	f.set("Packages.extra", map[string]any{"Debug": true})
	if change != nil {
		change(f)
	}
	return f.bytes(t)
}

func TestTwoUserManifestUpdate(t *testing.T) {
	t.Parallel()
	s := newUpdateSetup(t, 0)
	_, root := getChain(t, s.c, s.c.client(nil, nil))
	next := s.newManifest(t, nil)

	expect(t, do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/update-manifest"), nil), http.StatusNotFound, "fail")

	r := s.post(t, "alice", "/api/v2/update", next)
	expect(t, r, http.StatusOK, "success")
	var d updateData
	decode(t, r, &d)
	if d.MissingAcknowledgments != 1 || fmt.Sprint(d.MissingUsers) != "[bob]" {
		t.Fatalf("initiation: %s", r.Data)
	}
	// The pending update is visible, and survives a SIGKILL.
	s.c.restart()
	r = do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/update-manifest"), nil)
	expect(t, r, http.StatusOK, "success")
	decode(t, r, &d)
	if !bytes.Equal(d.Manifest, next) || fmt.Sprint(d.MissingUsers) != "[bob]" || d.Message != "1 user still needs to acknowledge the update manifest" {
		t.Fatalf("pending update %s", r.Data)
	}
	// Another update while one is pending: 409 (package updates too).
	expect(t, s.post(t, "bob", "/api/v2/update", next), http.StatusConflict, "fail")
	expect(t, s.post(t, "alice", "/api/v2/update", packageUpdate(5)), http.StatusConflict, "fail")
	// Acknowledging different bytes: 400; a second ack by alice changes nothing.
	expect(t, s.post(t, "bob", "/api/v2/update-manifest", append(bytes.Clone(next), ' ')), http.StatusBadRequest, "fail")
	r = s.post(t, "alice", "/api/v2/update-manifest", next)
	expect(t, r, http.StatusOK, "success")
	decode(t, r, &d)
	if d.MissingAcknowledgments != 1 || !strings.Contains(d.Message, "already acknowledged") {
		t.Fatalf("repeated acknowledgement %s", r.Data)
	}
	if !bytes.Equal(s.currentManifest(t), s.raw) {
		t.Fatal("manifest changed before all acknowledgements")
	}
	// Bob's acknowledgement applies it.
	r = s.post(t, "bob", "/api/v2/update-manifest", next)
	expect(t, r, http.StatusOK, "success")
	decode(t, r, &d)
	if d.MissingAcknowledgments != 0 || d.Message != "All users have acknowledged the update manifest. Update successfully applied" || d.RecoverySecrets != nil {
		t.Fatalf("final acknowledgement %s", r.Data)
	}
	checkManifest(t, s.c, s.c.client(root, nil), root, next)
	expect(t, do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/update-manifest"), nil), http.StatusNotFound, "fail")
	s.c.restart()
	checkManifest(t, s.c, s.c.client(root, nil), root, next)
	var updates []string
	for _, e := range getLog(t, s.c, s.c.client(nil, nil)) {
		updates = append(updates, e.Update+"/"+e.User)
	}
	want := "[Initial manifest set/ Complete Manifest update initiated by user. Waiting for acknowledgments to apply the update/alice Complete Manifest update acknowledged by user/bob Complete Manifest updated/]"
	if fmt.Sprint(updates) != want {
		t.Fatalf("log %v\nwant %s", updates, want)
	}
}

func TestThresholdTwoOfThree(t *testing.T) {
	t.Parallel()
	s := newUpdateSetup(t, 2, "carol", "reader:dave")
	next := s.newManifest(t, nil)
	r := s.post(t, "alice", "/api/v2/update", next)
	expect(t, r, http.StatusOK, "success")
	var d updateData
	decode(t, r, &d)
	if d.MissingAcknowledgments != 1 || fmt.Sprint(d.MissingUsers) != "[bob carol]" {
		t.Fatalf("initiation: %s", r.Data)
	}
	// A manifest user without UpdateManifest may neither acknowledge nor cancel.
	expect(t, s.post(t, "dave", "/api/v2/update-manifest", next), http.StatusForbidden, "fail")
	expect(t, do(t, s.clients["dave"], http.MethodPost, s.c.url("/api/v2/update-cancel"), nil), http.StatusForbidden, "fail")
	r = s.post(t, "carol", "/api/v2/update-manifest", next)
	expect(t, r, http.StatusOK, "success")
	decode(t, r, &d)
	if d.MissingAcknowledgments != 0 {
		t.Fatalf("carol's acknowledgement did not apply: %s", r.Data)
	}
	if !bytes.Equal(s.currentManifest(t), next) {
		t.Fatal("not applied")
	}
}

func TestCancelAndNothingPending(t *testing.T) {
	t.Parallel()
	s := newUpdateSetup(t, 0)
	next := s.newManifest(t, nil)
	for _, path := range []string{"/api/v2/update-manifest", "/api/v2/update-cancel"} {
		expect(t, s.post(t, "bob", path, next), http.StatusNotFound, "fail")
	}
	expect(t, s.post(t, "alice", "/api/v2/update", next), http.StatusOK, "success")
	// A user without UpdateManifest can neither cancel nor acknowledge.
	stranger, _ := newUserCert(t, "eve")
	expect(t, do(t, s.c.client(nil, &stranger), http.MethodPost, s.c.url("/api/v2/update-cancel"), nil), http.StatusUnauthorized, "fail")
	r := do(t, s.clients["bob"], http.MethodPost, s.c.url("/api/v2/update-cancel"), nil)
	expect(t, r, http.StatusOK, "success")
	var d updateData
	decode(t, r, &d)
	if d.Message != "Update successfully cancelled" {
		t.Fatalf("cancel %s", r.Data)
	}
	expect(t, s.post(t, "bob", "/api/v2/update-manifest", next), http.StatusNotFound, "fail")
	if !bytes.Equal(s.currentManifest(t), s.raw) {
		t.Fatal("a cancelled update changed the manifest")
	}
	// A new update can start after the cancel.
	expect(t, s.post(t, "alice", "/api/v2/update", next), http.StatusOK, "success")
	log := getLog(t, s.c, s.c.client(nil, nil))
	if log[2].Update != "Complete Manifest update cancelled by user" || log[2].User != "bob" {
		t.Fatalf("cancel log entry %+v", log[2])
	}
}

func TestUpdateWithoutPermissionAndSingleUpdater(t *testing.T) {
	t.Parallel()
	s := newUpdateSetup(t, 1, "reader:carol")
	next := s.newManifest(t, nil)
	// A user without UpdateManifest may not start a full update.
	expect(t, s.post(t, "carol", "/api/v2/update", next), http.StatusForbidden, "fail")
	r := s.post(t, "alice", "/api/v2/update", next)
	expect(t, r, http.StatusOK, "success")
	var d updateData
	decode(t, r, &d)
	if d.MissingAcknowledgments != 0 || !bytes.Equal(s.currentManifest(t), next) {
		t.Fatalf("threshold 1: the initiator alone must apply the update: %s", r.Data)
	}
	// Invalid full manifest: 400 and nothing pending.
	bad := s.newManifest(t, func(f *fixture) { f.set("Marbles.frontend.Package", "nope") })
	expect(t, s.post(t, "alice", "/api/v2/update", bad), http.StatusBadRequest, "fail")
	expect(t, do(t, s.c.client(nil, nil), http.MethodGet, s.c.url("/api/v2/update-manifest"), nil), http.StatusNotFound, "fail")
}

func TestUpdateChangingRecoveryKeys(t *testing.T) {
	t.Parallel()
	s := newUpdateSetup(t, 0)
	_, root := getChain(t, s.c, s.c.client(nil, nil))
	keys := recoveryKeys(t, 2)
	next := s.newManifest(t, func(f *fixture) {
		f.set("RecoveryKeys", map[string]any{"new1": publicKeyPEM(t, keys[0]), "new2": publicKeyPEM(t, keys[1])})
	})
	expect(t, s.post(t, "alice", "/api/v2/update", next), http.StatusOK, "success")
	r := s.post(t, "bob", "/api/v2/update-manifest", next)
	expect(t, r, http.StatusOK, "success")
	var d updateData
	decode(t, r, &d)
	if len(d.RecoverySecrets) != 2 {
		t.Fatalf("recoverySecrets %s", r.Data)
	}
	// The new secrets decrypt with the new keys and recover the state.
	plain := map[string][]byte{}
	for i, name := range []string{"new1", "new2"} {
		p, err := rsa.DecryptOAEP(sha256.New(), nil, keys[i], d.RecoverySecrets[name], nil)
		if err != nil {
			t.Fatalf("decrypting %s: %v", name, err)
		}
		plain[name] = p
	}
	s.c.kill()
	os.Remove(filepath.Join(s.c.sealDir, "sealed_key"))
	s.c.start()
	expectState(t, s.c, s.c.client(nil, nil), 1, msgRecovery)
	for i, name := range []string{"new1", "new2"} {
		r := postRecover(t, s.c, plain[name], sign(t, keys[i], plain[name]))
		expect(t, r, http.StatusOK, "success")
	}
	expectState(t, s.c, s.c.client(nil, nil), 3, msgRunning)
	checkManifest(t, s.c, s.c.client(root, nil), root, next)
}

func TestConcurrentAcknowledgements(t *testing.T) {
	t.Parallel()
	s := newUpdateSetup(t, 0, "carol", "dave")
	next := s.newManifest(t, nil)
	expect(t, s.post(t, "alice", "/api/v2/update", next), http.StatusOK, "success")
	var wg sync.WaitGroup
	results := make(chan updateData, 3)
	for _, user := range []string{"bob", "carol", "dave"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string][]byte{"manifest": next})
			resp, err := s.clients[user].Post(s.c.url("/api/v2/update-manifest"), "application/json", bytes.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var env struct {
				Data updateData `json:"data"`
			}
			json.NewDecoder(resp.Body).Decode(&env)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s: %s", user, resp.Status)
			}
			results <- env.Data
		}()
	}
	wg.Wait()
	close(results)
	seen := map[int]int{}
	for d := range results {
		seen[d.MissingAcknowledgments]++
	}
	if seen[0] != 1 || seen[1] != 1 || seen[2] != 1 {
		t.Fatalf("acknowledgements were not serialised: %v", seen)
	}
	if !bytes.Equal(s.currentManifest(t), next) {
		t.Fatal("not applied")
	}
	if strings.Contains(s.c.Logs(), "DATA RACE") {
		t.Fatal("data race in the coordinator")
	}
}
