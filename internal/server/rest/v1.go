package rest

import (
	"fmt"
	"net/http"

	v1 "github.com/quarry-cc/quarry/api/v1"
	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/internal/updatelog"
)

// The unprefixed generation (version 1.2): adapters that reshape requests
// and responses and call the same use cases as /api/v2. They hold no logic
// of their own; errors are rendered as JSend "error" (never "fail") with
// the same HTTP status codes as v2.

func (s *server) v1Routes() []route {
	return []route{
		{method: http.MethodGet, path: v1.PathStatus, handle: s.v1GetStatus, v1: true},
		{method: http.MethodGet, path: v1.PathManifest, handle: s.v1GetManifest, v1: true},
		{method: http.MethodPost, path: v1.PathManifest, handle: s.v1PostManifest, v1: true},
		{method: http.MethodGet, path: v1.PathQuote, handle: s.v1GetQuote, v1: true},
		{method: http.MethodPost, path: v1.PathRecover, handle: s.v1PostRecover, v1: true},
		{method: http.MethodGet, path: v1.PathSecrets, handle: s.v1GetSecrets, v1: true},
		{method: http.MethodPost, path: v1.PathSecrets, handle: s.v1PostSecrets, v1: true},
		{method: http.MethodGet, path: v1.PathUpdate, handle: s.v1GetUpdateLog, v1: true},
		{method: http.MethodPost, path: v1.PathUpdate, handle: s.v1PostUpdate, v1: true},
		{method: http.MethodGet, path: v1.PathUpdateManifest, handle: s.v1GetPendingUpdate, v1: true},
		{method: http.MethodPost, path: v1.PathUpdateManifest, handle: s.v1PostAcknowledge, v1: true},
		{method: http.MethodPost, path: v1.PathUpdateCancel, handle: s.v1PostCancel, v1: true},
	}
}

func (s *server) v1GetStatus(r *http.Request) (any, error) {
	st := s.c.Status()
	return v1.StatusResponse{StatusCode: int(st), StatusMessage: st.Message()}, nil
}

func (s *server) v1GetManifest(*http.Request) (any, error) {
	m, err := s.c.Manifest()
	if err != nil {
		return nil, err
	}
	return v1.ManifestGetResponse{ManifestSignatureRootECDSA: m.Signature, ManifestSignature: m.Fingerprint, Manifest: m.Raw}, nil
}

func (s *server) v1PostManifest(r *http.Request) (any, error) {
	if err := s.c.CheckSetManifest(); err != nil {
		return nil, err
	}
	raw, err := readRawBody(r, s.opts.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	secrets, err := s.c.SetManifest(r.Context(), raw)
	if err != nil || len(secrets) == 0 {
		return nil, err
	}
	return v1.ManifestSetResponse{RecoverySecrets: secrets}, nil
}

func (s *server) v1GetQuote(r *http.Request) (any, error) {
	res, err := s.c.Quote(r.Context(), nil)
	if err != nil {
		return nil, err
	}
	return v1.QuoteResponse{Cert: string(res.ChainPEM), Quote: res.Quote}, nil
}

// errV1RecoverDisabled answers v1 POST /recover unless the operator enabled
// it (docs/design/decisions.md#d11).
var errV1RecoverDisabled = &disabledError{msg: "POST /recover (v1) is disabled: it carries no signature over the recovery secret, " +
	"so it does not prove that the uploader holds the recovery key; use POST /api/v2/recover, " +
	"or start the Coordinator with --enable-v1-recover (QUARRY_ENABLE_V1_RECOVER=1)"}

func (s *server) v1PostRecover(r *http.Request) (any, error) {
	if !s.opts.EnableV1Recover {
		return nil, errV1RecoverDisabled
	}
	if err := s.c.CheckRecoverUnsigned(); err != nil {
		return nil, err
	}
	var secret []byte
	if err := decodeBody(r, maxRecoverBody, &secret); err != nil {
		return nil, err
	}
	if len(secret) == 0 {
		return nil, &bodyError{msg: "invalid request: the body must be the recovery secret as a JSON array of byte values"}
	}
	res, err := s.c.RecoverUnsigned(r.Context(), secret)
	if err != nil {
		return nil, err
	}
	return v1.RecoverResponse{StatusMessage: recoverMessage(res), Remaining: res.Remaining}, nil
}

func (s *server) v1GetSecrets(r *http.Request) (any, error) {
	got, err := s.readSecrets(r)
	if err != nil {
		return nil, err
	}
	out := make(map[string]v1.Secret, len(got))
	for n, v := range got {
		out[n] = v1.Secret(v)
	}
	return out, nil
}

func (s *server) v1PostSecrets(r *http.Request) (any, error) {
	if err := s.authenticate(r, opSecrets); err != nil {
		return nil, err
	}
	var req map[string]v1.UserSecret
	if err := decodeBody(r, maxSmallBody, &req); err != nil {
		return nil, err
	}
	uploads := make(map[string]secrets.Upload, len(req))
	for n, u := range req {
		uploads[n] = secrets.Upload{Key: u.Key, Cert: u.Cert, Private: u.Private}
	}
	return nil, s.c.SetSecrets(r.Context(), peerCertificates(r), uploads)
}

func (s *server) v1GetUpdateLog(r *http.Request) (any, error) {
	log, err := s.c.UpdateLog(r.Context())
	if err != nil {
		return nil, err
	}
	return updatelog.Text(log), nil
}

func (s *server) v1PostUpdate(r *http.Request) (any, error) {
	if err := s.authenticate(r, ""); err != nil {
		return nil, err
	}
	raw, err := readRawBody(r, s.opts.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	_, err = s.c.Update(r.Context(), peerCertificates(r), raw)
	return nil, err
}

func (s *server) v1GetPendingUpdate(r *http.Request) (any, error) {
	data, err := s.getPendingUpdate(r)
	if err != nil {
		return nil, err
	}
	return v1.PendingUpdateResponse(data.(pendingUpdateData)), nil
}

func (s *server) v1PostAcknowledge(r *http.Request) (any, error) {
	if err := s.authenticate(r, ""); err != nil {
		return nil, err
	}
	raw, err := readRawBody(r, s.opts.MaxManifestBytes)
	if err != nil {
		return nil, err
	}
	res, err := s.c.AcknowledgeUpdate(r.Context(), peerCertificates(r), raw)
	if err != nil {
		return nil, err
	}
	return ackMessage(res), nil
}

func (s *server) v1PostCancel(r *http.Request) (any, error) {
	if err := s.authenticate(r, ""); err != nil {
		return nil, err
	}
	if err := s.c.CancelUpdate(r.Context(), peerCertificates(r)); err != nil {
		return nil, err
	}
	return cancelMessage, nil
}

// recoverMessage is the progress text of a recovery.
func recoverMessage(res core.RecoverResult) string {
	if res.Remaining == 0 {
		return "Recovery successful."
	}
	return fmt.Sprintf("Secret was processed successfully. Upload the next secret. Remaining secrets: %d", res.Remaining)
}
