// Package peer transfers the data key between Coordinator instances that
// share one state (docs/ha.md, "The data key"), with mutual attestation: a
// joining instance dials a running one (its peer) over TLS 1.3, both sides
// present a certificate with a fresh key pair, and each proves with a
// quote that it is the same enclave. The peer verifies the joiner's quote
// before it answers with the data key; the joiner verifies the peer's
// quote before it uses the key. Both apply one rule (samePackage): for
// the state's seal mode UniqueKey the same MRENCLAVE; for ProductKey (and
// the others) the same MRSIGNER and ProductID with an ISVSVN at least the
// verifier's own; the debug attribute as the verifier's own; the TCB
// status rules of policy.Check. The quotes are checked with the same DCAP
// verifier as Marble activation and sign-quote.
//
// The wire protocol (version 2), after the TLS 1.3 handshake:
//
//	peer   → joiner  {"version":2,"nonce":<32 random bytes>}
//	joiner → peer    {"version":2,"keyID":<32 bytes>,"nonce":<32 random bytes>,
//	                  "quote":<the joiner's quote, or empty in simulation>}
//	peer   → joiner  {"key":<data key>,"mode":"ProductKey"|"UniqueKey",
//	                  "quote":<the peer's quote, or empty in simulation>}
//	                 or {"refused":<code>,"reason":<text>}
//
// Each message is a u32 big-endian length and that many bytes of JSON (at
// most MaxMessage). Both quotes bind this very TLS session through its
// exporter value E = the TLS exporter (RFC 8446 section 7.5) with label
// ExporterLabel, no context, 32 bytes, which only the two ends of the
// session know. The report data of the joiner's quote is
//
//	SHA-256(joiner certificate's SubjectPublicKeyInfo) ‖
//	SHA-256("quarry peer key v2 joiner" ‖ E ‖ peer's nonce ‖ keyID)
//
// and that of the peer's quote
//
//	SHA-256(peer certificate's SubjectPublicKeyInfo) ‖
//	SHA-256("quarry peer key v2 peer" ‖ E ‖ joiner's nonce ‖ keyID ‖ mode)
//
// so a quote is good for one session, one nonce of the other side, one
// key and one TLS key pair only, and neither side's quote passes as the
// other's. The mode is the seal mode of the state the peer opens with the
// key: the joiner checks the peer against it before it decrypts anything,
// and once the state is open it checks the peer again against the state's
// own seal mode (Key.Allows). A genuine enclave states the truth, and an
// impostor has no quote that binds the session.
//
// Without an enclave (simulation) there are no quotes: a peer gives the
// key to a joiner without a quote, and a joiner accepts a key without a
// quote, only when that side runs without an enclave too and has
// InsecureTrust (--insecure-peer-trust). An enclave never gives or accepts
// a key without a verified quote. Version 1 (only the joiner quoted) is
// refused. The package logs nothing: the server reports each exchange to a
// callback, and the client returns what it found.
package peer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"time"

	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/manifest"
)

// ProtocolVersion is the version of the wire protocol.
const ProtocolVersion = 2

// MaxMessage bounds one message of the protocol.
const MaxMessage = 256 << 10

// DefaultTimeout bounds one exchange (handshake and messages).
const DefaultTimeout = 10 * time.Second

// ExporterLabel is the label of the TLS exporter value both quotes bind.
const ExporterLabel = "EXPORTER-quarry-peer-key-v2"

const (
	joinerLabel = "quarry peer key v2 joiner"
	peerLabel   = "quarry peer key v2 peer"
	nonceSize   = 32
)

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
	ErrVersion     = errors.New("peer: the other side speaks another protocol version")
	ErrSelfQuote   = errors.New("peer: the peer cannot quote its own enclave")
)

// Reasons a joiner refuses the key a peer gave (returned by Client.Fetch;
// never a *RefusedError, which is the peer's refusal).
var (
	ErrPeerUnattested = errors.New("peer: the peer sent the key without a quote")
	ErrPeerUnverified = errors.New("peer: the peer's quote does not verify")
	ErrPeerBinding    = errors.New("peer: the peer's quote does not bind this connection's TLS key")
	ErrPeerStale      = errors.New("peer: the peer's quote is not fresh (not made for this session, nonce, key and seal mode)")
	ErrPeerIdentity   = errors.New("peer: the peer is not the same enclave")
)

var codes = map[string]error{
	"no-key": ErrNoKey, "identity": ErrIdentity, "binding": ErrBinding, "stale": ErrStale,
	"unverified": ErrUnverified, "simulation": ErrSimulation, "bad-request": ErrBadRequest,
	"version": ErrVersion, "self-quote": ErrSelfQuote,
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
	Version int    `json:"version"`
	KeyID   []byte `json:"keyID"`
	Nonce   []byte `json:"nonce"`
	Quote   []byte `json:"quote,omitempty"`
}

type response struct {
	Key     []byte `json:"key,omitempty"`
	Mode    string `json:"mode,omitempty"`
	Quote   []byte `json:"quote,omitempty"`
	Refused string `json:"refused,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// Exporter returns the TLS exporter value of a session that both quotes
// bind (ExporterLabel, no context, 32 bytes).
func Exporter(cs tls.ConnectionState) ([]byte, error) {
	return cs.ExportKeyingMaterial(ExporterLabel, nil, 32)
}

// JoinerReportData is what a joiner's quote must carry: it binds the
// joiner's TLS public key (cert's SubjectPublicKeyInfo), the session's
// exporter value, the peer's nonce and the key ID.
func JoinerReportData(cert *x509.Certificate, exporter, peerNonce []byte, keyID [32]byte) [64]byte {
	return reportData(cert, joinerLabel, exporter, peerNonce, keyID[:])
}

// PeerReportData is what a peer's quote must carry: it binds the peer's
// TLS public key, the session's exporter value, the joiner's nonce, the
// key ID and the seal mode the peer states.
func PeerReportData(cert *x509.Certificate, exporter, joinerNonce []byte, keyID [32]byte, mode string) [64]byte {
	return reportData(cert, peerLabel, exporter, joinerNonce, keyID[:], []byte(mode))
}

// reportData is SHA-256(cert's SubjectPublicKeyInfo) ‖ SHA-256(label ‖
// parts...). Every part but the last has a fixed size, and the labels
// differ before their ends, so no two inputs hash the same parts.
func reportData(cert *x509.Certificate, label string, parts ...[]byte) [64]byte {
	var rd [64]byte
	k := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	copy(rd[:32], k[:])
	h := sha256.New()
	h.Write([]byte(label))
	for _, p := range parts {
		h.Write(p)
	}
	copy(rd[32:], h.Sum(nil))
	return rd
}

// reportDataOf returns the report data of a verified quote (SGX or TDX).
func reportDataOf(vr *dcap.Result) [64]byte {
	if vr.TDX != nil {
		return vr.TDX.Report.ReportData
	}
	return vr.Report.ReportData()
}

// checkBinding compares the report data of a verified quote with want:
// the first half (the TLS key) gives errBinding, the second (session,
// nonce, key, mode) errStale.
func checkBinding(vr *dcap.Result, want [64]byte, errBinding, errStale error) error {
	rd := reportDataOf(vr)
	if !bytes.Equal(rd[:32], want[:32]) {
		return fmt.Errorf("%w: the quote's report data binds %x, the TLS key is %x", errBinding, rd[:8], want[:8])
	}
	if !bytes.Equal(rd[32:], want[32:]) {
		return errStale
	}
	return nil
}

// PolicyMode is the seal mode whose rules apply to a state with SealMode
// mode: UniqueKey, or ProductKey for every other mode (the default "").
func PolicyMode(mode string) string {
	if mode == seal.ModeUniqueKey {
		return mode
	}
	return seal.ModeProductKey
}

// samePackage is the manifest package another instance must satisfy for a
// state with seal mode mode: this enclave's MRENCLAVE (UniqueKey), or its
// MRSIGNER and ProductID with an ISVSVN at least its own (ProductKey, and
// any other mode); the debug attribute as its own.
func samePackage(self *sgxquote.ReportBody, mode string) manifest.Package {
	pkg := manifest.Package{Debug: self.Debug()}
	if PolicyMode(mode) == seal.ModeUniqueKey {
		mr := self.MRENCLAVE()
		pkg.UniqueID = hex.EncodeToString(mr[:])
		return pkg
	}
	signer := self.MRSIGNER()
	prod, svn := uint64(self.ISVProdID()), uint(self.ISVSVN())
	pkg.SignerID = hex.EncodeToString(signer[:])
	pkg.ProductID, pkg.SecurityVersion = &prod, &svn
	return pkg
}

// Verifier verifies a DCAP quote (core.QuoteVerifier, dcap.Verifier).
type Verifier interface {
	Verify(ctx context.Context, quote []byte) (*dcap.Result, error)
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
	// The buffer grows with the bytes that arrive, not with the length
	// the other side claims before anyone is authenticated.
	var buf bytes.Buffer
	if _, err := io.CopyN(&buf, r, int64(n)); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if err := json.Unmarshal(buf.Bytes(), v); err != nil {
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
