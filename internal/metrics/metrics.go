// Package metrics provides the Coordinator's Prometheus metrics (MarbleRun's
// names and labels, docs/design/behaviour.md#metrics-and-events, plus Quarry's own), the readiness
// probe, and the plain-HTTP handler of the metrics listener (/metrics,
// /events, /healthz, /readyz). Every App has its own registry: nothing is
// registered globally.
package metrics

import (
	"context"
	"strconv"
	"time"

	"github.com/google/uuid"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	"github.com/quarry-cc/quarry/internal/core"
)

// UnknownMarbleType is the type label of activation attempts whose Marble
// type the manifest does not define (or that arrive before there is a
// manifest): a client may send any string, and every distinct label value
// would be a new series.
const UnknownMarbleType = "<unknown>"

// InvalidUUID is the uuid label (with Options.MarbleUUIDLabel) of an
// activation attempt whose UUID does not parse.
const InvalidUUID = "invalid"

// Coordinator is what the collectors read from the Coordinator at scrape
// time.
type Coordinator interface {
	Status() core.State
	PendingUpdate(ctx context.Context) (core.PendingUpdate, error)
	RecoverySharesAccepted() (accepted, needed int)
	SealedStateSize() int64
}

// Options configure the metrics.
type Options struct {
	// Version and Commit label coordinator_version_info.
	Version, Commit string
	// MarbleUUIDLabel adds MarbleRun's uuid label to the activation
	// counters. Every Marble instance then makes new series, without
	// bound: off by default.
	MarbleUUIDLabel bool
	// CollateralNextUpdate returns the earliest nextUpdate of the cached
	// attestation collateral (false: none cached); nil when quote
	// verification has no collateral source.
	CollateralNextUpdate func() (time.Time, bool)
	// EtcdStatus, with store etcd, returns what each etcd endpoint says
	// about its database (etcd's maintenance Status API), asked at scrape
	// time; nil without etcd.
	EtcdStatus func(ctx context.Context) []EtcdMember
	// SkipProcessCollectors leaves out the Go and process collectors
	// (tests that compare whole outputs).
	SkipProcessCollectors bool
}

// Metrics are the Coordinator's metrics in their own registry.
type Metrics struct {
	reg  *prometheus.Registry
	opts Options

	activations        *prometheus.CounterVec
	activationsSuccess *prometheus.CounterVec
	activationFailures *prometheus.CounterVec
	commits            *prometheus.CounterVec
	commitDuration     prometheus.Histogram
	compactions        *prometheus.CounterVec
	grpc               *grpcprom.ServerMetrics
	requests           *RequestMetrics
}

// New creates the metrics of c in a new registry.
func New(c Coordinator, opts Options) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{reg: reg, opts: opts}
	activationLabels := []string{"type"}
	if opts.MarbleUUIDLabel {
		activationLabels = append(activationLabels, "uuid")
	}
	m.activations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "coordinator", Name: "marble_activations_total",
		Help: "Number of Marble activation attempts, successful or not, by Marble type (" + UnknownMarbleType + ": a type the manifest does not define).",
	}, activationLabels)
	m.activationsSuccess = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "coordinator", Name: "marble_activations_success_total",
		Help: "Number of successful Marble activations by Marble type.",
	}, activationLabels)
	m.activationFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "quarry", Name: "activation_failures_total",
		Help: "Number of refused or failed Marble activations by Marble type and reason.",
	}, []string{"type", "reason"})
	m.commits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "quarry", Name: "state_commits_total",
		Help: "Number of attempts to seal and store a changed state, by result (success, failure).",
	}, []string{"result"})
	for _, r := range []string{"success", "failure"} {
		m.commits.WithLabelValues(r)
	}
	m.commitDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "quarry", Name: "state_commit_duration_seconds",
		Help:    "Time to encode, seal and durably store a changed state.",
		Buckets: prometheus.DefBuckets,
	})
	m.grpc = grpcprom.NewServerMetrics()
	m.requests = newRequestMetrics()
	m.compactions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "quarry", Name: "etcd_compactions_total",
		Help: "Compactions of etcd's history started by this instance (store etcd, --etcd-compaction), by result (success, failure).",
	}, []string{"result"})
	if opts.EtcdStatus != nil {
		for _, r := range []string{"success", "failure"} {
			m.compactions.WithLabelValues(r)
		}
		reg.MustRegister(m.compactions, &etcdCollector{status: opts.EtcdStatus})
	}

	ctx := context.Background()
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "coordinator", Name: "state",
			Help: "State of the Coordinator: 1 recovery mode, 2 waiting for a manifest, 3 accepting Marbles.",
		}, func() float64 { return float64(c.Status()) }),
		prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "coordinator", Name: "version_info",
			Help:        "Version of the Coordinator (the value is always 0).",
			ConstLabels: prometheus.Labels{"version": opts.Version, "commit": opts.Commit},
		}),
		m.activations, m.activationsSuccess, m.activationFailures,
		m.commits, m.commitDuration,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "quarry", Name: "sealed_state_bytes",
			Help: "Size of the sealed state in the store (0: none stored).",
		}, func() float64 { return float64(c.SealedStateSize()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "quarry", Name: "update_pending",
			Help: "1 while a multi-party manifest update waits for acknowledgements, else 0.",
		}, func() float64 {
			if _, err := c.PendingUpdate(ctx); err != nil {
				return 0
			}
			return 1
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "quarry", Name: "update_missing_acknowledgements",
			Help: "Acknowledgements the pending manifest update still needs (0: none pending).",
		}, func() float64 {
			p, err := c.PendingUpdate(ctx)
			if err != nil {
				return 0
			}
			return float64(p.MissingAcknowledgments)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "quarry", Name: "recovery_shares_accepted",
			Help: "Recovery secrets accepted in the current recovery round (recovery mode; 0 otherwise).",
		}, func() float64 {
			n, _ := c.RecoverySharesAccepted()
			return float64(n)
		}),
		&collateralCollector{next: opts.CollateralNextUpdate},
		m.grpc,
		m.requests,
	)
	if !opts.SkipProcessCollectors {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// Registry returns the registry (for the /metrics handler and tests).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// OnActivation counts one activation attempt (core.Options.OnActivation).
func (m *Metrics) OnActivation(a core.ActivationAttempt) {
	typ := UnknownMarbleType
	if a.KnownType {
		typ = a.MarbleType
	}
	labels := []string{typ}
	if m.opts.MarbleUUIDLabel {
		id := InvalidUUID
		if u, err := uuid.Parse(a.UUID); err == nil {
			id = u.String()
		}
		labels = append(labels, id)
	}
	m.activations.WithLabelValues(labels...).Inc()
	if a.Refused == "" {
		m.activationsSuccess.WithLabelValues(labels...).Inc()
		return
	}
	m.activationFailures.WithLabelValues(typ, string(a.Refused)).Inc()
}

// OnCommit counts one attempt to store a changed state (core.Options.OnCommit).
func (m *Metrics) OnCommit(r core.CommitResult) {
	result := "success"
	if r.Err != nil {
		result = "failure"
	}
	m.commits.WithLabelValues(result).Inc()
	m.commitDuration.Observe(r.Duration.Seconds())
}

// OnCompaction counts one compaction of etcd's history
// (etcdstore.CompactionOptions.Done).
func (m *Metrics) OnCompaction(err error) {
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.compactions.WithLabelValues(result).Inc()
}

// GRPCInterceptor returns the Marble API's unary interceptor that records
// the grpc_server_* metrics.
func (m *Metrics) GRPCInterceptor() grpc.UnaryServerInterceptor {
	return m.grpc.UnaryServerInterceptor()
}

// InitializeGRPC creates the grpc_server_* series of every method of srv at
// zero, so that they exist before the first call.
func (m *Metrics) InitializeGRPC(srv reflection.ServiceInfoProvider) { m.grpc.InitializeMetrics(srv) }

// Requests returns the recorder of the Client API's requests
// (rest.Options.Metrics).
func (m *Metrics) Requests() *RequestMetrics { return m.requests }

// collateralCollector exports the earliest nextUpdate of the cached
// collateral, only while some is cached.
type collateralCollector struct {
	next func() (time.Time, bool)
}

var collateralDesc = prometheus.NewDesc("quarry_collateral_next_update_timestamp_seconds",
	"Earliest nextUpdate (Unix seconds) of the cached attestation collateral (TCB info, QE identity, CRLs); absent while none is cached. Quote verification fails once it has passed and fresh collateral cannot be fetched.",
	nil, nil)

func (c *collateralCollector) Describe(ch chan<- *prometheus.Desc) { ch <- collateralDesc }

func (c *collateralCollector) Collect(ch chan<- prometheus.Metric) {
	if c.next == nil {
		return
	}
	t, ok := c.next()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(collateralDesc, prometheus.GaugeValue, float64(t.UnixNano())/1e9)
}

// EtcdMember is what one etcd endpoint says about its database.
type EtcdMember struct {
	Endpoint string
	// OK is false when the endpoint did not answer (the sizes are then
	// unknown).
	OK bool
	// DBSize is the database file's size, DBSizeInUse the part in use
	// (the rest is free pages, reused by etcd and returned to the file
	// system by a defragmentation), Quota the member's
	// --quota-backend-bytes (0: the member does not say, etcd < 3.6).
	DBSize, DBSizeInUse, Quota int64
}

// etcdStatusTimeout bounds the status requests of one scrape.
const etcdStatusTimeout = 2 * time.Second

var (
	etcdUpDesc = prometheus.NewDesc("quarry_etcd_up",
		"1 when the etcd endpoint answered the status request of this scrape, else 0 (its size series are then absent).",
		[]string{"endpoint"}, nil)
	etcdSizeDesc = prometheus.NewDesc("quarry_etcd_db_size_bytes",
		"Size of the etcd endpoint's database file. etcd refuses every write (alarm NOSPACE) once it reaches the quota (quarry_etcd_db_quota_bytes).",
		[]string{"endpoint"}, nil)
	etcdInUseDesc = prometheus.NewDesc("quarry_etcd_db_size_in_use_bytes",
		"Part of the etcd endpoint's database file in use; the rest is free pages that etcd reuses and a defragmentation returns.",
		[]string{"endpoint"}, nil)
	etcdQuotaDesc = prometheus.NewDesc("quarry_etcd_db_quota_bytes",
		"The etcd endpoint's backend quota (--quota-backend-bytes; absent when the member does not report it, etcd before 3.6).",
		[]string{"endpoint"}, nil)
)

// etcdCollector asks the etcd endpoints for their database size at
// scrape time.
type etcdCollector struct {
	status func(ctx context.Context) []EtcdMember
}

func (c *etcdCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- etcdUpDesc
	ch <- etcdSizeDesc
	ch <- etcdInUseDesc
	ch <- etcdQuotaDesc
}

func (c *etcdCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), etcdStatusTimeout)
	defer cancel()
	for _, m := range c.status(ctx) {
		if !m.OK {
			ch <- prometheus.MustNewConstMetric(etcdUpDesc, prometheus.GaugeValue, 0, m.Endpoint)
			continue
		}
		ch <- prometheus.MustNewConstMetric(etcdUpDesc, prometheus.GaugeValue, 1, m.Endpoint)
		ch <- prometheus.MustNewConstMetric(etcdSizeDesc, prometheus.GaugeValue, float64(m.DBSize), m.Endpoint)
		ch <- prometheus.MustNewConstMetric(etcdInUseDesc, prometheus.GaugeValue, float64(m.DBSizeInUse), m.Endpoint)
		if m.Quota > 0 {
			ch <- prometheus.MustNewConstMetric(etcdQuotaDesc, prometheus.GaugeValue, float64(m.Quota), m.Endpoint)
		}
	}
}

// codeLabel is the code label of a status code.
func codeLabel(code int) string {
	if code < 100 || code > 999 {
		return "0"
	}
	return strconv.Itoa(code)
}
