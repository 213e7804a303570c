package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/api/marblepb"
	"github.com/quarry-cc/quarry/internal/ca"
	"github.com/quarry-cc/quarry/internal/secrets"
	"github.com/quarry-cc/quarry/manifest"
	"github.com/quarry-cc/quarry/marble/marbletest"
)

// impostorCerts returns the TLS certificates an impostor can build from
// what the Coordinator with authority a hands out: a Marble's leaf and key
// (MARBLE_PREDEFINED_*), and a certificate secret a user may read, each
// with the Coordinator's public chain.
func impostorCerts(t *testing.T, a *ca.Authority) map[string]tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := a.IssueMarbleCert(rand.Reader, csr, "6ba7b810-9dad-41d1-80b4-00c04fd430c8", "backend", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sec, err := secrets.GenerateCert(rand.Reader, "cert", manifest.Secret{Type: manifest.SecretTypeCertECDSA, Size: 256},
		secrets.Issuer{Cert: a.MarbleRoot, Key: a.IntermediateKey}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	secKey, err := x509.ParsePKCS8PrivateKey(sec.Private)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]tls.Certificate{
		"a Marble's credentials": {Certificate: [][]byte{leaf.Cert.Raw, a.Intermediate.Raw, a.Root.Raw}, PrivateKey: leaf.Key},
		"a certificate secret":   {Certificate: [][]byte{sec.Cert, a.Intermediate.Raw, a.Root.Raw}, PrivateKey: secKey},
	}
}

// TestPinnedPremainRefusesImpostors: pinned by file or fingerprint, the
// premain refuses a server holding a Marble's credentials or a
// certificate secret of the Coordinator (exit 1, naming why), writes
// nothing and execs nothing; the genuine Coordinator is accepted, also
// after its Marble Root was renewed. Unpinned, it takes the impostor's
// word (MarbleRun's premain's trust) and says on stderr that it is not
// pinned.
func TestPinnedPremainRefusesImpostors(t *testing.T) {
	genuine := marbletest.New(t, answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
	a := genuine.CA
	sum := sha256.Sum256(a.Root.Raw)
	pins := map[string]func(h *harness){
		"file":        func(h *harness) { h.pin(a.Root) },
		"fingerprint": func(h *harness) { h.setenv("QUARRY_COORDINATOR_ROOT_SHA256=" + hex.EncodeToString(sum[:])) },
	}
	for name, cert := range impostorCerts(t, a) {
		for pinName, pin := range pins {
			t.Run(name+", pinned by "+pinName, func(t *testing.T) {
				var h *harness
				impostor := marbletest.NewWithCertificate(t, cert, func(marbletest.Request) (*marblepb.Parameters, error) {
					return &marblepb.Parameters{
						Files: map[string][]byte{filepath.Join(h.dir, "planted"): []byte("evil")},
						Env:   map[string][]byte{"LD_PRELOAD": []byte("/tmp/evil.so")},
						Argv:  []string{"sh"},
					}, nil
				})
				h = newHarness(t, impostor.Addr)
				h.executable("bin/sh")
				h.setenv("QUARRY_ACTIVATION_ATTEMPTS=1")
				pin(h)
				if code := h.run(); code != 1 {
					t.Fatalf("exit %d, want 1 (stderr %q)", code, h.stderr.String())
				}
				for _, w := range []string{"did not prove to be the pinned Coordinator", "not certified by the pinned Coordinator root"} {
					if !strings.Contains(h.stderr.String(), w) {
						t.Errorf("stderr %q does not say %q", h.stderr.String(), w)
					}
				}
				if len(h.calls) != 0 || len(impostor.Requests()) != 0 {
					t.Errorf("%d execs, %d requests to the impostor; want none", len(h.calls), len(impostor.Requests()))
				}
				if _, err := os.Stat(filepath.Join(h.dir, "planted")); err == nil {
					t.Error("the impostor's file was written")
				}
			})
		}
		t.Run(name+", unpinned", func(t *testing.T) {
			impostor := marbletest.NewWithCertificate(t, cert, answer(t, &marblepb.Parameters{Argv: []string{"sh"}}))
			h := newHarness(t, impostor.Addr)
			h.executable("bin/sh")
			if code := h.run(); code != 0 || len(h.calls) != 1 {
				t.Fatalf("exit %d, %d execs: %s", code, len(h.calls), h.stderr.String())
			}
			if !strings.Contains(h.stderr.String(), "the Coordinator is not pinned") || !strings.Contains(h.stderr.String(), "QUARRY_COORDINATOR_ROOT") {
				t.Errorf("stderr %q, want the notice that the Coordinator is not pinned", h.stderr.String())
			}
		})
	}

	rotated, err := a.Rotate(rand.Reader, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	updated := marbletest.NewWithCertificate(t, *rotated.MarbleTLSCertificate(), answer(t, &marblepb.Parameters{Argv: []string{"app"}}))
	for _, coord := range []*marbletest.Coordinator{genuine, updated} {
		for pinName, pin := range pins {
			h := newHarness(t, coord.Addr)
			app := h.executable("bin/app")
			pin(h)
			if code := h.run(); code != 0 || len(h.calls) != 1 || h.calls[0].path != app {
				t.Fatalf("pinned by %s: exit %d, execs %+v: %s", pinName, code, h.calls, h.stderr.String())
			}
			if h.stderr.Len() != 0 {
				t.Errorf("pinned by %s: stderr %q, want nothing", pinName, h.stderr.String())
			}
		}
	}
}
