package client

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

// Coordinator states as reported by Status (MarbleRun's state codes).
const (
	StateRecovery          = 1 // waiting for recovery secrets, or a new manifest
	StateAcceptingManifest = 2 // ready for a manifest
	StateAcceptingMarbles  = 3 // running: manifest set, Marbles may activate
)

// Status returns the Coordinator's state code and message (GET
// /api/v2/status).
func (c *Client) Status(ctx context.Context) (*v2.StatusResponse, error) {
	var out v2.StatusResponse
	if _, err := c.do(ctx, http.MethodGet, v2.PathStatus, nil, nil, &out); err != nil {
		return nil, err
	}
	if out.Code == 0 {
		out.Code = out.Status // a server that sends only the spec's name
	}
	if out.Status == 0 {
		out.Status = out.Code // MarbleRun sends only code
	}
	return &out, nil
}

// GetManifest returns the manifest that is set, with its fingerprint and the
// root's signature (GET /api/v2/manifest). Use VerifyManifest to check them.
func (c *Client) GetManifest(ctx context.Context) (*v2.ManifestGetResponse, error) {
	var out v2.ManifestGetResponse
	if _, err := c.do(ctx, http.MethodGet, v2.PathManifest, nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetManifest uploads the manifest, exactly these bytes (POST
// /api/v2/manifest). It returns the encrypted recovery secrets, one per
// RecoveryKeys entry (empty without recovery keys).
func (c *Client) SetManifest(ctx context.Context, manifest []byte) (map[string][]byte, error) {
	if len(manifest) == 0 {
		return nil, errors.New("client: SetManifest: empty manifest")
	}
	var out v2.ManifestSetResponse
	if _, err := c.do(ctx, http.MethodPost, v2.PathManifest, nil, v2.ManifestSetRequest{Manifest: manifest}, &out); err != nil {
		return nil, err
	}
	if out.RecoverySecrets == nil {
		out.RecoverySecrets = map[string][]byte{}
	}
	return out.RecoverySecrets, nil
}

// Quote returns the Coordinator's certificate chain (PEM, intermediate then
// root) and its quote over SHA-256(root DER ‖ nonce) (GET /api/v2/quote). The
// quote is nil in simulation mode. A nil nonce asks for the cached quote
// without a nonce. To establish trust, use VerifyCoordinator instead.
func (c *Client) Quote(ctx context.Context, nonce []byte) (*v2.QuoteResponse, error) {
	out, _, err := c.quote(ctx, nonce)
	return out, err
}

func (c *Client) quote(ctx context.Context, nonce []byte) (*v2.QuoteResponse, response, error) {
	var q url.Values
	if len(nonce) > 0 {
		q = url.Values{"nonce": {base64.URLEncoding.EncodeToString(nonce)}}
	}
	var out v2.QuoteResponse
	r, err := c.do(ctx, http.MethodGet, v2.PathQuote, q, nil, &out)
	if err != nil {
		return nil, r, err
	}
	return &out, r, nil
}

// Recover uploads one recovery secret with its signature (POST
// /api/v2/recover): the plain secret, or the secret encrypted to the
// ephemeral key (EncryptRecoverySecret); the signature is always over the
// plain secret (SignRecoverySecret). Remaining tells how many more secrets
// are needed.
func (c *Client) Recover(ctx context.Context, secret, signature []byte) (*v2.RecoverResponse, error) {
	if len(secret) == 0 || len(signature) == 0 {
		return nil, errors.New("client: Recover: empty secret or signature")
	}
	var out v2.RecoverResponse
	req := v2.RecoverRequest{RecoverySecret: secret, RecoverySecretSignature: signature}
	if _, err := c.do(ctx, http.MethodPost, v2.PathRecover, nil, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RecoveryPublicKey returns the Coordinator's ephemeral RSA key for
// encrypting recovery secrets in transit (GET /api/v2/recover/public-key;
// recovery mode only).
func (c *Client) RecoveryPublicKey(ctx context.Context) (*rsa.PublicKey, error) {
	var out v2.RecoveryPublicKeyResponse
	if _, err := c.do(ctx, http.MethodGet, v2.PathRecoverKey, nil, nil, &out); err != nil {
		return nil, err
	}
	if out.Algorithm != "RSA" {
		return nil, fmt.Errorf("client: the Coordinator's ephemeral key uses algorithm %q; only RSA is supported", out.Algorithm)
	}
	pub, err := x509.ParsePKIXPublicKey(out.EphemeralPublicKey)
	if err != nil {
		return nil, fmt.Errorf("client: parsing the Coordinator's ephemeral key: %w", err)
	}
	rsaPub, ok := pub.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("client: the Coordinator's ephemeral key is a %T, not RSA", pub)
	}
	return rsaPub, nil
}

// RecoverySecrets returns the encrypted recovery secrets last handed out, by
// the manifest set or by the update that last made a new data key (it
// changed the recovery keys, or SealMode to UniqueKey)
// (GET /api/v2/recover/secrets), one per RecoveryKeys name: for when that
// answer was lost. Each is encrypted to its recovery key
// (DecryptRecoverySecret). It needs the client certificate of a manifest
// user with UpdateManifest. ErrNotFound: the manifest has no recovery keys.
func (c *Client) RecoverySecrets(ctx context.Context) (map[string][]byte, error) {
	var out v2.RecoverySecretsResponse
	if _, err := c.do(ctx, http.MethodGet, v2.PathRecoverSecrets, nil, nil, &out); err != nil {
		return nil, err
	}
	if out.RecoverySecrets == nil {
		out.RecoverySecrets = map[string][]byte{}
	}
	return out.RecoverySecrets, nil
}

// GetSecrets returns the named secrets (GET /api/v2/secrets). It needs a
// manifest user's client certificate (WithClientCertificate) with read
// permission for all of them.
func (c *Client) GetSecrets(ctx context.Context, names ...string) (map[string]v2.Secret, error) {
	if len(names) == 0 {
		return nil, errors.New("client: GetSecrets: no secret names given")
	}
	for _, n := range names {
		if n == "" {
			return nil, errors.New("client: GetSecrets: empty secret name")
		}
	}
	var out v2.SecretsGetResponse
	if _, err := c.do(ctx, http.MethodGet, v2.PathSecrets, url.Values{"s": names}, nil, &out); err != nil {
		return nil, err
	}
	return out.Secrets, nil
}

// SetSecrets uploads user-defined secrets (POST /api/v2/secrets). It needs a
// manifest user's client certificate with write permission for all of them.
func (c *Client) SetSecrets(ctx context.Context, secrets map[string]v2.UserSecret) error {
	if len(secrets) == 0 {
		return errors.New("client: SetSecrets: no secrets given")
	}
	_, err := c.do(ctx, http.MethodPost, v2.PathSecrets, nil, v2.SecretsSetRequest{Secrets: secrets}, nil)
	return err
}

// UpdateLog returns the update log, one JSON entry per string (GET
// /api/v2/update).
func (c *Client) UpdateLog(ctx context.Context) ([]string, error) {
	var out v2.UpdateLogResponse
	if _, err := c.do(ctx, http.MethodGet, v2.PathUpdate, nil, nil, &out); err != nil {
		return nil, err
	}
	return out.UpdateLog, nil
}

// Update sends a manifest update (POST /api/v2/update): only packages with
// new security versions (applied at once), or a complete new manifest
// (applied when enough users have acknowledged it). It needs a manifest
// user's client certificate.
func (c *Client) Update(ctx context.Context, manifest []byte) (*v2.UpdateResponse, error) {
	if len(manifest) == 0 {
		return nil, errors.New("client: Update: empty manifest")
	}
	var out v2.UpdateResponse
	if _, err := c.do(ctx, http.MethodPost, v2.PathUpdate, nil, v2.UpdateRequest{Manifest: manifest}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PendingUpdate returns the pending complete-manifest update and the users
// that have not acknowledged it (GET /api/v2/update-manifest). ErrNotFound:
// nothing is pending.
func (c *Client) PendingUpdate(ctx context.Context) (*v2.PendingUpdateResponse, error) {
	var out v2.PendingUpdateResponse
	if _, err := c.do(ctx, http.MethodGet, v2.PathUpdateManifest, nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AcknowledgeUpdate acknowledges the pending update by uploading the same
// manifest (POST /api/v2/update-manifest). The last acknowledgement applies
// it; RecoverySecrets is then set if it made a new data key (the recovery
// keys changed, or SealMode changed to UniqueKey).
func (c *Client) AcknowledgeUpdate(ctx context.Context, manifest []byte) (*v2.UpdateAckResponse, error) {
	if len(manifest) == 0 {
		return nil, errors.New("client: AcknowledgeUpdate: empty manifest")
	}
	var out v2.UpdateAckResponse
	if _, err := c.do(ctx, http.MethodPost, v2.PathUpdateManifest, nil, v2.UpdateRequest{Manifest: manifest}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CancelUpdate cancels the pending update (POST /api/v2/update-cancel) and
// returns the Coordinator's message. ErrNotFound: nothing is pending.
func (c *Client) CancelUpdate(ctx context.Context) (string, error) {
	var out v2.UpdateCancelResponse
	if _, err := c.do(ctx, http.MethodPost, v2.PathUpdateCancel, nil, struct{}{}, &out); err != nil {
		return "", err
	}
	return out.Message, nil
}

// SignQuote has the Coordinator verify an SGX quote and sign the result with
// its root key (POST /api/v2/sign-quote; enabled by the manifest's
// SignQuoteEndpoint feature gate). Check the result with VerifyQuoteSignature.
func (c *Client) SignQuote(ctx context.Context, quote []byte) (*v2.SignQuoteResponse, error) {
	if len(quote) == 0 {
		return nil, errors.New("client: SignQuote: empty quote")
	}
	var out v2.SignQuoteResponse
	if _, err := c.do(ctx, http.MethodPost, v2.PathSignQuote, nil, v2.SignQuoteRequest{SGXQuote: quote}, &out); err != nil {
		return nil, err
	}
	if len(out.Signature) == 0 {
		out.Signature = out.VerificationSignature // MarbleRun's name only
	}
	if len(out.VerificationSignature) == 0 {
		out.VerificationSignature = out.Signature
	}
	return &out, nil
}

// MonotonicCounter raises the calling Marble's counter name to value (POST
// /api/v2/monotonic-counter) and returns its previous value, 0 for a new
// counter. A counter never decreases: a value not larger than the current
// one changes nothing and returns the current value, so value 0 reads the
// counter without creating it. The Client must present a Marble
// certificate (WithClientCertificate with the leaf of
// MARBLE_PREDEFINED_MARBLE_CERTIFICATE_CHAIN and MARBLE_PREDEFINED_PRIVATE_KEY;
// ErrUnauthorized otherwise) and the manifest must enable the
// MonotonicCounter feature gate (ErrForbidden otherwise). Marbles written
// in Go can use marble.Credentials.MonotonicCounter instead.
func (c *Client) MonotonicCounter(ctx context.Context, name string, value uint64) (uint64, error) {
	if name == "" {
		return 0, errors.New("client: MonotonicCounter: empty counter name")
	}
	var out v2.MonotonicCounterResponse
	if _, err := c.do(ctx, http.MethodPost, v2.PathMonotonicCounter, nil, v2.MonotonicCounterRequest{Name: name, Value: value}, &out); err != nil {
		return 0, err
	}
	return out.Value, nil
}
