package injector

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
)

// MaxBody bounds an AdmissionReview request's size (the API server's
// requests are far smaller: a Pod is bounded by etcd's 1.5 MiB).
const MaxBody = 8 << 20

// Paths served by Handler.
const (
	PathMutate  = "/mutate"
	PathHealthz = "/healthz"
)

// Handler serves the webhook: POST PathMutate with an AdmissionReview
// (Content-Type application/json), and GET PathHealthz. observe, if not
// nil, is told the outcome of each review request (the response, or the
// error answered with an HTTP error status) so that the caller can log it.
func (in *Injector) Handler(observe func(*admissionv1.AdmissionResponse, error)) http.Handler {
	if observe == nil {
		observe = func(*admissionv1.AdmissionResponse, error) {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc(PathHealthz, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc(PathMutate, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed: the API server POSTs an AdmissionReview here", http.StatusMethodNotAllowed)
			observe(nil, fmt.Errorf("%w: method %s", ErrBadReview, r.Method))
			return
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			http.Error(w, "unsupported content type: want application/json", http.StatusUnsupportedMediaType)
			observe(nil, fmt.Errorf("%w: content type %q", ErrBadReview, r.Header.Get("Content-Type")))
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
		if err != nil {
			status := http.StatusBadRequest
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				status = http.StatusRequestEntityTooLarge
			}
			http.Error(w, "reading the request: "+err.Error(), status)
			observe(nil, fmt.Errorf("%w: %v", ErrBadReview, err))
			return
		}
		out, resp, err := in.Review(body)
		if err != nil {
			status := http.StatusInternalServerError
			if errors.Is(err, ErrBadReview) {
				status = http.StatusBadRequest
			}
			http.Error(w, err.Error(), status)
			observe(nil, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
		observe(resp, nil)
	})
	return mux
}

// CertReloader serves the key pair in two PEM files and reads them again
// when either file changes (cert-manager and kubelet replace a mounted
// Secret's files in place), at most once per second.
type CertReloader struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string
	checked time.Time
}

// NewCertReloader loads the pair once, so that a missing or bad file is
// an error at start.
func NewCertReloader(certFile, keyFile string) (*CertReloader, error) {
	c := &CertReloader{certFile: certFile, keyFile: keyFile}
	if _, err := c.GetCertificate(nil); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *CertReloader) fileStamp() string {
	var s string
	for _, f := range []string{c.certFile, c.keyFile} {
		if fi, err := os.Stat(f); err == nil {
			s += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
		}
	}
	return s
}

// GetCertificate is for tls.Config.GetCertificate. A pair that fails to
// load keeps the previous one in use.
func (c *CertReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && time.Since(c.checked) < time.Second {
		return c.cert, nil
	}
	c.checked = time.Now()
	stamp := c.fileStamp()
	if c.cert != nil && stamp == c.stamp {
		return c.cert, nil
	}
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		if c.cert != nil {
			return c.cert, nil
		}
		return nil, fmt.Errorf("loading the webhook's TLS key pair (%s, %s): %w", c.certFile, c.keyFile, err)
	}
	c.cert, c.stamp = &pair, stamp
	return c.cert, nil
}
