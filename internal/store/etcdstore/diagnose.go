package etcdstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"syscall"
	"time"
)

// ErrTLS is wrapped by Connect's error when etcd answered but TLS between
// it and this client failed: its certificate is not trusted, it refused
// the client certificate (or its absence), or it speaks TLS on an http://
// endpoint.
var ErrTLS = errors.New("TLS with etcd failed")

// http2Preface makes a gRPC server that accepted the TLS connection
// answer at once (with its SETTINGS), so that a refusal after the
// handshake (TLS 1.3 reports a refused client certificate only then) is
// told apart from an acceptance without waiting.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// diagnoseTLS looks for a TLS cause of a failed connect, which etcd's
// client only reports as a timeout: it dials each endpoint itself with
// conf (nil: no TLS options given) and returns the first TLS failure found
// (wrapping ErrTLS), or nil when none is found within timeout.
func diagnoseTLS(ctx context.Context, endpoints []string, conf *tls.Config, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	found := make(chan error, len(endpoints))
	for _, ep := range endpoints {
		go func() { found <- probeTLS(ctx, ep, conf) }()
	}
	for range endpoints {
		if err := <-found; err != nil {
			return err
		}
	}
	return nil
}

func probeTLS(ctx context.Context, endpoint string, conf *tls.Config) error {
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
		case errors.As(err, &verr):
			return fmt.Errorf("%w: %s: the server's certificate is not trusted (wrong or missing etcd CA?): %v", ErrTLS, endpoint, err)
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
