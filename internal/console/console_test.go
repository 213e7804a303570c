package console

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/core"
)

// fakeSource is a Coordinator in a chosen state with a real certificate
// chain and a log signed by the root's key.
type fakeSource struct {
	state      core.State
	raw        []byte
	chainPEM   []byte
	rootKey    *ecdsa.PrivateKey
	log        []string
	records    []logchain.Record // as served (tests may alter them)
	checkpoint logchain.Checkpoint
	pending    *core.PendingUpdate
	events     []core.ActivationEvent
	dropped    uint64
	accepted   int
	needed     int
	logErr     error // UpdateLogPage fails with it
	pendingErr error // PendingUpdate fails with it
}

func newFake(t testing.TB, state core.State) *fakeSource {
	t.Helper()
	rootKey, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rootTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Test Root"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 365 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, &rootKey.PublicKey, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	interKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	interTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "Test Intermediate"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(10 * 24 * time.Hour), IsCA: true, BasicConstraintsValid: true}
	root, _ := x509.ParseCertificate(rootDER)
	interDER, err := x509.CreateCertificate(rand.Reader, interTmpl, root, &interKey.PublicKey, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: interDER}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rootDER})...)
	f := &fakeSource{state: state, chainPEM: chain, rootKey: rootKey}
	f.setLog(t, []string{
		`{"time":"2026-01-02T03:04:05.000Z","update":"Initial manifest set"}`,
		`{"time":"2026-01-03T03:04:05.000Z","update":"Secret set","user":"alice","secret":"apikey","type":"plain"}`,
	})
	return f
}

func (f *fakeSource) setLog(t testing.TB, entries []string) {
	t.Helper()
	f.log = entries
	f.records = logchain.Chain(logchain.Head{}, entries)
	head := logchain.Head{}.Append(entries...)
	cp, err := logchain.Sign(rand.Reader, f.rootKey, head, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.checkpoint = cp
}

func (f *fakeSource) Status() core.State { return f.state }

func (f *fakeSource) Manifest() (core.ManifestResult, error) {
	if f.state != core.StateAcceptingMarbles {
		return core.ManifestResult{}, &core.WrongStateError{State: f.state, Op: "get the manifest"}
	}
	sum := sha256.Sum256(f.raw)
	return core.ManifestResult{Raw: f.raw, Fingerprint: hex.EncodeToString(sum[:])}, nil
}

func (f *fakeSource) Quote(context.Context, []byte) (core.QuoteResult, error) {
	return core.QuoteResult{ChainPEM: f.chainPEM}, nil
}

func (f *fakeSource) UpdateLogPage(_ context.Context, after, limit uint64) (core.LogPage, error) {
	if f.state != core.StateAcceptingMarbles {
		return core.LogPage{}, &core.WrongStateError{State: f.state, Op: "read the log"}
	}
	if f.logErr != nil {
		return core.LogPage{}, f.logErr
	}
	end := min(after+limit, uint64(len(f.records)))
	p := core.LogPage{Records: f.records[after:end], Checkpoint: f.checkpoint}
	if after > 0 {
		p.Prev = f.records[after-1].Hash
	}
	return p, nil
}

func (f *fakeSource) PendingUpdate(context.Context) (core.PendingUpdate, error) {
	if f.pendingErr != nil {
		return core.PendingUpdate{}, f.pendingErr
	}
	if f.pending == nil {
		return core.PendingUpdate{}, fmt.Errorf("%w: no update in progress", core.ErrNotFound)
	}
	return *f.pending, nil
}

func (f *fakeSource) ActivationEvents() ([]core.ActivationEvent, uint64) { return f.events, f.dropped }
func (f *fakeSource) RecoverySharesAccepted() (int, int)                 { return f.accepted, f.needed }

// The secret material a manifest may carry: it must never be shown.
var (
	fixedPrivate = []byte("PRIVATE-BYTES-never-shown-0123456789")
	fixedPublic  = []byte("PUBLIC-BYTES-of-a-fixed-secret")
)

// testManifest has n Marble types over two packages, templates using
// secrets, two users with roles and two recovery keys.
func testManifest(t testing.TB, n int) []byte {
	t.Helper()
	_, userPEM := userCert(t, "Alice Admin")
	marbles := map[string]any{}
	for i := range n {
		marbles[fmt.Sprintf("svc-%04d", i)] = map[string]any{
			"Package":        []string{"backend", "frontend"}[i%2],
			"MaxActivations": i % 3,
			"Parameters": map[string]any{
				"Files": map[string]string{"/tls/cert.pem": "{{ pem .Secrets.shared_cert.Cert }}"},
				"Env":   map[string]string{"API_KEY": "{{ raw .Secrets.apikey }}"},
				"Argv":  []string{"svc", "--key={{ hex .Secrets.symkey }}"},
			},
		}
	}
	m := map[string]any{
		"Packages": map[string]any{
			"backend":  map[string]any{"UniqueID": strings.Repeat("ab", 32), "Debug": false},
			"frontend": map[string]any{"SignerID": strings.Repeat("cd", 32), "ProductID": 3, "SecurityVersion": 2},
		},
		"Marbles": marbles,
		"Secrets": map[string]any{
			"shared_cert": map[string]any{"Type": "cert-ecdsa", "Size": 256, "Shared": true},
			"symkey":      map[string]any{"Type": "symmetric-key", "Size": 128},
			"apikey":      map[string]any{"Type": "plain", "UserDefined": true},
			"fixed":       map[string]any{"Type": "symmetric-key", "Size": 256, "Private": fixedPrivate, "Public": fixedPublic},
		},
		"Users": map[string]any{
			"alice": map[string]any{"Certificate": userPEM, "Roles": []string{"updater", "secretwriter"}},
			"bob":   map[string]any{"Certificate": userPEM, "Roles": []string{"secretwriter"}},
		},
		"Roles": map[string]any{
			"updater":      map[string]any{"ResourceType": "Manifest", "Actions": []string{"UpdateManifest"}},
			"secretwriter": map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"apikey"}, "Actions": []string{"WriteSecret"}},
		},
		"RecoveryKeys": map[string]string{"k1": "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----", "k2": "y"},
		"Config":       map[string]any{"RecoveryThreshold": 2},
	}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func userCert(t testing.TB, cn string) (*x509.Certificate, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

type got struct {
	code   int
	header http.Header
	body   string
}

func get(t testing.TB, h http.Handler, method, path string) got {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return got{code: rec.Code, header: rec.Result().Header, body: string(b)}
}

var pages = []string{"/console/", "/console/deployment", "/console/activity", "/console/history", "/console/recovery"}

func TestPagesInEveryState(t *testing.T) {
	for _, st := range []core.State{core.StateRecovery, core.StateAcceptingManifest, core.StateAcceptingMarbles} {
		f := newFake(t, st)
		f.raw = testManifest(t, 5)
		h := New(f, Options{Version: "v9.9.9-test", Counts: &Counts{}})
		for _, p := range pages {
			r := get(t, h, http.MethodGet, p)
			if r.code != http.StatusOK {
				t.Fatalf("state %d %s: %d %s", st, p, r.code, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
				t.Errorf("state %d %s: Content-Type %q", st, p, ct)
			}
			if r.header.Get("Content-Security-Policy") != ContentSecurityPolicy || !strings.Contains(ContentSecurityPolicy, "script-src 'self'") {
				t.Errorf("state %d %s: CSP %q", st, p, r.header.Get("Content-Security-Policy"))
			}
			if !strings.Contains(r.body, fmt.Sprintf("State %d:", st)) || !strings.Contains(r.body, "v9.9.9-test") {
				t.Errorf("state %d %s: no state or version in the page", st, p)
			}
			checkNoInline(t, p, r.body)
		}
	}
}

// checkNoInline fails on what the CSP would block or what would leak.
func checkNoInline(t *testing.T, page, body string) {
	t.Helper()
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`<script>|<script [^>]*>[^<]`), // inline script
		regexp.MustCompile(`\sstyle=`),                    // inline style attributes
		regexp.MustCompile(`<style`),
		regexp.MustCompile(`\son[a-z]+=`), // event handler attributes
		regexp.MustCompile(`(src|href)="(https?:)?//`),
	} {
		if m := bad.FindString(body); m != "" {
			t.Errorf("%s: %q in the page", page, m)
		}
	}
}

func TestOverviewShowsChainStepAndPendingUpdate(t *testing.T) {
	f := newFake(t, core.StateAcceptingMarbles)
	f.raw = testManifest(t, 3)
	f.pending = &core.PendingUpdate{Manifest: []byte(`{"new":1}`), MissingUsers: []string{"bob", "carol"}, MissingAcknowledgments: 2}
	h := New(f, Options{CollateralNextUpdate: func() (time.Time, bool) { return time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), true },
		Cluster: func(context.Context) Cluster {
			return Cluster{Shared: true, Members: []Member{{Endpoint: "https://127.0.0.1:2379", OK: true, DBSize: 4096}, {Endpoint: "https://127.0.0.1:2380"}}}
		}})
	body := get(t, h, http.MethodGet, "/console/").body
	certs, err := parseChain(f.chainPEM)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(f.raw)
	pendingSum := sha256.Sum256([]byte(`{"new":1}`))
	for _, want := range []string{
		fingerprintOf(certs[0]), fingerprintOf(certs[1]), "Test Root", "Test Intermediate",
		hex.EncodeToString(sum[:]), hex.EncodeToString(pendingSum[:]),
		"<li>bob</li>", "<li>carol</li>", `<strong id="missing-acks">2</strong>`,
		"2030-01-02 03:04:05 UTC", "https://127.0.0.1:2379", "does not answer", "4096 bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q:\n%s", want, body)
		}
	}
	// The intermediate expires within 30 days, the root does not.
	if !regexp.MustCompile(`class="warn">(9|10) days left`).MatchString(body) || !strings.Contains(body, "(3650 days left)") && !strings.Contains(body, "(3649 days left)") {
		t.Errorf("expiry warnings are wrong:\n%s", body)
	}
}

func fingerprintOf(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

func TestNextStepPerState(t *testing.T) {
	for st, want := range map[core.State]string{
		core.StateRecovery:          "quarry recover",
		core.StateAcceptingManifest: "quarry manifest set",
		core.StateAcceptingMarbles:  "Running: Marbles can activate",
	} {
		f := newFake(t, st)
		f.raw = testManifest(t, 1)
		f.accepted, f.needed = 1, 3
		body := get(t, New(f, Options{}), http.MethodGet, "/console/").body
		if !strings.Contains(body, want) {
			t.Errorf("state %d: overview lacks %q", st, want)
		}
	}
}

func TestDeploymentShowsDefinitionsNeverValues(t *testing.T) {
	f := newFake(t, core.StateAcceptingMarbles)
	f.raw = testManifest(t, 4)
	h := New(f, Options{})
	var all strings.Builder
	for _, p := range pages {
		all.WriteString(get(t, h, http.MethodGet, p).body)
	}
	body := get(t, h, http.MethodGet, "/console/deployment").body
	for _, want := range []string{
		`<th scope="row">svc-0003</th><td>frontend</td>`, "apikey, shared_cert, symkey", // secrets the templates use
		"UniqueID " + strings.Repeat("ab", 32), "ProductID 3", "SecurityVersion 2",
		`<th scope="row">fixed</th><td>symmetric-key</td>`, "set by a user",
		"Alice Admin", "2 recovery keys: k1, k2", "Threshold: 2 shares",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("deployment lacks %q", want)
		}
	}
	// alice holds both roles (columns secretwriter, updater), bob one.
	if !regexp.MustCompile(`alice.*?</th><td><span aria-label="holds the role">✓</span></td><td><span aria-label="holds the role">✓`).MatchString(body) ||
		!regexp.MustCompile(`bob.*?</th><td><span aria-label="holds the role">✓</span></td><td><span aria-label="does not hold the role">`).MatchString(body) {
		t.Errorf("users × roles matrix is wrong:\n%s", body)
	}
	for _, secret := range []string{string(fixedPrivate), base64.StdEncoding.EncodeToString(fixedPrivate),
		string(fixedPublic), base64.StdEncoding.EncodeToString(fixedPublic), "BEGIN CERTIFICATE", "BEGIN PUBLIC KEY"} {
		if strings.Contains(all.String(), secret) {
			t.Errorf("a page shows %q", secret)
		}
	}
}

func TestHistoryVerifiesTheLog(t *testing.T) {
	f := newFake(t, core.StateAcceptingMarbles)
	f.raw = testManifest(t, 1)
	h := New(f, Options{})
	body := get(t, h, http.MethodGet, "/console/history").body
	if !strings.Contains(body, "Verified: all 2 entries") || !strings.Contains(body, f.checkpoint.Head.String()) ||
		!strings.Contains(body, "Secret set") {
		t.Fatalf("history of a good log:\n%s", body)
	}

	// An entry changed on the way (the host rewrote a segment).
	good := f.records[1]
	f.records[1].Entry = strings.Replace(good.Entry, "alice", "mallory", 1)
	if body := get(t, h, http.MethodGet, "/console/history").body; !strings.Contains(body, "Not verified") {
		t.Errorf("a changed entry verifies:\n%s", body)
	}
	f.records[1] = good

	// A checkpoint signed by another key than the root's.
	other, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	forged, err := logchain.Sign(rand.Reader, other, f.checkpoint.HeadOf(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.checkpoint = forged
	if body := get(t, h, http.MethodGet, "/console/history").body; !strings.Contains(body, "Not verified") {
		t.Errorf("a checkpoint signed by another key verifies:\n%s", body)
	}

	// A log cut short: the checkpoint names more entries than served.
	f.setLog(t, f.log)
	f.records = f.records[:1]
	if body := get(t, h, http.MethodGet, "/console/history").body; !strings.Contains(body, "Not verified") {
		t.Errorf("a truncated log verifies:\n%s", body)
	}
}

func TestHistoryPagesThroughLongLogs(t *testing.T) {
	f := newFake(t, core.StateAcceptingMarbles)
	f.raw = testManifest(t, 1)
	entries := make([]string, core.MaxLogPage+5)
	for i := range entries {
		entries[i] = fmt.Sprintf(`{"time":"2026-01-01T00:00:00.000Z","update":"Secret set","n":%d}`, i)
	}
	f.setLog(t, entries)
	body := get(t, New(f, Options{}), http.MethodGet, "/console/history").body
	if !strings.Contains(body, fmt.Sprintf("Verified: all %d entries", len(entries))) {
		t.Fatalf("a log of two pages does not verify")
	}
	if n := strings.Count(body, "<tr data-seq="); n != historyShown {
		t.Errorf("%d entries listed, want the newest %d", n, historyShown)
	}
	if !strings.Contains(body, fmt.Sprintf(`<tr data-seq="%d">`, len(entries))) {
		t.Errorf("the newest entry is not listed")
	}
}

func TestRecoveryPage(t *testing.T) {
	f := newFake(t, core.StateRecovery)
	f.accepted, f.needed = 1, 3
	body := get(t, New(f, Options{}), http.MethodGet, "/console/recovery").body
	if !strings.Contains(body, `<strong id="shares-missing">2</strong> of <span id="shares-needed">3</span>`) ||
		!strings.Contains(body, "quarry recover") {
		t.Errorf("recovery page:\n%s", body)
	}
	f.state = core.StateAcceptingMarbles
	if body := get(t, New(f, Options{}), http.MethodGet, "/console/recovery").body; !strings.Contains(body, "not in recovery mode") {
		t.Errorf("recovery page outside recovery:\n%s", body)
	}
}

func TestActivityCountsAndCharts(t *testing.T) {
	f := newFake(t, core.StateAcceptingMarbles)
	f.raw = testManifest(t, 2)
	now := time.Now()
	for i := range 30 {
		f.events = append(f.events, core.ActivationEvent{Time: now.Add(time.Duration(i-30) * time.Minute), MarbleType: []string{"svc-0000", "svc-0001", "svc-0001"}[i%3]})
	}
	f.dropped = 4
	c := &Counts{}
	for range 3 {
		c.OnActivation(core.ActivationAttempt{MarbleType: "svc-0000", KnownType: true})
	}
	c.OnActivation(core.ActivationAttempt{MarbleType: "svc-0001", KnownType: true, Refused: core.RefusedQuote})
	c.OnActivation(core.ActivationAttempt{MarbleType: "evil<script>", KnownType: false, Refused: core.RefusedUnknownType})
	c.OnActivation(core.ActivationAttempt{MarbleType: "other", KnownType: false, Refused: core.RefusedUnknownType})
	body := get(t, New(f, Options{Counts: c}), http.MethodGet, "/console/activity").body
	for _, want := range []string{
		"30 kept, 4 older ones dropped",
		`<tr data-type="svc-0000"><th scope="row">svc-0000</th><td class="kept">10</td><td class="success">3</td><td class="refused">0</td>`,
		`<tr data-type="svc-0001"><th scope="row">svc-0001</th><td class="kept">20</td><td class="success">0</td><td class="refused">1</td><td>quote 1</td>`,
		`<tr data-type="&lt;unknown&gt;"`, "unknown_marble_type 2",
		"Refusals since this instance started: unknown_marble_type 2, quote 1.",
		`<svg viewBox="0 0 640 240" role="img" aria-labelledby="timeline-t timeline-d"`,
		"svc-0001 (20)", "6 attempts since this instance started",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("activity lacks %q", want)
		}
	}
	if strings.Contains(body, "evil<script>") {
		t.Error("a Marble type name is not escaped")
	}
	// The chart's bars add up to the kept events.
	total := 0
	for _, m := range regexp.MustCompile(`<title>[^<]*: (\d+) activations from`).FindAllStringSubmatch(body, -1) {
		var n int
		fmt.Sscan(m[1], &n)
		total += n
	}
	if total != 30 {
		t.Errorf("the timeline's bars hold %d activations, want 30", total)
	}
}

func TestCountsBoundTypes(t *testing.T) {
	c := &Counts{}
	for i := range maxCountedTypes + 50 {
		c.OnActivation(core.ActivationAttempt{MarbleType: fmt.Sprint(i), KnownType: true})
	}
	v := c.view()
	if len(v.Types) != maxCountedTypes+1 {
		t.Fatalf("%d types kept, want %d and %q", len(v.Types), maxCountedTypes, otherType)
	}
	for _, tc := range v.Types {
		if tc.Type == otherType && tc.Success != 50 {
			t.Errorf("%s counts %d, want 50", otherType, tc.Success)
		}
	}
}

func TestReadOnlyAndUnknownPaths(t *testing.T) {
	h := New(newFake(t, core.StateAcceptingManifest), Options{})
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		r := get(t, h, m, "/console/")
		if r.code != http.StatusMethodNotAllowed || r.header.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: %d Allow %q", m, r.code, r.header.Get("Allow"))
		}
	}
	for _, p := range []string{"/console/nope", "/console/static/", "/console/static/missing.js", "/console/deployment/x"} {
		if r := get(t, h, http.MethodGet, p); r.code != http.StatusNotFound {
			t.Errorf("GET %s: %d", p, r.code)
		}
	}
	if r := get(t, h, http.MethodHead, "/console/"); r.code != http.StatusOK || r.body != "" || r.header.Get("Content-Length") == "0" {
		t.Errorf("HEAD: %d %q", r.code, r.body)
	}
	for p, ct := range map[string]string{"/console/static/console.css": "text/css; charset=utf-8", "/console/static/refresh.js": "text/javascript; charset=utf-8"} {
		r := get(t, h, http.MethodGet, p)
		if r.code != http.StatusOK || r.header.Get("Content-Type") != ct || r.header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: %d %q", p, r.code, r.header.Get("Content-Type"))
		}
	}
}

func TestManifestChangeIsShown(t *testing.T) {
	f := newFake(t, core.StateAcceptingMarbles)
	f.raw = testManifest(t, 2)
	h := New(f, Options{})
	if body := get(t, h, http.MethodGet, "/console/deployment").body; !strings.Contains(body, "2 Marble types") {
		t.Fatalf("deployment of 2 types:\n%s", body)
	}
	f.raw = testManifest(t, 3) // an update applied: a new fingerprint
	if body := get(t, h, http.MethodGet, "/console/deployment").body; !strings.Contains(body, "3 Marble types") {
		t.Errorf("the deployment page still shows the old manifest")
	}
	if body := get(t, h, http.MethodGet, "/console/").body; !strings.Contains(body, `<dd id="marble-types">3</dd>`) {
		t.Errorf("the overview still counts the old manifest's types")
	}
}

func TestReadFailuresAreNamed(t *testing.T) {
	f := newFake(t, core.StateAcceptingMarbles)
	f.raw = testManifest(t, 1)
	f.logErr = fmt.Errorf("%w: segment 3 could not be read", core.ErrStoreUnavailable)
	f.pendingErr = core.ErrStoreUnavailable
	h := New(f, Options{})
	r := get(t, h, http.MethodGet, "/console/history")
	if r.code != http.StatusInternalServerError || !strings.Contains(r.body, "could not read the Coordinator") || !strings.Contains(r.body, "segment 3") {
		t.Errorf("history with an unreadable log: %d %q", r.code, r.body)
	}
	r = get(t, h, http.MethodGet, "/console/")
	if r.code != http.StatusOK || !strings.Contains(r.body, "The pending update could not be read") {
		t.Errorf("overview with an unreadable pending update: %d", r.code)
	}
	f.raw = []byte("null")
	f.pendingErr = nil
	r = get(t, New(f, Options{}), http.MethodGet, "/console/deployment")
	if r.code != http.StatusInternalServerError || !strings.Contains(r.body, "the stored manifest does not parse") {
		t.Errorf("deployment of a manifest that does not parse: %d %q", r.code, r.body)
	}
}
