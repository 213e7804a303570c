package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Buckets of the Client API request metrics (MarbleRun's, docs/design/behaviour.md#metrics-and-events).
var (
	durationBuckets = []float64{.005, .025, .1, .5, 1, 2.5, 5}
	sizeBuckets     = []float64{100, 1000, 2000, 5000, 10000}
)

// RequestMetrics records the Client API's requests under MarbleRun's names
// (server_client_api_http_*). The path label is the route pattern the REST
// server reports, never the raw request path; the method label is one of
// the standard methods in lower case (as promhttp writes them) or "other".
type RequestMetrics struct {
	total     *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	reqSize   *prometheus.HistogramVec
	respSize  *prometheus.HistogramVec
	inFlight  *prometheus.GaugeVec
	collector []prometheus.Collector
}

func newRequestMetrics() *RequestMetrics {
	const ns, sub = "server", "client_api"
	r := &RequestMetrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "http_request_total",
			Help: "Number of Client API requests by route pattern, status code and method.",
		}, []string{"path", "code", "method"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "http_request_duration_histogram_seconds",
			Help:    "Time to answer a Client API request, by route pattern and method.",
			Buckets: durationBuckets,
		}, []string{"path", "method"}),
		reqSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "http_request_size_histogram_bytes",
			Help:    "Approximate size of Client API requests (request line, headers, declared body), by route pattern.",
			Buckets: sizeBuckets,
		}, []string{"path"}),
		respSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "http_response_size_histogram_bytes",
			Help:    "Size of Client API response bodies, by route pattern.",
			Buckets: sizeBuckets,
		}, []string{"path"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "http_in_flight_requests",
			Help: "Client API requests being served, by route pattern.",
		}, []string{"path"}),
	}
	r.collector = []prometheus.Collector{r.total, r.duration, r.reqSize, r.respSize, r.inFlight}
	return r
}

// Describe implements prometheus.Collector.
func (r *RequestMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range r.collector {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (r *RequestMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range r.collector {
		c.Collect(ch)
	}
}

// Started records that a request for route began.
func (r *RequestMetrics) Started(route string) { r.inFlight.WithLabelValues(route).Inc() }

// Finished records a request for route that Started recorded.
func (r *RequestMetrics) Finished(route, method string, code int, requestBytes, responseBytes int64, elapsed time.Duration) {
	m := methodLabel(method)
	r.inFlight.WithLabelValues(route).Dec()
	r.total.WithLabelValues(route, codeLabel(code), m).Inc()
	r.duration.WithLabelValues(route, m).Observe(elapsed.Seconds())
	r.reqSize.WithLabelValues(route).Observe(float64(requestBytes))
	r.respSize.WithLabelValues(route).Observe(float64(responseBytes))
}

// methodLabel bounds the method label: a client may send any token.
func methodLabel(m string) string {
	switch m {
	case http.MethodGet:
		return "get"
	case http.MethodPost:
		return "post"
	case http.MethodHead:
		return "head"
	case http.MethodPut:
		return "put"
	case http.MethodDelete:
		return "delete"
	case http.MethodPatch:
		return "patch"
	case http.MethodOptions:
		return "options"
	case http.MethodConnect:
		return "connect"
	case http.MethodTrace:
		return "trace"
	}
	return "other"
}
