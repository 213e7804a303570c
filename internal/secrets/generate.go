package secrets

import (
	"cmp"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/manifest"
)

// DefaultCommonName is the subject common name of a generated certificate
// whose template has none and does not have exactly one DNS name.
const DefaultCommonName = "MarbleRun Generated Certificate"

// ErrNoIssuer means a certificate had to be generated without an issuer
// certificate and key.
var ErrNoIssuer = errors.New("no issuer certificate and key for secret certificates")

// Issuer signs generated certificates: the Coordinator passes the Marble
// root certificate (whose subject becomes the issuer) and the intermediate
// key (which shares the Marble root's key).
type Issuer struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Generate produces the stored secrets of a manifest at manifest set.
//
//   - shared, not user-defined symmetric-key: Size/8 random bytes, Private =
//     Public = key.
//   - shared, not user-defined cert-*: a fresh key and a certificate from the
//     definition's template (see GenerateCert).
//   - user-defined (any type, plain included): the bare definition, to be
//     uploaded later.
//   - per-Marble (Shared false, not user-defined): the definition without
//     values; values are made at each Marble activation (DerivePerMarble,
//     GenerateCert). Certificate definitions get ValidFor written back.
//
// Definitions are checked first (type, size, validity; errors wrap
// ErrInvalid). The values are then generated in parallel by at most
// runtime.GOMAXPROCS(0) workers. rand is only read under a lock, so any
// reader will do. When several secrets fail, the error returned is the one
// of the alphabetically first failing secret; every error names its secret
// (*Error).
func Generate(rand io.Reader, defs map[string]manifest.Secret, issuer Issuer, now time.Time) (map[string]Secret, error) {
	names := make([]string, 0, len(defs))
	for name := range defs {
		names = append(names, name)
	}
	slices.Sort(names)

	out := make(map[string]Secret, len(defs))
	var jobs []string // names to generate, sorted
	for _, name := range names {
		def := defs[name]
		if def.UserDefined {
			if err := checkType(name, def); err != nil {
				return nil, err
			}
			out[name] = definition(def)
			continue
		}
		if err := checkGenerated(name, def); err != nil {
			return nil, err
		}
		if !def.Shared {
			s := definition(def)
			if isCertType(def.Type) && s.NotAfter.IsZero() && s.ValidFor == 0 {
				s.ValidFor = DefaultValidFor
			}
			out[name] = s
			continue
		}
		jobs = append(jobs, name)
	}

	values, err := generateAll(&lockedReader{r: rand}, jobs, defs, issuer, now)
	if err != nil {
		return nil, err
	}
	for i, name := range jobs {
		out[name] = values[i]
	}
	return out, nil
}

// generateAll generates defs[jobs[i]] into result[i] with a bounded pool.
// Once a job has failed, jobs after it (in jobs order) are skipped; jobs
// before it always run, so the first failing job's error is reported
// whatever the scheduling.
func generateAll(rand io.Reader, jobs []string, defs map[string]manifest.Secret, issuer Issuer, now time.Time) ([]Secret, error) {
	results := make([]Secret, len(jobs))
	errs := make([]error, len(jobs))
	workers := min(runtime.GOMAXPROCS(0), len(jobs))

	// Workers take the most expensive jobs first (RSA key generation
	// dominates), so that the slowest job never starts last. Indices and
	// the first-error rule stay in name order.
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(cost(defs[jobs[b]]), cost(defs[jobs[a]])) })

	var next atomic.Int64
	var firstFailed atomic.Int64
	firstFailed.Store(int64(len(jobs)))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= len(jobs) {
					return
				}
				i := order[k]
				if int64(i) > firstFailed.Load() {
					continue
				}
				name := jobs[i]
				s, err := generateOne(rand, name, defs[name], issuer, now)
				if err != nil {
					errs[i] = err
					for {
						cur := firstFailed.Load()
						if int64(i) >= cur || firstFailed.CompareAndSwap(cur, int64(i)) {
							break
						}
					}
					continue
				}
				results[i] = s
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return results, nil
}

// cost ranks how long generating a secret takes: RSA keys by far the
// longest (growing with the size), then ECDSA, Ed25519, symmetric keys.
func cost(def manifest.Secret) uint {
	switch def.Type {
	case manifest.SecretTypeCertRSA:
		return 1_000_000 + def.Size
	case manifest.SecretTypeCertECDSA:
		return 1_000 + def.Size
	case manifest.SecretTypeCertED25519:
		return 500
	}
	return def.Size / 8
}

// generateOne makes the value of one shared secret (definition checked).
func generateOne(rand io.Reader, name string, def manifest.Secret, issuer Issuer, now time.Time) (Secret, error) {
	if def.Type == manifest.SecretTypeSymmetric {
		key := make([]byte, def.Size/8)
		if _, err := io.ReadFull(rand, key); err != nil {
			return Secret{}, failed(name, err)
		}
		s := definition(def)
		s.Private, s.Public = key, key
		return s, nil
	}
	return newCert(rand, name, def, issuer, now)
}

// GenerateCert makes a new key pair and certificate for the cert-*
// definition def named name, signed by issuer, valid from now. The result
// holds Cert (DER), Private (PKCS#8) and Public (PKIX), and ValidFor
// written back (DefaultValidFor when the definition gives no validity).
// Generate uses it for shared certificates; Marble activation uses it for
// per-Marble ones.
//
// The template rules (docs/design/behaviour.md#secret-certificate-templates): the serial is random in
// [0, 2^128); NotBefore is now; BasicConstraintsValid is true and IsCA comes
// from the template; nil DNSNames become ["localhost"] (an explicit empty
// list stays empty); nil IPAddresses become 127.0.0.1 and ::1; nil
// ExtKeyUsage becomes ServerAuth and ClientAuth; an empty CommonName becomes
// the only DNS name if there is exactly one, else DefaultCommonName;
// NotAfter, unless the template sets it, is now + ValidFor days.
//
// KeyUsage 0 becomes DigitalSignature (plus KeyEncipherment for RSA keys)
// for a leaf, and DigitalSignature|CertSign for a CA template. MarbleRun
// gives every certificate CertSign, including leaves (CA:FALSE), which
// contradicts RFC 5280 §4.2.1.3; Quarry does not copy that.
func GenerateCert(rand io.Reader, name string, def manifest.Secret, issuer Issuer, now time.Time) (Secret, error) {
	if def.UserDefined || !isCertType(def.Type) {
		return Secret{}, invalidf(name, "secret %s of type %s is not a certificate the Coordinator generates", name, def.Type)
	}
	if err := checkGenerated(name, def); err != nil {
		return Secret{}, err
	}
	return newCert(rand, name, def, issuer, now)
}

// newCert implements GenerateCert for a checked definition.
func newCert(rand io.Reader, name string, def manifest.Secret, issuer Issuer, now time.Time) (Secret, error) {
	if issuer.Cert == nil || issuer.Key == nil {
		return Secret{}, failed(name, ErrNoIssuer)
	}
	priv, pub, err := newKey(rand, def)
	if err != nil {
		return Secret{}, failed(name, err)
	}
	serial, err := ca.SerialNumber(rand)
	if err != nil {
		return Secret{}, failed(name, err)
	}

	s := definition(def)
	tmpl := def.Cert // a shallow copy; its slices are replaced, never changed
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now
	tmpl.BasicConstraintsValid = true
	if tmpl.DNSNames == nil {
		tmpl.DNSNames = []string{"localhost"}
	}
	if tmpl.IPAddresses == nil {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	if tmpl.KeyUsage == 0 {
		tmpl.KeyUsage = defaultKeyUsage(def.Type, tmpl.IsCA)
	}
	if tmpl.ExtKeyUsage == nil {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	if tmpl.Subject.CommonName == "" {
		if len(tmpl.DNSNames) == 1 {
			tmpl.Subject.CommonName = tmpl.DNSNames[0]
		} else {
			tmpl.Subject.CommonName = DefaultCommonName
		}
	}
	if tmpl.NotAfter.IsZero() {
		if s.ValidFor == 0 {
			s.ValidFor = DefaultValidFor
		}
		tmpl.NotAfter = now.Add(time.Duration(s.ValidFor) * 24 * time.Hour)
	}
	// Fields that describe an existing certificate, not a request.
	tmpl.Raw, tmpl.RawTBSCertificate, tmpl.RawSubjectPublicKeyInfo = nil, nil, nil
	tmpl.RawSubject, tmpl.RawIssuer, tmpl.Signature = nil, nil, nil
	tmpl.PublicKey = nil

	der, err := ca.CreateCertificate(rand, &tmpl, issuer.Cert, pub, issuer.Key)
	if err != nil {
		return Secret{}, invalidCause(name, err, "creating certificate for secret %s", name)
	}
	s.Private, err = x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return Secret{}, failed(name, err)
	}
	s.Public, err = x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return Secret{}, failed(name, err)
	}
	s.Cert = der
	return s, nil
}

func defaultKeyUsage(typ string, isCA bool) x509.KeyUsage {
	if isCA {
		return x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign
	}
	if typ == manifest.SecretTypeCertRSA {
		return x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	}
	return x509.KeyUsageDigitalSignature
}

// newKey generates the key pair of a checked cert-* definition.
func newKey(rand io.Reader, def manifest.Secret) (crypto.Signer, crypto.PublicKey, error) {
	switch def.Type {
	case manifest.SecretTypeCertECDSA:
		curve, _ := curveForSize(def.Size)
		k, err := ecdsa.GenerateKey(curve, rand)
		if err != nil {
			return nil, nil, err
		}
		return k, &k.PublicKey, nil
	case manifest.SecretTypeCertRSA:
		k, err := rsa.GenerateKey(rand, int(def.Size))
		if err != nil {
			return nil, nil, err
		}
		return k, &k.PublicKey, nil
	default: // manifest.SecretTypeCertED25519
		pub, k, err := ed25519.GenerateKey(rand)
		if err != nil {
			return nil, nil, err
		}
		return k, pub, nil
	}
}

// curveForSize maps a cert-ecdsa size to its NIST curve.
func curveForSize(size uint) (elliptic.Curve, bool) {
	switch size {
	case 224:
		return elliptic.P224(), true
	case 256:
		return elliptic.P256(), true
	case 384:
		return elliptic.P384(), true
	case 521:
		return elliptic.P521(), true
	}
	return nil, false
}

// lockedReader serialises reads so that one reader can serve all workers.
type lockedReader struct {
	mu sync.Mutex
	r  io.Reader
}

func (l *lockedReader) Read(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Read(p)
}

var _ io.Reader = (*lockedReader)(nil)
