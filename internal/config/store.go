package config

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Store backends.
const (
	// StoreFile keeps the sealed state in the seal directory (one
	// Coordinator instance).
	StoreFile = "file"
	// StoreEtcd keeps it in etcd, shared by several instances.
	StoreEtcd = "etcd"
	// DefaultEtcdPrefix is the default key prefix in etcd.
	DefaultEtcdPrefix = "/quarry/"
	// DefaultStoreTimeout bounds one step with etcd (a read, a write,
	// the read-back of a write whose answer was lost).
	DefaultStoreTimeout = 2 * time.Second
	// DefaultCompactionRetention is how much of etcd's history Quarry
	// keeps when it compacts (docs/ha.md, "Compaction").
	DefaultCompactionRetention = 5 * time.Minute
	// minCompactionRetention covers the longest request (its deadline,
	// about 2 min) plus the longest read-back of a lost write (1 min).
	minCompactionRetention = 3 * time.Minute
)

// StoreConfig says where the sealed state is kept.
type StoreConfig struct {
	// Kind is StoreFile or StoreEtcd.
	Kind string
	// EtcdEndpoints are etcd's client URLs (StoreEtcd).
	EtcdEndpoints []string
	// EtcdPrefix is put before every key, so that several deployments
	// share one etcd.
	EtcdPrefix string
	// EtcdCA, EtcdCert and EtcdKey are PEM files: the CA of etcd's server
	// certificates and the client certificate and key (optional).
	EtcdCA, EtcdCert, EtcdKey string
	// InsecurePeerTrust lets instances without an enclave share the data
	// key through etcd (where it then lies unprotected).
	InsecurePeerTrust bool
	// PeerAddr is the listen address of the peer key server (store etcd;
	// empty: none, this instance gives the data key to no other).
	PeerAddr string
	// PeerAdvertiseAddr is the address other instances dial to reach
	// PeerAddr (registered under members/); empty: PeerAddr itself.
	PeerAdvertiseAddr string
	// Timeout bounds one step with etcd (store etcd): with etcd away or
	// without quorum, requests get 503 within about this time.
	Timeout time.Duration
	// Compaction makes the instances compact etcd's history (on by
	// default; off for an etcd whose history others need).
	Compaction bool
	// CompactionRetention is the history kept when compacting.
	CompactionRetention time.Duration
}

// storeFlags are the store settings as given, before they are checked.
type storeFlags struct {
	kind, endpoints, prefix, ca, cert, key, peerTrust string
	peerAddr, peerAdvertise, timeout                  string
	compaction, retention                             string
}

// registerStore adds the store settings to fs.
func registerStore(fs *flag.FlagSet, env func(name, def string) string) *storeFlags {
	f := &storeFlags{}
	fs.StringVar(&f.kind, "store", env("QUARRY_STORE", StoreFile),
		"where the sealed state is kept: file (the seal directory, one instance) or etcd (shared by several instances) [QUARRY_STORE]")
	fs.StringVar(&f.endpoints, "etcd-endpoints", env("QUARRY_ETCD_ENDPOINTS", ""),
		"comma-separated etcd client URLs, e.g. https://etcd-0:2379,https://etcd-1:2379 (store etcd) [QUARRY_ETCD_ENDPOINTS]")
	fs.StringVar(&f.prefix, "etcd-prefix", env("QUARRY_ETCD_PREFIX", DefaultEtcdPrefix),
		"key prefix in etcd; instances with the same prefix share one state [QUARRY_ETCD_PREFIX]")
	fs.StringVar(&f.ca, "etcd-ca", env("QUARRY_ETCD_CA", ""),
		"PEM file with the CA of etcd's server certificates [QUARRY_ETCD_CA]")
	fs.StringVar(&f.cert, "etcd-cert", env("QUARRY_ETCD_CERT", ""),
		"PEM file with the client certificate for etcd (with --etcd-key) [QUARRY_ETCD_CERT]")
	fs.StringVar(&f.key, "etcd-key", env("QUARRY_ETCD_KEY", ""),
		"PEM file with the client certificate's key for etcd (with --etcd-cert) [QUARRY_ETCD_KEY]")
	f.peerTrust = env("QUARRY_INSECURE_PEER_TRUST", "0")
	fs.Var((*switchFlag)(&f.peerTrust), "insecure-peer-trust",
		"with store etcd and no enclave (simulation), let the instances share the data key through etcd, where it then lies unprotected (--insecure-peer-trust, or =1 / =0); for tests only, a warning is logged at every start [QUARRY_INSECURE_PEER_TRUST]")
	fs.StringVar(&f.peerAddr, "peer-addr", env("QUARRY_PEER_ADDR", ""),
		"with store etcd, listen address of the peer key server, through which instances on other CPUs obtain the data key after attestation, e.g. :2003; empty: none (docs/ha.md) [QUARRY_PEER_ADDR]")
	fs.StringVar(&f.peerAdvertise, "peer-advertise-addr", env("QUARRY_PEER_ADVERTISE_ADDR", ""),
		"host:port at which other instances reach --peer-addr (e.g. the pod IP); empty: --peer-addr itself, which then needs a host [QUARRY_PEER_ADVERTISE_ADDR]")
	fs.StringVar(&f.timeout, "store-timeout", env("QUARRY_STORE_TIMEOUT", DefaultStoreTimeout.String()),
		"with store etcd, how long one step with etcd may take (a read, a write, the read-back of a write whose answer was lost) before the request is answered 503, e.g. 2s; 100ms to 1m (docs/ha.md) [QUARRY_STORE_TIMEOUT]")
	f.compaction = env("QUARRY_ETCD_COMPACTION", "1")
	fs.Var((*switchFlag)(&f.compaction), "etcd-compaction",
		"with store etcd, compact etcd's history behind the state (=1, the default) so that etcd's database stays bounded; =0 for an etcd whose history other users need, which must then compact itself (--auto-compaction-*, docs/ha.md) [QUARRY_ETCD_COMPACTION]")
	fs.StringVar(&f.retention, "etcd-compaction-retention", env("QUARRY_ETCD_COMPACTION_RETENTION", DefaultCompactionRetention.String()),
		"with store etcd and --etcd-compaction, how much of etcd's history is kept, e.g. 5m; 3m to 24h (docs/ha.md) [QUARRY_ETCD_COMPACTION_RETENTION]")
	return f
}

// apply checks the store settings and sets c.Store.
func (f *storeFlags) apply(c *Config) []error {
	var errs []error
	s := StoreConfig{
		Kind:       strings.ToLower(strings.TrimSpace(f.kind)),
		EtcdPrefix: f.prefix,
		EtcdCA:     f.ca, EtcdCert: f.cert, EtcdKey: f.key,
		PeerAddr: strings.TrimSpace(f.peerAddr), PeerAdvertiseAddr: strings.TrimSpace(f.peerAdvertise),
	}
	for _, e := range strings.Split(f.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			s.EtcdEndpoints = append(s.EtcdEndpoints, e)
		}
	}
	var err error
	if s.InsecurePeerTrust, err = parseBool("insecure-peer-trust", "QUARRY_INSECURE_PEER_TRUST", f.peerTrust); err != nil {
		errs = append(errs, err)
	}
	if d, err := time.ParseDuration(strings.TrimSpace(f.timeout)); err != nil || d < 100*time.Millisecond || d > time.Minute {
		errs = append(errs, fmt.Errorf("store-timeout [QUARRY_STORE_TIMEOUT]: %q is not a duration between 100ms and 1m, such as 2s", f.timeout))
	} else {
		s.Timeout = d
	}
	if s.Compaction, err = parseBool("etcd-compaction", "QUARRY_ETCD_COMPACTION", f.compaction); err != nil {
		errs = append(errs, err)
	}
	if d, err := time.ParseDuration(strings.TrimSpace(f.retention)); err != nil || d < minCompactionRetention || d > 24*time.Hour {
		errs = append(errs, fmt.Errorf("etcd-compaction-retention [QUARRY_ETCD_COMPACTION_RETENTION]: %q is not a duration between 3m and 24h, such as 5m", f.retention))
	} else {
		s.CompactionRetention = d
	}
	c.Store = s
	return append(errs, s.validate()...)
}

func (s StoreConfig) validate() []error {
	var errs []error
	switch s.Kind {
	case StoreFile:
		if len(s.EtcdEndpoints) > 0 || s.EtcdCA != "" || s.EtcdCert != "" || s.EtcdKey != "" || s.PeerAddr != "" || s.PeerAdvertiseAddr != "" {
			errs = append(errs, errors.New("store [QUARRY_STORE]: etcd settings are given but the store is file; set --store etcd or remove them"))
		}
		return errs
	case StoreEtcd:
	default:
		return append(errs, fmt.Errorf("store [QUARRY_STORE]: %q is not one of file, etcd", s.Kind))
	}
	if len(s.EtcdEndpoints) == 0 {
		errs = append(errs, errors.New("etcd-endpoints [QUARRY_ETCD_ENDPOINTS]: store etcd needs at least one endpoint"))
	}
	for _, e := range s.EtcdEndpoints {
		if err := validateEndpoint(e); err != nil {
			errs = append(errs, fmt.Errorf("etcd-endpoints [QUARRY_ETCD_ENDPOINTS]: %w", err))
		}
	}
	if s.EtcdPrefix == "" || strings.ContainsAny(s.EtcdPrefix, "\x00") || !strings.HasPrefix(s.EtcdPrefix, "/") {
		errs = append(errs, fmt.Errorf("etcd-prefix [QUARRY_ETCD_PREFIX]: %q is not a key prefix starting with /, such as /quarry/", s.EtcdPrefix))
	}
	for _, f := range []struct{ flag, env, path string }{
		{"etcd-ca", "QUARRY_ETCD_CA", s.EtcdCA},
		{"etcd-cert", "QUARRY_ETCD_CERT", s.EtcdCert},
		{"etcd-key", "QUARRY_ETCD_KEY", s.EtcdKey},
	} {
		if f.path == "" {
			continue
		}
		if info, err := os.Stat(f.path); err != nil {
			errs = append(errs, fmt.Errorf("%s [%s]: %w", f.flag, f.env, err))
		} else if info.IsDir() {
			errs = append(errs, fmt.Errorf("%s [%s]: %s is a directory, not a PEM file", f.flag, f.env, f.path))
		}
	}
	errs = append(errs, s.validatePeer()...)
	if (s.EtcdCert == "") != (s.EtcdKey == "") {
		errs = append(errs, errors.New("etcd-cert [QUARRY_ETCD_CERT] and etcd-key [QUARRY_ETCD_KEY] go together: give both or neither"))
	}
	return errs
}

func validateEndpoint(e string) error {
	u, err := url.Parse(e)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("%q is not an etcd client URL such as https://etcd-0:2379", e)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil {
		return fmt.Errorf("%q: the URL needs a port, such as https://etcd-0:2379", e)
	}
	return nil
}

func (s StoreConfig) validatePeer() []error {
	var errs []error
	if s.PeerAddr != "" {
		if err := validateAddr(s.PeerAddr); err != nil {
			errs = append(errs, fmt.Errorf("peer-addr [QUARRY_PEER_ADDR]: %w", err))
		}
	}
	switch {
	case s.PeerAdvertiseAddr != "" && s.PeerAddr == "":
		errs = append(errs, errors.New("peer-advertise-addr [QUARRY_PEER_ADVERTISE_ADDR]: set without --peer-addr [QUARRY_PEER_ADDR]"))
	case s.PeerAdvertiseAddr != "":
		if err := validateDialAddr(s.PeerAdvertiseAddr); err != nil {
			errs = append(errs, fmt.Errorf("peer-advertise-addr [QUARRY_PEER_ADVERTISE_ADDR]: %w", err))
		}
	case s.PeerAddr != "":
		if err := validateDialAddr(s.PeerAddr); err != nil {
			errs = append(errs, fmt.Errorf("peer-addr [QUARRY_PEER_ADDR]: other instances cannot dial it (%v); set --peer-advertise-addr [QUARRY_PEER_ADVERTISE_ADDR]", err))
		}
	}
	return errs
}

// validateDialAddr checks a host:port that others can dial: a host that
// is not the unspecified address, and a port other than 0.
func validateDialAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q is not host:port", a)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return fmt.Errorf("%q has no host others can dial", a)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("%q has no port others can dial", a)
	}
	return nil
}

// PeerDialAddr is the address other instances dial for the peer key
// server (empty without one).
func (s StoreConfig) PeerDialAddr() string {
	if s.PeerAdvertiseAddr != "" {
		return s.PeerAdvertiseAddr
	}
	return s.PeerAddr
}
