package loadgen

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

// The upload-concurrent scenario drives state changes from several users at
// once: N users (-c), each with a client certificate of its own in the
// manifest and a role that lets it write one user-defined secret, POST
// /api/v2/secrets again and again, each on its own keep-alive connection,
// with a new 256-bit key every time. Every answered upload is a committed
// change, so what is measured is how the Coordinator's commits take
// concurrent writers. The request is MarbleRun's too (POST /api/v2/secrets
// with {"secrets": {NAME: {"Key": …}}}), so the scenario runs against
// MarbleRun's Coordinator as well.

// ScenarioUploadConcurrent is the name of the upload scenario.
const ScenarioUploadConcurrent = "upload-concurrent"

// UploadUser is one uploading user: its client certificate and the secret
// it writes.
type UploadUser struct {
	Name   string
	Secret string
	Cert   tls.Certificate
	// CertPEM is the certificate in the manifest.
	CertPEM string
}

// NewUploadUsers makes n users with their certificates.
func NewUploadUsers(n int) ([]UploadUser, error) {
	users := make([]UploadUser, n)
	for i := range users {
		name := fmt.Sprintf("uploader%d", i)
		cert, certPEM, err := NewUserCertificate(name)
		if err != nil {
			return nil, err
		}
		users[i] = UploadUser{Name: name, Secret: fmt.Sprintf("upload%d", i), Cert: cert, CertPEM: certPEM}
	}
	return users, nil
}

// UploadManifest returns the manifest of the upload scenario: one package
// and Marble type (MarbleRun wants them), and per user a user-defined
// 256-bit symmetric key, the user with its certificate, and a role allowing
// it to write that secret.
func UploadManifest(users []UploadUser) ([]byte, error) {
	type obj = map[string]any
	secrets, us, roles := obj{}, obj{}, obj{}
	for _, u := range users {
		role := "write-" + u.Secret
		secrets[u.Secret] = obj{"Type": "symmetric-key", "Size": 256, "UserDefined": true}
		us[u.Name] = obj{"Certificate": u.CertPEM, "Roles": []string{role}}
		roles[role] = obj{"ResourceType": "Secrets", "ResourceNames": []string{u.Secret}, "Actions": []string{"WriteSecret"}}
	}
	return json.MarshalIndent(obj{
		"Packages": obj{"bench": obj{"SignerID": strings.Repeat("51", 32), "ProductID": 1, "SecurityVersion": 1}},
		"Marbles":  obj{"bench": obj{"Package": "bench", "Parameters": obj{"Argv": []string{"./marble"}}}},
		"Secrets":  secrets,
		"Users":    us,
		"Roles":    roles,
	}, "", "  ")
}

// UploadConfig says how RunUpload drives a Client API.
type UploadConfig struct {
	// Addr is the Client API, host:port; its manifest is UploadManifest's
	// of Users.
	Addr  string
	Users []UploadUser
	// Duration, Warmup, Timeout, HTTP2 and TLS (server verification; each
	// user adds its certificate) as in RunConfig.
	Duration, Warmup time.Duration
	Timeout          time.Duration
	HTTP2            bool
	TLS              *tls.Config
}

// RunUpload lets every user upload its secret again and again for
// cfg.Warmup+cfg.Duration and returns what was measured in cfg.Duration,
// as Run does.
func RunUpload(ctx context.Context, cfg UploadConfig) (RunResult, error) {
	if len(cfg.Users) < 1 {
		return RunResult{}, errors.New("at least one user is needed")
	}
	if cfg.Duration <= 0 || cfg.Warmup < 0 {
		return RunResult{}, errors.New("the duration must be positive and the warm-up not negative")
	}
	var dials atomic.Int64
	from := time.Now().Add(cfg.Warmup)
	to := from.Add(cfg.Duration)
	runCtx, cancel := context.WithDeadline(ctx, to)
	defer cancel()
	results := make([]workerResult, len(cfg.Users))
	var wg sync.WaitGroup
	for i, u := range cfg.Users {
		tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.TLS != nil {
			tlsCfg = cfg.TLS.Clone()
		}
		tlsCfg.Certificates = []tls.Certificate{u.Cert}
		c := &uploadClient{
			ctx: runCtx, url: "https://" + cfg.Addr + v2.PathSecrets, secret: u.Secret,
			t: newTransport(RunConfig{HTTP2: cfg.HTTP2, TLS: tlsCfg, Timeout: cfg.Timeout}, &dials),
		}
		wg.Go(func() {
			results[i] = work(runCtx, c, from, to)
			c.close()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return RunResult{}, err
	}
	return combine(results, cfg.Duration, dials.Load()), nil
}

// uploadClient is one user: it uploads a new key for its secret at every
// exchange.
type uploadClient struct {
	ctx    context.Context
	url    string
	secret string
	t      *http.Transport
}

func (c *uploadClient) exchange(_ time.Time, wantHead bool) (exchange, error) {
	key := make([]byte, 32)
	rand.Read(key)
	body, err := json.Marshal(v2.SecretsSetRequest{Secrets: map[string]v2.UserSecret{c.secret: {Key: key}}})
	if err != nil {
		return exchange{}, err
	}
	req, err := http.NewRequestWithContext(c.ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return exchange{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.t.RoundTrip(req)
	if err != nil {
		return exchange{}, err
	}
	return readResponse(resp, wantHead)
}

func (c *uploadClient) close() { c.t.CloseIdleConnections() }

// upload runs the scenario against the Client API at addr, whose manifest
// is UploadManifest(users), and appends its result.
func (b *bench) upload(ctx context.Context, addr string, base *tls.Config, users []UploadUser) error {
	o := b.o
	b.progress("%s: POST %s, %d users each on its own connection, %v after %v warm-up", ScenarioUploadConcurrent, v2.PathSecrets, len(users), o.Duration, o.Warmup)
	res, err := RunUpload(ctx, UploadConfig{
		Addr: addr, Users: users, Duration: o.Duration, Warmup: o.Warmup, Timeout: o.Timeout, HTTP2: o.HTTP2, TLS: base,
	})
	if err != nil {
		return fmt.Errorf("%s: %w", ScenarioUploadConcurrent, err)
	}
	req := fmt.Sprintf("POST %s, %d users, each its own secret and connection", v2.PathSecrets, len(users))
	b.rep.Scenarios = append(b.rep.Scenarios, loadResult(ScenarioUploadConcurrent, req, res))
	return nil
}

// uploadOn sets the upload manifest on the fresh Coordinator at addr
// (state: accepting a manifest) and runs the scenario.
func (b *bench) uploadOn(ctx context.Context, addr string, base *tls.Config) error {
	users, err := NewUploadUsers(b.o.Connections)
	if err != nil {
		return err
	}
	raw, err := UploadManifest(users)
	if err != nil {
		return err
	}
	body, err := SetRequest(raw)
	if err != nil {
		return err
	}
	if x, _ := b.setManifest(ctx, addr, insecureTLS, body, false); x.err != nil || x.status != http.StatusOK {
		return fmt.Errorf("%s: setting the upload manifest (%d users) needs a Coordinator without a manifest: %s", ScenarioUploadConcurrent, len(users), describe(x.status, x.msg, x.err))
	}
	return b.upload(ctx, addr, base, users)
}

// uploadStarted runs the scenario on a Coordinator of its own.
func (b *bench) uploadStarted(ctx context.Context) error {
	o := b.o
	c, err := StartCoordinator(ctx, o.CoordinatorBin, o.Env, o.StartTimeout)
	if err != nil {
		return fmt.Errorf("%s: %w", ScenarioUploadConcurrent, err)
	}
	defer c.Stop()
	b.progress("%s: coordinator %s started: pid %d, https://%s", ScenarioUploadConcurrent, o.CoordinatorBin, c.PID(), c.Addr)
	return b.uploadOn(ctx, c.Addr, &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true})
}
