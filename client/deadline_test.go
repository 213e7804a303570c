package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/client"
)

// racingTransport answers every request only once its context has ended,
// with what the server wrote meanwhile (body, or nothing), as net/http's
// Transport does when a response races the cancellation ("use the response
// if available", persistConn.roundTrip): when the caller's deadline passes,
// the transport closes the connection; a server whose handler returns when
// it sees the client go (without writing) sends an implicit 200 OK with no
// body, and if the transport's read loop has it before the round trip
// notices the closed connection (a descheduled goroutine under load), the
// round trip returns it without error.
type racingTransport struct {
	status int
	body   string
}

func (rt racingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	<-req.Context().Done()
	return &http.Response{
		StatusCode: rt.status, Status: http.StatusText(rt.status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader(rt.body)), ContentLength: int64(len(rt.body)),
		Request: req,
	}, nil
}

// TestDeadlineIsNeverAnAnswer: a response that raced the caller's deadline
// and is no Client API answer is the deadline, never a success or "not a
// Client API answer" (the flaky failure of cli.TestGlobalFlags under load:
// "unexpected response (not a Client API answer) (HTTP 200 OK; GET
// /api/v2/manifest)"). A state-changing request was sent, so its outcome is
// unknown.
func TestDeadlineIsNeverAnAnswer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		body   string
	}{
		{"implicit empty 200", http.StatusOK, ""},
		{"proxy page", http.StatusBadGateway, "<html>bad gateway</html>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := client.New("127.0.0.1:1", client.WithHTTPClient(&http.Client{Transport: racingTransport{tc.status, tc.body}}))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			m, err := c.GetManifest(ctx)
			if err == nil {
				t.Fatalf("a request past its deadline succeeded: %+v", m)
			}
			if e, ok := client.AsError(err); ok {
				t.Fatalf("a request past its deadline became a Coordinator answer: %v (HTTP %d)", e, e.HTTPStatus)
			}
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, client.ErrOutcomeUnknown) {
				t.Fatalf("GET past its deadline: %v, want context.DeadlineExceeded only", err)
			}

			ctx, cancel = context.WithCancel(t.Context())
			time.AfterFunc(20*time.Millisecond, cancel)
			_, err = c.CancelUpdate(ctx)
			if _, ok := client.AsError(err); ok || !errors.Is(err, context.Canceled) || !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Fatalf("POST whose context ended: %v, want context.Canceled and ErrOutcomeUnknown", err)
			}
		})
	}
}
