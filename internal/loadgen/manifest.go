package loadgen

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/quarry-cc/quarry/manifest"
)

// Mix holds the relative weights of the generated secret types. The default,
// 10:20:10:10, gives 10 RSA-2048, 20 ECDSA P-256, 10 Ed25519 certificates and
// 10 symmetric keys for 50 secrets.
type Mix struct {
	RSA       int `json:"rsa"`
	ECDSA     int `json:"ecdsa"`
	Ed25519   int `json:"ed25519"`
	Symmetric int `json:"symmetric"`
}

// DefaultMix is the mix of -mix's default.
var DefaultMix = Mix{RSA: 10, ECDSA: 20, Ed25519: 10, Symmetric: 10}

// ParseMix reads a mix such as "rsa=10,ecdsa=20,ed25519=10,symmetric=10"
// ("sym" is accepted for "symmetric"). Types left out get weight 0; at least
// one weight must be positive.
func ParseMix(s string) (Mix, error) {
	var m Mix
	seen := map[string]bool{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		key, val, ok := strings.Cut(part, "=")
		if !ok {
			return Mix{}, fmt.Errorf("mix %q: %q is not type=weight", s, part)
		}
		key = strings.ToLower(strings.TrimSpace(key))
		if key == "sym" {
			key = "symmetric"
		}
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil || n < 0 {
			return Mix{}, fmt.Errorf("mix %q: weight of %s must be a non-negative integer", s, key)
		}
		if seen[key] {
			return Mix{}, fmt.Errorf("mix %q: %s given twice", s, key)
		}
		seen[key] = true
		switch key {
		case "rsa":
			m.RSA = n
		case "ecdsa":
			m.ECDSA = n
		case "ed25519":
			m.Ed25519 = n
		case "symmetric":
			m.Symmetric = n
		default:
			return Mix{}, fmt.Errorf("mix %q: unknown type %q (want rsa, ecdsa, ed25519, symmetric)", s, key)
		}
	}
	if m.total() == 0 {
		return Mix{}, fmt.Errorf("mix %q: at least one weight must be positive", s)
	}
	return m, nil
}

func (m Mix) total() int { return m.RSA + m.ECDSA + m.Ed25519 + m.Symmetric }

// String returns the mix in ParseMix's form.
func (m Mix) String() string {
	return fmt.Sprintf("rsa=%d,ecdsa=%d,ed25519=%d,symmetric=%d", m.RSA, m.ECDSA, m.Ed25519, m.Symmetric)
}

// Counts splits n secrets by the weights of m (largest remainder, ties to
// the type named first), so the counts always add up to n.
func (m Mix) Counts(n int) Mix {
	w := []int{m.RSA, m.ECDSA, m.Ed25519, m.Symmetric}
	total := m.total()
	if total == 0 || n <= 0 {
		return Mix{}
	}
	c := make([]int, len(w))
	rem := make([]int, len(w))
	left := n
	for i, wi := range w {
		c[i] = n * wi / total
		rem[i] = n * wi % total
		left -= c[i]
	}
	order := []int{0, 1, 2, 3}
	sort.SliceStable(order, func(a, b int) bool { return rem[order[a]] > rem[order[b]] })
	for _, i := range order[:left] {
		c[i]++
	}
	return Mix{RSA: c[0], ECDSA: c[1], Ed25519: c[2], Symmetric: c[3]}
}

// ManifestOptions says what GenerateManifest produces.
type ManifestOptions struct {
	// TargetBytes is the wanted size of the JSON document. The manifest is
	// filled up to exactly this size with more packages and Marbles and a
	// final padding value; if the secrets alone need more, it is larger.
	TargetBytes int
	// Secrets is the number of shared secrets, typed by Mix.
	Secrets int
	Mix     Mix
	// UserCertPEM, if set, adds the user BenchUser with this certificate and
	// a role to read one generated secret (ManifestInfo.ReadableSecret).
	UserCertPEM string
}

// BenchUser is the manifest user that GenerateManifest adds.
const BenchUser = "bench"

// ManifestInfo describes a generated manifest.
type ManifestInfo struct {
	Bytes    int `json:"bytes"`
	Secrets  int `json:"secrets"`
	Mix      Mix `json:"mix"`
	Packages int `json:"packages"`
	Marbles  int `json:"marbles"`
	// ReadableSecret is a secret BenchUser may read (a symmetric key if
	// there is one); empty without secrets or user.
	ReadableSecret string `json:"readableSecret,omitempty"`
}

// Secret type prefixes of the generated names (underscores keep them usable
// in templates as .Secrets.<name>).
const (
	prefixRSA       = "rsa_"
	prefixECDSA     = "ecdsa_"
	prefixEd25519   = "ed25519_"
	prefixSymmetric = "sym_"
)

// JSON shape of the generated manifest: only the members it uses, in the
// names MarbleRun documents.
type (
	genManifest struct {
		Packages map[string]genPackage
		Marbles  map[string]genMarble
		Secrets  map[string]genSecret `json:",omitempty"`
		Users    map[string]genUser   `json:",omitempty"`
		Roles    map[string]genRole   `json:",omitempty"`
	}
	genPackage struct {
		UniqueID        string `json:",omitempty"`
		SignerID        string `json:",omitempty"`
		ProductID       int    `json:",omitempty"`
		SecurityVersion int    `json:",omitempty"`
	}
	genMarble struct {
		Package        string
		MaxActivations int `json:",omitempty"`
		Parameters     genParameters
	}
	genParameters struct {
		Files map[string]string `json:",omitempty"`
		Env   map[string]string `json:",omitempty"`
		Argv  []string          `json:",omitempty"`
	}
	genSecret struct {
		Type   string
		Size   int `json:",omitempty"`
		Shared bool
		Cert   *genCert `json:",omitempty"`
	}
	genCert struct {
		Subject genSubject
	}
	genSubject struct {
		CommonName string
	}
	genUser struct {
		Certificate string
		Roles       []string `json:",omitempty"`
	}
	genRole struct {
		ResourceType  string
		ResourceNames []string
		Actions       []string
	}
)

// paddingEnv is the environment variable of the "bench" Marble that takes
// the last bytes up to the target size.
const paddingEnv = "BENCH_PADDING"

// GenerateManifest returns a valid manifest (manifest.Parse and Validate
// accept it) with o.Secrets shared secrets, filled to o.TargetBytes.
// The output depends only on o.
func GenerateManifest(o ManifestOptions) ([]byte, ManifestInfo, error) {
	if o.Secrets < 0 || o.TargetBytes < 0 {
		return nil, ManifestInfo{}, errors.New("negative secret count or size")
	}
	counts := o.Mix.Counts(o.Secrets)
	if o.Secrets > 0 && counts.total() != o.Secrets {
		return nil, ManifestInfo{}, fmt.Errorf("mix %s has no positive weight", o.Mix)
	}
	g := newGenerator(counts, o.UserCertPEM)

	// The size grows with the number of filler units: find the most that
	// fit (binary search, a few encodings even for megabytes), then pad.
	lo, hi := 0, 1
	for g.size(hi) <= o.TargetBytes {
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if g.size(mid) <= o.TargetBytes {
			lo = mid
		} else {
			hi = mid
		}
	}
	m := g.build(lo, 0)
	if pad := o.TargetBytes - g.size(lo); pad > 0 {
		m = g.build(lo, pad)
	}
	raw, err := encode(m)
	if err != nil {
		return nil, ManifestInfo{}, err
	}
	info := ManifestInfo{
		Bytes:    len(raw),
		Secrets:  o.Secrets,
		Mix:      counts,
		Packages: len(m.Packages),
		Marbles:  len(m.Marbles),
	}
	if o.UserCertPEM != "" {
		info.ReadableSecret = g.readable
	}
	return raw, info, nil
}

// SetRequest returns the body of POST /api/v2/manifest for raw.
func SetRequest(raw []byte) ([]byte, error) {
	return json.Marshal(struct {
		Manifest []byte `json:"manifest"`
	}{raw})
}

// CheckManifest parses and validates raw as the Coordinator would.
func CheckManifest(raw []byte) error {
	m, err := manifest.Parse(raw)
	if err != nil {
		return err
	}
	return m.Validate()
}

type generator struct {
	secrets    map[string]genSecret
	certs, sym []string // cert secrets and symmetric keys, sorted
	readable   string   // the secret BenchUser may read: a symmetric key if any
	userPEM    string
}

func newGenerator(c Mix, userPEM string) *generator {
	g := &generator{secrets: map[string]genSecret{}, userPEM: userPEM}
	add := func(prefix string, n int, s func(name string) genSecret) {
		for i := range n {
			name := fmt.Sprintf("%s%03d", prefix, i)
			g.secrets[name] = s(name)
		}
	}
	cert := func(typ string, size int) func(string) genSecret {
		return func(name string) genSecret {
			return genSecret{Type: typ, Size: size, Shared: true, Cert: &genCert{
				Subject: genSubject{CommonName: strings.ReplaceAll(name, "_", "-") + ".bench.internal"},
			}}
		}
	}
	add(prefixRSA, c.RSA, cert(manifest.SecretTypeCertRSA, 2048))
	add(prefixECDSA, c.ECDSA, cert(manifest.SecretTypeCertECDSA, 256))
	add(prefixEd25519, c.Ed25519, cert(manifest.SecretTypeCertED25519, 0))
	add(prefixSymmetric, c.Symmetric, func(string) genSecret {
		return genSecret{Type: manifest.SecretTypeSymmetric, Size: 256, Shared: true}
	})
	for name, s := range g.secrets {
		if s.Type == manifest.SecretTypeSymmetric {
			g.sym = append(g.sym, name)
		} else {
			g.certs = append(g.certs, name)
		}
	}
	sort.Strings(g.certs)
	sort.Strings(g.sym)
	switch {
	case len(g.sym) > 0:
		g.readable = g.sym[0]
	case len(g.certs) > 0:
		g.readable = g.certs[0]
	}
	return g
}

func (g *generator) size(units int) int {
	raw, err := encode(g.build(units, 0))
	if err != nil {
		panic(err) // only plain strings, ints and maps: cannot fail
	}
	return len(raw)
}

func encode(m *genManifest) ([]byte, error) { return json.MarshalIndent(m, "", "  ") }

// id returns a 64-hex-digit identifier derived from s (looks like a
// measurement; stable across runs).
func id(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// build returns the manifest with the base package and Marble plus units
// filler package/Marble pairs; pad > 0 adds that many bytes of padding.
func (g *generator) build(units, pad int) *genManifest {
	m := &genManifest{
		Packages: map[string]genPackage{
			"bench": {SignerID: id("signer/bench"), ProductID: 1, SecurityVersion: 1},
		},
		Marbles: map[string]genMarble{},
		Secrets: g.secrets,
	}
	base := genMarble{Package: "bench", Parameters: genParameters{
		Env:  map[string]string{paddingEnv: strings.Repeat("x", pad)},
		Argv: []string{"/usr/bin/bench-service", "--listen", ":8443"},
	}}
	g.mount(&base.Parameters, 0)
	m.Marbles["bench"] = base

	for i := range units {
		pkg := fmt.Sprintf("pkg_%03d", i)
		if i%2 == 0 {
			m.Packages[pkg] = genPackage{UniqueID: id("unique/" + pkg)}
		} else {
			m.Packages[pkg] = genPackage{SignerID: id("signer/" + pkg), ProductID: 1 + i, SecurityVersion: 1 + i%3}
		}
		p := genParameters{
			Env: map[string]string{
				"SERVICE_NAME": fmt.Sprintf("svc-%03d", i),
				"LOG_LEVEL":    "info",
			},
			Argv: []string{"/usr/bin/svc", "--config", "/etc/svc/config.yaml", "--port", strconv.Itoa(9000 + i)},
		}
		g.mount(&p, i+1)
		m.Marbles[fmt.Sprintf("svc_%03d", i)] = genMarble{Package: pkg, MaxActivations: 1 + i%4, Parameters: p}
	}
	if g.userPEM != "" && g.readable != "" {
		m.Users = map[string]genUser{BenchUser: {Certificate: g.userPEM, Roles: []string{"bench-reader"}}}
		m.Roles = map[string]genRole{"bench-reader": {
			ResourceType:  manifest.ResourceSecrets,
			ResourceNames: []string{g.readable},
			Actions:       []string{manifest.ActionReadSecret},
		}}
	} else if g.userPEM != "" {
		m.Users = map[string]genUser{BenchUser: {Certificate: g.userPEM}}
	}
	return m
}

// mount gives a Marble's parameters the n-th certificate secret as files and
// the n-th symmetric key in its environment, as templates.
func (g *generator) mount(p *genParameters, n int) {
	if len(g.certs) > 0 {
		c := g.certs[n%len(g.certs)]
		p.Files = map[string]string{
			"/etc/svc/tls/cert.pem": "{{ pem .Secrets." + c + ".Cert }}",
			"/etc/svc/tls/key.pem":  "{{ pem .Secrets." + c + ".Private }}",
			"/etc/svc/tls/ca.pem":   "{{ pem .MarbleRun.RootCA.Cert }}",
		}
	}
	if len(g.sym) > 0 {
		if p.Env == nil {
			p.Env = map[string]string{}
		}
		p.Env["DATA_KEY"] = "{{ hex .Secrets." + g.sym[n%len(g.sym)] + ".Private }}"
	}
}
