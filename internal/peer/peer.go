// Package peer transfers the data key between Coordinator instances that
// share one state (docs/ha.md, "The data key"): a joining instance dials a
// running one over mutual TLS and sends a fresh quote whose report data
// binds its TLS public key and the server's nonce; the server verifies the
// quote (the same DCAP verifier as Marble activation and sign-quote),
// checks that the joiner is the same enclave (UniqueKey: same MRENCLAVE;
// ProductKey: same MRSIGNER and ProductID, ISVSVN at least its own) and
// answers with the data key inside the verified TLS channel.
//
// The wire protocol (version 1), after the TLS 1.3 handshake in which both
// sides present a certificate (the client's is the key the quote binds):
//
//	server → client  {"version":1,"nonce":<32 random bytes>}
//	client → server  {"keyID":<32 bytes>,"quote":<raw quote, or empty in simulation>}
//	server → client  {"key":<data key>} or {"refused":<code>,"reason":<text>}
//
// Each message is a u32 big-endian length and that many bytes of JSON
// (at most MaxMessage). The report data of the quote is
//
//	SHA-256(client certificate's SubjectPublicKeyInfo) ‖ SHA-256("quarry peer key v1" ‖ nonce ‖ keyID)
//
// so a quote is good for one connection (the nonce), one key and one TLS
// key pair only. The package logs nothing: the server reports each
// exchange to a callback.
package peer

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"time"
)

// ProtocolVersion is the version of the wire protocol.
const ProtocolVersion = 1

// MaxMessage bounds one message of the protocol.
const MaxMessage = 256 << 10

// DefaultTimeout bounds one exchange (handshake and messages).
const DefaultTimeout = 10 * time.Second

const freshnessLabel = "quarry peer key v1"

// Reasons a server refuses to give the key. A refusal reaches the client
// as a *RefusedError that matches one of them with errors.Is.
var (
	ErrNoKey       = errors.New("peer: the peer does not hold the data key")
	ErrIdentity    = errors.New("peer: the joiner is not the same enclave")
	ErrBinding     = errors.New("peer: the quote does not bind the joiner's TLS key")
	ErrStale       = errors.New("peer: the quote is not fresh (not made for this connection's nonce and key)")
	ErrUnverified  = errors.New("peer: the quote does not verify")
	ErrSimulation  = errors.New("peer: no attestation (simulation) and --insecure-peer-trust is not set")
	ErrBadRequest  = errors.New("peer: malformed request")
	ErrBadResponse = errors.New("peer: malformed response")
)

var codes = map[string]error{
	"no-key": ErrNoKey, "identity": ErrIdentity, "binding": ErrBinding, "stale": ErrStale,
	"unverified": ErrUnverified, "simulation": ErrSimulation, "bad-request": ErrBadRequest,
}

func codeOf(err error) string {
	for c, e := range codes {
		if errors.Is(err, e) {
			return c
		}
	}
	return "bad-request"
}

// RefusedError is a refusal by the server: Code names the reason, Reason
// says it in words.
type RefusedError struct {
	Code   string
	Reason string
}

func (e *RefusedError) Error() string { return "peer refused: " + e.Reason }

// Is matches the sentinel of the code.
func (e *RefusedError) Is(target error) bool { return codes[e.Code] == target }

type hello struct {
	Version int    `json:"version"`
	Nonce   []byte `json:"nonce"`
}

type request struct {
	KeyID []byte `json:"keyID"`
	Quote []byte `json:"quote,omitempty"`
}

type response struct {
	Key     []byte `json:"key,omitempty"`
	Refused string `json:"refused,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// ReportData is what a joiner's quote must carry: it binds the TLS public
// key (cert's SubjectPublicKeyInfo), the server's nonce and the key ID.
func ReportData(cert *x509.Certificate, nonce []byte, keyID [32]byte) [64]byte {
	var rd [64]byte
	k := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	copy(rd[:32], k[:])
	h := sha256.New()
	h.Write([]byte(freshnessLabel))
	h.Write(nonce)
	h.Write(keyID[:])
	copy(rd[32:], h.Sum(nil))
	return rd
}

func writeMsg(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxMessage {
		return fmt.Errorf("peer: message of %d bytes exceeds %d", len(b), MaxMessage)
	}
	buf := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// readMsg reads one message into v; errBad wraps a malformed one.
func readMsg(r io.Reader, v any, errBad error) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxMessage {
		return fmt.Errorf("%w: message of %d bytes (at most %d)", errBad, n, MaxMessage)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %v", errBad, err)
	}
	return nil
}

// NewCertificate returns a fresh self-signed TLS certificate (ECDSA P-256)
// for one process: its key never leaves memory, and a quote binds it.
func NewCertificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "Quarry Coordinator peer"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}
