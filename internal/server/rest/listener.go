package rest

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"time"
)

// recordTypeHandshake is the first byte of every TLS connection: the
// record type of the ClientHello.
const recordTypeHandshake = 0x16

// Bounds of the plain-HTTP answer on the TLS port.
const (
	plainHeadLimit = 16 << 10 // read at most this much of the request
	plainLinger    = time.Second
	plainDrain     = 64 << 10
)

// errPlainHTTP is what the TLS handshake reports for a connection that
// spoke plain HTTP; it has been answered already.
var errPlainHTTP = errors.New("client sent plain HTTP to the HTTPS port; answered 400")

// errNotTLS is the answer to plain HTTP on the TLS port.
var errNotTLS = &bodyError{msg: "this port speaks HTTPS only: send the request over TLS (https://)"}

// GuardPlainHTTP wraps the Client API's TCP listener, below TLS: a
// connection whose first byte is not a TLS handshake record (a client
// speaking plain HTTP to the HTTPS port) gets a JSend 400 saying that this
// port speaks HTTPS, and is closed; net/http would answer in plain text.
func GuardPlainHTTP(ln net.Listener) net.Listener { return guardListener{ln} }

type guardListener struct{ net.Listener }

func (l guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c}, nil
}

// guardConn inspects the first byte read from the connection. The read
// happens in the TLS handshake, in the connection's own goroutine and
// under net/http's handshake deadline, so Accept never waits for a client.
type guardConn struct {
	net.Conn
	checked bool
}

// NetConn returns the wrapped connection (as tls.Conn's NetConn does), so
// that wrappers below can be found (admission.Listener.ConnState).
func (c *guardConn) NetConn() net.Conn { return c.Conn }

func (c *guardConn) Read(p []byte) (int, error) {
	if c.checked || len(p) == 0 {
		return c.Conn.Read(p)
	}
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	c.checked = true
	if p[0] == recordTypeHandshake {
		return n, err
	}
	c.answerPlain(bytes.Clone(p[:n]))
	return 0, errPlainHTTP
}

// answerPlain reads the rest of the request head (bounded), writes a JSend
// 400 in the envelope of the requested path's generation, and lingers
// briefly reading what the client still sends, so that closing does not
// reset the connection before the client has read the answer.
func (c *guardConn) answerPlain(head []byte) {
	buf := make([]byte, 4096)
	for !bytes.Contains(head, []byte("\r\n\r\n")) && len(head) < plainHeadLimit {
		n, err := c.Conn.Read(buf)
		head = append(head, buf[:n]...)
		if err != nil {
			break
		}
	}
	v1 := true
	if line, _, ok := bytes.Cut(head, []byte("\r\n")); ok {
		if f := strings.Fields(string(line)); len(f) == 3 && strings.HasPrefix(f[1], "/api/v2/") {
			v1 = false
		}
	}
	if _, err := c.Conn.Write(rawAnswer(errNotTLS, v1)); err != nil {
		return
	}
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.Conn.SetReadDeadline(time.Now().Add(plainLinger))
	io.CopyN(io.Discard, c.Conn, plainDrain)
}
