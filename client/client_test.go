package client_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
	"github.com/quarry-cc/quarry/internal/testpki"
)

func pinned(t *testing.T, f *fake, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(f.endpoint(), append([]client.Option{client.WithRootCertificate(f.root)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewEndpoints(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"coordinator", "https://coordinator:4433"},
		{"127.0.0.1:1234", "https://127.0.0.1:1234"},
		{"https://example.org:99", "https://example.org:99"},
		{"https://example.org/", "https://example.org:4433"},
		{"[::1]:4433", "https://[::1]:4433"},
		{" localhost ", "https://localhost:4433"},
	} {
		c, err := client.New(tc.in, client.WithInsecureSkipVerify())
		if err != nil {
			t.Errorf("New(%q): %v", tc.in, err)
			continue
		}
		if got := c.Endpoint(); got != tc.want {
			t.Errorf("New(%q).Endpoint() = %q, want %q", tc.in, got, tc.want)
		}
	}
	for _, bad := range []string{"", "http://coordinator:4433", "https://host:1/path", "https://host?x=1", "https://user@host", "https://:4433"} {
		if _, err := client.New(bad, client.WithInsecureSkipVerify()); err == nil {
			t.Errorf("New(%q) succeeded", bad)
		}
	}
}

func TestNewNeedsExplicitTrust(t *testing.T) {
	if _, err := client.New("localhost"); !errors.Is(err, client.ErrNoTrust) {
		t.Fatalf("New without trust: %v, want ErrNoTrust", err)
	}
	// A client certificate alone is no trust decision.
	cert := userCert(t, "alice")
	if _, err := client.New("localhost", client.WithClientCertificate(cert)); !errors.Is(err, client.ErrNoTrust) {
		t.Fatalf("New with only a client certificate: %v, want ErrNoTrust", err)
	}
	p := newPKI(t)
	if _, err := client.New("localhost", client.WithRootCertificate(p.root), client.WithInsecureSkipVerify()); !errors.Is(err, client.ErrExclusiveOptions) {
		t.Fatalf("root and insecure together: %v, want ErrExclusiveOptions", err)
	}
	if _, err := client.New("localhost", client.WithRootPEM([]byte("junk"))); err == nil {
		t.Fatal("junk PEM accepted")
	}
	// A chain as /quote returns it: the root is picked.
	c, err := client.New("localhost", client.WithRootPEM([]byte(certPEM(p.inter, p.root))))
	if err != nil {
		t.Fatal(err)
	}
	if !c.Root().Equal(p.root) {
		t.Fatal("WithRootPEM did not pick the root of the chain")
	}
	// A caller-supplied transport that is not an *http.Transport cannot
	// take TLS options, but can be used as is.
	rt := roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, errors.New("unused") })
	if _, err := client.New("localhost", client.WithHTTPClient(&http.Client{Transport: rt}), client.WithInsecureSkipVerify()); err == nil {
		t.Fatal("custom RoundTripper with TLS options accepted")
	}
	if _, err := client.New("localhost", client.WithHTTPClient(&http.Client{Transport: rt})); err != nil {
		t.Fatalf("custom RoundTripper alone: %v", err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestPinning(t *testing.T) {
	f := newFake(t)
	f.handle("GET "+v2.PathStatus, success(v2.StatusResponse{Code: 2, Status: 2, Message: "ready"}))
	ctx := context.Background()

	if _, err := pinned(t, f).Status(ctx); err != nil {
		t.Fatalf("pinned to the served root: %v", err)
	}
	insecure, err := client.New(f.endpoint(), client.WithInsecureSkipVerify())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := insecure.Status(ctx); err != nil {
		t.Fatalf("insecure: %v", err)
	}
	// Another root: refused, and the error says so.
	other := newPKI(t)
	c, err := client.New(f.endpoint(), client.WithRootCertificate(other.root))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Status(ctx)
	if !errors.Is(err, client.ErrVerification) || !errors.Is(err, client.ErrRootMismatch) {
		t.Fatalf("pinned to another root: %v, want ErrVerification and ErrRootMismatch", err)
	}
	// A certificate issued under the right intermediate (as a Marble's
	// would be) is not the root: refused.
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := createCert(t, "marble", f.inter, f.interKey, leafKey)
	impostor := newFakeWithTLSCert(t, f.pki, &tls.Certificate{Certificate: [][]byte{leaf.Raw, f.inter.Raw}, PrivateKey: leafKey})
	impostor.handle("GET "+v2.PathStatus, success(v2.StatusResponse{Code: 3}))
	if _, err := pinned(t, impostor).Status(ctx); !errors.Is(err, client.ErrRootMismatch) {
		t.Fatalf("certificate under the intermediate: %v, want ErrRootMismatch", err)
	}
}

func TestHTTPClientOption(t *testing.T) {
	f := newFake(t)
	f.handle("GET "+v2.PathStatus, success(v2.StatusResponse{Code: 3, Status: 3}))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
	c, err := client.New(f.endpoint(), client.WithHTTPClient(hc), client.WithRootCertificate(f.root))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cfg := hc.Transport.(*http.Transport).TLSClientConfig; cfg != nil && (cfg.InsecureSkipVerify || cfg.VerifyConnection != nil) {
		t.Fatal("the caller's transport was modified")
	}
}

func TestClientCertificateIsPresented(t *testing.T) {
	f := newFake(t)
	f.handle("GET "+v2.PathSecrets, success(v2.SecretsGetResponse{Secrets: map[string]v2.Secret{}}))
	cert := userCert(t, "alice")
	c := pinned(t, f, client.WithClientCertificate(cert))
	if _, err := c.GetSecrets(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	got := f.last().PeerCerts
	if len(got) != 1 || !bytes.Equal(got[0].Raw, cert.Certificate[0]) {
		t.Fatalf("the server saw %d client certificates, not alice's", len(got))
	}
}

// endpointCase is one SDK method against one route.
type endpointCase struct {
	name  string
	route string
	data  any                                                // success data the fake sends
	call  func(context.Context, *client.Client) (any, error) // the SDK call
	want  any                                                // what the call returns
	req   func(t *testing.T, r recorded)                     // checks the request
}

func endpointCases(t *testing.T) []endpointCase {
	rsaKey := testRSAKey(t)
	pubDER, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	manifest := []byte(`{"Packages":{}}`)
	jsonBody := func(t *testing.T, r recorded, want any) {
		t.Helper()
		var got, exp any
		if err := json.Unmarshal(r.Body, &got); err != nil {
			t.Fatalf("request body %q: %v", r.Body, err)
		}
		b, _ := json.Marshal(want)
		_ = json.Unmarshal(b, &exp)
		if !reflect.DeepEqual(got, exp) {
			t.Fatalf("request body %s, want %s", r.Body, b)
		}
	}
	noBody := func(t *testing.T, r recorded) {
		t.Helper()
		if len(r.Body) != 0 {
			t.Fatalf("unexpected request body %q", r.Body)
		}
	}
	return []endpointCase{
		{
			name: "Status", route: "GET " + v2.PathStatus,
			data: map[string]any{"code": 3, "message": "running"}, // MarbleRun's shape: code only
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.Status(ctx) },
			want: &v2.StatusResponse{Code: 3, Status: 3, Message: "running"},
			req:  noBody,
		},
		{
			name: "GetManifest", route: "GET " + v2.PathManifest,
			data: v2.ManifestGetResponse{ManifestSignatureRootECDSA: []byte{1, 2}, ManifestFingerprint: "ab", Manifest: manifest},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.GetManifest(ctx) },
			want: &v2.ManifestGetResponse{ManifestSignatureRootECDSA: []byte{1, 2}, ManifestFingerprint: "ab", Manifest: manifest},
			req:  noBody,
		},
		{
			name: "SetManifest", route: "POST " + v2.PathManifest,
			data: v2.ManifestSetResponse{RecoverySecrets: map[string][]byte{"k": {9}}},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.SetManifest(ctx, manifest) },
			want: map[string][]byte{"k": {9}},
			req:  func(t *testing.T, r recorded) { jsonBody(t, r, v2.ManifestSetRequest{Manifest: manifest}) },
		},
		{
			name: "Quote", route: "GET " + v2.PathQuote,
			data: v2.QuoteResponse{Cert: "PEM", Quote: []byte{7}},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.Quote(ctx, []byte{0xfb, 0xff}) },
			want: &v2.QuoteResponse{Cert: "PEM", Quote: []byte{7}},
			req: func(t *testing.T, r recorded) {
				// URL-safe base64 with padding, as MarbleRun's server decodes it.
				if got := r.Query["nonce"]; len(got) != 1 || got[0] != "-_8=" {
					t.Fatalf("nonce query %q, want -_8=", got)
				}
			},
		},
		{
			name: "Recover", route: "POST " + v2.PathRecover,
			data: v2.RecoverResponse{Remaining: 1, Message: "next"},
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.Recover(ctx, []byte("secret"), []byte("sig"))
			},
			want: &v2.RecoverResponse{Remaining: 1, Message: "next"},
			req: func(t *testing.T, r recorded) {
				jsonBody(t, r, v2.RecoverRequest{RecoverySecret: []byte("secret"), RecoverySecretSignature: []byte("sig")})
			},
		},
		{
			name: "RecoveryPublicKey", route: "GET " + v2.PathRecoverKey,
			data: v2.RecoveryPublicKeyResponse{Algorithm: "RSA", EphemeralPublicKey: pubDER},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.RecoveryPublicKey(ctx) },
			want: &rsaKey.PublicKey,
			req:  noBody,
		},
		{
			name: "RecoverySecrets", route: "GET " + v2.PathRecoverSecrets,
			data: map[string]any{"recoverySecrets": map[string]any{"alice": "AQI=", "bob": "Aw=="}},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.RecoverySecrets(ctx) },
			want: map[string][]byte{"alice": {1, 2}, "bob": {3}},
			req:  noBody,
		},
		{
			name: "GetSecrets", route: "GET " + v2.PathSecrets,
			data: v2.SecretsGetResponse{Secrets: map[string]v2.Secret{"a": {Type: "symmetric-key", Size: 128, Private: []byte{1}, Public: []byte{1}}}},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.GetSecrets(ctx, "a", "b") },
			want: map[string]v2.Secret{"a": {Type: "symmetric-key", Size: 128, Private: []byte{1}, Public: []byte{1}}},
			req: func(t *testing.T, r recorded) {
				if got := r.Query["s"]; !reflect.DeepEqual(got, []string{"a", "b"}) {
					t.Fatalf("s query %q", got)
				}
			},
		},
		{
			name: "SetSecrets", route: "POST " + v2.PathSecrets,
			data: map[string]any{},
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.SetSecrets(ctx, map[string]v2.UserSecret{"k": {Key: []byte{1, 2, 3}}})
			},
			want: nil,
			req: func(t *testing.T, r recorded) {
				jsonBody(t, r, map[string]any{"secrets": map[string]any{"k": map[string]any{"key": "AQID"}}})
			},
		},
		{
			name: "UpdateLog", route: "GET " + v2.PathUpdate,
			data: v2.UpdateLogResponse{UpdateLog: []string{`{"update":"Initial manifest set"}`}},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.UpdateLog(ctx) },
			want: []string{`{"update":"Initial manifest set"}`},
			req:  noBody,
		},
		{
			name: "Update", route: "POST " + v2.PathUpdate,
			data: v2.UpdateResponse{MissingAcknowledgments: 1, MissingUsers: []string{"bob"}},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.Update(ctx, manifest) },
			want: &v2.UpdateResponse{MissingAcknowledgments: 1, MissingUsers: []string{"bob"}},
			req:  func(t *testing.T, r recorded) { jsonBody(t, r, v2.UpdateRequest{Manifest: manifest}) },
		},
		{
			name: "PendingUpdate", route: "GET " + v2.PathUpdateManifest,
			data: v2.PendingUpdateResponse{Manifest: manifest, MissingUsers: []string{"bob"}, Message: "waiting"},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.PendingUpdate(ctx) },
			want: &v2.PendingUpdateResponse{Manifest: manifest, MissingUsers: []string{"bob"}, Message: "waiting"},
			req:  noBody,
		},
		{
			name: "AcknowledgeUpdate", route: "POST " + v2.PathUpdateManifest,
			data: v2.UpdateAckResponse{Message: "applied", RecoverySecrets: map[string][]byte{"k": {1}}},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.AcknowledgeUpdate(ctx, manifest) },
			want: &v2.UpdateAckResponse{Message: "applied", RecoverySecrets: map[string][]byte{"k": {1}}},
			req:  func(t *testing.T, r recorded) { jsonBody(t, r, v2.UpdateRequest{Manifest: manifest}) },
		},
		{
			name: "CancelUpdate", route: "POST " + v2.PathUpdateCancel,
			data: v2.UpdateCancelResponse{Message: "Update successfully cancelled"},
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.CancelUpdate(ctx) },
			want: "Update successfully cancelled",
			req:  func(t *testing.T, r recorded) { jsonBody(t, r, map[string]any{}) },
		},
		{
			name: "SignQuote", route: "POST " + v2.PathSignQuote,
			data: map[string]any{"verificationSignature": "AQI=", "tcbStatus": "UpToDate"}, // MarbleRun's name only
			call: func(ctx context.Context, c *client.Client) (any, error) { return c.SignQuote(ctx, []byte{3}) },
			want: &v2.SignQuoteResponse{Signature: []byte{1, 2}, VerificationSignature: []byte{1, 2}, TCBStatus: "UpToDate"},
			req:  func(t *testing.T, r recorded) { jsonBody(t, r, v2.SignQuoteRequest{SGXQuote: []byte{3}}) },
		},
	}
}

func TestEndpointsSuccess(t *testing.T) {
	f := newFake(t)
	c := pinned(t, f)
	for _, tc := range endpointCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			f.handle(tc.route, success(tc.data))
			got, err := tc.call(context.Background(), c)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if got != nil {
					t.Fatalf("got %#v, want nothing", got)
				}
			} else if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v, want %#v", got, tc.want)
			}
			r := f.last()
			if r.Method+" "+r.Path != tc.route {
				t.Fatalf("request %s %s, want %s", r.Method, r.Path, tc.route)
			}
			tc.req(t, r)
		})
	}
}

// TestEndpointsErrors checks that every method turns each class of failure
// into a *client.Error with the server's message, matching its sentinel.
func TestEndpointsErrors(t *testing.T) {
	f := newFake(t)
	c := pinned(t, f)
	classes := []struct {
		status   int
		sentinel error
		is       func(error) bool
		jsend    string
	}{
		{http.StatusBadRequest, client.ErrBadRequest, client.IsBadRequest, "fail"},
		{http.StatusUnauthorized, client.ErrUnauthorized, client.IsUnauthorized, "fail"},
		{http.StatusForbidden, client.ErrForbidden, client.IsForbidden, "fail"},
		{http.StatusNotFound, client.ErrNotFound, client.IsNotFound, "fail"},
		{http.StatusConflict, client.ErrConflict, client.IsConflict, "fail"},
		{http.StatusRequestEntityTooLarge, client.ErrTooLarge, nil, "fail"},
		{http.StatusInternalServerError, client.ErrServer, nil, "error"},
	}
	for i, tc := range endpointCases(t) {
		cl := classes[i%len(classes)]
		t.Run(tc.name, func(t *testing.T) {
			msg := "message for " + tc.name
			var data any
			if cl.status == http.StatusBadRequest {
				data = v2.ValidationFailure{Section: "Packages"}
			}
			f.handle(tc.route, failure(cl.status, msg, data))
			_, err := tc.call(context.Background(), c)
			e, ok := client.AsError(err)
			if !ok {
				t.Fatalf("error %v (%T) is not a *client.Error", err, err)
			}
			method, path, _ := strings.Cut(tc.route, " ")
			if e.HTTPStatus != cl.status || e.Status != cl.jsend || e.Message != msg || e.Method != method || e.Path != path {
				t.Fatalf("got %+v, want HTTP %d %s %q", e, cl.status, cl.jsend, msg)
			}
			if !errors.Is(err, cl.sentinel) {
				t.Fatalf("errors.Is(%v, %v) = false", err, cl.sentinel)
			}
			if cl.is != nil && !cl.is(err) {
				t.Fatalf("helper does not recognise %v", err)
			}
			if cl.status < 500 && !errors.Is(err, client.ErrRejected) {
				t.Fatalf("4xx not ErrRejected: %v", err)
			}
			if cl.status >= 500 && errors.Is(err, client.ErrRejected) {
				t.Fatalf("5xx is ErrRejected: %v", err)
			}
			if cl.sentinel != client.ErrNotFound && client.IsNotFound(err) {
				t.Fatalf("HTTP %d counts as not found", cl.status)
			}
			if !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), "HTTP ") {
				t.Fatalf("Error() = %q lacks the message or status", err.Error())
			}
			if data != nil {
				var vf v2.ValidationFailure
				if err := json.Unmarshal(e.Data, &vf); err != nil || vf.Section != "Packages" {
					t.Fatalf("fail data %s", e.Data)
				}
			} else if e.Data != nil {
				t.Fatalf("data %s, want none", e.Data)
			}
		})
	}
}

func TestUnexpectedResponses(t *testing.T) {
	f := newFake(t)
	c := pinned(t, f)
	ctx := context.Background()

	f.handle("GET "+v2.PathStatus, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte("<html>bad gateway</html>"))
	})
	_, err := c.Status(ctx)
	e, ok := client.AsError(err)
	if !ok || e.HTTPStatus != http.StatusBadGateway || e.Status != "" || !strings.Contains(e.Message, "bad gateway") {
		t.Fatalf("non-JSend answer: %v", err)
	}
	if !errors.Is(err, client.ErrServer) {
		t.Fatal("non-JSend 502 is not ErrServer")
	}

	// 200 with a fail status is still an error.
	f.handle("GET "+v2.PathStatus, func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, "fail", nil, "odd")
	})
	if _, err := c.Status(ctx); err == nil {
		t.Fatal("200 fail accepted")
	}
	// Success without data where data is required.
	f.handle("GET "+v2.PathStatus, success(nil))
	if _, err := c.Status(ctx); err == nil {
		t.Fatal("success without data accepted")
	}
	// Error without a message: the HTTP status text stands in.
	f.handle("GET "+v2.PathStatus, failure(http.StatusMethodNotAllowed, "", nil))
	_, err = c.Status(ctx)
	if e, ok := client.AsError(err); !ok || e.Message != "Method Not Allowed" || !errors.Is(err, client.ErrMethodNotAllowed) {
		t.Fatalf("405 without message: %v", err)
	}
	// Unknown routes of the fake are 404 fail, like the real server's.
	if _, err := c.PendingUpdate(ctx); !client.IsNotFound(err) {
		t.Fatalf("unknown route: %v", err)
	}
	// A cancelled context is a transport error, not a *client.Error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = c.Status(cctx)
	if _, ok := client.AsError(err); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

func TestArgumentChecks(t *testing.T) {
	c, err := client.New("localhost", client.WithInsecureSkipVerify())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"GetSecrets none":   func() error { _, err := c.GetSecrets(ctx); return err },
		"GetSecrets empty":  func() error { _, err := c.GetSecrets(ctx, "a", ""); return err },
		"SetSecrets none":   func() error { return c.SetSecrets(ctx, nil) },
		"SetManifest empty": func() error { _, err := c.SetManifest(ctx, nil); return err },
		"Update empty":      func() error { _, err := c.Update(ctx, nil); return err },
		"Ack empty":         func() error { _, err := c.AcknowledgeUpdate(ctx, nil); return err },
		"Recover empty":     func() error { _, err := c.Recover(ctx, nil, []byte{1}); return err },
		"SignQuote empty":   func() error { _, err := c.SignQuote(ctx, nil); return err },
	} {
		if err := call(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestRecoveryPublicKeyRejectsOtherAlgorithms(t *testing.T) {
	f := newFake(t)
	c := pinned(t, f)
	f.handle("GET "+v2.PathRecoverKey, success(v2.RecoveryPublicKeyResponse{Algorithm: "ECDH", EphemeralPublicKey: []byte{1}}))
	if _, err := c.RecoveryPublicKey(context.Background()); err == nil {
		t.Fatal("ECDH key accepted")
	}
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	f.handle("GET "+v2.PathRecoverKey, success(v2.RecoveryPublicKeyResponse{Algorithm: "RSA", EphemeralPublicKey: der}))
	if _, err := c.RecoveryPublicKey(context.Background()); err == nil {
		t.Fatal("EC key labelled RSA accepted")
	}
}

// userCert returns a self-signed client certificate.
func userCert(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	return testpki.SelfSigned(t, cn, testpki.ClientAuth()).TLS()
}

var testRSA *rsa.PrivateKey

// testRSAKey returns one 2048-bit key shared by the tests (generation is
// slow on a shared machine).
func testRSAKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	if testRSA == nil {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		testRSA = k
	}
	return testRSA
}

// TestBusyAnswer: a 503 is ErrUnavailable (and ErrServer) with the
// Coordinator's Retry-After.
func TestBusyAnswer(t *testing.T) {
	f := newFake(t)
	c := pinned(t, f)
	f.handle("POST "+v2.PathUpdate, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3")
		failure(http.StatusServiceUnavailable, "the Coordinator is busy", nil)(w, r)
	})
	_, err := c.Update(context.Background(), []byte(`{}`))
	e, ok := client.AsError(err)
	if !ok || !client.IsUnavailable(err) || !errors.Is(err, client.ErrServer) || errors.Is(err, client.ErrRejected) || e.RetryAfter != 3*time.Second {
		t.Fatalf("error %#v", err)
	}
	f.handle("GET "+v2.PathStatus, failure(http.StatusInternalServerError, "broken", nil))
	if _, err := c.Status(context.Background()); client.IsUnavailable(err) {
		t.Fatalf("500 counts as unavailable: %v", err)
	}
}

// TestMonotonicCounter: the request the SDK sends for the counter, the
// previous value it returns, and the Coordinator's refusals as *Error.
func TestMonotonicCounter(t *testing.T) {
	f := newFake(t)
	f.handle("POST /api/v2/monotonic-counter", success(map[string]uint64{"value": 41}))
	c := pinned(t, f)
	got, err := c.MonotonicCounter(context.Background(), "requests", 42)
	if err != nil || got != 41 {
		t.Fatalf("MonotonicCounter = %d, %v; want 41", got, err)
	}
	var body map[string]any
	if err := json.Unmarshal(f.last().Body, &body); err != nil || body["name"] != "requests" || body["value"] != float64(42) || len(body) != 2 {
		t.Errorf("request body %s, want {\"name\":\"requests\",\"value\":42}", f.last().Body)
	}

	f.handle("POST /api/v2/monotonic-counter", failure(http.StatusForbidden, "MonotonicCounter feature is not enabled in the manifest", nil))
	_, err = c.MonotonicCounter(context.Background(), "requests", 1)
	if e, ok := client.AsError(err); !client.IsForbidden(err) || !ok || e.Message != "MonotonicCounter feature is not enabled in the manifest" {
		t.Errorf("disabled gate: %v, want 403 with the Coordinator's message", err)
	}
	n := f.total()
	if _, err := c.MonotonicCounter(context.Background(), "", 1); err == nil || f.total() != n {
		t.Errorf("empty name: %v, %d requests sent; want an error and none", err, f.total()-n)
	}
}
