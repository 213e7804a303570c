package rest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

// maxNonceBytes bounds the decoded quote nonce.
const maxNonceBytes = 1024

func (s *server) getStatus(*http.Request) (any, error) {
	st := s.c.Status()
	return v2.StatusResponse{Code: int(st), Status: int(st), Message: st.Message()}, nil
}

func (s *server) getManifest(*http.Request) (any, error) {
	m, err := s.c.Manifest()
	if err != nil {
		return nil, err
	}
	if c := s.manifestCache.Load(); c != nil && c.fingerprint == m.Fingerprint && bytes.Equal(c.signature, m.Signature) {
		return c.body, nil
	}
	body, err := json.Marshal(v2.ManifestGetResponse{
		ManifestSignatureRootECDSA: m.Signature,
		ManifestFingerprint:        m.Fingerprint,
		Manifest:                   m.Raw,
	})
	if err != nil {
		return nil, err
	}
	s.manifestCache.Store(&manifestCache{fingerprint: m.Fingerprint, signature: m.Signature, body: body})
	return encoded(body), nil
}

// manifestCache holds the encoded GET manifest answer for one manifest and
// signature: the manifest changes rarely and is read often, and encoding it
// (base64 inside JSON) was the largest cost of the request.
type manifestCache struct {
	fingerprint string
	signature   []byte
	body        encoded
}

func (s *server) postManifest(r *http.Request) (any, error) {
	if err := s.c.CheckSetManifest(); err != nil {
		return nil, err
	}
	raw, err := s.readManifestBody(r)
	if err != nil {
		return nil, err
	}
	secrets, err := s.c.SetManifest(r.Context(), raw)
	if err != nil {
		return nil, err
	}
	return v2.ManifestSetResponse{RecoverySecrets: secrets}, nil
}

func (s *server) getQuote(r *http.Request) (any, error) {
	var nonce []byte
	if q := r.URL.Query(); q.Get("nonce") != "" {
		var err error
		if nonce, err = decodeNonce(q.Get("nonce")); err != nil {
			return nil, &bodyError{msg: "invalid query: bad nonce format: " + err.Error()}
		}
	}
	res, err := s.c.Quote(r.Context(), nonce)
	if err != nil {
		return nil, err
	}
	return v2.QuoteResponse{Cert: string(res.ChainPEM), Quote: res.Quote}, nil
}

// decodeNonce decodes URL-safe base64, with or without padding.
func decodeNonce(s string) ([]byte, error) {
	enc := base64.URLEncoding
	if len(s)%4 != 0 {
		enc = base64.RawURLEncoding
	}
	n, err := enc.DecodeString(s)
	if err != nil {
		return nil, err
	}
	if len(n) > maxNonceBytes {
		return nil, fmt.Errorf("the nonce has %d bytes; at most %d are allowed", len(n), maxNonceBytes)
	}
	return n, nil
}

func (s *server) postRecover(r *http.Request) (any, error) {
	if err := s.c.CheckRecover(); err != nil {
		return nil, err
	}
	var req v2.RecoverRequest
	if err := decodeBody(r, maxRecoverBody, &req); err != nil {
		return nil, err
	}
	if len(req.RecoverySecret) == 0 {
		return nil, &bodyError{msg: `invalid request: the "recoverySecret" member is missing or empty`}
	}
	if len(req.RecoverySecretSignature) == 0 {
		return nil, &bodyError{msg: `invalid request: the "recoverySecretSignature" member is missing or empty`}
	}
	res, err := s.c.Recover(r.Context(), req.RecoverySecret, req.RecoverySecretSignature)
	if err != nil {
		return nil, err
	}
	return v2.RecoverResponse{Remaining: res.Remaining, Message: recoverMessage(res)}, nil
}

func (s *server) getRecoveryKey(r *http.Request) (any, error) {
	der, err := s.c.RecoveryPublicKey(r.Context())
	if err != nil {
		return nil, err
	}
	return v2.RecoveryPublicKeyResponse{Algorithm: "RSA", EphemeralPublicKey: der}, nil
}

// getRecoverySecrets returns the encrypted recovery secrets last handed out
// to a user holding UpdateManifest, so that an answer lost on the way (to
// the manifest set or to the update that changed RecoveryKeys) can be
// fetched again.
func (s *server) getRecoverySecrets(r *http.Request) (any, error) {
	secrets, err := s.c.RecoverySecrets(r.Context(), peerCertificates(r))
	if err != nil {
		return nil, err
	}
	return v2.RecoverySecretsResponse{RecoverySecrets: secrets}, nil
}
