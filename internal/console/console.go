// Package console serves the operator console: read-only HTML pages under
// /console/ on the Client API that show what the Client API already shows
// without a client certificate — the state, the manifest, the certificate
// chain, the update log and its verification, the pending update, the
// activation events and the activation counts (docs/console.md). It reads
// through Source, the same use cases the REST handlers call; it has no way
// to read a secret value or a private key.
//
// The pages are html/template output with SVG charts drawn on the server,
// one stylesheet and one optional script (a periodic reload), all served
// from the binary under a strict Content-Security-Policy.
package console

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/manifest"
)

// Path is where the console is mounted on the Client API. It is not part of
// the API: the API's description leaves it out.
const Path = "/console/"

// Source is what the console reads from the Coordinator: the use cases the
// Client API serves without a client certificate, the activation events
// and the recovery progress.
type Source interface {
	Status() core.State
	Manifest() (core.ManifestResult, error)
	Quote(ctx context.Context, nonce []byte) (core.QuoteResult, error)
	UpdateLogPage(ctx context.Context, after, limit uint64) (core.LogPage, error)
	PendingUpdate(ctx context.Context) (core.PendingUpdate, error)
	ActivationEvents() ([]core.ActivationEvent, uint64)
	RecoverySharesAccepted() (accepted, needed int)
}

// Member is one etcd endpoint of a shared store as the Coordinator sees it.
type Member struct {
	Endpoint string
	OK       bool
	DBSize   int64
}

// Cluster is what the console shows of a shared store (high availability).
type Cluster struct {
	// Shared tells whether the state is on a shared store.
	Shared bool
	// Members are the store's endpoints and whether each answered.
	Members []Member
}

// Options configure the console.
type Options struct {
	// Version is the Coordinator's version (and commit) as shown.
	Version string
	// Counts, if set, holds the activation and refusal counts since this
	// instance started (the OnActivation hook feeds it).
	Counts *Counts
	// CollateralNextUpdate, if set, returns when the cached attestation
	// collateral expires (false: none held).
	CollateralNextUpdate func() (time.Time, bool)
	// Cluster, if set, describes the shared store.
	Cluster func(ctx context.Context) Cluster
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// The pages under Path.
const (
	pageOverview   = ""
	pageDeployment = "deployment"
	pageActivity   = "activity"
	pageHistory    = "history"
	pageRecovery   = "recovery"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// ContentSecurityPolicy is the policy of every console response: nothing
// but the console's own stylesheet and script, no inline script or style,
// no framing, no form posts.
const ContentSecurityPolicy = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; " +
	"connect-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

type handler struct {
	src   Source
	opts  Options
	pages map[string]*template.Template
	files http.Handler
	// parsed is the last manifest parsed, by fingerprint: the manifest
	// changes rarely and parsing a large one is most of a page's cost.
	parsed atomic.Pointer[parsedManifest]
}

type parsedManifest struct {
	fingerprint string
	m           *manifest.Manifest
}

// manifest returns the current manifest parsed (it was validated when it
// was set, so ParseStored applies).
func (h *handler) manifest(mr core.ManifestResult) (*manifest.Manifest, error) {
	if p := h.parsed.Load(); p != nil && p.fingerprint == mr.Fingerprint {
		return p.m, nil
	}
	m, err := manifest.ParseStored(mr.Raw)
	if err != nil {
		return nil, err
	}
	h.parsed.Store(&parsedManifest{fingerprint: mr.Fingerprint, m: m})
	return m, nil
}

// New returns the console's handler; it expects requests whose path starts
// with Path.
func New(src Source, opts Options) http.Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	h := &handler{src: src, opts: opts, pages: map[string]*template.Template{}}
	for page, file := range map[string]string{
		pageOverview: "overview.html", pageDeployment: "deployment.html", pageActivity: "activity.html",
		pageHistory: "history.html", pageRecovery: "recovery.html",
	} {
		h.pages[page] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+file))
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err)
	}
	h.files = http.StripPrefix(Path+"static/", http.FileServerFS(sub))
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", ContentSecurityPolicy)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hd.Set("Allow", "GET, HEAD")
		plain(w, http.StatusMethodNotAllowed, "the console is read-only: only GET and HEAD are allowed")
		return
	}
	rest := r.URL.Path[min(len(Path), len(r.URL.Path)):]
	if len(rest) > len("static/") && rest[:len("static/")] == "static/" {
		hd.Set("Cache-Control", "no-cache")
		h.files.ServeHTTP(w, r)
		return
	}
	tmpl, ok := h.pages[rest]
	if !ok || len(r.URL.Path) < len(Path) {
		plain(w, http.StatusNotFound, fmt.Sprintf("no console page at %s; the pages are %s, %sdeployment, %sactivity, %shistory and %srecovery", r.URL.Path, Path, Path, Path, Path, Path))
		return
	}
	data, err := h.gather(r.Context(), rest)
	if err != nil {
		plain(w, http.StatusInternalServerError, "the console could not read the Coordinator: "+err.Error())
		return
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, data); err != nil {
		plain(w, http.StatusInternalServerError, "the console could not render the page: "+err.Error())
		return
	}
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(buf.Bytes())
	}
}

// plain writes a short text answer.
func plain(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}
