package loadgen

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/quarry-cc/quarry/api/marblepb"
)

// The activate scenario drives a Coordinator's Marble API: N simulated
// Marbles (-c) call /rpc.Marble/Activate over gRPC and TLS, as MarbleRun's
// premain and Quarry's marble.Activate do, again and again for the
// duration. Each Marble makes its key (ECDSA P-384), self-signed TLS client
// certificate, CSR and UUID once, before the run, as a premain does; it then
// re-activates with the same UUID, which a Coordinator allows. So the
// client's key generation is not measured; what is measured is the
// Coordinator's activation (in simulation the quote is empty and not
// checked) plus gRPC. By default each Marble keeps one connection (TLS
// handshake once, in the warm-up); with ActivateConfig.Reconnect each
// activation opens a connection of its own, as a real Marble does, and the
// handshake is part of each activation.
//
// With a started Coordinator the scenario runs twice, on a fresh
// Coordinator each (per-Marble secrets are made for every Marble type of a
// manifest): activate-shared (a manifest whose secrets are all shared) and
// activate-cert (also a per-Marble ECDSA certificate and a per-Marble
// symmetric key, made at every activation).

// Marble types and result names of the started Coordinator's activation
// manifests.
const (
	ActivateMarbleShared = "bench-shared"
	ActivateMarbleCert   = "bench-cert"

	activateShared = ScenarioActivate + "-shared"
	activateCert   = ScenarioActivate + "-cert"
)

// activateVariant is one run of the activate scenario with a started
// Coordinator.
type activateVariant struct {
	name       string // of the result
	marbleType string
	perMarble  bool
	desc       string
}

var activateVariants = []activateVariant{
	{activateShared, ActivateMarbleShared, false, "shared secrets only"},
	{activateCert, ActivateMarbleCert, true, "per-Marble certificate and key"},
}

// ActivateManifest returns the manifest the started Coordinator gets for the
// activate scenario: one package and one Marble type, ActivateMarbleShared
// with a shared ECDSA certificate and a shared symmetric key in its files and
// environment or, with perMarble, ActivateMarbleCert with these and a
// per-Marble ECDSA P-256 certificate and a per-Marble 256-bit symmetric key.
// No MaxActivations: activations are not counted in the sealed state.
func ActivateManifest(perMarble bool) ([]byte, error) {
	type obj = map[string]any
	secrets := obj{
		"shared_cert": obj{"Type": "cert-ecdsa", "Size": 256, "Shared": true},
		"shared_key":  obj{"Type": "symmetric-key", "Size": 256, "Shared": true},
	}
	files := obj{
		"/secrets/shared.crt": "{{pem .Secrets.shared_cert.Cert}}",
		"/secrets/shared.key": "{{pem .Secrets.shared_cert.Private}}",
	}
	env := obj{"SHARED_KEY": "{{hex .Secrets.shared_key.Private}}"}
	marbleType := ActivateMarbleShared
	if perMarble {
		marbleType = ActivateMarbleCert
		secrets["marble_cert"] = obj{"Type": "cert-ecdsa", "Size": 256}
		secrets["marble_key"] = obj{"Type": "symmetric-key", "Size": 256}
		files["/secrets/marble.crt"] = "{{pem .Secrets.marble_cert.Cert}}"
		files["/secrets/marble.key"] = "{{pem .Secrets.marble_cert.Private}}"
		env["MARBLE_KEY"] = "{{hex .Secrets.marble_key.Private}}"
	}
	return json.MarshalIndent(obj{
		"Packages": obj{"bench": obj{
			"SignerID":        strings.Repeat("51", 32),
			"ProductID":       1,
			"SecurityVersion": 1,
		}},
		"Marbles": obj{marbleType: obj{
			"Package":    "bench",
			"Parameters": obj{"Files": files, "Env": env, "Argv": []string{"./marble", "--serve"}},
		}},
		"Secrets": secrets,
	}, "", "  ")
}

// ActivateConfig says how RunActivate drives a Marble API.
type ActivateConfig struct {
	// Addr is the Marble API (mesh) address, host:port.
	Addr string
	// MarbleType is the Marble type every activation asks for.
	MarbleType string
	// Marbles is the number of concurrent Marbles, each with its own
	// identity and connection.
	Marbles int
	// Duration is the measured time; Warmup runs before it, not counted.
	Duration, Warmup time.Duration
	// Timeout bounds each activation; 0 means no limit other than the end
	// of the run.
	Timeout time.Duration
	// Reconnect opens a new connection (TCP and TLS handshake) for every
	// activation instead of keeping one per Marble.
	Reconnect bool
	// Resume, with Reconnect, keeps each Marble's TLS session ticket and
	// resumes it on the next connection (a Marble process that comes back
	// to the Coordinator); without it every handshake is a full one, as a
	// newly started Marble's.
	Resume bool
	// KeyP256 makes each Marble's TLS key ECDSA P-256, as Quarry's Marble
	// runtime (package marble, quarry-premain) makes it; without it the
	// key is P-384, as MarbleRun's premain makes it.
	KeyP256 bool
}

// maxActivationAnswer bounds an activation answer (the rendered Files and
// Env), as marble.MaxResponseSize does.
const maxActivationAnswer = 128 << 20

// RunActivate activates cfg.Marbles Marbles again and again for
// cfg.Warmup+cfg.Duration and returns what was measured in cfg.Duration, as
// Run does: an activation counts when its answer arrives in the window. A
// refused activation (a gRPC status from the Coordinator, or an answer
// without the Marble's certificate) counts as an answer in Non2xx; gRPC's
// Unavailable, DeadlineExceeded and Canceled are transport errors (Errors).
func RunActivate(ctx context.Context, cfg ActivateConfig) (RunResult, error) {
	if cfg.Marbles < 1 {
		return RunResult{}, errors.New("at least one Marble is needed")
	}
	if cfg.Duration <= 0 || cfg.Warmup < 0 {
		return RunResult{}, errors.New("the duration must be positive and the warm-up not negative")
	}
	if cfg.Addr == "" || cfg.MarbleType == "" {
		return RunResult{}, errors.New("the Marble API address and the Marble type are needed")
	}
	var dials atomic.Int64
	marbles := make([]*activateMarble, cfg.Marbles)
	for i := range marbles {
		m, err := newActivateMarble(cfg, &dials)
		if err != nil {
			for _, m := range marbles[:i] {
				m.close()
			}
			return RunResult{}, err
		}
		marbles[i] = m
	}
	from := time.Now().Add(cfg.Warmup)
	to := from.Add(cfg.Duration)
	runCtx, cancel := context.WithDeadline(ctx, to)
	defer cancel()
	results := make([]workerResult, len(marbles))
	var wg sync.WaitGroup
	for i, m := range marbles {
		wg.Go(func() {
			results[i] = m.work(runCtx, from, to)
			m.close()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return RunResult{}, err
	}
	return combine(results, cfg.Duration, dials.Load()), nil
}

// activateMarble is one simulated Marble: its identity, made once, and its
// connection.
type activateMarble struct {
	cfg   ActivateConfig
	req   *marblepb.ActivationReq
	creds credentials.TransportCredentials
	dial  func(context.Context, string) (net.Conn, error)
	conn  *grpc.ClientConn // kept unless cfg.Reconnect
}

// newActivateMarble makes a Marble's identity as a premain does: a P-384
// key (P-256 with KeyP256, as Quarry's runtime), a self-signed certificate for TLS (the one a quote would cover), a
// CSR with the same SANs, a random UUID; the quote is empty (simulation).
func newActivateMarble(cfg ActivateConfig, dials *atomic.Int64) (*activateMarble, error) {
	curve := elliptic.P384()
	if cfg.KeyP256 {
		curve = elliptic.P256()
	}
	key, err := ecdsa.GenerateKey(curve, rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "MarbleRun Marble"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		DNSNames: tmpl.DNSNames, IPAddresses: tmpl.IPAddresses,
	}, key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	m := &activateMarble{
		cfg: cfg,
		req: &marblepb.ActivationReq{Quote: []byte{}, CSR: csr, MarbleType: cfg.MarbleType, UUID: uuid.NewString()},
		// Marbles do not verify the Coordinator's certificate
		// (docs/design/behaviour.md#marble-api); they check it through the
		// parameters they receive.
	}
	tlsCfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true,
		Certificates:       []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}},
	}
	if cfg.Resume {
		tlsCfg.ClientSessionCache = tls.NewLRUClientSessionCache(1)
	}
	m.creds = credentials.NewTLS(tlsCfg)
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	m.dial = func(ctx context.Context, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			dials.Add(1)
		}
		return conn, err
	}
	if !cfg.Reconnect {
		if m.conn, err = m.newConn(); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// newConn returns a client connection; it connects at its first call.
func (m *activateMarble) newConn() (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+m.cfg.Addr,
		grpc.WithTransportCredentials(m.creds),
		grpc.WithContextDialer(m.dial),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxActivationAnswer)),
		grpc.WithUserAgent(userAgent))
}

func (m *activateMarble) close() {
	if m.conn != nil {
		m.conn.Close()
		m.conn = nil
	}
}

// work is one Marble's loop (as work in runner.go).
func (m *activateMarble) work(ctx context.Context, from, to time.Time) workerResult {
	w := workerResult{lat: make([]time.Duration, 0, 1024)}
	for {
		start := time.Now()
		if !start.Before(to) || ctx.Err() != nil {
			return w
		}
		var p peer.Peer
		resp, err := m.activate(ctx, w.proto == "", &p)
		end := time.Now()
		if end.After(to) || ctx.Err() != nil {
			return w // cut off by the end of the run
		}
		if w.proto == "" {
			if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
				w.proto = "gRPC, " + tls.VersionName(info.State.Version)
			}
		}
		if end.Before(from) {
			continue // warm-up
		}
		if err != nil {
			st, isStatus := status.FromError(err)
			if !isStatus || transportCode(st.Code()) {
				w.errors++
			} else {
				w.lat = append(w.lat, end.Sub(start))
				w.non2xx++
			}
			if w.firstErr == "" {
				w.firstErr = fmt.Sprintf("gRPC %s: %s", st.Code(), st.Message())
			}
			continue
		}
		w.lat = append(w.lat, end.Sub(start))
		w.bytes += int64(proto.Size(resp))
		if len(resp.GetParameters().GetEnv()[envCertificateChain]) == 0 {
			w.non2xx++
			if w.firstErr == "" {
				w.firstErr = "an answer without " + envCertificateChain
			}
		}
	}
}

// envCertificateChain is the Marble's certificate chain in every
// activation answer (docs/design/behaviour.md#activation-response).
const envCertificateChain = "MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN"

// activate sends one activation, with a connection of its own if
// m.cfg.Reconnect; wantPeer asks for the connection's TLS state in p.
func (m *activateMarble) activate(ctx context.Context, wantPeer bool, p *peer.Peer) (*marblepb.ActivationResp, error) {
	conn := m.conn
	if conn == nil {
		var err error
		if conn, err = m.newConn(); err != nil {
			return nil, err
		}
		defer conn.Close()
	}
	if m.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.Timeout)
		defer cancel()
	}
	var opts []grpc.CallOption
	if wantPeer {
		opts = append(opts, grpc.Peer(p))
	}
	return marblepb.NewMarbleClient(conn).Activate(ctx, m.req, opts...)
}

// transportCode reports whether code means that no answer came (rather than
// a refusal by the Coordinator).
func transportCode(code codes.Code) bool {
	return code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled
}

// marbleAPIMsg is the message of the Coordinator's JSON log line that
// carries the Marble API address (logged before the Client API's).
const marbleAPIMsg = "marble API listening"

// meshAddrFromLog returns the Marble API address a Coordinator logged.
func meshAddrFromLog(log string) (string, error) {
	for line := range strings.Lines(log) {
		var entry struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == marbleAPIMsg && entry.Addr != "" {
			return entry.Addr, nil
		}
	}
	return "", fmt.Errorf("the coordinator did not log %q; its log:\n%s", marbleAPIMsg, log)
}

// activateRequest describes the activate scenario's request in the report.
func activateRequest(marbleType, desc string, reconnect, resume, p256 bool) string {
	conn := "one connection per Marble"
	switch {
	case reconnect && resume:
		conn = "a new connection per activation, resuming the TLS session"
	case reconnect:
		conn = "a new connection per activation"
	}
	key := "P-384 Marble keys (MarbleRun's premain)"
	if p256 {
		key = "P-256 Marble keys (Quarry's runtime)"
	}
	s := fmt.Sprintf("gRPC /rpc.Marble/Activate, Marble type %q, %s, %s", marbleType, conn, key)
	if desc != "" {
		s += ", " + desc
	}
	return s
}

// activate runs the activate scenario against the Marble API at addr and
// appends its result.
func (b *bench) activate(ctx context.Context, name, addr, marbleType, desc string) error {
	o := b.o
	b.progress("%s: gRPC Activate at %s as Marble type %q, %d Marbles, %v after %v warm-up", name, addr, marbleType, o.Connections, o.Duration, o.Warmup)
	res, err := RunActivate(ctx, ActivateConfig{
		Addr:       addr,
		MarbleType: marbleType,
		Marbles:    o.Connections,
		Duration:   o.Duration,
		Warmup:     o.Warmup,
		Timeout:    o.Timeout,
		Reconnect:  o.ActivateReconnect,
		Resume:     o.ActivateResume,
		KeyP256:    o.ActivateKey == "p256",
	})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	b.rep.Scenarios = append(b.rep.Scenarios, loadResult(name, activateRequest(marbleType, desc, o.ActivateReconnect, o.ActivateResume, o.ActivateKey == "p256"), res))
	return nil
}

// activateStarted runs the activate scenario's variants, each on a fresh
// Coordinator with its manifest.
func (b *bench) activateStarted(ctx context.Context) error {
	for _, v := range activateVariants {
		raw, err := ActivateManifest(v.perMarble)
		if err != nil {
			return err
		}
		body, err := SetRequest(raw)
		if err != nil {
			return err
		}
		if err := b.activateOn(ctx, v, body); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
	}
	return nil
}

// activateOn runs one variant on a Coordinator of its own.
func (b *bench) activateOn(ctx context.Context, v activateVariant, setBody []byte) error {
	o := b.o
	c, err := StartCoordinator(ctx, o.CoordinatorBin, o.Env, o.StartTimeout)
	if err != nil {
		return fmt.Errorf("%s: %w", v.name, err)
	}
	defer c.Stop()
	mesh, err := meshAddrFromLog(c.Logs())
	if err != nil {
		return fmt.Errorf("%s: %w", v.name, err)
	}
	b.progress("%s: coordinator %s started: pid %d, https://%s, Marble API %s", v.name, o.CoordinatorBin, c.PID(), c.Addr, mesh)
	if x, _ := b.setManifest(ctx, c.Addr, insecureTLS, setBody, false); x.err != nil || x.status != http.StatusOK {
		return fmt.Errorf("%s: setting the activation manifest (%s): %s", v.name, v.desc, describe(x.status, x.msg, x.err))
	}
	if err := b.activate(ctx, v.name, mesh, v.marbleType, v.desc); err != nil {
		return err
	}
	if mem, err := c.ResidentMemory(); err == nil {
		b.progress("%s: coordinator resident memory after load: %.1f MiB (VmRSS; peak VmHWM %.1f MiB)", v.name, mib(mem.RSS), mib(mem.Peak))
	}
	return nil
}
