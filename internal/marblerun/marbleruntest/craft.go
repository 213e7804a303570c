package marbleruntest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/quarry-cc/quarry/internal/marblerun"
)

// Store decrypts the vector's store (store key → raw value) for crafting.
func (v *Vector) Store(t testing.TB) map[string][]byte {
	t.Helper()
	sd, err := marblerun.ParseSealedData(v.Data)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := sd.Open(v.Key)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// Reseal seals a crafted store as MarbleRun does, under the vector's data
// key and with its recovery data, so the vector's sealed_key and recovery
// secrets open it.
func (v *Vector) Reseal(t testing.TB, kv map[string][]byte) []byte {
	t.Helper()
	sd, err := marblerun.ParseSealedData(v.Data)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Seal(v.Key, sd.RecoveryData, kv)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// SetManifest replaces the store's manifest with the JSON of tree (the
// manifest as a generic JSON tree) and signs it with the store's root key
// as MarbleRun does (ASN.1 ECDSA over SHA-256). It returns the raw bytes.
func SetManifest(t testing.TB, kv map[string][]byte, tree map[string]any) []byte {
	t.Helper()
	raw, err := json.MarshalIndent(tree, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParseECPrivateKey(kv["privateKey:coordinatorRootKey"])
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	sig, err := ecdsa.SignASN1(rand.Reader, key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	kv["manifest"], kv["manifestSignature"] = raw, sig
	return raw
}

// ManifestTree returns the store's manifest as a generic JSON tree.
func ManifestTree(t testing.TB, kv map[string][]byte) map[string]any {
	t.Helper()
	var tree map[string]any
	if err := json.Unmarshal(kv["manifest"], &tree); err != nil {
		t.Fatal(err)
	}
	return tree
}

// NewUser makes a self-signed client certificate for a manifest user: the
// certificate as DER and PEM and the PKCS #8 key as PEM.
func NewUser(t testing.TB, name string) (der, certPEM, keyPEM []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if der, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k); err != nil {
		t.Fatal(err)
	}
	pk, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return der, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pk})
}

// PendingState is a crafted MarbleRun state with a multi-party update
// waiting for acknowledgements.
type PendingState struct {
	// Data is the sealed_data (the vector's sealed_key opens it).
	Data []byte
	// Manifest is the current manifest: the vector's with a second user
	// alice who, like admin, holds UpdateManifest (UpdateThreshold 0, so
	// both must acknowledge a full update).
	Manifest []byte
	// Update is the pending manifest: Manifest with a new shared secret
	// newKey. admin initiated it (acknowledged), alice has not.
	Update []byte
	// AliceCertPEM and AliceKeyPEM are alice's client credentials.
	AliceCertPEM, AliceKeyPEM []byte
}

// WithPendingUpdate crafts, from the vector (which must have the user admin
// holding UpdateManifest: "single"), a state as MarbleRun writes it after
// admin initiated a full manifest update that alice still has to
// acknowledge: the pendingUpdate store key (docs/design/behaviour.md#multi-party-updates, docs/design/behaviour.md#sealed-state), user
// alice, and the initiation's update log entry. With legacyNoCount the
// pendingUpdate has no missingAcknowledgments member, as MarbleRun versions
// before it was introduced wrote it (MarbleRun then counts the required
// users that have not acknowledged).
func (v *Vector) WithPendingUpdate(t testing.TB, legacyNoCount bool) *PendingState {
	t.Helper()
	kv := v.Store(t)
	der, certPEM, keyPEM := NewUser(t, "alice")
	tree := ManifestTree(t, kv)
	tree["Users"].(map[string]any)["alice"] = map[string]any{"Certificate": string(certPEM), "Roles": []string{"updateManifest"}}
	cur := SetManifest(t, kv, tree)
	user, err := json.Marshal(map[string]any{"Name": "alice", "Certificate": der,
		"Permissions": map[string]any{"updatemanifest": map[string]any{"PermissionID": "updatemanifest", "ResourceID": map[string]bool{}}}})
	if err != nil {
		t.Fatal(err)
	}
	kv["user:alice"] = user

	tree["Secrets"].(map[string]any)["newKey"] = map[string]any{"Type": "symmetric-key", "Size": 256, "Shared": true}
	update, err := json.MarshalIndent(tree, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	pending := map[string]any{"manifestRaw": update, "requiredUsers": map[string]bool{"admin": true, "alice": false}}
	if !legacyNoCount {
		pending["missingAcknowledgments"] = 1
	}
	if kv["pendingUpdate"], err = json.Marshal(pending); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(update)
	entry, err := json.Marshal(map[string]any{"time": "2026-11-23T20:30:00.000Z",
		"update": "Complete Manifest update initiated by user. Waiting for acknowledgments to apply the update",
		"user":   "admin", "missingAcknowledgments": 1, "missingUsers": []string{"alice"}, "manifestFingerprint": hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	kv["updateLog"] = append(append(kv["updateLog"], entry...), '\n')
	return &PendingState{Data: v.Reseal(t, kv), Manifest: cur, Update: update, AliceCertPEM: certPEM, AliceKeyPEM: keyPEM}
}

// WithLegacyKey seals the vector's store under a 16-byte data key, as
// MarbleRun deployments from before 1.9.0 have it (docs/design/behaviour.md#recovery-secrets);
// MarbleRun's no-enclave sealed_key then holds the raw 16-byte key (key).
func (v *Vector) WithLegacyKey(t testing.TB) (data, key []byte) {
	t.Helper()
	sd, err := marblerun.ParseSealedData(v.Data)
	if err != nil {
		t.Fatal(err)
	}
	key = make([]byte, 16)
	for i := range key {
		key[i] = byte(0x16 + i)
	}
	if data, err = Seal(key, sd.RecoveryData, v.Store(t)); err != nil {
		t.Fatal(err)
	}
	return data, key
}
