package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quarry-cc/quarry/internal/core"
)

// EventSource is the Coordinator's bounded log of activation events.
type EventSource interface {
	ActivationEvents() ([]core.ActivationEvent, uint64)
}

// Readiness is what /readyz asks.
type Readiness interface {
	Ready(ctx context.Context) (core.State, error)
}

// DroppedEventsHeader is the response header of /events that counts the
// events dropped because the bounded log was full.
const DroppedEventsHeader = "X-Quarry-Events-Dropped"

// Handler returns the plain-HTTP handler of the metrics listener: GET (and
// HEAD) /metrics, /events, /healthz and /readyz; anything else is 404.
func Handler(g prometheus.Gatherer, events EventSource, ready Readiness, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	routes := map[string]http.Handler{
		"/metrics": promhttp.HandlerFor(g, promhttp.HandlerOpts{
			ErrorHandling:       promhttp.ContinueOnError,
			ErrorLog:            slog.NewLogLogger(log.Handler(), slog.LevelWarn),
			MaxRequestsInFlight: 4,
			Timeout:             30 * time.Second,
		}),
		"/events":  http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serveEvents(w, events, log) }),
		"/healthz": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { plain(w, http.StatusOK, "ok") }),
		"/readyz": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := ready.Ready(r.Context()); err != nil {
				log.Warn("not ready", "error", err.Error())
				var nr *NotReadyError
				msg := "not ready"
				if errors.As(err, &nr) {
					msg = "not ready: " + nr.Reason
				}
				plain(w, http.StatusServiceUnavailable, msg)
				return
			}
			plain(w, http.StatusOK, "ok")
		}),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := routes[r.URL.Path]
		if !ok || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			plain(w, http.StatusNotFound, "404 page not found")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func plain(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write([]byte(msg + "\n"))
}

// Event is one entry of /events (MarbleRun's shape, behaviour.md §13).
type Event struct {
	Time       string          `json:"time"`
	Activation EventActivation `json:"activation"`
}

// EventActivation is the activation of an Event; Quote is base64 in JSON,
// null in simulation.
type EventActivation struct {
	MarbleType string `json:"marbleType"`
	UUID       string `json:"uuid"`
	Quote      []byte `json:"quote"`
}

func serveEvents(w http.ResponseWriter, src EventSource, log *slog.Logger) {
	evs, dropped := src.ActivationEvents()
	out := make([]Event, len(evs))
	for i, e := range evs {
		out[i] = Event{
			Time:       e.Time.Format(time.RFC3339Nano),
			Activation: EventActivation{MarbleType: e.MarbleType, UUID: e.UUID, Quote: e.Quote},
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(DroppedEventsHeader, strconv.FormatUint(dropped, 10))
	if err := json.NewEncoder(w).Encode(out); err != nil {
		log.Debug("writing /events", "error", err.Error())
	}
}
