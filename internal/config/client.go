package config

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Defaults of the Client API's limits (docs/http.md, "Connections and
// sources").
const (
	// DefaultClientMinBodyRate is the slowest a request body may arrive
	// after DefaultClientBodyGrace, in bytes per second.
	DefaultClientMinBodyRate = 4 << 10
	// DefaultClientBodyGrace is how long a body may take before the
	// minimum rate applies.
	DefaultClientBodyGrace = 10 * time.Second
	// maxClientCount bounds the connection counts (larger values are
	// typing mistakes).
	maxClientCount = 1_000_000
	// maxClientBodyGrace: the whole body has 2 minutes anyway.
	maxClientBodyGrace = 2 * time.Minute
)

// ClientLimits bound what clients can take of the Client API.
type ClientLimits struct {
	// MaxConns bounds the Client API's connections at once (0: derived
	// at start from the file descriptor limit).
	MaxConns int
	// MaxPerSource bounds the connections, and the requests in
	// progress, of one source address (an IPv4 address, an IPv6 /64)
	// (0: derived from MaxConns).
	MaxPerSource int
	// MinBodyRate is the slowest a request body may arrive once
	// BodyGrace has passed, in bytes per second on average (0: no
	// minimum).
	MinBodyRate int64
	// BodyGrace is how long a body may take before the minimum rate
	// applies.
	BodyGrace time.Duration
}

// clientFlags are the Client API's limits as given, before they are
// checked.
type clientFlags struct{ maxConns, perSource, rate, grace string }

// registerClient adds the Client API's limits to fs.
func registerClient(fs *flag.FlagSet, env func(name, def string) string) *clientFlags {
	f := &clientFlags{}
	fs.StringVar(&f.maxConns, "client-max-conns", env("QUARRY_CLIENT_MAX_CONNS", "auto"),
		"most Client API connections at once; auto: from the file descriptor limit (RLIMIT_NOFILE), leaving room for the Coordinator's other files and the Marble API, at most 4096. At the limit a new connection takes the place of an idle one of the address holding the most, or is closed (docs/http.md) [QUARRY_CLIENT_MAX_CONNS]")
	fs.StringVar(&f.perSource, "client-max-per-source", env("QUARRY_CLIENT_MAX_PER_SOURCE", "auto"),
		"most Client API connections, and most requests in progress, of one source address (an IPv4 address or an IPv6 /64); more connections are closed at once, more requests get 429; auto: a quarter of --client-max-conns, at most 64. Raise it behind a proxy, where every client has the proxy's address [QUARRY_CLIENT_MAX_PER_SOURCE]")
	fs.StringVar(&f.rate, "client-min-body-rate", env("QUARRY_CLIENT_MIN_BODY_RATE", strconv.Itoa(DefaultClientMinBodyRate)),
		"slowest a request body may arrive, in bytes per second on average since the request came, once --client-body-grace has passed; a slower one is cut with 408; 0: no minimum [QUARRY_CLIENT_MIN_BODY_RATE]")
	fs.StringVar(&f.grace, "client-body-grace", env("QUARRY_CLIENT_BODY_GRACE", DefaultClientBodyGrace.String()),
		"how long a request body may take before --client-min-body-rate applies, e.g. 10s; 0 to 2m [QUARRY_CLIENT_BODY_GRACE]")
	return f
}

// apply checks the Client API's limits and sets c.Client.
func (f *clientFlags) apply(c *Config) []error {
	var errs []error
	count := func(name, env, v string) int {
		v = strings.TrimSpace(v)
		if strings.EqualFold(v, "auto") || v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxClientCount {
			errs = append(errs, fmt.Errorf("%s [%s]: %q is not auto or a count between 1 and %d", name, env, v, maxClientCount))
			return 0
		}
		return n
	}
	c.Client.MaxConns = count("client-max-conns", "QUARRY_CLIENT_MAX_CONNS", f.maxConns)
	c.Client.MaxPerSource = count("client-max-per-source", "QUARRY_CLIENT_MAX_PER_SOURCE", f.perSource)
	if n, err := strconv.ParseInt(strings.TrimSpace(f.rate), 10, 64); err != nil || n < 0 || n > 1<<30 {
		errs = append(errs, fmt.Errorf("client-min-body-rate [QUARRY_CLIENT_MIN_BODY_RATE]: %q is not a byte rate between 0 (no minimum) and 1073741824", f.rate))
	} else {
		c.Client.MinBodyRate = n
	}
	if d, err := time.ParseDuration(strings.TrimSpace(f.grace)); err != nil || d < 0 || d > maxClientBodyGrace {
		errs = append(errs, fmt.Errorf("client-body-grace [QUARRY_CLIENT_BODY_GRACE]: %q is not a duration between 0 and 2m, such as 10s", f.grace))
	} else {
		c.Client.BodyGrace = d
	}
	return errs
}
