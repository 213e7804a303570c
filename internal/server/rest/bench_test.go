package rest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/quarry-cc/quarry/internal/core"
	"github.com/quarry-cc/quarry/internal/seal"
	"github.com/quarry-cc/quarry/internal/store/memstore"
	"github.com/quarry-cc/quarry/internal/testpki"
)

// BenchmarkStateChangeHTTPS measures one state-changing request end to end:
// POST /api/v2/secrets over HTTPS keep-alive with a client certificate,
// through the middleware, handler and core, sealed and stored (in memory)
// before the answer, with 100 secrets in the state.
func BenchmarkStateChangeHTTPS(b *testing.B) {
	alice := testpki.SelfSigned(b, "", testpki.Serial(1))
	key, der := alice.ECDSA(b), alice.DER()
	secrets := map[string]any{"upload": map[string]any{"Type": "symmetric-key", "Size": 256, "UserDefined": true}}
	for i := 0; i < 100; i++ {
		secrets[fmt.Sprintf("s%d", i)] = map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true}
	}
	raw, _ := json.Marshal(map[string]any{
		"Packages": map[string]any{"p": map[string]any{"Debug": true}},
		"Marbles":  map[string]any{"m": map[string]any{"Package": "p"}},
		"Secrets":  secrets,
		"Users":    map[string]any{"alice": map[string]any{"Certificate": string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), "Roles": []string{"w"}}},
		"Roles":    map[string]any{"w": map[string]any{"ResourceType": "Secrets", "ResourceNames": []string{"upload"}, "Actions": []string{"WriteSecret"}}},
	})
	c, err := core.New(context.Background(), core.Options{Data: memstore.New(), Key: memstore.New(), KeySealer: seal.SimulationKeySealer{}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.SetManifest(context.Background(), raw); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(New(c, Options{MaxManifestBytes: 8 << 20}))
	srv.TLS = TLSConfig(c.TLSCertificate)
	srv.StartTLS()
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true,
		Certificates:       []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}}}
	body, _ := json.Marshal(map[string]any{"secrets": map[string]any{"upload": map[string]any{"key": make([]byte, 32)}}})
	b.ResetTimer()
	for b.Loop() {
		resp, err := hc.Post(srv.URL+"/api/v2/secrets", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatal(resp.Status)
		}
	}
}
