package console

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/api/logchain"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/manifest"
)

// page is what every page shows around its content.
type page struct {
	Title     string
	Page      string
	Nav       []navLink
	State     int
	StateName string
	Version   string
	Now       time.Time
	Body      any
}

type navLink struct {
	Href, Label string
	Current     bool
}

func (h *handler) gather(ctx context.Context, name string) (page, error) {
	st := h.src.Status()
	p := page{Page: name, State: int(st), StateName: st.String(), Version: h.opts.Version, Now: h.opts.Now().UTC()}
	for _, l := range []struct{ page, label string }{
		{pageOverview, "Overview"}, {pageDeployment, "Deployment"}, {pageActivity, "Activity"},
		{pageHistory, "History"}, {pageRecovery, "Recovery"},
	} {
		p.Nav = append(p.Nav, navLink{Href: Path + l.page, Label: l.label, Current: l.page == name})
		if l.page == name {
			p.Title = l.label
		}
	}
	var err error
	switch name {
	case pageOverview:
		p.Body, err = h.overview(ctx, st)
	case pageDeployment:
		p.Body, err = h.deployment(st)
	case pageActivity:
		p.Body = h.activity()
	case pageHistory:
		p.Body, err = h.history(ctx, st)
	case pageRecovery:
		p.Body = h.recovery(st)
	}
	return p, err
}

// nextStep tells the operator what the state asks for.
type nextStep struct {
	Text    string
	Command string
	Link    string
}

func stepFor(st core.State, missing int) nextStep {
	switch st {
	case core.StateRecovery:
		return nextStep{
			Text:    fmt.Sprintf("The sealed state could not be opened. Upload recovery secrets (%d more needed), or set a new manifest, which discards the old state.", missing),
			Command: "quarry recover SECRETS_FILE ADDRESS -k PRIVATE_KEY_FILE",
			Link:    Path + pageRecovery,
		}
	case core.StateAcceptingManifest:
		return nextStep{
			Text:    "No manifest is set. Set the deployment's manifest; Marbles can activate after that.",
			Command: "quarry manifest set manifest.json ADDRESS",
		}
	case core.StateAcceptingMarbles:
		return nextStep{Text: "Running: Marbles can activate. Nothing is needed; changes go through a manifest update."}
	}
	return nextStep{Text: "The Coordinator is starting."}
}

// certInfo is what the console shows of a certificate.
type certInfo struct {
	Role        string
	Subject     string
	Fingerprint string
	NotBefore   time.Time
	NotAfter    time.Time
	DaysLeft    int
	Expired     bool
	ExpiresSoon bool
}

type pending struct {
	Fingerprint  string
	Missing      int
	MissingUsers []string
}

type overview struct {
	Running             bool
	Message             string
	Step                nextStep
	Fingerprint         string
	Certs               []certInfo
	CertError           string
	QuotePresent        bool
	Collateral          time.Time
	CollateralSet       bool
	CollateralExpired   bool
	Cluster             *Cluster
	Pending             *pending
	PendingError        string
	MarbleTypes         int
	ActivationsRecorded int
	Missing             int
	Needed              int
}

func (h *handler) overview(ctx context.Context, st core.State) (overview, error) {
	acc, need := h.src.RecoverySharesAccepted()
	o := overview{Running: st == core.StateAcceptingMarbles, Message: st.Message(), Needed: need, Missing: max(need-acc, 0)}
	o.Step = stepFor(st, o.Missing)
	certs, quote, err := h.chain(ctx)
	if err != nil {
		o.CertError = err.Error()
	}
	o.Certs, o.QuotePresent = certs, quote
	if h.opts.CollateralNextUpdate != nil {
		o.Collateral, o.CollateralSet = h.opts.CollateralNextUpdate()
		o.CollateralExpired = o.CollateralSet && o.Collateral.Before(h.opts.Now())
	}
	if h.opts.Cluster != nil {
		c := h.opts.Cluster(ctx)
		o.Cluster = &c
	}
	if st == core.StateAcceptingMarbles {
		if m, err := h.src.Manifest(); err == nil {
			o.Fingerprint = m.Fingerprint
			if pm, err := h.manifest(m); err == nil {
				o.MarbleTypes = len(pm.Marbles)
			}
		}
		p, err := h.src.PendingUpdate(ctx)
		switch {
		case err == nil:
			sum := sha256.Sum256(p.Manifest)
			o.Pending = &pending{Fingerprint: hex.EncodeToString(sum[:]), Missing: p.MissingAcknowledgments, MissingUsers: p.MissingUsers}
		case errors.Is(err, core.ErrNotFound):
		default:
			o.PendingError = err.Error()
		}
	}
	evs, _ := h.src.ActivationEvents()
	o.ActivationsRecorded = len(evs)
	return o, nil
}

// chain returns the intermediate and root certificate as GET quote shows
// them, and whether a quote is present.
func (h *handler) chain(ctx context.Context) ([]certInfo, bool, error) {
	q, err := h.src.Quote(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	certs, err := parseChain(q.ChainPEM)
	if err != nil {
		return nil, false, err
	}
	now := h.opts.Now()
	var out []certInfo
	for i, c := range certs {
		role := "Intermediate"
		if i == len(certs)-1 {
			role = "Root"
		}
		sum := sha256.Sum256(c.Raw)
		// In seconds: a root valid for centuries overflows a Duration.
		left := c.NotAfter.Unix() - now.Unix()
		out = append(out, certInfo{
			Role: role, Subject: c.Subject.CommonName, Fingerprint: hex.EncodeToString(sum[:]),
			NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC(), DaysLeft: int(left / 86400),
			Expired: left <= 0, ExpiresSoon: left > 0 && left < 30*86400,
		})
	}
	return out, len(q.Quote) > 0, nil
}

func parseChain(chainPEM []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := chainPEM; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("the certificate chain does not parse: %w", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("the certificate chain is empty")
	}
	return certs, nil
}

// Deployment page.

type pkgView struct {
	Name        string
	Kind        string
	Identity    []string
	Debug       bool
	MarbleTypes []string
}

type marbleView struct {
	Name           string
	Package        string
	MaxActivations uint
	Secrets        []string
	TLS            []string
}

type secretView struct {
	Name, Type   string
	Size         uint
	Shared, User bool
	UsedBy       int
}

type roleView struct {
	Name, ResourceType string
	ResourceNames      []string
	Actions            []string
}

type userView struct {
	Name    string
	Subject string
	Has     []bool // per role of deployment.Roles
}

type deployment struct {
	Available         bool
	Reason            string
	Fingerprint       string
	Packages          []pkgView
	Marbles           []marbleView
	Secrets           []secretView
	Roles             []roleView
	Users             []userView
	RecoveryKeys      []string
	RecoveryThreshold uint
	UpdateThreshold   uint
	SealMode          string
	FeatureGates      []string
}

// secretRef finds the secrets a template uses: {{... .Secrets.NAME ...}}
// and {{... .Previous.Secrets.NAME ...}} (manifest/template.go).
var secretRef = regexp.MustCompile(`\.Secrets\.([A-Za-z0-9_-]+)`)

func (h *handler) deployment(st core.State) (deployment, error) {
	if st != core.StateAcceptingMarbles {
		return deployment{Reason: "No manifest is active in this state (" + st.String() + ")."}, nil
	}
	mr, err := h.src.Manifest()
	if err != nil {
		return deployment{Reason: "The manifest cannot be read: " + err.Error()}, nil
	}
	m, err := h.manifest(mr)
	if err != nil {
		return deployment{}, fmt.Errorf("the stored manifest does not parse: %w", err)
	}
	d := deployment{Available: true, Fingerprint: mr.Fingerprint, RecoveryThreshold: m.Config.RecoveryThreshold,
		UpdateThreshold: m.Config.UpdateThreshold, SealMode: m.Config.SealMode, FeatureGates: m.Config.FeatureGates}
	usedBy := map[string]int{}
	byPkg := map[string][]string{}
	for _, name := range sortedKeys(m.Marbles) {
		mb := m.Marbles[name]
		byPkg[mb.Package] = append(byPkg[mb.Package], name)
		refs := map[string]bool{}
		add := func(f manifest.File) {
			if f.NoTemplates {
				return
			}
			for _, sm := range secretRef.FindAllStringSubmatch(f.Data, -1) {
				refs[sm[1]] = true
			}
		}
		for _, f := range mb.Parameters.Files {
			add(f)
		}
		for _, f := range mb.Parameters.Env {
			add(f)
		}
		for _, a := range mb.Parameters.Argv {
			add(manifest.File{Data: a})
		}
		mv := marbleView{Name: name, Package: mb.Package, MaxActivations: mb.MaxActivations, TLS: mb.TLS}
		for s := range refs {
			mv.Secrets = append(mv.Secrets, s)
			usedBy[s]++
		}
		sort.Strings(mv.Secrets)
		d.Marbles = append(d.Marbles, mv)
	}
	for _, name := range sortedKeys(m.Packages) {
		p := m.Packages[name]
		pv := pkgView{Name: name, Kind: "SGX", Debug: p.Debug, MarbleTypes: byPkg[name]}
		if p.IsTDX() {
			pv.Kind = "TDX"
		}
		if p.UniqueID != "" {
			pv.Identity = append(pv.Identity, "UniqueID "+p.UniqueID)
		}
		if p.SignerID != "" {
			pv.Identity = append(pv.Identity, "SignerID "+p.SignerID)
		}
		if p.ProductID != nil {
			pv.Identity = append(pv.Identity, fmt.Sprintf("ProductID %d", *p.ProductID))
		}
		if p.SecurityVersion != nil {
			pv.Identity = append(pv.Identity, fmt.Sprintf("SecurityVersion %d", *p.SecurityVersion))
		}
		d.Packages = append(d.Packages, pv)
	}
	// Only the definitions: never Private or Public, which a manifest may
	// carry for a secret it fixes.
	for _, name := range sortedKeys(m.Secrets) {
		s := m.Secrets[name]
		d.Secrets = append(d.Secrets, secretView{Name: name, Type: s.Type, Size: s.Size, Shared: s.Shared, User: s.UserDefined, UsedBy: usedBy[name]})
	}
	roles := sortedKeys(m.Roles)
	for _, name := range roles {
		r := m.Roles[name]
		d.Roles = append(d.Roles, roleView{Name: name, ResourceType: r.ResourceType, ResourceNames: r.ResourceNames, Actions: r.Actions})
	}
	for _, name := range sortedKeys(m.Users) {
		u := m.Users[name]
		uv := userView{Name: name, Has: make([]bool, len(roles))}
		if c, err := manifest.ParseUserCertificate(u.Certificate); err == nil {
			uv.Subject = c.Subject.CommonName
		}
		for i, r := range roles {
			for _, ur := range u.Roles {
				if ur == r {
					uv.Has[i] = true
				}
			}
		}
		d.Users = append(d.Users, uv)
	}
	d.RecoveryKeys = sortedKeys(m.RecoveryKeys)
	return d, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Activity page.

type activity struct {
	Kept      int
	Dropped   uint64
	First     time.Time
	Last      time.Time
	Timeline  chart
	PerType   []typeRow
	Refusals  chart
	Counts    countsView
	HasCounts bool
}

type typeRow struct {
	Type    string
	Kept    int
	Success uint64
	Refused uint64
	Reasons string
}

func (h *handler) activity() activity {
	evs, dropped := h.src.ActivationEvents()
	a := activity{Kept: len(evs), Dropped: dropped, HasCounts: h.opts.Counts != nil}
	if len(evs) > 0 {
		a.First, a.Last = evs[0].Time.UTC(), evs[len(evs)-1].Time.UTC()
	}
	a.Timeline = timeline(evs, h.opts.Now())
	a.Counts = h.opts.Counts.view()
	kept := map[string]int{}
	for _, e := range evs {
		kept[e.MarbleType]++
	}
	rows := map[string]*typeRow{}
	for t, n := range kept {
		rows[t] = &typeRow{Type: t, Kept: n}
	}
	for _, tc := range a.Counts.Types {
		r := rows[tc.Type]
		if r == nil {
			r = &typeRow{Type: tc.Type}
			rows[tc.Type] = r
		}
		r.Success, r.Refused = tc.Success, tc.Refused
		var parts []string
		for _, reason := range sortedKeys(tc.ByReason) {
			parts = append(parts, fmt.Sprintf("%s %d", reason, tc.ByReason[reason]))
		}
		r.Reasons = strings.Join(parts, ", ")
	}
	for _, r := range rows {
		a.PerType = append(a.PerType, *r)
	}
	sort.Slice(a.PerType, func(i, j int) bool { return a.PerType[i].Type < a.PerType[j].Type })
	a.Refusals = barChart(a.Counts.Reasons)
	return a
}

// History page.

// historyShown bounds the entries the history page lists (the newest).
const historyShown = 200

type logRow struct {
	Seq    uint64
	Time   string
	Update string
	Entry  string
	Hash   string
}

type history struct {
	Available   bool
	Reason      string
	Count       uint64
	Verified    bool
	VerifyError string
	Head        string
	CheckTime   string
	CheckCount  uint64
	RootFP      string
	Rows        []logRow
	Shown       int
}

func (h *handler) history(ctx context.Context, st core.State) (history, error) {
	if st != core.StateAcceptingMarbles {
		return history{Reason: "The update log is served while the Coordinator runs (state 3); it is now " + st.String() + "."}, nil
	}
	q, err := h.src.Quote(ctx, nil)
	if err != nil {
		return history{}, err
	}
	certs, err := parseChain(q.ChainPEM)
	if err != nil {
		return history{}, err
	}
	root := certs[len(certs)-1]
	sum := sha256.Sum256(root.Raw)
	hs := history{Available: true, RootFP: hex.EncodeToString(sum[:])}
	// Verify the whole log page by page against the root (as
	// `quarry manifest log --verify` does) and keep the newest entries.
	var head logchain.Head
	var recent []logchain.Record
	var cp logchain.Checkpoint
	for {
		pg, err := h.src.UpdateLogPage(ctx, head.Count, core.MaxLogPage)
		if err != nil {
			return history{}, err
		}
		cp = pg.Checkpoint
		next, err := logchain.VerifyPage(root, pg.Checkpoint, head, pg.Records)
		if err != nil {
			hs.VerifyError = err.Error()
			break
		}
		head = next
		recent = append(recent, pg.Records...)
		if len(recent) > historyShown {
			recent = recent[len(recent)-historyShown:]
		}
		if len(pg.Records) == 0 || head.Count >= pg.Checkpoint.Count {
			break
		}
	}
	hs.Count, hs.CheckCount, hs.CheckTime, hs.Head = head.Count, cp.Count, cp.Time, cp.Head.String()
	hs.Verified = hs.VerifyError == "" && head.Count == cp.Count && head.Hash == cp.Head
	if hs.VerifyError == "" && !hs.Verified {
		hs.VerifyError = fmt.Sprintf("the log ends at entry %d, the checkpoint names %d", head.Count, cp.Count)
	}
	for i := len(recent) - 1; i >= 0; i-- {
		r := recent[i]
		row := logRow{Seq: r.Seq, Entry: r.Entry, Hash: r.Hash.String()}
		row.Time, row.Update = entryFields(r.Entry)
		hs.Rows = append(hs.Rows, row)
	}
	hs.Shown = len(hs.Rows)
	return hs, nil
}

// entryFields reads "time" and "update" of an entry (internal/updatelog's
// format); an entry that is not such an object shows as it is.
func entryFields(entry string) (string, string) {
	var e struct {
		Time   string `json:"time"`
		Update string `json:"update"`
	}
	if err := jsonUnmarshal(entry, &e); err != nil {
		return "", ""
	}
	return e.Time, e.Update
}

// Recovery page.

type recoveryView struct {
	InRecovery bool
	StateName  string
	Accepted   int
	Needed     int
	Missing    int
	Unknown    bool
}

func (h *handler) recovery(st core.State) recoveryView {
	acc, need := h.src.RecoverySharesAccepted()
	return recoveryView{InRecovery: st == core.StateRecovery, StateName: st.String(), Accepted: acc, Needed: need,
		Missing: max(need-acc, 0), Unknown: need == 0}
}
