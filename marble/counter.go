package marble

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/quarry-cc/quarry/api/jsend"
	v2 "github.com/quarry-cc/quarry/api/v2"
)

// counterTimeout bounds one counter request when ctx has no deadline.
const counterTimeout = 30 * time.Second

// maxCounterAnswer bounds the Coordinator's answer to a counter request.
const maxCounterAnswer = 64 << 10

// ErrNotCoordinatorRoot: the server at the Client API address did not
// present the Coordinator root of the Credentials as its certificate.
var ErrNotCoordinatorRoot = errors.New("marble: the server is not the Coordinator that issued this Marble's credentials")

// CounterError is an answer of the Coordinator to a counter request other
// than success: a JSend fail (HTTP 4xx: 403 when the manifest lacks the
// MonotonicCounter feature gate or the Marble has too many counters, 401
// when the Marble certificate predates the last update, 409 when the
// Coordinator is not running) or error (HTTP 5xx).
type CounterError struct {
	HTTPStatus int    // the HTTP status code
	Status     string // the JSend status, "fail" or "error"; empty if the body was not JSend
	Message    string // the Coordinator's message
}

func (e *CounterError) Error() string {
	return fmt.Sprintf("marble: monotonic counter: %s (HTTP %d)", e.Message, e.HTTPStatus)
}

// MonotonicCounter raises this Marble's counter name to value at the
// Coordinator's Client API (POST /api/v2/monotonic-counter) and returns the
// counter's previous value: 0 for a new counter. A counter never decreases:
// if value is not larger than the current value, nothing changes and the
// current value comes back. The Coordinator stores the new value before it
// answers. Counters belong to the Marble's type and UUID: a restart with
// the same UUID file sees the same counters.
//
// clientAPI is the Coordinator's Client API address, host:port (4433 by
// default). The Coordinator does not hand it out; pass it to the Marble
// like any other setting, e.g. in the manifest's Env. Whoever answers
// there must present the Coordinator root of c (MARBLE_PREDEFINED_COORDINATOR_ROOT_CA)
// as its TLS certificate, else ErrNotCoordinatorRoot; the Marble presents
// its Marble certificate. The manifest must enable the counter
// ("Config": {"FeatureGates": ["MonotonicCounter"]}). A refusal is a
// *CounterError.
func (c *Credentials) MonotonicCounter(ctx context.Context, clientAPI, name string, value uint64) (uint64, error) {
	if name == "" {
		return 0, errors.New("marble: monotonic counter: empty counter name")
	}
	if _, _, err := net.SplitHostPort(clientAPI); err != nil {
		return 0, fmt.Errorf("marble: monotonic counter: the Client API address %q is not host:port: %w", clientAPI, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, counterTimeout)
		defer cancel()
	}
	root := c.CoordinatorRoot
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{
			MinVersion:         tls.VersionTLS12,
			Certificates:       []tls.Certificate{c.Certificate},
			InsecureSkipVerify: true, // the certificate is compared with the pinned root below
			VerifyConnection: func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) == 0 || !cs.PeerCertificates[0].Equal(root) {
					return ErrNotCoordinatorRoot
				}
				return nil
			},
		},
		ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	body, err := json.Marshal(v2.MonotonicCounterRequest{Name: name, Value: value})
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+clientAPI+v2.PathMonotonicCounter, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("marble: monotonic counter: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		if errors.Is(err, ErrNotCoordinatorRoot) {
			return 0, fmt.Errorf("marble: monotonic counter at %s: %w", clientAPI, ErrNotCoordinatorRoot)
		}
		return 0, fmt.Errorf("marble: monotonic counter at %s: %w", clientAPI, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxCounterAnswer+1))
	if err != nil {
		return 0, fmt.Errorf("marble: monotonic counter at %s: reading the answer: %w", clientAPI, err)
	}
	if len(raw) > maxCounterAnswer {
		return 0, &CounterError{HTTPStatus: resp.StatusCode, Message: fmt.Sprintf("answer larger than %d bytes", maxCounterAnswer)}
	}
	var out jsend.Response[json.RawMessage]
	jerr := json.Unmarshal(raw, &out)
	var data v2.MonotonicCounterResponse
	if jerr == nil && out.Status == jsend.StatusSuccess {
		jerr = json.Unmarshal(out.Data, &data)
	}
	if resp.StatusCode != http.StatusOK || jerr != nil || out.Status != jsend.StatusSuccess {
		e := &CounterError{HTTPStatus: resp.StatusCode, Status: out.Status, Message: out.Message}
		if jerr != nil || out.Status == "" {
			e.Status, e.Message = "", "the answer is not a JSend response"
		} else if e.Message == "" {
			e.Message = http.StatusText(resp.StatusCode)
		}
		return 0, e
	}
	return data.Value, nil
}

// ReadMonotonicCounter returns the current value of this Marble's counter
// name without raising it (0 for a counter that does not exist; reading
// does not create it). See MonotonicCounter.
func (c *Credentials) ReadMonotonicCounter(ctx context.Context, clientAPI, name string) (uint64, error) {
	return c.MonotonicCounter(ctx, clientAPI, name, 0)
}
