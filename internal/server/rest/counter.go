package rest

import (
	"net/http"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

// postMonotonicCounter raises a Marble's monotonic counter and returns its
// previous value (docs/design/behaviour.md#monotonic-counters). Before the
// body is read (docs/design/decisions.md#d16): the state (409), the
// caller's Marble certificate, the leaf only (401;
// docs/design/decisions.md#d14), then the MonotonicCounter feature gate (403): only
// an authenticated Marble learns whether the feature is on.
func (s *server) postMonotonicCounter(r *http.Request) (any, error) {
	if err := s.c.CheckMonotonicCounter(); err != nil {
		return nil, err
	}
	if _, err := s.c.AuthenticateMarble(peerCertificates(r)); err != nil {
		return nil, err
	}
	if err := s.c.CheckMonotonicCounterFeature(); err != nil {
		return nil, err
	}
	var req v2.MonotonicCounterRequest
	if err := decodeBody(r, maxCounterBody, &req); err != nil {
		return nil, err
	}
	prev, err := s.c.SetMonotonicCounter(r.Context(), peerCertificates(r), req.Name, req.Value)
	if err != nil {
		return nil, err
	}
	return v2.MonotonicCounterResponse{Value: prev}, nil
}
