package rest

import (
	"crypto/x509"
	"net/http"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/internal/secrets"
)

// peerCertificates returns the client certificates of the TLS handshake.
func peerCertificates(r *http.Request) []*x509.Certificate {
	if r.TLS == nil {
		return nil
	}
	return r.TLS.PeerCertificates
}

// secretNames reads the repeatable, non-empty query parameter s.
func secretNames(r *http.Request) ([]string, error) {
	names, ok := r.URL.Query()["s"]
	if !ok || len(names) == 0 {
		return nil, &bodyError{msg: "invalid query: endpoint requires at least one query parameter s=<secret name>"}
	}
	for _, n := range names {
		if n == "" {
			return nil, &bodyError{msg: "malformed query string: empty query parameter s"}
		}
	}
	return names, nil
}

func toV2Secret(s secrets.Secret) v2.Secret {
	return v2.Secret{
		Type: s.Type, Size: s.Size, Shared: s.Shared, UserDefined: s.UserDefined,
		Cert: s.Cert, ValidFor: s.ValidFor, Private: s.Private, Public: s.Public,
	}
}

// readSecrets is GET secrets of both generations: the named secrets in the
// v2 shape. It reads no body, so it needs no cheap check before the core's
// (state, then user): only the query is checked first.
func (s *server) readSecrets(r *http.Request) (map[string]v2.Secret, error) {
	names, err := secretNames(r)
	if err != nil {
		return nil, err
	}
	got, err := s.c.Secrets(r.Context(), peerCertificates(r), names)
	if err != nil {
		return nil, err
	}
	out := make(map[string]v2.Secret, len(got))
	for n, v := range got {
		out[n] = toV2Secret(v)
	}
	return out, nil
}

func (s *server) getSecrets(r *http.Request) (any, error) {
	got, err := s.readSecrets(r)
	if err != nil {
		return nil, err
	}
	return v2.SecretsGetResponse{Secrets: got}, nil
}

func (s *server) postSecrets(r *http.Request) (any, error) {
	if err := s.authenticate(r, opSecrets); err != nil {
		return nil, err
	}
	var req v2.SecretsSetRequest
	if err := decodeBody(r, maxSmallBody, &req); err != nil {
		return nil, err
	}
	uploads := make(map[string]secrets.Upload, len(req.Secrets))
	for n, u := range req.Secrets {
		uploads[n] = secrets.Upload{Key: u.Key, Cert: u.Cert, Private: u.Private, Public: u.Public}
	}
	return nil, s.c.SetSecrets(r.Context(), peerCertificates(r), uploads)
}

func (s *server) getUpdateLog(r *http.Request) (any, error) {
	log, err := s.c.UpdateLog(r.Context())
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = []string{}
	}
	return v2.UpdateLogResponse{UpdateLog: log}, nil
}
