package integration

// The operator console (docs/console.md) in a real browser: headless
// Chromium driven over the Chrome DevTools Protocol (chromedp) against the
// real binary in states 1, 2 and 3, with a pending update, and on an HA
// pair. Every page must load with no console error and no CSP violation,
// show what the Client API (and /metrics, /events) return — fetched here,
// never copied from the console's code — and keep its links working.
// Screenshots go to -console.screenshots, $QUARRY_CONSOLE_SCREENSHOTS or
// the test's artifact directory (go test -artifacts).

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/google/uuid"

	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/store/etcdstore/etcdtest"
)

var consoleScreenshots = flag.String("console.screenshots", "", "directory for the console tests' screenshots (default: $QUARRY_CONSOLE_SCREENSHOTS, else the test's artifact directory)")

// consolePages are the console's pages, in the order of its navigation.
var consolePages = []string{"/console/", "/console/deployment", "/console/activity", "/console/history", "/console/recovery"}

// chromiumPath finds Chromium; under CI=true its absence fails the test.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("Chromium is not installed (.ci/run installs Debian's chromium); the console's browser tests need it")
	}
	t.Skip("Chromium is not installed: apt-get install chromium")
	return ""
}

// screenshotDir is where this test's screenshots go.
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := *consoleScreenshots
	if dir == "" {
		dir = os.Getenv("QUARRY_CONSOLE_SCREENSHOTS")
	}
	if dir == "" {
		return t.ArtifactDir()
	}
	dir = filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// browser is one headless Chromium that trusts one Coordinator's root.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string
	dir  string

	mu       sync.Mutex
	problems []string // console errors, exceptions, failed loads, CSP reports
	synced   string   // the latest sync marker the console reader saw
	marks    int
}

// cspProbe records every CSP violation the page reports; a script added
// over the DevTools protocol runs whatever the page's policy says.
const cspProbe = `window.__csp = []; document.addEventListener("securitypolicyviolation",
  function (e) { window.__csp.push(e.violatedDirective + " " + e.blockedURI); });`

// syncPrefix marks the console messages the test writes itself to know
// that the reader has seen every message before them.
const syncPrefix = "quarry-console-test-sync-"

// newBrowser starts Chromium trusting the public keys of roots only (no
// blanket --ignore-certificate-errors): the Coordinator's chain is
// self-signed.
func newBrowser(t *testing.T, c *coordinator, roots ...*x509.Certificate) *browser {
	t.Helper()
	var spki []string
	for _, r := range roots {
		sum := sha256.Sum256(r.RawSubjectPublicKeyInfo)
		spki = append(spki, base64.StdEncoding.EncodeToString(sum[:]))
	}
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // root in CI containers
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("ignore-certificate-errors-spki-list", strings.Join(spki, ",")),
		chromedp.UserDataDir(t.TempDir()), // the SPKI list needs its own profile
		chromedp.WindowSize(1100, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 45*time.Second)
	b := &browser{t: t, ctx: ctx, base: "https://" + c.addr, dir: screenshotDir(t)}
	msgs := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			switch {
			case strings.HasPrefix(m.Text, syncPrefix):
				b.mu.Lock()
				b.synced = m.Text
				b.mu.Unlock()
			case m.Type == "error" || m.Type == "assert" || m.IsException() || m.Source == "security":
				b.problem("%s %s: %s %s", m.Source, m.Type, m.Text, m.URL)
			}
		}
	}()
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc(); <-done })
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: cspProbe}); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return b
}

func (b *browser) problem(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, fmt.Sprintf(format, args...))
}

// takeProblems returns and clears what went wrong until now: it writes a
// marker to the console and waits until the reader has seen it.
func (b *browser) takeProblems() []string {
	b.t.Helper()
	b.marks++
	mark := fmt.Sprintf("%s%d", syncPrefix, b.marks)
	evalAs[chromedp.Void](b, fmt.Sprintf("console.debug(%q)", mark))
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.mu.Lock()
		seen := b.synced == mark
		if seen || time.Now().After(deadline) {
			p := b.problems
			b.problems = nil
			b.mu.Unlock()
			if !seen {
				p = append(p, "the console messages did not arrive within 5 s")
			}
			return p
		}
		b.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
}

// run runs browser actions and fails the test on an error.
func (b *browser) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// evalAs evaluates a JavaScript expression in the page.
func evalAs[T any](b *browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// text returns the text of the first element matching sel ("<missing>"
// when none does), without waiting for it.
func (b *browser) text(sel string) string {
	b.t.Helper()
	return evalAs[string](b, fmt.Sprintf(`(function(){ const e = document.querySelector(%q); return e ? e.textContent.replace(/\s+/g, " ").trim() : "<missing>"; })()`, sel))
}

// texts returns the texts of every element matching sel.
func (b *browser) texts(sel string) []string {
	b.t.Helper()
	return evalAs[[]string](b, fmt.Sprintf(`Array.from(document.querySelectorAll(%q), e => e.textContent.replace(/\s+/g, " ").trim())`, sel))
}

// open loads a console page and checks that it loaded with 200, with its
// stylesheet applied and its script run, without console errors or CSP
// violations.
func (b *browser) open(path string) {
	b.t.Helper()
	b.run("opening "+path, chromedp.Navigate(b.base+path), chromedp.WaitReady(chromedp.CSS("footer")))
	b.checkLoaded(path)
}

func (b *browser) checkLoaded(path string) {
	b.t.Helper()
	if status := evalAs[int](b, `performance.getEntriesByType("navigation")[0].responseStatus`); status != http.StatusOK {
		b.t.Errorf("%s: HTTP %d", path, status)
	}
	// The stylesheet applied (a same-origin file the CSP allows).
	if display := evalAs[string](b, `getComputedStyle(document.querySelector("nav ul")).display`); display != "flex" {
		b.t.Errorf("%s: the stylesheet is not applied (nav ul display %q)", path, display)
	}
	for _, v := range evalAs[[]string](b, `window.__csp || []`) {
		b.t.Errorf("%s: CSP violation: %s", path, v)
	}
	for _, p := range b.takeProblems() {
		b.t.Errorf("%s: %s", path, p)
	}
}

// screenshot saves a PNG of the whole page.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	p := filepath.Join(b.dir, name+".png")
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s", p)
}

// checkAllPages opens every page, follows every link on it and checks the
// page's accessibility basics; it saves a screenshot of each as
// prefix-page.png.
func (b *browser) checkAllPages(hc *http.Client, prefix string) {
	b.t.Helper()
	checked := map[string]bool{}
	for _, p := range consolePages {
		b.open(p)
		name := strings.Trim(strings.TrimPrefix(p, "/console"), "/")
		if name == "" {
			name = "overview"
		}
		b.screenshot(prefix + "-" + name)
		b.checkStructure(p)
		for _, h := range evalAs[[]string](b, `Array.from(document.querySelectorAll("a[href]"), a => a.href)`) {
			u, err := url.Parse(h)
			if err != nil {
				b.t.Errorf("%s: bad link %q", p, h)
				continue
			}
			if u.Host != strings.TrimPrefix(b.base, "https://") {
				b.t.Errorf("%s: a link leaves the console: %s", p, h)
				continue
			}
			if u.Fragment != "" && u.Path == p {
				if b.text("#"+u.Fragment) == "<missing>" {
					b.t.Errorf("%s: the link %s points at no element", p, h)
				}
				continue
			}
			u.Fragment = ""
			if checked[u.String()] {
				continue
			}
			checked[u.String()] = true
			resp, err := hc.Get(u.String())
			if err != nil {
				b.t.Errorf("%s: link %s: %v", p, u, err)
				continue
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.t.Errorf("%s: link %s answers %d", p, u, resp.StatusCode)
			}
		}
	}
	// The navigation works by clicks too.
	b.open("/console/")
	for _, p := range consolePages[1:] {
		b.run("clicking "+p, chromedp.Click(chromedp.CSS(fmt.Sprintf(`nav a[href=%q]`, p))),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`nav a[href=%q][aria-current="page"]`, p))))
		// The click's page is there; wait until it has loaded (its
		// stylesheet and script) before checking it.
		if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.readyState === "complete"`, chromedp.WithPollingInterval(20*time.Millisecond))); err != nil {
			b.t.Fatalf("waiting for %s to load: %v", p, err)
		}
		if path := evalAs[string](b, `location.pathname`); path != p {
			b.t.Errorf("clicking %s went to %s", p, path)
		}
		b.checkLoaded(p)
	}
}

// checkStructure checks what makes a page usable by keyboard, screen
// reader and phone: the first Tab reaches the skip link, every table has a
// caption and every chart a title, and the page is no wider than a phone.
func (b *browser) checkStructure(p string) {
	b.t.Helper()
	b.run("tab", chromedp.KeyEvent(kb.Tab))
	if focused := evalAs[string](b, `document.activeElement.className`); focused != "skip" {
		b.t.Errorf("%s: the first Tab focuses %q, not the skip link", p, focused)
	}
	evalAs[chromedp.Void](b, `document.activeElement.blur()`)
	missing := evalAs[[]string](b, `Array.from(document.querySelectorAll("table"), t => t.caption ? "" : (t.id || "table")).filter(Boolean)
		.concat(Array.from(document.querySelectorAll("svg[role=img]"), s => s.querySelector("title") ? "" : "chart").filter(Boolean))`)
	for _, m := range missing {
		b.t.Errorf("%s: %s has no caption or title", p, m)
	}
	// Phone width: the page scrolls only vertically (wide tables scroll
	// inside their own box).
	b.run("phone", chromedp.EmulateViewport(390, 844))
	if evalAs[bool](b, `document.documentElement.scrollWidth > window.innerWidth + 1`) {
		b.t.Errorf("%s: wider than a 390 px phone screen", p)
	}
	if p == "/console/" {
		b.screenshot("phone-overview")
	}
	b.run("desktop", chromedp.EmulateViewport(1100, 900))
}

// apiChain returns the intermediate and root as GET /api/v2/quote shows
// them.
func apiChain(t *testing.T, c *coordinator) (inter, root *x509.Certificate) {
	t.Helper()
	r := do(t, c.client(nil, nil), http.MethodGet, c.url("/api/v2/quote"), nil)
	expect(t, r, http.StatusOK, "success")
	var q quoteData
	decode(t, r, &q)
	inter, root, err := client.ParseCertificateChain([]byte(q.Cert))
	if err != nil {
		t.Fatal(err)
	}
	return inter, root
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// checkOverviewChain compares the overview's state and certificates with
// the API's.
func (b *browser) checkOverviewChain(t *testing.T, c *coordinator) {
	t.Helper()
	b.open("/console/")
	st := getStatus(t, c, c.client(nil, nil))
	if got := b.text("#state"); !strings.HasPrefix(got, fmt.Sprintf("State %d:", st.Code)) {
		t.Errorf("overview state %q, the API says %d", got, st.Code)
	}
	if got := b.text("#state-message"); got != st.Message {
		t.Errorf("overview message %q, the API says %q", got, st.Message)
	}
	inter, root := apiChain(t, c)
	for role, cert := range map[string]*x509.Certificate{"Intermediate": inter, "Root": root} {
		if got := b.text(fmt.Sprintf(`tr[data-role=%q] code`, role)); got != sha256Hex(cert.Raw) {
			t.Errorf("%s fingerprint %q, the API's certificate has %s", role, got, sha256Hex(cert.Raw))
		}
		if got := b.text(fmt.Sprintf(`tr[data-role=%q] td:nth-of-type(4)`, role)); !strings.HasPrefix(got, cert.NotAfter.UTC().Format("2006-01-02 15:04:05")) {
			t.Errorf("%s valid until %q, the API's certificate until %s", role, got, cert.NotAfter.UTC())
		}
	}
}

// TestConsoleAcceptingManifest: state 2, fresh.
func TestConsoleAcceptingManifest(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "")
	_, root := apiChain(t, c)
	b := newBrowser(t, c, root)
	b.checkOverviewChain(t, c)
	if got := b.text("#next-step"); !strings.Contains(got, "quarry manifest set") {
		t.Errorf("next step in state 2: %q", got)
	}
	b.open("/console/deployment")
	if got := b.text("#no-manifest"); !strings.Contains(got, "No manifest") {
		t.Errorf("deployment in state 2: %q", got)
	}
	b.checkAllPages(c.client(root, nil), "state2")

	// The checks above see a violation: an inline script added to a page
	// does not run, and both the page's report and the console's error
	// reach the test.
	b.open("/console/")
	ran := evalAs[bool](b, `(function(){ const s = document.createElement("script"); s.textContent = "window.__ran = true"; document.head.appendChild(s); return window.__ran === true; })()`)
	if ran {
		t.Error("an inline script ran despite the Content-Security-Policy")
	}
	if csp := evalAs[[]string](b, `window.__csp`); len(csp) == 0 || !strings.HasPrefix(csp[0], "script-src") {
		t.Errorf("the blocked inline script was not reported as a CSP violation: %v", csp)
	}
	if p := b.takeProblems(); len(p) == 0 {
		t.Error("the blocked inline script left no console error")
	}

	// --console=0: the console is gone, the API is not.
	off := startCoordinator(t, "", "QUARRY_CONSOLE=0")
	r := do(t, off.client(nil, nil), http.MethodGet, off.url("/console/"), nil)
	if r.HTTPStatus != http.StatusNotFound || !strings.Contains(r.Message, "unknown path") {
		t.Errorf("GET /console/ with QUARRY_CONSOLE=0: %d %s", r.HTTPStatus, r.Raw)
	}
	expect(t, do(t, off.client(nil, nil), http.MethodGet, off.url("/api/v2/status"), nil), http.StatusOK, "success")
}

// TestConsoleRecovery: state 1 with one of two recovery secrets uploaded.
func TestConsoleRecovery(t *testing.T) {
	t.Parallel()
	s := newRecoverySetup(t, 2, 0)
	s.breakKey(t)
	r := postRecover(t, s.c, s.secrets["key1"], sign(t, s.keys["key1"], s.secrets["key1"]))
	expect(t, r, http.StatusOK, "success")
	var d recoverData
	decode(t, r, &d)
	// In recovery mode the Coordinator serves a new, temporary chain.
	inter, root := apiChain(t, s.c)
	b := newBrowser(t, s.c, root, inter)
	b.checkOverviewChain(t, s.c)
	if got := b.text("#next-step"); !strings.Contains(got, "quarry recover") {
		t.Errorf("next step in state 1: %q", got)
	}
	b.open("/console/recovery")
	if got := b.text("#shares-missing"); got != strconv.Itoa(d.Remaining) {
		t.Errorf("recovery page: %s shares missing, the API answered remaining %d", got, d.Remaining)
	}
	if got := b.text("#shares-needed"); got != strconv.Itoa(len(s.keys)) {
		t.Errorf("recovery page: %s shares needed, the manifest has %d keys", got, len(s.keys))
	}
	b.checkAllPages(s.c.client(root, nil), "state1")
}

// TestConsoleRunningWithPendingUpdate: state 3 with activations and
// refusals, then a manifest update waiting for one acknowledgement.
func TestConsoleRunningWithPendingUpdate(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t, "", envMetrics)
	f := newFixture(t)
	keys := recoveryKeys(t, 2)
	f.set("RecoveryKeys", map[string]any{"ops": publicKeyPEM(t, keys[0]), "escrow": publicKeyPEM(t, keys[1])})
	f.set("Config.RecoveryThreshold", 2)
	raw := f.bytes(t)
	expect(t, setManifest(t, c, c.client(nil, nil), raw), http.StatusOK, "success")
	_, root := apiChain(t, c)
	alice, bob := f.users["alice"].cert, f.users["bob"].cert
	expect(t, postSecrets(t, c, c.client(root, &alice), map[string]any{"userkey": map[string]any{"key": make([]byte, 32)}}), http.StatusOK, "success")

	// Activations: two types, one refused for its limit, one unknown type.
	tm := newTestMarble(t)
	tm.mustActivate(t, c, "backend_first", uuid.NewString())
	for range 3 {
		tm.mustActivate(t, c, "frontend", uuid.NewString())
	}
	if _, err := tm.activate(t, c, "backend_first", uuid.NewString()); err == nil {
		t.Fatal("a second backend_first activated beyond MaxActivations 1")
	}
	if _, err := tm.activate(t, c, "ghost", uuid.NewString()); err == nil {
		t.Fatal("an unknown Marble type activated")
	}

	b := newBrowser(t, c, root)
	b.checkOverviewChain(t, c)
	var md manifestData
	mr := do(t, c.client(root, nil), http.MethodGet, c.url("/api/v2/manifest"), nil)
	expect(t, mr, http.StatusOK, "success")
	decode(t, mr, &md)
	var apiManifest struct {
		Marbles      map[string]json.RawMessage
		Users        map[string]json.RawMessage
		Roles        map[string]json.RawMessage
		Secrets      map[string]json.RawMessage
		RecoveryKeys map[string]string
	}
	if err := json.Unmarshal(md.Manifest, &apiManifest); err != nil {
		t.Fatal(err)
	}
	if got := b.text("#manifest-fingerprint"); got != md.Fingerprint {
		t.Errorf("overview fingerprint %q, the API says %q", got, md.Fingerprint)
	}
	if got := b.text("#marble-types"); got != strconv.Itoa(len(apiManifest.Marbles)) {
		t.Errorf("overview counts %s Marble types, the API's manifest has %d", got, len(apiManifest.Marbles))
	}
	if got := b.text("#pending-update"); got != "No update is pending." {
		t.Errorf("pending update before any: %q", got)
	}

	// Deployment: the manifest's names, never a secret value.
	b.open("/console/deployment")
	sameSet := func(what string, got []string, want map[string]json.RawMessage) {
		t.Helper()
		var names []string
		for n := range want {
			names = append(names, n)
		}
		slices.Sort(names)
		slices.Sort(got)
		if !slices.Equal(got, names) {
			t.Errorf("deployment %s %v, the API's manifest has %v", what, got, names)
		}
	}
	sameSet("Marble types", b.texts("#marbles tbody th"), apiManifest.Marbles)
	sameSet("roles", b.texts("#roles tbody th"), apiManifest.Roles)
	sameSet("secrets", b.texts("#secrets tbody th"), apiManifest.Secrets)
	users := evalAs[[]string](b, `Array.from(document.querySelectorAll("#users tbody th"), th => th.firstChild.textContent.trim())`)
	sameSet("users", users, apiManifest.Users)
	if got := b.text("#recovery-keys"); !strings.Contains(got, "escrow, ops") || !strings.Contains(got, "Threshold: 2") {
		t.Errorf("recovery keys: %q", got)
	}
	symkey := getSecrets(t, c, c.client(root, &alice), "symkey")["symkey"].Private
	if len(symkey) == 0 {
		t.Fatal("the API returned no value of the secret symkey")
	}
	secretValue := hex.EncodeToString(symkey)
	for _, p := range consolePages {
		b.open(p)
		html := evalAs[string](b, `document.documentElement.outerHTML`)
		for _, v := range []string{secretValue, base64.StdEncoding.EncodeToString(symkey), "PRIVATE KEY"} {
			if strings.Contains(strings.ToLower(html), strings.ToLower(v)) {
				t.Errorf("%s shows a secret value (%.12s…)", p, v)
			}
		}
	}

	// Activity against /events and /metrics.
	_, evBody, _ := plainGet(t, http.MethodGet, "http://"+metricsAddr(t, c)+"/events")
	var evs []struct {
		Activation struct {
			MarbleType string `json:"marbleType"`
		} `json:"activation"`
	}
	if err := json.Unmarshal(evBody, &evs); err != nil {
		t.Fatal(err)
	}
	kept := map[string]int{}
	for _, e := range evs {
		kept[e.Activation.MarbleType]++
	}
	if len(kept) != 2 {
		t.Fatalf("/events has %v", kept)
	}
	fam := scrape(t, c)
	b.open("/console/activity")
	for typ, n := range kept {
		row := fmt.Sprintf(`tr[data-type=%q]`, typ)
		if got := b.text(row + " .kept"); got != strconv.Itoa(n) {
			t.Errorf("activity %s: %s events kept, /events has %d", typ, got, n)
		}
		succ, _ := fam.value("coordinator_marble_activations_success_total", "type", typ)
		if got := b.text(row + " .success"); got != strconv.Itoa(int(succ)) {
			t.Errorf("activity %s: %s activated, /metrics says %v", typ, got, succ)
		}
	}
	refusedByType := map[string]float64{}
	for _, m := range fam["quarry_activation_failures_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "type" {
				refusedByType[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	if len(refusedByType) != 2 {
		t.Fatalf("/metrics refusals: %v", refusedByType)
	}
	for typ, n := range refusedByType {
		if got := b.text(fmt.Sprintf(`tr[data-type=%q] .refused`, typ)); got != strconv.Itoa(int(n)) {
			t.Errorf("activity %s: %s refused, /metrics says %v", typ, got, n)
		}
	}
	if n := len(b.texts("figure.chart svg rect")); n == 0 {
		t.Error("the activity page draws no chart bars")
	}

	// History against GET /api/v2/update-log.
	lr := do(t, c.client(root, nil), http.MethodGet, c.url("/api/v2/update-log?limit=10000"), nil)
	expect(t, lr, http.StatusOK, "success")
	var logPage struct {
		Entries    []struct{ Seq uint64 }
		Checkpoint struct {
			Count uint64
			Head  string
		}
	}
	decode(t, lr, &logPage)
	b.open("/console/history")
	if got := b.text("#verification"); !strings.HasPrefix(got, "Verified") {
		t.Errorf("history verification: %q", got)
	}
	if got := b.text("#checkpoint-count"); got != strconv.FormatUint(logPage.Checkpoint.Count, 10) {
		t.Errorf("history checkpoint count %s, the API's %d", got, logPage.Checkpoint.Count)
	}
	if got := b.text("#checkpoint-head"); got != logPage.Checkpoint.Head {
		t.Errorf("history head %s, the API's %s", got, logPage.Checkpoint.Head)
	}
	if got := len(b.texts("#log tbody tr")); got != len(logPage.Entries) {
		t.Errorf("history lists %d entries, the API has %d", got, len(logPage.Entries))
	}
	if got := b.text("#root-fingerprint"); got != sha256Hex(root.Raw) {
		t.Errorf("history verifies against %s, the API's root is %s", got, sha256Hex(root.Raw))
	}
	b.checkAllPages(c.client(root, nil), "state3")

	// A manifest update alice started and bob has not acknowledged.
	var tree map[string]any
	json.Unmarshal(raw, &tree)
	uf := &fixture{tree: tree, users: f.users}
	uf.set("Marbles.frontend.MaxActivations", 10)
	ur := do(t, c.client(root, &alice), http.MethodPost, c.url("/api/v2/update"), map[string][]byte{"manifest": uf.bytes(t)})
	expect(t, ur, http.StatusOK, "success")
	pr := do(t, c.client(root, nil), http.MethodGet, c.url("/api/v2/update-manifest"), nil)
	expect(t, pr, http.StatusOK, "success")
	var pending struct {
		Manifest     []byte   `json:"manifest"`
		MissingUsers []string `json:"missingUsers"`
	}
	decode(t, pr, &pending)
	b.open("/console/")
	if got := b.texts("#missing-users li"); !slices.Equal(got, pending.MissingUsers) || len(got) == 0 {
		t.Errorf("pending update: missing %v, the API says %v", got, pending.MissingUsers)
	}
	if got := b.text("#pending-update code"); got != sha256Hex(pending.Manifest) {
		t.Errorf("pending update fingerprint %s, the API's manifest hashes to %s", got, sha256Hex(pending.Manifest))
	}
	b.screenshot("pending-update")
	// Once bob acknowledges, nothing is pending any more.
	ar := do(t, c.client(root, &bob), http.MethodPost, c.url("/api/v2/update-manifest"), map[string][]byte{"manifest": uf.bytes(t)})
	expect(t, ar, http.StatusOK, "success")
	b.open("/console/")
	if got := b.text("#pending-update"); got != "No update is pending." {
		t.Errorf("pending update after the last acknowledgement: %q", got)
	}
}

// TestConsoleHAPair: two instances on one etcd; the console of the one
// that did not set the manifest shows the shared state and the store.
func TestConsoleHAPair(t *testing.T) {
	t.Parallel()
	cluster := etcdtest.Start(t, 1)
	env := haEnv(cluster.Endpoints(), newPrefix())
	a, b2 := startCoordinator(t, "", env...), startCoordinator(t, "", env...)
	f := newFixture(t)
	expect(t, setManifest(t, a, a.client(nil, nil), f.bytes(t)), http.StatusOK, "success")
	_, root := apiChain(t, b2)
	br := newBrowser(t, b2, root)
	br.checkOverviewChain(t, b2)
	var md manifestData
	mr := do(t, a.client(root, nil), http.MethodGet, a.url("/api/v2/manifest"), nil)
	expect(t, mr, http.StatusOK, "success")
	decode(t, mr, &md)
	if got := br.text("#manifest-fingerprint"); got != md.Fingerprint {
		t.Errorf("the second instance shows manifest %q, the first instance's API says %q", got, md.Fingerprint)
	}
	members := br.texts("#members tbody tr")
	if len(members) != len(cluster.Endpoints()) {
		t.Fatalf("members %v, etcd has %v", members, cluster.Endpoints())
	}
	for i, ep := range cluster.Endpoints() {
		if !strings.Contains(members[i], ep) || !strings.Contains(members[i], "answers") {
			t.Errorf("member row %q, want %s answering", members[i], ep)
		}
	}
	br.screenshot("ha-overview")
	br.checkAllPages(b2.client(root, nil), "ha")
}
