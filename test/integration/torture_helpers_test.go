package integration

import (
	"bytes"
	"context"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// tortureDo is do without the test: it sends a request and decodes the JSend
// envelope, and returns an error instead of failing the test, for goroutines
// and for requests that may meet a dead process.
func tortureDo(hc *http.Client, method, url string, body any) (response, error) {
	var rd io.Reader
	if body != nil {
		buf, err := json.Marshal(body)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, url, rd)
	if err != nil {
		return response{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("reading the answer (HTTP %d): %w", resp.StatusCode, err)
	}
	r := response{HTTPStatus: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Raw: raw}
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("HTTP %d, body is not JSON (%v): %q", resp.StatusCode, err, raw)
	}
	return r, nil
}

// tortureLogEntry is the part of an update log entry the torture test
// compares.
type tortureLogEntry struct {
	Update      string `json:"update"`
	User        string `json:"user,omitempty"`
	Secret      string `json:"secret,omitempty"`
	Type        string `json:"type,omitempty"`
	Fingerprint string `json:"manifestFingerprint,omitempty"`
}

func (e tortureLogEntry) String() string {
	b, _ := json.Marshal(e)
	return string(b)
}

// The update log entries the torture writes produce.
func tortureLogManifestSet() tortureLogEntry {
	return tortureLogEntry{Update: "Initial manifest set"}
}

func tortureLogSecretSet(user, secret string) tortureLogEntry {
	return tortureLogEntry{Update: "Secret set", User: user, Secret: secret, Type: "plain"}
}

func tortureLogUpdate(user, fp string) []tortureLogEntry {
	return []tortureLogEntry{
		{Update: "Complete Manifest update initiated by user. No further acknowledgements required", User: user, Fingerprint: fp},
		{Update: "Complete Manifest updated", Fingerprint: fp},
	}
}

// tortureFetchLog reads GET /api/v2/update as comparable entries.
func tortureFetchLog(hc *http.Client, c *coordinator) ([]tortureLogEntry, error) {
	r, err := tortureDo(hc, http.MethodGet, c.url("/api/v2/update"), nil)
	if err != nil {
		return nil, err
	}
	if r.HTTPStatus != http.StatusOK {
		return nil, fmt.Errorf("GET /api/v2/update: HTTP %d %s", r.HTTPStatus, r.Raw)
	}
	var d struct {
		UpdateLog []string `json:"updateLog"`
	}
	if err := json.Unmarshal(r.Data, &d); err != nil {
		return nil, err
	}
	out := make([]tortureLogEntry, 0, len(d.UpdateLog))
	for _, line := range d.UpdateLog {
		var e tortureLogEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("log entry %q: %w", line, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// tortureCompareLog returns "" if got equals want, else a description of the
// first difference.
func tortureCompareLog(got, want []tortureLogEntry) string {
	for i := 0; i < len(got) && i < len(want); i++ {
		if got[i] != want[i] {
			return fmt.Sprintf("entry %d of %d is %s, want %s", i, len(got), got[i], want[i])
		}
	}
	switch {
	case len(got) < len(want):
		return fmt.Sprintf("the log has %d entries, want %d; missing from %s on", len(got), len(want), want[len(got)])
	case len(got) > len(want):
		return fmt.Sprintf("the log has %d entries, want %d; unexpected from %s on", len(got), len(want), got[len(want)])
	}
	return ""
}

// tortureReadCounter reads the plain secret as a decimal counter (0: never set).
func tortureReadCounter(hc *http.Client, c *coordinator, name string) (uint64, error) {
	r, err := tortureDo(hc, http.MethodGet, secretsURL(c, name), nil)
	if err != nil {
		return 0, err
	}
	if r.HTTPStatus != http.StatusOK {
		return 0, fmt.Errorf("GET secret %s: HTTP %d %s", name, r.HTTPStatus, r.Raw)
	}
	var d struct {
		Secrets map[string]v2Secret `json:"secrets"`
	}
	if err := json.Unmarshal(r.Data, &d); err != nil {
		return 0, err
	}
	v := d.Secrets[name].Private
	if len(v) == 0 {
		return 0, nil
	}
	return strconv.ParseUint(string(v), 10, 64)
}

// tortureReadFingerprint reads the current manifest fingerprint.
func tortureReadFingerprint(hc *http.Client, c *coordinator) (string, error) {
	r, err := tortureDo(hc, http.MethodGet, c.url("/api/v2/manifest"), nil)
	if err != nil {
		return "", err
	}
	if r.HTTPStatus != http.StatusOK {
		return "", fmt.Errorf("GET manifest: HTTP %d %s", r.HTTPStatus, r.Raw)
	}
	var m manifestData
	if err := json.Unmarshal(r.Data, &m); err != nil {
		return "", err
	}
	return m.Fingerprint, nil
}

// tortureDecrypt decrypts answered recovery secrets with the keys
// (RSA-OAEP SHA-256, as MarbleRun's CLI does); every key must have one.
func tortureDecrypt(enc map[string][]byte, keys map[string]*rsa.PrivateKey) (map[string][]byte, error) {
	if len(enc) != len(keys) {
		return nil, fmt.Errorf("%d recovery secrets for %d recovery keys", len(enc), len(keys))
	}
	out := map[string][]byte{}
	for name, ct := range enc {
		k, ok := keys[name]
		if !ok {
			return nil, fmt.Errorf("recovery secret for unknown key %q", name)
		}
		p, err := rsa.DecryptOAEP(sha256.New(), nil, k, ct, nil)
		if err != nil {
			return nil, fmt.Errorf("decrypting the recovery secret of %s: %w", name, err)
		}
		out[name] = p
	}
	return out, nil
}

// tortureSealDir describes the files of a seal directory.
func tortureSealDir(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			lines = append(lines, e.Name()+": "+err.Error())
			continue
		}
		lines = append(lines, fmt.Sprintf("%s %d bytes %s", e.Name(), fi.Size(), fi.ModTime().Format("15:04:05.000000")))
	}
	sort.Strings(lines)
	return filepath.Base(dir) + ": " + strings.Join(lines, "; ")
}
