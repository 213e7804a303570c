package integration

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/loadgen"
)

// floodUsers starts a Coordinator whose manifest has the user alice (with
// UpdateManifest) and returns it with alice's certificate.
func floodUsers(tb testing.TB, env ...string) (*coordinator, tls.Certificate) {
	tb.Helper()
	c := startCoordinator(tb, "", env...)
	alice, alicePEM := newUserCert(tb, "alice")
	raw, _ := json.Marshal(map[string]any{
		"Packages": map[string]any{"p": map[string]any{"Debug": true}},
		"Marbles":  map[string]any{"m": map[string]any{"Package": "p"}},
		"Users":    map[string]any{"alice": map[string]any{"Certificate": alicePEM, "Roles": []string{"admin"}}},
		"Roles":    map[string]any{"admin": map[string]any{"ResourceType": "Manifest", "Actions": []string{"UpdateManifest"}}},
	})
	body, _ := json.Marshal(map[string][]byte{"manifest": raw})
	resp, err := c.client(nil, nil).Post(c.url("/api/v2/manifest"), "application/json", bytes.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("setting the manifest: %s", resp.Status)
	}
	return c, alice
}

// floodBody is a well-formed update request of about size bytes: a JSON
// object whose manifest member is a long base64 string, the most a
// Coordinator that decodes first would buffer and decode.
func floodBody(size int) []byte {
	payload := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{'x'}, (size-32)/4*3))
	return []byte(`{"manifest":"` + payload + `"}`)
}

// flood sends n concurrent POSTs of body to path, each on its own
// connection (HTTP/1.1, or HTTP/2 when h2), presenting cert if given, and
// returns how many got each answer ("401", "503", or a transport error).
func flood(tb testing.TB, c *coordinator, path string, cert *tls.Certificate, n int, body []byte, h2 bool) map[string]int {
	tb.Helper()
	var (
		mu  sync.Mutex
		got = map[string]int{}
		wg  sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			cfg := &tls.Config{InsecureSkipVerify: true}
			if cert != nil {
				cfg.Certificates = []tls.Certificate{*cert}
			}
			tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: h2, DisableKeepAlives: true}
			if !h2 {
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
			answer := ""
			resp, err := hc.Post(c.url(path), "application/json", bytes.NewReader(body))
			if err != nil {
				answer = "transport error"
			} else {
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answer = fmt.Sprint(resp.StatusCode)
				if !json.Valid(raw) {
					answer += " (not JSON)"
				}
			}
			mu.Lock()
			got[answer]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return got
}

func summary(got map[string]int) string {
	var parts []string
	for k, v := range got {
		parts = append(parts, fmt.Sprintf("%d×%s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// BenchmarkBodyFlood measures the Coordinator's peak resident memory (VmHWM)
// while 40 clients at once each POST an 8 MiB update body (docs/design/decisions.md#d16):
// without a client certificate (answered 401 before the body is read), and
// as a manifest user (bodies decoded at once are bounded by the memory
// budget; the rest get 503). The Coordinator is the release build
// (coordinatorBin) also when the tests run with the race detector:
//
//	go test -run '^$' -bench BodyFlood -benchtime 1x ./test/integration
func BenchmarkBodyFlood(b *testing.B) {
	body := floodBody(8 << 20)
	for _, tc := range []struct {
		name string
		user bool
		h2   bool
	}{
		{"unauthenticated-http1", false, false},
		{"unauthenticated-http2", false, true},
		{"user-http1", true, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c, alice := floodUsers(b)
			var cert *tls.Certificate
			if tc.user {
				cert = &alice
			}
			before, err := loadgen.ProcessMemory(c.cmd.Process.Pid)
			if err != nil {
				b.Skip(err)
			}
			var last map[string]int
			for b.Loop() {
				last = flood(b, c, "/api/v2/update", cert, 40, body, tc.h2)
			}
			after, err := loadgen.ProcessMemory(c.cmd.Process.Pid)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(before.Peak)/(1<<20), "MiB-peak-before")
			b.ReportMetric(float64(after.Peak)/(1<<20), "MiB-peak")
			b.Logf("answers: %s; VmHWM %.1f MiB before the flood, %.1f MiB after", summary(last), float64(before.Peak)/(1<<20), float64(after.Peak)/(1<<20))
		})
	}
}
