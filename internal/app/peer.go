package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/attest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/limit"
	"github.com/quarry-cc/quarry/internal/peer"
	"github.com/quarry-cc/quarry/internal/seal"
)

// InstanceIDFile names the file in the seal directory that holds this
// instance's id (store etcd): its entry in the key file.
const InstanceIDFile = "instance_id"

// peerState is the peer key transfer of an instance on a shared store
// (docs/ha.md, "The data key").
type peerState struct {
	id     seal.InstanceID
	idHex  string
	client *peer.Client
	// self is this instance's own enclave (nil in simulation).
	self *sgxquote.ReportBody
}

// instanceID reads the instance id from the seal directory, or makes one.
func (a *App) instanceID() (seal.InstanceID, error) {
	var id seal.InstanceID
	if err := os.MkdirAll(a.cfg.SealDir, 0o700); err != nil {
		return id, fmt.Errorf("creating seal directory for the instance id: %w", err)
	}
	path := filepath.Join(a.cfg.SealDir, InstanceIDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		raw, derr := hex.DecodeString(strings.TrimSpace(string(b)))
		if derr != nil || len(raw) != len(id) {
			return id, fmt.Errorf("%s: not an instance id (%d hex digits); delete it to get a new one", path, 2*len(id))
		}
		copy(id[:], raw)
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return id, fmt.Errorf("reading the instance id: %w", err)
	}
	rand.Read(id[:])
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(id[:])+"\n"), 0o600); err != nil {
		return id, fmt.Errorf("writing the instance id: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return id, fmt.Errorf("writing the instance id: %w", err)
	}
	a.log.Info("new instance id written to the seal directory", "instance", hex.EncodeToString(id[:]), "file", path)
	return id, nil
}

// setupPeer prepares the peer key transfer on a shared store: the
// instance id, the TLS certificate quotes bind, this instance's own
// enclave identity, and the client that asks the other instances (with
// the quote verifier a.verifier, which checks the peers' quotes).
func (a *App) setupPeer(ctx context.Context, issuer attest.Issuer) error {
	if !a.shared() {
		return nil
	}
	id, err := a.instanceID()
	if err != nil {
		return err
	}
	cert, err := peer.NewCertificate()
	if err != nil {
		return fmt.Errorf("peer certificate: %w", err)
	}
	p := &peerState{id: id, idHex: hex.EncodeToString(id[:]), client: &peer.Client{
		Certificate: cert, Issuer: issuer, InsecureTrust: a.cfg.Store.InsecurePeerTrust,
	}}
	if a.verifier != nil {
		p.client.Verifier = a.verifier
	}
	q, err := issuer.Issue(ctx, [attest.ReportDataSize]byte{})
	switch {
	case errors.Is(err, attest.ErrUnsupported):
	case err != nil:
		return fmt.Errorf("peer key transfer: quoting this instance's own enclave: %w", err)
	default:
		parsed, err := sgxquote.ParseAny(q)
		if err != nil {
			return fmt.Errorf("peer key transfer: this instance's own quote: %w", err)
		}
		p.self = &parsed.Body
		if a.verifier == nil {
			a.log.Warn("peer key transfer: without a collateral source (--collateral-file or --pccs-url) this instance can neither verify a joining instance nor a running one; it cannot join through a peer, nor let others join through it")
		}
	}
	p.client.Self = p.self
	a.peer = p
	return nil
}

// peerOptions are the Core's options for per-instance key entries.
func (a *App) peerOptions(o *core.Options) {
	if a.peer == nil {
		return
	}
	o.InstanceID = &a.peer.id
	o.KeySource = a.peer.source(a)
}

// peerSource asks the running instances registered in etcd, one after
// the other, for the data key.
type peerSource struct {
	a *App
	p *peerState
}

func (p *peerState) source(a *App) core.KeySource { return &peerSource{a: a, p: p} }

func (s *peerSource) FetchKey(ctx context.Context, keyID [32]byte) (*core.FetchedKey, error) {
	members, err := s.a.etcd.Members(ctx)
	if err != nil {
		return nil, err
	}
	var errs []error
	tried := 0
	for _, raw := range members {
		var m identity
		if json.Unmarshal(raw, &m) != nil || m.PeerAddr == "" || m.Instance == s.p.idHex {
			continue
		}
		tried++
		k, err := s.p.client.Fetch(ctx, m.PeerAddr, keyID)
		if err == nil {
			if k.Peer == nil {
				s.a.log.Warn("INSECURE: obtained the data key from an instance without attestation (--insecure-peer-trust, simulation)", "peer", m.PeerAddr, "peerInstance", m.Instance)
			} else {
				s.a.log.Info("obtained the data key from a running instance; its quote shows the same enclave", "peer", m.PeerAddr, "peerInstance", m.Instance, "sealMode", k.Mode)
			}
			return &core.FetchedKey{DEK: k.DEK, Allows: k.Allows}, nil
		}
		s.a.log.Warn("a running instance did not give the data key", "peer", m.PeerAddr, "peerInstance", m.Instance, "reason", err.Error())
		errs = append(errs, fmt.Errorf("%s: %w", m.PeerAddr, err))
		if ctx.Err() != nil {
			break
		}
	}
	if tried == 0 {
		return nil, errors.New("no other running instance has a peer address (--peer-addr)")
	}
	return nil, errors.Join(errs...)
}

// listenPeer opens the peer key server's listener (nil without one).
func (a *App) listenPeer() (net.Listener, error) {
	if a.peer == nil || a.cfg.Store.PeerAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", a.cfg.Store.PeerAddr)
	if err != nil {
		return nil, fmt.Errorf("peer key server: %w", err)
	}
	return ln, nil
}

// servePeer runs the peer key server on ln until the returned stop is
// called.
func (a *App) servePeer(ln net.Listener, verifier core.QuoteVerifier) (stop func()) {
	if ln == nil {
		return func() {}
	}
	// Refusals come from anyone who reaches the port: logged at most once
	// per refusalLogInterval (limits.go), with the count left out.
	refused := &limit.Sampler{Every: refusalLogInterval}
	insecure := a.cfg.Store.InsecurePeerTrust && a.peer.self == nil
	s := &peer.Server{
		Keys: a.core, Self: a.peer.self, Issuer: a.peer.client.Issuer, Certificate: a.peer.client.Certificate,
		InsecureTrust: a.cfg.Store.InsecurePeerTrust,
		OnRefuse:      a.refusalLog("peer key server"),
		OnResult: func(r peer.Result) {
			switch {
			case r.Err != nil:
				if ok, left := refused.Allow(time.Now()); ok {
					a.log.Warn("peer key request refused", "remote", r.Remote, "reason", r.Err.Error(), "refusalsNotLogged", left)
				}
			case a.peer.self == nil:
				a.log.Warn("INSECURE: gave the data key to an instance without attestation (--insecure-peer-trust, simulation)", "remote", r.Remote)
			default:
				a.log.Info("gave the data key to an attested instance of the same enclave", "remote", r.Remote)
			}
		},
	}
	if verifier != nil {
		s.Verifier = verifier
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Serve(ln); err != nil {
			a.log.Error("peer key server stopped", "error", err.Error())
		}
	}()
	if insecure {
		a.log.Warn("peer key server listening; INSECURE: it gives the data key to instances without attestation (--insecure-peer-trust, simulation)",
			"addr", ln.Addr().String(), "advertised", a.cfg.Store.PeerDialAddr())
	} else {
		a.log.Info("peer key server listening", "addr", ln.Addr().String(), "advertised", a.cfg.Store.PeerDialAddr())
	}
	return func() {
		ln.Close()
		s.Close()
		<-done
	}
}
