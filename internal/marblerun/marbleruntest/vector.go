package marbleruntest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// VectorNames are the scenarios in testdata/marblerun-state at the module
// root (its README says how MarbleRun wrote them).
var VectorNames = []string{"single", "multiparty", "threshold"}

// Secret is a secret as expected.json shows it (JSON names match either
// case).
type Secret struct {
	Type        string
	Size        uint
	Shared      bool
	UserDefined bool
	Cert        []byte
	ValidFor    uint
	Private     []byte
	Public      []byte
}

// Expected is the part of expected.json the tests compare.
type Expected struct {
	Certificates struct {
		Root         string `json:"rootPEM"`
		Intermediate string `json:"intermediatePEM"`
		MarbleRoot   string `json:"marbleRootPEM"`
	} `json:"certificates"`
	QuoteResponse struct {
		Cert string `json:"cert"`
	} `json:"quoteResponse"`
	Manifest struct {
		Manifest    string `json:"manifest"`
		Fingerprint string `json:"manifestFingerprint"`
		Signature   string `json:"manifestSignatureRootECDSA"`
	} `json:"manifest"`
	SecretsQuery    []string `json:"secretsQuery"`
	SecretsResponse struct {
		Secrets map[string]Secret `json:"secrets"`
	} `json:"secretsResponse"`
	UpdateLog struct {
		UpdateLog []string `json:"updateLog"`
	} `json:"updateLog"`
}

// Vector is one MarbleRun state vector.
type Vector struct {
	Name                string
	Data, Key, Manifest []byte
	// AdminCertPEM and AdminKeyPEM are the manifest user admin's.
	AdminCertPEM, AdminKeyPEM []byte
	// RecoveryKeys are the recovery private keys and RecoverySecrets the
	// plain recovery secrets (decrypted from recovery_data.json with them,
	// as `marblerun recover` does), by key name.
	RecoveryKeys    map[string]*rsa.PrivateKey
	RecoverySecrets map[string][]byte
	Expected        Expected
}

// ReadVector reads the scenario name from root (the marblerun-state
// directory). The vectors are part of the repository, so a missing scenario
// fails t.
func ReadVector(t testing.TB, root, name string) *Vector {
	t.Helper()
	dir := filepath.Join(root, name)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("MarbleRun state vector %s: %v (the vectors are committed under testdata/marblerun-state at the module root)", name, err)
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	v := &Vector{Name: name, Data: read("sealed_data"), Key: read("sealed_key"), Manifest: read("manifest.json"),
		AdminCertPEM: read("user/admin.crt"), AdminKeyPEM: read("user/admin.key")}
	if err := json.Unmarshal(read("expected.json"), &v.Expected); err != nil {
		t.Fatal(err)
	}
	var rd struct{ RecoverySecrets map[string][]byte }
	if err := json.Unmarshal(read("recovery_data.json"), &rd); err != nil {
		t.Fatal(err)
	}
	v.RecoveryKeys, v.RecoverySecrets = map[string]*rsa.PrivateKey{}, map[string][]byte{}
	for k, ct := range rd.RecoverySecrets {
		blk, _ := pem.Decode(read("recovery_keys/" + k + ".pem"))
		priv, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		v.RecoveryKeys[k] = priv.(*rsa.PrivateKey)
		if v.RecoverySecrets[k], err = rsa.DecryptOAEP(sha256.New(), nil, v.RecoveryKeys[k], ct, nil); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// Sign signs secret with recovery key k as the CLI does (PKCS #1 v1.5
// over SHA-256).
func (v *Vector) Sign(t testing.TB, k string, secret []byte) []byte {
	t.Helper()
	d := sha256.Sum256(secret)
	sig, err := rsa.SignPKCS1v15(rand.Reader, v.RecoveryKeys[k], crypto.SHA256, d[:])
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// RecoveryOrder is the keys whose secrets recover the state, in order
// (threshold: two of the three, first).
func (v *Vector) RecoveryOrder(first string) []string {
	if v.Name == "threshold" {
		if first == "" {
			first = "shareholder1"
		}
		return []string{first, "shareholder3"}
	}
	var names []string
	for k := range v.RecoveryKeys {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
