package metrics

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// MaxEventsRequests bounds the /events requests served at once; more are
// answered 503 at once (docs/operations.md, "Activation events"). Each
// streams its answer through a small buffer, so a client that does not
// read holds one place and little memory until the server's write
// timeout.
const MaxEventsRequests = 2

// eventsBuffer is the buffer each /events answer is written through.
const eventsBuffer = 32 << 10

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
		"/events":  &eventsHandler{src: events, log: log, busy: make(chan struct{}, MaxEventsRequests)},
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

// Event is one entry of /events (MarbleRun's shape, docs/design/behaviour.md#metrics-and-events).
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

// eventsHandler serves /events: the kept events as one JSON array,
// encoded event by event into the connection, at most MaxEventsRequests
// at once.
type eventsHandler struct {
	src  EventSource
	log  *slog.Logger
	busy chan struct{}
}

func (h *eventsHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case h.busy <- struct{}{}:
		defer func() { <-h.busy }()
	default:
		w.Header().Set("Retry-After", "1")
		plain(w, http.StatusServiceUnavailable, fmt.Sprintf("busy: %d /events requests are being answered; try again", MaxEventsRequests))
		return
	}
	evs, dropped := h.src.ActivationEvents()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(DroppedEventsHeader, strconv.FormatUint(dropped, 10))
	if r.Method == http.MethodHead {
		return
	}
	bw := bufio.NewWriterSize(w, eventsBuffer)
	err := writeEvents(bw, evs)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		h.log.Debug("writing /events", "error", err.Error())
	}
}

// writeEvents writes evs as a JSON array of Event, one event at a time.
func writeEvents(w *bufio.Writer, evs []core.ActivationEvent) error {
	w.WriteByte('[')
	for i, e := range evs {
		if i > 0 {
			w.WriteByte(',')
		}
		b, err := json.Marshal(Event{
			Time:       e.Time.Format(time.RFC3339Nano),
			Activation: EventActivation{MarbleType: e.MarbleType, UUID: e.UUID, Quote: e.Quote},
		})
		if err != nil {
			return err
		}
		if _, err := w.Write(b); err != nil {
			return err // the client is gone or too slow
		}
	}
	_, err := w.WriteString("]\n")
	return err
}
