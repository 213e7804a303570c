package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/server/rest"
	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/etcdstore"
	"github.com/quarry-cc/quarry/internal/store/filestore"
)

// memberTTL is how long a killed instance stays registered in etcd.
const memberTTL = 10 * time.Second

// openFiles opens the file store: the seal directory (taken exclusively).
// release gives it back.
func (a *App) openFiles() (data, key store.Store, release func() error, err error) {
	if err := os.MkdirAll(a.cfg.SealDir, 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("creating seal directory: %w", err)
	}
	tightenSealDir(a.cfg.SealDir, a.log)
	unlock, err := filestore.LockDir(a.cfg.SealDir)
	if err != nil {
		return nil, nil, nil, err
	}
	d, err := filestore.New(a.cfg.SealDir, SealedDataFile)
	if err != nil {
		unlock()
		return nil, nil, nil, err
	}
	k, err := filestore.New(a.cfg.SealDir, SealedKeyFile)
	if err != nil {
		unlock()
		return nil, nil, nil, err
	}
	return d, k, unlock, nil
}

// connectEtcd connects to etcd, trying until ctx ends (each failure goes
// to onRetry); only a TLS failure that persists (etcdstore.TLSAttempts in
// a row) or a configuration that cannot work ends it with an error.
func (a *App) connectEtcd(ctx context.Context, onRetry func(err error, wait time.Duration)) (*etcdstore.Client, error) {
	s := a.cfg.Store
	a.log.Info("connecting to etcd", "endpoints", strings.Join(s.EtcdEndpoints, ","), "prefix", s.EtcdPrefix)
	return etcdstore.Connect(ctx, etcdstore.Options{
		Endpoints: s.EtcdEndpoints, Prefix: s.EtcdPrefix,
		CAFile: s.EtcdCA, CertFile: s.EtcdCert, KeyFile: s.EtcdKey,
		// Each attempt has etcdstore's default dial timeout (2 s), which
		// also bounds the client's connection attempts; it is not tied to
		// the store timeout, which bounds the steps of requests.
		ConnectAttempts: -1, Backoff: startBackoff,
		OnRetry: func(_ int, err error, wait time.Duration) { onRetry(err, wait) },
	})
}

// etcdStores are the stores of the sealed state and the key file in etcd.
func etcdStores(cli *etcdstore.Client) (data, key store.Store, err error) {
	d, err := cli.Store(SealedDataFile)
	if err != nil {
		return nil, nil, err
	}
	k, err := cli.Store(SealedKeyFile)
	if err != nil {
		return nil, nil, err
	}
	return d, k, nil
}

// enableCompaction makes cli compact etcd's history behind the commits of
// this instance (docs/ha.md, "Compaction"), unless it is switched off.
func (a *App) enableCompaction(cli *etcdstore.Client) {
	s := a.cfg.Store
	if !s.Compaction {
		a.log.Info("etcd's history is not compacted by Quarry (--etcd-compaction=0): etcd must compact it itself (--auto-compaction-retention), or its database grows with every change until it reaches its quota")
		return
	}
	cli.EnableCompaction(etcdstore.CompactionOptions{
		Retention: s.CompactionRetention,
		Done: func(rev int64, err error) {
			a.hooks.onCompaction(err)
			if err != nil {
				a.log.Warn("compacting etcd's history failed; the next commit tries again", "revision", rev, "error", err.Error())
				return
			}
			a.log.Debug("compacted etcd's history", "revision", rev)
		},
	})
}

// identity is what instances sharing one state must agree on.
type identity struct {
	Sealer      string `json:"sealer"`
	Attestation string `json:"attestation"`
	Binary      string `json:"binary"`
	// Instance and PeerAddr say which instance this is and where its peer
	// key server listens (peer.go); they differ between instances.
	Instance string `json:"instance,omitempty"`
	PeerAddr string `json:"peerAddr,omitempty"`
}

// same reports whether two instances may share one state.
func (i identity) same(o identity) bool {
	return i.Sealer == o.Sealer && i.Attestation == o.Attestation && i.Binary == o.Binary
}

// checkSharedKey checks, with store etcd, that the data key may be shared
// the way it is sealed; otherwise the start is refused with the reason.
func (a *App) checkSharedKey() error {
	if seal.ProtectsKey(a.sealer) {
		return nil
	}
	if !a.cfg.Store.InsecurePeerTrust {
		return errors.New("store etcd without an enclave: the data key would lie unprotected in etcd, so that every instance can read it; set --insecure-peer-trust (QUARRY_INSECURE_PEER_TRUST=1) to allow this for tests, or run under Gramine (see docs/ha.md)")
	}
	a.log.Warn("INSECURE: --insecure-peer-trust: the instances share the data key through etcd, where it lies unprotected; anyone who can read etcd under the prefix has every secret; for tests only",
		"prefix", a.cfg.Store.EtcdPrefix)
	return nil
}

// joinShared registers this instance in etcd and checks that the
// instances already running use the same binary and sealer; otherwise the
// start is refused with the reason. When etcd does not answer within the
// store timeout the error wraps core.ErrUnavailable (the start is tried
// again).
func (a *App) joinShared(ctx context.Context) error {
	me := identity{Sealer: fmt.Sprintf("%T", a.sealer), Attestation: a.cfg.Attestation, Binary: binaryHash()}
	if a.peer != nil {
		me.Instance, me.PeerAddr = a.peer.idHex, a.cfg.Store.PeerDialAddr()
	}
	raw, err := json.Marshal(me)
	if err != nil {
		return err
	}
	jctx, cancel := context.WithTimeout(ctx, a.cfg.Store.Timeout)
	defer cancel()
	others, err := a.etcd.Join(jctx, raw, memberTTL)
	if err != nil {
		return fmt.Errorf("%w: joining the instances in etcd: %w", core.ErrUnavailable, err)
	}
	for _, o := range others {
		var other identity
		if err := json.Unmarshal(o, &other); err != nil {
			return fmt.Errorf("another instance on prefix %s registered an unreadable identity: %w", a.cfg.Store.EtcdPrefix, err)
		}
		if !other.same(me) {
			return fmt.Errorf("refusing to share state with a different instance on prefix %s: it runs sealer %s, attestation %s, binary sha256 %s; this one runs sealer %s, attestation %s, binary sha256 %s (stop the others first, or use another prefix)",
				a.cfg.Store.EtcdPrefix, other.Sealer, other.Attestation, other.Binary, me.Sealer, me.Attestation, me.Binary)
		}
	}
	a.log.Info("joined the instances sharing the state in etcd", "prefix", a.cfg.Store.EtcdPrefix, "othersRunning", len(others))
	return nil
}

// binaryHash is the SHA-256 of the running executable ("unknown" if it
// cannot be read).
func binaryHash() string {
	path, err := os.Executable()
	if err != nil {
		return "unknown"
	}
	f, err := os.Open(path)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "unknown"
	}
	return hex.EncodeToString(h.Sum(nil))
}

// syncing makes the Client API serve the newest shared state: before each
// request the instance checks the stored revision (one linearizable etcd
// read) and reloads on a change. When etcd cannot be reached the answer
// is 503 with Retry-After, never a stale read.
//
// While the store is known to be away (a sync of a handshake or a request
// failed within the last moment, freshness.failedRecently) a request is
// refused at once instead of waiting the store timeout again: the first
// request on a new connection, whose handshake just waited for the store,
// gets its 503 within one store timeout in all.
func (a *App) syncing(next http.Handler, fresh *freshness) http.Handler {
	if !a.core.Shared() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var err error
		if fresh.failedRecently(time.Now()) {
			err = errStoreAway
		} else {
			err = a.core.Sync(r.Context()) // within the store timeout when the store is away
			fresh.note(err, time.Now())
		}
		if err != nil {
			rest.Unavailable(w, r, a.log, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// errStoreAway: a request refused without a sync because one failed a
// moment ago.
var errStoreAway = errors.New("the state store did not answer a moment ago (refused without waiting again)")

// startupManifestRace reports whether a startup manifest failed only
// because another instance set one first.
func (a *App) startupManifestRace(err error) bool {
	return errors.Is(err, core.ErrWrongState) && a.core.Shared() && a.core.Status() == core.StateAcceptingMarbles
}
