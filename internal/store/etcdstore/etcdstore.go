// Package etcdstore is the store.Store on etcd, for several Coordinator
// instances that share one state: each Store is one key under a prefix of
// one etcd cluster, its revision the key's mod revision, and Save a
// compare-and-swap on it in one etcd transaction. It holds only what it is
// given (the Coordinator's sealed blobs); it never logs.
package etcdstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/quarry-cc/quarry/internal/store"
)

// MaxBlobBytes is the largest blob a Save sends (etcd's own request limit,
// --max-request-bytes, must be at least this plus a little for the
// transaction; its default, 1.5 MiB, is lower).
const MaxBlobBytes = 16 << 20

// maxAside bounds the search for a free MoveAside/CopyAside name.
const maxAside = 10000

// Options say how to reach etcd.
type Options struct {
	// Endpoints are the etcd client URLs (https://host:2379, or http://
	// without TLS).
	Endpoints []string
	// Prefix is put before every key (e.g. "/quarry/"), so that several
	// deployments share one etcd.
	Prefix string
	// CAFile, CertFile and KeyFile are PEM files: the CA that signed the
	// etcd servers' certificates, and the client certificate and key
	// (optional; both or neither).
	CAFile, CertFile, KeyFile string
	// DialTimeout bounds one attempt to reach etcd (default 2 s).
	DialTimeout time.Duration
	// ConnectAttempts is how many times Connect tries to reach etcd
	// before it gives up (default 8), waiting Backoff (default 250 ms)
	// after the first failure, doubled after each further one up to 5 s.
	// Negative: Connect tries until ctx ends, except that TLSAttempts
	// TLS failures in a row (ErrTLS: a wrong CA, client certificate or
	// scheme, which waiting does not cure) end it. Whatever the number,
	// a trust failure at every endpoint (ErrUntrusted) ends it at once.
	ConnectAttempts int
	Backoff         time.Duration
	// OnRetry, if set, is called after each failed attempt with the
	// attempt number, the error and the wait before the next one.
	OnRetry func(attempt int, err error, wait time.Duration)
}

// ErrUnreachable is wrapped by Connect's error when no etcd endpoint
// answered within the attempts.
var ErrUnreachable = errors.New("etcd is unreachable")

// TLSAttempts is how many TLS failures in a row end a Connect that
// otherwise tries until its context ends (ConnectAttempts < 0): with the
// backoff about half a minute, within which a rotation of etcd's
// certificates passes.
const TLSAttempts = 8

// Client is a connection to etcd under one prefix; its Stores share it.
type Client struct {
	cli    *clientv3.Client
	prefix string
	// endpoints are the configured endpoints (the client itself may use
	// only the leader's: balance.go).
	endpoints []string
	stopLease context.CancelFunc // set by Join
	lease     clientv3.LeaseID

	compactMu sync.Mutex
	compact   *compactor // nil: compaction is off (compact.go)
}

// Connect opens a client and checks that etcd answers, retrying with
// exponential backoff; it gives up after opts.ConnectAttempts (negative:
// when ctx ends, or after TLSAttempts TLS failures in a row) with an error
// wrapping ErrUnreachable that names the endpoints and the last cause, or
// wrapping ErrTLS when etcd answered but TLS with it failed. When every
// endpoint answered with a definite trust failure (ErrUntrusted: its
// certificate is not signed by the CA, or it refused the client
// certificate) it gives up at once with that error.
func Connect(ctx context.Context, opts Options) (*Client, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("etcdstore: no endpoints")
	}
	if opts.DialTimeout == 0 {
		opts.DialTimeout = 2 * time.Second
	}
	if opts.ConnectAttempts == 0 {
		opts.ConnectAttempts = 8
	}
	if opts.Backoff == 0 {
		opts.Backoff = 250 * time.Millisecond
	}
	tlsConf, err := tlsConfig(opts)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:          opts.Endpoints,
		DialTimeout:        opts.DialTimeout,
		TLS:                tlsConf,
		Logger:             zap.NewNop(),
		MaxCallSendMsgSize: MaxBlobBytes + 1<<20,
		MaxCallRecvMsgSize: 2*MaxBlobBytes + 1<<20,
		// Keepalives end a connection to a member that stopped
		// answering (10 s is grpc-go's lowest interval); the selector
		// and the per-attempt deadlines in balance.go act sooner.
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(unaryInterceptor),
			grpc.WithChainStreamInterceptor(streamInterceptor),
			// A member that is back is tried again within a second;
			// a connection that gets no answer (a frozen member
			// accepts it) is given up after the dial timeout.
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: opts.DialTimeout,
			}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: %w", err)
	}
	c := &Client{cli: cli, prefix: opts.Prefix, endpoints: slices.Clone(opts.Endpoints)}
	wait := opts.Backoff
	tlsInARow := 0
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(context.WithValue(ctx, failFastKey, true), opts.DialTimeout)
		_, err = cli.Get(actx, c.prefix, clientv3.WithCountOnly())
		cancel()
		if err == nil {
			if len(opts.Endpoints) > 1 {
				sel := &selector{cli: cli, endpoints: slices.Clone(opts.Endpoints), conns: make([]*grpc.ClientConn, len(opts.Endpoints)), current: opts.Endpoints}
				go sel.run()
			}
			return c, nil
		}
		definite := false
		if ctx.Err() == nil {
			// etcd's client reports a TLS failure as a timeout: look
			// for it, so that the error names it.
			var terr error
			if terr, definite = diagnoseTLS(ctx, opts.Endpoints, tlsConf, opts.CAFile, opts.DialTimeout); terr != nil {
				err = terr
			}
		}
		if errors.Is(err, ErrTLS) {
			tlsInARow++
		} else {
			tlsInARow = 0
		}
		giveUp := attempt >= opts.ConnectAttempts
		if opts.ConnectAttempts < 0 {
			giveUp = tlsInARow >= TLSAttempts
		}
		// A trust failure at every endpoint is a setting that waiting
		// does not cure (ErrUntrusted): it ends the connect at once.
		if ctx.Err() != nil || giveUp || definite {
			cli.Close()
			if errors.Is(err, ErrTLS) {
				return nil, fmt.Errorf("etcdstore: %w (endpoints %s, %s)",
					err, strings.Join(opts.Endpoints, ","), attempts(attempt))
			}
			return nil, fmt.Errorf("etcdstore: %w (endpoints %s, %s): %v",
				ErrUnreachable, strings.Join(opts.Endpoints, ","), attempts(attempt), err)
		}
		if opts.OnRetry != nil {
			opts.OnRetry(attempt, err, wait)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return strconv.Itoa(n) + " attempts"
}

func tlsConfig(opts Options) (*tls.Config, error) {
	if opts.CAFile == "" && opts.CertFile == "" && opts.KeyFile == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if opts.CAFile != "" {
		pem, err := os.ReadFile(opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("etcdstore: reading the etcd CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcdstore: the etcd CA file %s holds no PEM certificate", opts.CAFile)
		}
		conf.RootCAs = pool
	}
	if (opts.CertFile == "") != (opts.KeyFile == "") {
		return nil, errors.New("etcdstore: the client certificate and key go together (both or neither)")
	}
	if opts.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(opts.CertFile, opts.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("etcdstore: loading the client certificate: %w", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

// Close closes the connection (and ends a Join's membership at once).
func (c *Client) Close() error {
	if c.stopLease != nil {
		c.stopLease()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c.cli.Revoke(ctx, c.lease) // best effort: else the lease expires
		cancel()
	}
	return c.cli.Close()
}

// Prefix returns the key prefix.
func (c *Client) Prefix() string { return c.prefix }

// Store returns the Store of the key <prefix><name>. name must be a plain
// name (no "/"), not ending in a MoveAside suffix of another Store.
func (c *Client) Store(name string) (*Store, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("etcdstore: bad key name %q", name)
	}
	return &Store{c: c, key: c.prefix + name}, nil
}

// Store keeps one blob in one etcd key. Its revision is the key's mod
// revision (decimal), which etcd never gives twice: after a MoveAside and a
// new Save, a stale revision still conflicts. Methods are safe for
// concurrent use, also across processes.
type Store struct {
	c   *Client
	key string
}

var (
	_ store.Store  = (*Store)(nil)
	_ store.Mover  = (*Store)(nil)
	_ store.Copier = (*Store)(nil)
)

// Key returns the etcd key of the blob.
func (s *Store) Key() string { return s.key }

func rev(r int64) store.Revision { return store.Revision(strconv.FormatInt(r, 10)) }

// parseRev returns the mod revision named by r, or false for a revision
// this store never gave.
func parseRev(r store.Revision) (int64, bool) {
	n, err := strconv.ParseInt(string(r), 10, 64)
	if err != nil || n <= 0 || rev(n) != r {
		return 0, false
	}
	return n, true
}

// Load returns the blob and its mod revision, or store.ErrNotFound. The
// read is linearizable (a quorum read).
func (s *Store) Load(ctx context.Context) ([]byte, store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", fmt.Errorf("etcdstore: load: %w", err)
	}
	resp, err := s.c.cli.Get(ctx, s.key)
	if err != nil {
		return nil, "", fmt.Errorf("etcdstore: load %s: %w", s.key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, "", store.ErrNotFound
	}
	kv := resp.Kvs[0]
	return append([]byte{}, kv.Value...), rev(kv.ModRevision), nil
}

// cmpRev is the transaction's condition that the key's stored revision is
// prev (absent when prev is empty); false when prev can never match.
func cmpRev(key string, prev store.Revision) (clientv3.Cmp, bool) {
	if prev == "" {
		return clientv3.Compare(clientv3.CreateRevision(key), "=", 0), true
	}
	n, ok := parseRev(prev)
	if !ok {
		return clientv3.Cmp{}, false
	}
	return clientv3.Compare(clientv3.ModRevision(key), "=", n), true
}

// Save stores blob if the key's mod revision is prevRev (empty: the key is
// absent), in one transaction, and returns the new mod revision. A lost
// compare is store.ErrConflict. Any other error (etcd lost during the
// write) leaves the outcome unknown: Load tells, by the revision, whether
// the write happened, and a Save repeated with the same prevRev is then
// safe (it conflicts when the first one landed).
func (s *Store) Save(ctx context.Context, blob []byte, prevRev store.Revision) (store.Revision, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("etcdstore: save: %w", err)
	}
	if len(blob) > MaxBlobBytes {
		return "", fmt.Errorf("etcdstore: save: blob of %d bytes exceeds %d", len(blob), MaxBlobBytes)
	}
	cond, ok := cmpRev(s.key, prevRev)
	if !ok {
		return "", store.ErrConflict
	}
	resp, err := s.c.cli.Txn(ctx).If(cond).Then(clientv3.OpPut(s.key, string(blob))).Commit()
	if err != nil {
		return "", fmt.Errorf("etcdstore: save %s: %w", s.key, err)
	}
	if !resp.Succeeded {
		return "", store.ErrConflict
	}
	return rev(resp.Header.Revision), nil
}

// MoveAside moves the blob to <key>.<suffix> (or .<suffix>.1, .2, … when
// that exists) in one transaction that never overwrites a key, and returns
// the new key.
func (s *Store) MoveAside(ctx context.Context, suffix string) (string, error) {
	return s.aside(ctx, "move aside", suffix, true)
}

// CopyAside copies the blob to <key>.<suffix> (or a numbered variant),
// never overwriting a key; the blob stays.
func (s *Store) CopyAside(ctx context.Context, suffix string) (string, error) {
	return s.aside(ctx, "copy aside", suffix, false)
}

func (s *Store) aside(ctx context.Context, what, suffix string, remove bool) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("etcdstore: %s: %w", what, err)
	}
	if suffix == "" || suffix == "." || suffix == ".." || strings.ContainsAny(suffix, "/\x00") {
		return "", fmt.Errorf("etcdstore: %s: bad suffix %q", what, suffix)
	}
	for attempt := 0; attempt < 16; attempt++ {
		blob, cur, err := s.Load(ctx)
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return "", err
			}
			return "", fmt.Errorf("etcdstore: %s: %w", what, err)
		}
		n, _ := parseRev(cur)
		dst, err := s.freeName(ctx, suffix)
		if err != nil {
			return "", fmt.Errorf("etcdstore: %s: %w", what, err)
		}
		ops := []clientv3.Op{clientv3.OpPut(dst, string(blob))}
		if remove {
			ops = append(ops, clientv3.OpDelete(s.key))
		}
		resp, err := s.c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(s.key), "=", n),
			clientv3.Compare(clientv3.CreateRevision(dst), "=", 0),
		).Then(ops...).Commit()
		if err != nil {
			return "", fmt.Errorf("etcdstore: %s: %w", what, err)
		}
		if resp.Succeeded {
			return dst, nil
		}
		// The blob changed or the name was taken meanwhile: look again.
	}
	return "", fmt.Errorf("etcdstore: %s: %s keeps changing", what, s.key)
}

// freeName returns the first of <key>.<suffix>, <key>.<suffix>.1, … that
// does not exist (the transaction checks again).
func (s *Store) freeName(ctx context.Context, suffix string) (string, error) {
	base := s.key + "." + suffix
	resp, err := s.c.cli.Get(ctx, base, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return "", err
	}
	taken := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		taken[string(kv.Key)] = true
	}
	for i := 0; i <= maxAside; i++ {
		dst := base
		if i > 0 {
			dst = base + "." + strconv.Itoa(i)
		}
		if !taken[dst] {
			return dst, nil
		}
	}
	return "", fmt.Errorf("%s and %d numbered variants all exist", base, maxAside)
}

// Join registers this instance under <prefix>members/ with value and a
// lease of ttl, kept alive until Close (a killed instance's entry goes
// when the lease expires), and returns the values of the other live
// members. Instances compare them to refuse running beside a different
// binary or sealer.
func (c *Client) Join(ctx context.Context, value []byte, ttl time.Duration) ([][]byte, error) {
	lease, err := c.cli.Grant(ctx, int64(max(ttl/time.Second, 1)))
	if err != nil {
		return nil, fmt.Errorf("etcdstore: member lease: %w", err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	ch, err := c.cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("etcdstore: member lease: %w", err)
	}
	go func() {
		for range ch { // drain the keep-alive answers
		}
	}()
	c.stopLease, c.lease = cancel, lease.ID
	dir := c.prefix + "members/"
	me := dir + strconv.FormatInt(int64(lease.ID), 16)
	if _, err := c.cli.Put(ctx, me, string(value), clientv3.WithLease(lease.ID)); err != nil {
		return nil, fmt.Errorf("etcdstore: registering member: %w", err)
	}
	resp, err := c.cli.Get(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcdstore: listing members: %w", err)
	}
	var others [][]byte
	for _, kv := range resp.Kvs {
		if string(kv.Key) != me {
			others = append(others, append([]byte{}, kv.Value...))
		}
	}
	return others, nil
}
