package integration

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"strings"
	"sync"
	"testing"
)

// deleted marks a member to remove in a manifest mutation.
type deletedMarker struct{}

var deleted = deletedMarker{}

// fixture is a valid manifest as a JSON tree plus the users' credentials.
type fixture struct {
	tree  map[string]any
	users map[string]userCred
}

type userCred struct {
	pem  string
	cert tls.Certificate
}

var (
	rsaKeysOnce sync.Once
	rsaKeys     []*rsa.PrivateKey
)

// recoveryKeys returns n RSA keys shared by the whole test binary (key
// generation is slow; 3072 bits as the issue asks for recovery tests).
func recoveryKeys(t *testing.T, n int) []*rsa.PrivateKey {
	t.Helper()
	rsaKeysOnce.Do(func() {
		for i := 0; i < 3; i++ {
			k, err := rsa.GenerateKey(rand.Reader, 3072)
			if err != nil {
				panic(err)
			}
			rsaKeys = append(rsaKeys, k)
		}
	})
	if n > len(rsaKeys) {
		t.Fatalf("only %d recovery keys available", len(rsaKeys))
	}
	return rsaKeys[:n]
}

func publicKeyPEM(t *testing.T, k *rsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

const (
	hexA = "0000000000000000000000000000000000000000000000000000000000000001"
	hexB = "00000000000000000000000000000000000000000000000000000000000000ff"
)

// newFixture returns a valid manifest that exercises every section: two
// packages, a marble with files, env and TLS tags, shared, user-defined and
// certificate secrets, users with roles, and Config.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	alice, alicePEM := newUserCert(t, "alice")
	bob, bobPEM := newUserCert(t, "bob")
	f := &fixture{users: map[string]userCred{
		"alice": {pem: alicePEM, cert: alice},
		"bob":   {pem: bobPEM, cert: bob},
	}}
	doc := `{
	"Packages": {
		"backend": {"SignerID": "` + hexA + `", "ProductID": 1, "SecurityVersion": 1},
		"frontend": {"UniqueID": "` + hexB + `"}
	},
	"Infrastructures": {"Azure": {"QESVN": 2, "PCESVN": 3}},
	"Marbles": {
		"backend_first": {
			"Package": "backend",
			"MaxActivations": 1,
			"Parameters": {
				"Files": {"/tmp/key": "{{ hex .Secrets.symkey.Private }}", "/tmp/raw": {"Data": "aGVsbG8=", "Encoding": "base64", "NoTemplates": true}},
				"Env": {"CERT": "{{ pem .Secrets.cert.Cert }}"},
				"Argv": ["./backend", "--serve"]
			},
			"TLS": ["web"]
		},
		"frontend": {"Package": "frontend"}
	},
	"Secrets": {
		"symkey": {"Type": "symmetric-key", "Size": 128, "Shared": true},
		"cert": {"Type": "cert-ecdsa", "Size": 256, "Shared": true, "ValidFor": 7, "Cert": {"Subject": {"CommonName": "backend"}, "DNSNames": ["backend.example"]}},
		"userkey": {"Type": "symmetric-key", "Size": 256, "UserDefined": true}
	},
	"Users": {
		"alice": {"Certificate": ` + jsonString(alicePEM) + `, "Roles": ["reader", "writer", "updater", "admin"]},
		"bob": {"Certificate": ` + jsonString(bobPEM) + `, "Roles": ["reader", "admin"]}
	},
	"Roles": {
		"reader": {"ResourceType": "Secrets", "ResourceNames": ["symkey", "cert", "userkey"], "Actions": ["ReadSecret"]},
		"writer": {"ResourceType": "Secrets", "ResourceNames": ["userkey"], "Actions": ["WriteSecret"]},
		"updater": {"ResourceType": "Packages", "ResourceNames": ["backend"], "Actions": ["UpdateSecurityVersion"]},
		"admin": {"ResourceType": "Manifest", "Actions": ["UpdateManifest"]}
	},
	"TLS": {
		"web": {
			"Incoming": [{"Port": "8443", "Cert": "cert", "DisableClientAuth": true}, {"Port": "9000"}],
			"Outgoing": [{"Addr": "service.example", "Port": "443"}]
		}
	},
	"Config": {"FeatureGates": ["SignQuoteEndpoint"], "UpdateThreshold": 2}
}`
	if err := json.Unmarshal([]byte(doc), &f.tree); err != nil {
		t.Fatal(err)
	}
	return f
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// bytes returns the manifest JSON.
func (f *fixture) bytes(t *testing.T) []byte {
	t.Helper()
	b, err := json.MarshalIndent(f.tree, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// set changes the member at a dotted path ("Packages.backend.UniqueID");
// the value deleted removes it. Missing objects on the way are created.
func (f *fixture) set(path string, value any) *fixture {
	parts := strings.Split(path, ".")
	node := f.tree
	for _, p := range parts[:len(parts)-1] {
		child, ok := node[p].(map[string]any)
		if !ok {
			child = map[string]any{}
			node[p] = child
		}
		node = child
	}
	last := parts[len(parts)-1]
	if value == deleted {
		delete(node, last)
	} else {
		node[last] = value
	}
	return f
}
