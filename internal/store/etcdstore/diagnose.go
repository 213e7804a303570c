package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"reflect"
	"syscall"
	"time"
)

// ErrTLS is wrapped by Connect's error when etcd answered but TLS between
// it and this client failed: its certificate is not trusted, it refused
// the client certificate (or its absence), or it speaks TLS on an http://
// endpoint.
var ErrTLS = errors.New("TLS with etcd failed")

// ErrUntrusted is wrapped, beside ErrTLS, by Connect's error when trust
// between this client and every etcd endpoint definitely failed: etcd's
// certificate is not signed by the configured CA (x509: unknown
// authority), or etcd refused the client certificate with a certificate
// alert (bad certificate, unknown CA, certificate required; RFC 8446
// section 6.2). Both are settings that waiting cannot cure (the CA and
// the client certificate are read once), so Connect gives up at once.
//
// Its text is not repeated in the error (which reads "TLS with etcd
// failed: …" and names the setting): it is wrapped with "%.0w".
var ErrUntrusted = errors.New("etcd's TLS trust failed")

// Certificate alerts that say the peer refused our certificate (RFC 8446
// section 6; RFC 5246 section 7.2.2).
const (
	alertBadCertificate      = 42
	alertUnknownCA           = 48
	alertCertificateRequired = 116
)

// http2Preface makes a gRPC server that accepted the TLS connection
// answer at once (with its SETTINGS), so that a refusal after the
// handshake (TLS 1.3 reports a refused client certificate only then) is
// told apart from an acceptance without waiting.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// diagnoseTLS looks for a TLS cause of a failed connect, which etcd's
// client only reports as a timeout: it dials each endpoint itself with
// conf (nil: no TLS options given) and returns the first TLS failure found
// (wrapping ErrTLS), or nil when none is found within timeout. definite
// reports that every endpoint failed with ErrUntrusted.
func diagnoseTLS(ctx context.Context, endpoints []string, conf *tls.Config, caFile string, timeout time.Duration) (err error, definite bool) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	found := make(chan error, len(endpoints))
	for _, ep := range endpoints {
		go func() { found <- probeTLS(ctx, ep, conf, caFile) }()
	}
	untrusted := 0
	for range endpoints {
		if e := <-found; e != nil {
			if err == nil {
				err = e
			}
			if errors.Is(e, ErrUntrusted) {
				untrusted++
			}
		}
	}
	return err, untrusted == len(endpoints)
}

func probeTLS(ctx context.Context, endpoint string, conf *tls.Config, caFile string) error {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		return nil
	}
	host, _, err := net.SplitHostPort(u.Host)
	if err != nil {
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if conf != nil {
		c = conf.Clone()
	}
	if c.ServerName == "" {
		c.ServerName = host
	}
	d := &tls.Dialer{Config: c}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	var verr *tls.CertificateVerificationError
	if u.Scheme == "http" {
		// Whether etcd speaks TLS there: a handshake that succeeds or
		// fails only on the certificate says so.
		if err == nil || errors.As(err, &verr) {
			if conn != nil {
				conn.Close()
			}
			return fmt.Errorf("%w: %s serves TLS; use https:// with the etcd CA (and client certificate)", ErrTLS, endpoint)
		}
		return nil
	}
	if err != nil {
		switch {
		case errors.As(err, &verr) && errors.As(verr.Err, new(x509.UnknownAuthorityError)):
			if caFile == "" {
				return fmt.Errorf("%w%.0w: %s: the server's certificate is not trusted: no etcd CA is set and no system root CA signed it; "+
					"set --etcd-ca (QUARRY_ETCD_CA) to the CA that signed etcd's server certificates: %v", ErrTLS, ErrUntrusted, endpoint, err)
			}
			return fmt.Errorf("%w%.0w: %s: the server's certificate is not trusted: the etcd CA %s did not sign it; "+
				"set --etcd-ca (QUARRY_ETCD_CA) to the CA that signed etcd's server certificates: %v", ErrTLS, ErrUntrusted, endpoint, caFile, err)
		case errors.As(err, &verr):
			return fmt.Errorf("%w: %s: the server's certificate is not trusted (wrong or missing etcd CA?): %v", ErrTLS, endpoint, err)
		case refusedCertificate(err):
			return clientCertRefused(endpoint, conf, err)
		case isAlert(err):
			return fmt.Errorf("%w: %s refused the TLS handshake (client certificate missing or not trusted by etcd?): %v", ErrTLS, endpoint, err)
		}
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			// etcd without TLS closes the connection on a TLS hello.
			return fmt.Errorf("%w: %s does not speak TLS (it answered the TLS hello with %v); use http:// if etcd serves no TLS", ErrTLS, endpoint, err)
		}
		return nil // not a TLS failure (refused, timed out, …)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte(http2Preface)); err == nil {
		var b [1]byte
		_, err = conn.Read(b[:])
		if refusedCertificate(err) {
			return clientCertRefused(endpoint, conf, err)
		}
		if isAlert(err) {
			return fmt.Errorf("%w: %s refused the client certificate (missing, or not signed by a CA etcd trusts): %v", ErrTLS, endpoint, err)
		}
	}
	return nil
}

// isAlert reports whether err is a TLS alert the server sent.
func isAlert(err error) bool {
	var op *net.OpError
	var alert tls.AlertError
	return (errors.As(err, &op) && op.Op == "remote error") || errors.As(err, &alert)
}

// refusedCertificate reports whether err is a certificate alert the server
// sent: it refused our client certificate or its absence. crypto/tls
// reports a received alert as a net.OpError "remote error" around its
// (unexported) alert type, a uint8 holding the alert's code.
func refusedCertificate(err error) bool {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return false
	}
	v := reflect.ValueOf(op.Err)
	if v.Kind() != reflect.Uint8 {
		return false
	}
	switch v.Uint() {
	case alertBadCertificate, alertUnknownCA, alertCertificateRequired:
		return true
	}
	return false
}

func clientCertRefused(endpoint string, conf *tls.Config, err error) error {
	if conf == nil || len(conf.Certificates) == 0 {
		return fmt.Errorf("%w%.0w: %s refused the client certificate: none is set and etcd requires one; "+
			"set --etcd-cert and --etcd-key (QUARRY_ETCD_CERT, QUARRY_ETCD_KEY) to one signed by a CA etcd trusts: %v", ErrTLS, ErrUntrusted, endpoint, err)
	}
	return fmt.Errorf("%w%.0w: %s refused the client certificate: etcd does not trust it; "+
		"set --etcd-cert and --etcd-key (QUARRY_ETCD_CERT, QUARRY_ETCD_KEY) to one signed by a CA etcd trusts: %v", ErrTLS, ErrUntrusted, endpoint, err)
}
