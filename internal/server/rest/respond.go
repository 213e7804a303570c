package rest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"

	"github.com/quarry-cc/quarry/api/jsend"
	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/internal/admission"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/manifest"
)

// Errors of the HTTP layer itself.
var (
	errUnknownPath = errors.New("unknown path")
	errBadMethod   = errors.New("method not allowed")
	errPanic       = errors.New("internal error")
	// errBusy: the memory reserved for request bodies is taken by other
	// large requests (docs/design/decisions.md#d16).
	errBusy = &unavailableError{
		msg:        "the Coordinator is busy with other large requests; retry in a moment",
		retryAfter: 1,
	}
	// errSourceBusy: the request's source address holds its share of
	// the memory for request bodies already.
	errSourceBusy = &limitError{
		msg:        "too many large requests from your address at once: it holds its share of the Coordinator's memory for request bodies; retry when one of them has been answered",
		retryAfter: 1,
	}
	// errTooManyRequests: the request's source address has as many
	// requests in progress as it may.
	errTooManyRequests = &limitError{
		msg:        "too many requests from your address in progress at once; retry when one of them has been answered",
		retryAfter: 1,
	}
)

// msgNoFiles is the message of a request that failed because the process
// has no file descriptor left (EMFILE, ENFILE).
const msgNoFiles = "the Coordinator has too many open files at the moment; retry in a moment"

// msgStoreUnavailable is the message of a request refused because the
// shared store cannot be reached (core.ErrUnavailable).
const msgStoreUnavailable = "the Coordinator cannot reach its state store (etcd); try again, here or at another instance (a retry runs against the stored state, so nothing is applied twice)"

// bodyError is a problem with the request body or query (400, 413 when
// the body is too large, 408 when it arrived too slowly).
type bodyError struct {
	msg      string
	tooLarge bool
	timeout  bool
}

func (e *bodyError) Error() string { return e.msg }

// disabledError is a request for a feature the operator has switched off
// (403); the message says which setting switches it on.
type disabledError struct{ msg string }

func (e *disabledError) Error() string { return e.msg }

// unavailableError is a request the Coordinator cannot serve now but may
// later (503, with Retry-After in seconds): not the client's mistake, and
// not a failure whose cause must be hidden.
type unavailableError struct {
	msg        string
	retryAfter int
	err        error // the cause, if any (logged, not shown)
}

func (e *unavailableError) Error() string   { return e.msg }
func (e *unavailableError) Unwrap() error   { return e.err }
func (e *unavailableError) RetryAfter() int { return e.retryAfter }

// limitError is a request refused because its source address holds as
// much as one address may (429, with Retry-After in seconds).
type limitError struct {
	msg        string
	retryAfter int
}

func (e *limitError) Error() string   { return e.msg }
func (e *limitError) RetryAfter() int { return e.retryAfter }

// failData is an error that carries the data object of a fail response.
type failData interface {
	error
	FailData() any
}

// class is who caused a failure, which decides how it is rendered.
type class int

const (
	// classInternal: the service failed (500 error); the client gets a
	// generic message with the request ID, the log gets the cause.
	classInternal class = iota
	// classClient: the client's mistake (4xx; v2 fail) with its message.
	classClient
	// classUnavailable: the Coordinator is busy or out of time (503
	// error with the message and Retry-After).
	classUnavailable
)

// statusOf maps an error to its HTTP status and its class (docs/design/decisions.md#d1).
// It is the only error→status map.
func statusOf(err error) (int, class) {
	var (
		be *bodyError
		de *disabledError
		ue *unavailableError
		he *headerError
		le *limitError
	)
	switch {
	case errors.As(err, &he):
		return http.StatusRequestHeaderFieldsTooLarge, classClient
	case errors.As(err, &ue), errors.Is(err, core.ErrUnavailable), admission.NoFiles(err):
		return http.StatusServiceUnavailable, classUnavailable
	case errors.As(err, &le):
		return http.StatusTooManyRequests, classClient
	case errors.As(err, &be):
		switch {
		case be.tooLarge:
			return http.StatusRequestEntityTooLarge, classClient
		case be.timeout:
			return http.StatusRequestTimeout, classClient
		}
		return http.StatusBadRequest, classClient
	case errors.As(err, &de):
		return http.StatusForbidden, classClient
	case errors.Is(err, core.ErrTooLarge):
		// The change would take the state beyond a limit the message
		// names (docs/ha.md, "Limits").
		return http.StatusRequestEntityTooLarge, classClient
	case errors.Is(err, manifest.ErrInvalid), errors.Is(err, core.ErrInvalidRequest):
		return http.StatusBadRequest, classClient
	case errors.Is(err, core.ErrUnauthenticated):
		return http.StatusUnauthorized, classClient
	case errors.Is(err, core.ErrForbidden):
		return http.StatusForbidden, classClient
	case errors.Is(err, errUnknownPath), errors.Is(err, core.ErrNotFound):
		return http.StatusNotFound, classClient
	case errors.Is(err, errBadMethod):
		return http.StatusMethodNotAllowed, classClient
	case errors.Is(err, core.ErrWrongState), errors.Is(err, core.ErrConflict):
		return http.StatusConflict, classClient
	}
	return http.StatusInternalServerError, classInternal
}

// dataOf returns the data object of a fail response for err, if any.
func dataOf(err error) any {
	var ve *manifest.ValidationError
	if errors.As(err, &ve) {
		return v2.ValidationFailure{Section: ve.Section, Name: ve.Name, Field: ve.Field}
	}
	var fd failData
	if errors.As(err, &fd) {
		return fd.FailData()
	}
	return nil
}

// encoded is response data already encoded as JSON; the renderer embeds it
// as is. Handlers use it for large responses that do not change between
// requests (see manifestCache).
type encoded []byte

// document is response data that is not JSON (the OpenAPI description):
// the renderer sends body as is with its media type.
type document struct {
	contentType []string
	body        []byte
}

// renderer writes every response of one API generation.
type renderer struct {
	log     *slog.Logger
	v1      bool
	methods map[string][]string // path → methods, for the Allow header
}

// write renders the result of a handler: success with data, or the error as
// fail (client mistakes, v2) or error (v1 always; service failures always).
// It is the only place that writes JSend.
func (r renderer) write(w http.ResponseWriter, req *http.Request, data any, err error) {
	status := http.StatusOK
	var body any
	if enc, ok := data.(encoded); ok && err == nil {
		prefix := `{"status":"success","data":`
		if r.v1 {
			prefix = `{"Status":"success","Data":`
		}
		buf := make([]byte, 0, len(prefix)+len(enc)+2)
		buf = append(append(append(buf, prefix...), enc...), '}')
		r.send(w, status, buf)
		return
	}
	if doc, ok := data.(document); ok && err == nil {
		r.sendAs(w, status, doc.contentType, doc.body)
		return
	}
	if err == nil {
		if r.v1 {
			body = jsend.V1Response[any]{Status: jsend.StatusSuccess, Data: data}
		} else {
			body = jsend.Response[any]{Status: jsend.StatusSuccess, Data: data}
		}
	} else {
		var cl class
		status, cl = statusOf(err)
		msg := err.Error()
		switch cl {
		case classInternal:
			r.log.Error("request failed", "requestID", requestID(req.Context()), "error", err.Error())
			msg = "internal error (request ID " + requestID(req.Context()) + "); see the Coordinator's log"
		case classUnavailable:
			var ue *unavailableError
			switch {
			case errors.As(err, &ue):
				if ue.err != nil {
					r.log.Warn("request abandoned", "requestID", requestID(req.Context()), "error", ue.err.Error())
				}
			case admission.NoFiles(err):
				// A file the use case needed could not be opened:
				// the cause goes to the log, the client retries.
				r.log.Warn("request refused: no file descriptor left", "requestID", requestID(req.Context()), "error", err.Error())
				msg = msgNoFiles
			default:
				// core.ErrUnavailable: the cause (etcd's endpoints and
				// error) goes to the log, the client gets what to do.
				r.log.Warn("request refused: the shared state store is unavailable", "requestID", requestID(req.Context()), "error", err.Error())
				msg = msgStoreUnavailable
			}
		}
		if cl != classInternal {
			retryAfter := 0
			var ra interface{ RetryAfter() int }
			if errors.As(err, &ra) {
				retryAfter = ra.RetryAfter()
			}
			if cl == classUnavailable {
				retryAfter = max(retryAfter, 1)
			}
			if retryAfter > 0 {
				w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
			}
		}
		switch {
		case r.v1:
			body = jsend.V1Response[any]{Status: jsend.StatusError, Message: msg}
		case cl == classClient:
			body = jsend.Response[any]{Status: jsend.StatusFail, Data: dataOf(err), Message: msg}
		default:
			body = jsend.Response[any]{Status: jsend.StatusError, Message: msg}
		}
		if status == http.StatusMethodNotAllowed {
			if allow := allowHeader(r.methods, req.URL.Path); allow != "" {
				w.Header().Set("Allow", allow)
			}
		}
	}
	buf, mErr := json.Marshal(body)
	if mErr != nil {
		r.log.Error("encoding response", "requestID", requestID(req.Context()), "error", mErr.Error())
		status = http.StatusInternalServerError
		buf = []byte(`{"status":"error","data":null,"message":"internal error: response could not be encoded"}`)
	}
	r.send(w, status, buf)
}

// send writes a JSON body (a newline is appended) with its length, so that
// the response is never chunked.
func (r renderer) send(w http.ResponseWriter, status int, body []byte) {
	r.sendAs(w, status, contentTypeJSON, append(body, '\n'))
}

// sendAs writes body as is, of the media type contentType, with its
// length.
func (r renderer) sendAs(w http.ResponseWriter, status int, contentType []string, body []byte) {
	h := w.Header()
	h["Content-Type"] = contentType
	h["X-Content-Type-Options"] = nosniff
	h["Cache-Control"] = noStore
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	w.Write(body)
}

// Header values shared by every response (never modified).
var (
	contentTypeJSON = []string{"application/json"}
	nosniff         = []string{"nosniff"}
	noStore         = []string{"no-store"}
)

// rawAnswer renders err with the one renderer as a complete HTTP/1.1
// response that closes the connection, for answers written below net/http
// (see GuardPlainHTTP).
func rawAnswer(err error, v1 bool) []byte {
	rec := &recorder{header: http.Header{}}
	req := (&http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/"}}).WithContext(context.Background())
	renderer{log: slog.New(slog.DiscardHandler), v1: v1}.write(rec, req, nil, err)
	resp := &http.Response{
		StatusCode: rec.status, ProtoMajor: 1, ProtoMinor: 1, Header: rec.header, Close: true,
		ContentLength: int64(rec.body.Len()), Body: io.NopCloser(&rec.body),
	}
	var out bytes.Buffer
	resp.Write(&out)
	return out.Bytes()
}

// recorder is a ResponseWriter that keeps the response (for rawAnswer).
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(status int)      { r.status = status }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
