package manifest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"
)

func ptr[T any](v T) *T { return &v }

// Helpers that change one entry of a map of structs.

func setPackage(m *Manifest, name string, f func(*Package)) {
	p := m.Packages[name]
	f(&p)
	m.Packages[name] = p
}

func setMarble(m *Manifest, name string, f func(*Marble)) {
	mb := m.Marbles[name]
	f(&mb)
	m.Marbles[name] = mb
}

func setSecret(m *Manifest, name string, f func(*Secret)) {
	s := m.Secrets[name]
	f(&s)
	m.Secrets[name] = s
}

func setUser(m *Manifest, name string, f func(*User)) {
	u := m.Users[name]
	f(&u)
	m.Users[name] = u
}

func setRole(m *Manifest, name string, f func(*Role)) {
	r := m.Roles[name]
	f(&r)
	m.Roles[name] = r
}

func setTLS(m *Manifest, name string, f func(*TLSTag)) {
	tag := m.TLS[name]
	f(&tag)
	m.TLS[name] = tag
}

func setFile(m *Manifest, marble, path, data string) {
	setMarble(m, marble, func(mb *Marble) {
		if mb.Parameters.Files == nil {
			mb.Parameters.Files = make(map[string]File)
		}
		mb.Parameters.Files[path] = File{Data: data, Encoding: EncodingString}
	})
}

func setEnv(m *Manifest, marble, name string, f File) {
	setMarble(m, marble, func(mb *Marble) {
		if mb.Parameters.Env == nil {
			mb.Parameters.Env = make(map[string]File)
		}
		mb.Parameters.Env[name] = f
	})
}

// rewrapPEM re-encodes the first PEM block of text with 76-character lines:
// the same certificate in a different PEM text.
func rewrapPEM(t *testing.T, text string) string {
	t.Helper()
	block, _ := pem.Decode([]byte(text))
	if block == nil {
		t.Fatal("no PEM block")
	}
	b64 := base64.StdEncoding.EncodeToString(block.Bytes)
	var sb strings.Builder
	sb.WriteString("-----BEGIN CERTIFICATE-----\n")
	for len(b64) > 76 {
		sb.WriteString(b64[:76] + "\n")
		b64 = b64[76:]
	}
	sb.WriteString(b64 + "\n-----END CERTIFICATE-----\n")
	if sb.String() == text {
		t.Fatal("rewrapped PEM is unchanged")
	}
	return sb.String()
}

func publicKeyPEM(t *testing.T, key any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// rsaPublicKeyPEM returns a PEM "PUBLIC KEY" with an RSA modulus of the given
// size (not a real key: only its size matters to Validate).
func rsaPublicKeyPEM(t *testing.T, bits int) string {
	n := new(big.Int).Lsh(big.NewInt(1), uint(bits-1))
	n.Add(n, big.NewInt(1))
	return publicKeyPEM(t, &rsa.PublicKey{N: n, E: 65537})
}

func TestValidateFixtures(t *testing.T) {
	for _, name := range []string{"manifest.json", "minimal.json"} {
		t.Run(name, func(t *testing.T) {
			if err := loadFixture(t, name).Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

func TestValidateNil(t *testing.T) {
	var m *Manifest
	err := m.Validate()
	var verr *ValidationError
	if !errors.As(err, &verr) || verr.Message != "no allowed packages defined" {
		t.Fatalf("Validate on nil = %v", err)
	}
}

// TestValidateRules has one row per rule (and variant) of MarbleRun's
// validation (docs/design/behaviour.md#manifest-validation), in rule order, each a mutation of testdata/manifest.json.
func TestValidateRules(t *testing.T) {
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, junkKeyErr := x509.ParsePKIXPublicKey([]byte("junk"))
	fixture := loadFixture(t, "manifest.json")
	alicePEM := fixture.Users["alice"].Certificate
	aliceRewrapped := rewrapPEM(t, alicePEM)

	tests := []ruleRow{
		{"1 no packages", func(m *Manifest) { m.Packages = nil },
			"Packages", "", "", "no allowed packages defined", ""},
		{"2 no marbles", func(m *Manifest) { m.Marbles = map[string]Marble{} },
			"Marbles", "", "", "no allowed marbles defined", ""},
		{"3 marble package missing", func(m *Manifest) { setMarble(m, "frontend", func(mb *Marble) { mb.Package = "nope" }) },
			"Marbles", "frontend", "Package", "manifest does not contain marble package nope", ""},
		{"4 UniqueID and SignerID", func(m *Manifest) { setPackage(m, "frontend", func(p *Package) { p.SignerID = "ab" }) },
			"Packages", "frontend", "UniqueID", "manifest specifies both UniqueID *and* SignerID/ProductID/SecurityVersion in package frontend", ""},
		{"4 UniqueID and ProductID", func(m *Manifest) { setPackage(m, "frontend", func(p *Package) { p.ProductID = ptr[uint64](0) }) },
			"Packages", "frontend", "UniqueID", "manifest specifies both UniqueID *and* SignerID/ProductID/SecurityVersion in package frontend", ""},
		{"4 UniqueID and SecurityVersion", func(m *Manifest) { setPackage(m, "frontend", func(p *Package) { p.SecurityVersion = ptr[uint](0) }) },
			"Packages", "frontend", "UniqueID", "manifest specifies both UniqueID *and* SignerID/ProductID/SecurityVersion in package frontend", ""},
		{"5 SignerID missing", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.SignerID = "" }) },
			"Packages", "backend", "SignerID", "manifest misses value for SignerID in package backend", ""},
		{"5 ProductID missing", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.ProductID = nil }) },
			"Packages", "backend", "ProductID", "manifest misses value for ProductID in package backend", ""},
		{"5 SecurityVersion missing", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.SecurityVersion = nil }) },
			"Packages", "backend", "SecurityVersion", "manifest misses value for SecurityVersion in package backend", ""},
		{"5 unreferenced package is checked", func(m *Manifest) { m.Packages["orphan"] = Package{} },
			"Packages", "orphan", "SignerID", "manifest misses value for SignerID in package orphan", ""},
		{"6 unknown TLS tag", func(m *Manifest) { setMarble(m, "frontend", func(mb *Marble) { mb.TLS = append(mb.TLS, "nope") }) },
			"Marbles", "frontend", "TLS", "manifest misses TLS entry for nope", ""},
		{"7 incoming without port", func(m *Manifest) { setTLS(m, "web", func(tag *TLSTag) { tag.Incoming[0].Port = "" }) },
			"TLS", "web", "Incoming[0].Port", "manifest misses Port in TLS.Incoming.web", ""},
		{"8 incoming cert undefined", func(m *Manifest) { setTLS(m, "web", func(tag *TLSTag) { tag.Incoming[1].Cert = "nope" }) },
			"TLS", "web", "Incoming[1].Cert", "TLS.Incoming.web references undefined secret nope", ""},
		{"9 incoming cert with client auth", func(m *Manifest) { setTLS(m, "web", func(tag *TLSTag) { tag.Incoming[1].DisableClientAuth = false }) },
			"TLS", "web", "Incoming[1].DisableClientAuth", "TLS.Incoming.web defines Cert but does not disable client authentication", ""},
		{"10 client auth disabled without cert", func(m *Manifest) { setTLS(m, "web", func(tag *TLSTag) { tag.Incoming[0].DisableClientAuth = true }) },
			"TLS", "web", "Incoming[0].Cert", "TLS.Incoming.web disables client authentication", ""},
		{"11 outgoing without addr", func(m *Manifest) { setTLS(m, "web", func(tag *TLSTag) { tag.Outgoing[0].Addr = "" }) },
			"TLS", "web", "Outgoing[0].Addr", "manifest misses Addr in TLS.Outgoing.web", ""},
		{"11 outgoing without port", func(m *Manifest) { setTLS(m, "web", func(tag *TLSTag) { tag.Outgoing[0].Port = "" }) },
			"TLS", "web", "Outgoing[0].Port", "manifest misses Port in TLS.Outgoing.web", ""},
		{"11 outgoing after all incoming", func(m *Manifest) {
			setTLS(m, "web", func(tag *TLSTag) { tag.Outgoing[0].Port = "" })
			m.TLS["zzz"] = TLSTag{Incoming: []TLSTagEntry{{}}}
		}, "TLS", "zzz", "Incoming[0].Port", "manifest misses Port in TLS.Incoming.zzz", ""},
		{"12 user without certificate", func(m *Manifest) { setUser(m, "bob", func(u *User) { u.Certificate = "" }) },
			"Users", "bob", "Certificate", "manifest does not contain a certificate for user bob", ""},
		{"13 user with unknown role", func(m *Manifest) { setUser(m, "carol", func(u *User) { u.Roles = append(u.Roles, "nope") }) },
			"Users", "carol", "Roles", "manifest specifies role nope for user carol, but role does not exist", ""},
		{"14 same certificate", func(m *Manifest) { setUser(m, "carol", func(u *User) { u.Certificate = alicePEM }) },
			"Users", "carol", "Certificate", "manifest contains the same certificate for users alice and carol", ""},
		{"14 same certificate in other PEM text", func(m *Manifest) { setUser(m, "bob", func(u *User) { u.Certificate = aliceRewrapped }) },
			"Users", "bob", "Certificate", "manifest contains the same certificate for users alice and bob", ""},
		{"15 unknown package in role", func(m *Manifest) {
			setRole(m, "updatePackages", func(r *Role) { r.ResourceNames = append(r.ResourceNames, "nope") })
		},
			"Roles", "updatePackages", "ResourceNames", "role updatePackages: resource nope of type Packages is not defined in manifest", ""},
		{"15 bad action for packages", func(m *Manifest) { setRole(m, "updatePackages", func(r *Role) { r.Actions = []string{"ReadSecret"} }) },
			"Roles", "updatePackages", "Actions", "unknown action: ReadSecret for type Packages in role: updatePackages", ""},
		{"16 bad action for secrets", func(m *Manifest) { setRole(m, "readSecrets", func(r *Role) { r.Actions = []string{"UpdateManifest"} }) },
			"Roles", "readSecrets", "Actions", "unknown action: UpdateManifest for type Secrets in role: readSecrets", ""},
		{"16 unknown secret in role", func(m *Manifest) {
			setRole(m, "readSecrets", func(r *Role) { r.ResourceNames = append(r.ResourceNames, "nope") })
		},
			"Roles", "readSecrets", "ResourceNames", "role readSecrets: resource nope of type Secrets is not defined in manifest", ""},
		{"17 write on generated secret", func(m *Manifest) {
			setRole(m, "writeSecrets", func(r *Role) { r.ResourceNames = append(r.ResourceNames, "symmetricShared") })
		}, "Roles", "writeSecrets", "Actions", "manifest specifies write permission for role writeSecrets and secret symmetricShared, but secret is not user-defined", ""},
		{"18 read on per-marble secret", func(m *Manifest) {
			setRole(m, "readSecrets", func(r *Role) { r.ResourceNames = append(r.ResourceNames, "symmetricPerMarble") })
		}, "Roles", "readSecrets", "Actions", "manifest specifies read permission for role readSecrets and per-marble-unique secret symmetricPerMarble", ""},
		{"19 resource names for manifest", func(m *Manifest) { setRole(m, "updateManifest", func(r *Role) { r.ResourceNames = []string{"x"} }) },
			"Roles", "updateManifest", "ResourceNames", "role updateManifest: resource names are not allowed for type Manifest", ""},
		{"19 bad action for manifest", func(m *Manifest) {
			setRole(m, "updateManifest", func(r *Role) { r.Actions = []string{"updatemanifest", "ReadSecret"} })
		},
			"Roles", "updateManifest", "Actions", "unknown action: ReadSecret for type Manifest in role: updateManifest", ""},
		{"20 unknown resource type", func(m *Manifest) { setRole(m, "updateManifest", func(r *Role) { r.ResourceType = "manifest" }) },
			"Roles", "updateManifest", "ResourceType", "unrecognized resource type: manifest for role: updateManifest", ""},
		{"21 unknown secret type", func(m *Manifest) { setSecret(m, "edCert", func(s *Secret) { s.Type = "cert-dsa" }) },
			"Secrets", "edCert", "Type", "unknown type: cert-dsa for secret: edCert", ""},
		{"21 empty secret type", func(m *Manifest) { m.Secrets["blank"] = Secret{} },
			"Secrets", "blank", "Type", "unknown type:  for secret: blank", ""},
		{"22 NotAfter and ValidFor", func(m *Manifest) {
			setSecret(m, "serverCert", func(s *Secret) { s.Cert.NotAfter = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) })
		}, "Secrets", "serverCert", "ValidFor", "ambiguous certificate validity duration for secret: serverCert, both NotAfter and ValidFor are specified", ""},
		{"23 update threshold too high", func(m *Manifest) { m.Config.UpdateThreshold = 3 },
			"Config", "", "UpdateThreshold", "not enough users with manifest update permissions (2) to meet the threshold of 3", ""},
		{"23 any action counts once per user", func(m *Manifest) {
			setRole(m, "updateManifest", func(r *Role) { r.Actions = []string{"updatemanifest", "UPDATEMANIFEST"} })
			m.Config.UpdateThreshold = 3
		}, "Config", "", "UpdateThreshold", "not enough users with manifest update permissions (2) to meet the threshold of 3", ""},
		{"24 bad seal mode", func(m *Manifest) { m.Config.SealMode = "productkey" },
			"Config", "", "SealMode", "unknown seal mode: productkey", ""},
		{"25 unknown feature gate", func(m *Manifest) { m.Config.FeatureGates = append(m.Config.FeatureGates, "FeatureFlags") },
			"Config", "", "FeatureGates", "unknown feature gate: FeatureFlags", ""},
		{"25 Azure HSM sealing", func(m *Manifest) { m.Config.FeatureGates = []string{"azurehsmsealing"} },
			"Config", "", "FeatureGates", "unsupported feature gate: azurehsmsealing: sealing with an Azure HSM key is not supported by this Coordinator", ""},
		{"26 recovery threshold too high", func(m *Manifest) { m.Config.RecoveryThreshold = 3 },
			"Config", "", "RecoveryThreshold", "not enough recovery keys (2) defined to meet the recovery threshold of 3", ""},
		{"26 recovery threshold without keys", func(m *Manifest) { m.RecoveryKeys = nil; m.Config.RecoveryThreshold = 1 },
			"Config", "", "RecoveryThreshold", "not enough recovery keys (0) defined to meet the recovery threshold of 1", ""},
		{"27 recovery threshold 1", func(m *Manifest) { m.Config.RecoveryThreshold = 1 },
			"Config", "", "RecoveryThreshold", "invalid recovery threshold: if set, threshold must be at least 2", ""},
		{"28 symmetric size 0", func(m *Manifest) { setSecret(m, "symmetricShared", func(s *Secret) { s.Size = 0 }) },
			"Secrets", "symmetricShared", "Size", "invalid secret size: symmetricShared", stageSharedSecrets},
		{"28 symmetric size not a multiple of 8", func(m *Manifest) { setSecret(m, "symmetricPerMarble", func(s *Secret) { s.Size = 12 }) },
			"Secrets", "symmetricPerMarble", "Size", "invalid secret size: symmetricPerMarble", stageMarbleSecrets},
		{"28 shared secrets first", func(m *Manifest) {
			setSecret(m, "symmetricPerMarble", func(s *Secret) { s.Size = 12 })
			setSecret(m, "symmetricShared", func(s *Secret) { s.Size = 12 })
		}, "Secrets", "symmetricShared", "Size", "invalid secret size: symmetricShared", stageSharedSecrets},
		{"28 symmetric size above the maximum", func(m *Manifest) {
			setSecret(m, "symmetricShared", func(s *Secret) { s.Size = MaxSymmetricSecretSize + 8 })
		},
			"Secrets", "symmetricShared", "Size", "invalid secret size for symmetric-key secret symmetricShared: 65544 bits exceed the maximum of 65536", stageSharedSecrets},
		{"28 ecdsa size", func(m *Manifest) { setSecret(m, "serverCert", func(s *Secret) { s.Size = 255 }) },
			"Secrets", "serverCert", "Size", "invalid secret size for cert-ecdsa secret serverCert: unsupported size 255: does not map to a supported curve", stageSharedSecrets},
		{"28 ecdsa size 0", func(m *Manifest) { setSecret(m, "serverCert", func(s *Secret) { s.Size = 0 }) },
			"Secrets", "serverCert", "Size", "invalid secret size for cert-ecdsa secret serverCert: unsupported size 0: does not map to a supported curve", stageSharedSecrets},
		{"28 ed25519 size", func(m *Manifest) { setSecret(m, "edCert", func(s *Secret) { s.Size = 256 }) },
			"Secrets", "edCert", "Size", "invalid secret size for cert-ed25519 secret edCert: none is expected, got: 256", stageMarbleSecrets},
		{"28 rsa size too small", func(m *Manifest) { setSecret(m, "rsaCert", func(s *Secret) { s.Size = 512 }) },
			"Secrets", "rsaCert", "Size", "crypto/rsa: 512-bit keys are insecure (see https://go.dev/pkg/crypto/rsa#hdr-Minimum_key_size)", stageSharedSecrets},
		{"28 rsa size 0", func(m *Manifest) { setSecret(m, "rsaCert", func(s *Secret) { s.Size = 0 }) },
			"Secrets", "rsaCert", "Size", "crypto/rsa: 0-bit keys are insecure (see https://go.dev/pkg/crypto/rsa#hdr-Minimum_key_size)", stageSharedSecrets},
		{"28 rsa size above the maximum", func(m *Manifest) { setSecret(m, "rsaCert", func(s *Secret) { s.Size = MaxRSASecretSize + 1 }) },
			"Secrets", "rsaCert", "Size", "invalid secret size for cert-rsa secret rsaCert: 8193-bit keys exceed the maximum of 8192", stageSharedSecrets},
		{"28 plain secret not user-defined", func(m *Manifest) { m.Secrets["generatedPlain"] = Secret{Type: SecretTypePlain, Shared: true} },
			"Secrets", "generatedPlain", "UserDefined", "secret generatedPlain is invalid: unsupported secret of type plain", stageSharedSecrets},
		{"28 user-defined symmetric key needs a size", func(m *Manifest) { setSecret(m, "userKey", func(s *Secret) { s.Size = 0 }) },
			"Secrets", "userKey", "Size", "invalid secret size: userKey", ""},
		{"28 user-defined certificate size is checked if set", func(m *Manifest) { setSecret(m, "userCert", func(s *Secret) { s.Size = 1000 }) },
			"Secrets", "userCert", "Size", "crypto/rsa: 1000-bit keys are insecure (see https://go.dev/pkg/crypto/rsa#hdr-Minimum_key_size)", ""},
		{"29 recovery key not PEM", func(m *Manifest) { m.RecoveryKeys["recoveryKey2"] = "not a key" },
			"RecoveryKeys", "recoveryKey2", "", "given PEM data is not a public key", stageRecoveryKeys},
		{"29 recovery key of another PEM type", func(m *Manifest) {
			m.RecoveryKeys["recoveryKey1"] = string(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: []byte("x")}))
		}, "RecoveryKeys", "recoveryKey1", "", "given PEM data is not a public key", stageRecoveryKeys},
		{"29 recovery key not PKIX", func(m *Manifest) {
			m.RecoveryKeys["recoveryKey1"] = string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("junk")}))
		}, "RecoveryKeys", "recoveryKey1", "", junkKeyErr.Error(), stageRecoveryKeys},
		{"29 recovery key not RSA", func(m *Manifest) { m.RecoveryKeys["recoveryKey1"] = publicKeyPEM(t, &ecKey.PublicKey) },
			"RecoveryKeys", "recoveryKey1", "", "unsupported type of public key", stageRecoveryKeys},
		{"29 recovery key too small", func(m *Manifest) { m.RecoveryKeys["recoveryKey1"] = rsaPublicKeyPEM(t, 512) },
			"RecoveryKeys", "recoveryKey1", "", "crypto/rsa: 512-bit keys are insecure (see https://go.dev/pkg/crypto/rsa#hdr-Minimum_key_size)", stageRecoveryKeys},
		{"29 recovery key too large", func(m *Manifest) { m.RecoveryKeys["recoveryKey1"] = rsaPublicKeyPEM(t, MaxRecoveryKeySize+8) },
			"RecoveryKeys", "recoveryKey1", "", "recovery key of 16392 bits exceeds the maximum of 16384", stageRecoveryKeys},
		{"30 user certificate not PEM", func(m *Manifest) { setUser(m, "carol", func(u *User) { u.Certificate = "carol's certificate" }) },
			"Users", "carol", "Certificate", "received invalid certificate for user carol", stageUsers},
		{"30 user certificate not X.509", func(m *Manifest) {
			setUser(m, "bob", func(u *User) {
				u.Certificate = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")}))
			})
		}, "Users", "bob", "Certificate", "received invalid certificate for user bob", stageUsers},
		{"31 empty value in file template", func(m *Manifest) { setFile(m, "backend_first", "/x", "{{raw .Secrets.symmetricShared.Cert}}") },
			"Marbles", "backend_first", "Parameters.Files./x",
			`in Marble backend_first: file /x: template: /x:1:2: executing "/x" at <raw .Secrets.symmetricShared.Cert>: error calling raw: tried to parse secret with empty value`, stageTemplateDryRun},
		{"31 Coordinator root has no public key", func(m *Manifest) { setFile(m, "backend_first", "/root", "{{pem .MarbleRun.RootCA.Public}}") },
			"Marbles", "backend_first", "Parameters.Files./root",
			`in Marble backend_first: file /root: template: /root:1:2: executing "/root" at <pem .MarbleRun.RootCA.Public>: error calling pem: tried to parse secret with empty value`, stageTemplateDryRun},
		{"31 pem of a whole secret", func(m *Manifest) { setFile(m, "backend_first", "/c", "{{pem .Secrets.serverCert}}") },
			"Marbles", "backend_first", "Parameters.Files./c",
			`in Marble backend_first: file /c: template: /c:1:2: executing "/c" at <pem .Secrets.serverCert>: error calling pem: invalid secret type for pem encoding`, stageTemplateDryRun},
		{"31 template syntax error", func(m *Manifest) { setFile(m, "frontend", "/s", "{{.Secrets.x") },
			"Marbles", "frontend", "Parameters.Files./s",
			`in Marble frontend: file /s: template: /s:1: unclosed action`, stageTemplateDryRun},
		{"31 raw is not defined for env", func(m *Manifest) { setEnv(m, "frontend", "RAW", File{Data: "{{raw .Secrets.userKey}}"}) },
			"Marbles", "frontend", "Parameters.Env.RAW",
			`in Marble frontend: env variable RAW: template: RAW:1: function "raw" not defined (Env allow pem, string, hex, base64, and print, printf, println, html, js, urlquery, len, index, slice and the other built-ins of Go's text/template; for a plain secret in Env use "string"; see docs/marbles.md)`, stageTemplateDryRun},
		{"31 string of a non-plain secret", func(m *Manifest) { setEnv(m, "frontend", "KEY", File{Data: "{{string .Secrets.userKey}}"}) },
			"Marbles", "frontend", "Parameters.Env.KEY",
			`in Marble frontend: env variable KEY: template: KEY:1:2: executing "KEY" at <string .Secrets.userKey>: error calling string: only secrets of type plain are allowed to use string encoding for environment variables`, stageTemplateDryRun},
		{"31 NUL in env data", func(m *Manifest) {
			setEnv(m, "frontend", "NUL", File{Data: "a\x00b", Encoding: EncodingHex, NoTemplates: true})
		},
			"Marbles", "frontend", "Parameters.Env.NUL",
			`in Marble frontend: env variable: NUL: content contains null bytes`, stageTemplateDryRun},
		{"31 NUL rendered into env", func(m *Manifest) { setEnv(m, "frontend", "NUL", File{Data: `{{printf "%c" 0}}`}) },
			"Marbles", "frontend", "Parameters.Env.NUL",
			`in Marble frontend: env variable: NUL: content contains null bytes`, stageTemplateDryRun},
		{"31 files before env, marbles sorted", func(m *Manifest) {
			setEnv(m, "backend_first", "A", File{Data: "{{pem .Secrets.serverCert}}"})
			setFile(m, "backend_first", "/z", "{{pem .Secrets.serverCert}}")
			setFile(m, "frontend", "/a", "{{pem .Secrets.serverCert}}")
		}, "Marbles", "backend_first", "Parameters.Files./z",
			`in Marble backend_first: file /z: template: /z:1:2: executing "/z" at <pem .Secrets.serverCert>: error calling pem: invalid secret type for pem encoding`, stageTemplateDryRun},
	}
	runRuleRows(t, tests)
}

// ruleRow is a mutation of testdata/manifest.json and the *ValidationError
// that Validate must report for it.
type ruleRow struct {
	rule    string
	mutate  func(m *Manifest)
	section string
	name    string
	field   string
	message string
	stage   string // "" means "checking manifest"
}

func runRuleRows(t *testing.T, tests []ruleRow) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.rule, func(t *testing.T) {
			m := loadFixture(t, "manifest.json")
			tt.mutate(m)
			err := m.Validate()
			if err == nil {
				t.Fatal("Validate succeeded")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not wrap ErrInvalid", err)
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("error %T is not a *ValidationError", err)
			}
			if verr.Message != tt.message {
				t.Errorf("Message:\n got %q\nwant %q", verr.Message, tt.message)
			}
			if err.Error() != verr.Message {
				t.Errorf("Error() = %q, want Message", err.Error())
			}
			if verr.Section != tt.section || verr.Name != tt.name || verr.Field != tt.field {
				t.Errorf("Section/Name/Field = %q/%q/%q, want %q/%q/%q", verr.Section, verr.Name, verr.Field, tt.section, tt.name, tt.field)
			}
			wantStage := tt.stage
			if wantStage == "" {
				wantStage = stageCheck
			}
			if verr.Stage() != wantStage {
				t.Errorf("Stage() = %q, want %q", verr.Stage(), wantStage)
			}
			if again := m.Validate(); again.Error() != err.Error() {
				t.Errorf("second Validate reported %q", again)
			}
		})
	}
}

// TestValidateAccepts lists manifests that MarbleRun accepts and so must we.
func TestValidateAccepts(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m *Manifest)
	}{
		{"debug package with UniqueID and SignerID", func(m *Manifest) {
			setPackage(m, "debug", func(p *Package) { p.UniqueID, p.SignerID, p.ProductID = hex64, hex64, ptr[uint64](1) })
		}},
		{"debug package without values", func(m *Manifest) { m.Packages["other"] = Package{Debug: true} }},
		{"UniqueID only", func(m *Manifest) { m.Packages["other"] = Package{UniqueID: hex64} }},
		{"actions are case-insensitive", func(m *Manifest) {
			setRole(m, "updatePackages", func(r *Role) { r.Actions = []string{"updatesecurityversion"} })
			setRole(m, "readSecrets", func(r *Role) { r.Actions = []string{"READSECRET"} })
		}},
		{"roles without actions or resources", func(m *Manifest) { m.Roles["empty"] = Role{ResourceType: ResourceSecrets} }},
		{"user without roles", func(m *Manifest) { setUser(m, "carol", func(u *User) { u.Roles = nil }) }},
		{"no users, roles, secrets or TLS", func(m *Manifest) {
			m.Users, m.Roles, m.TLS, m.Config.UpdateThreshold = nil, nil, nil, 0
			for name := range m.Marbles {
				setMarble(m, name, func(mb *Marble) { mb.TLS = nil })
			}
		}},
		{"update threshold equal to the updaters", func(m *Manifest) { m.Config.UpdateThreshold = 2 }},
		{"update threshold 0", func(m *Manifest) { m.Config.UpdateThreshold = 0 }},
		{"recovery threshold 0", func(m *Manifest) { m.Config.RecoveryThreshold = 0 }},
		{"no recovery keys", func(m *Manifest) { m.RecoveryKeys, m.Config.RecoveryThreshold = nil, 0 }},
		{"seal modes", func(m *Manifest) { m.Config.SealMode = SealModeUniqueKey }},
		{"seal mode disabled", func(m *Manifest) { m.Config.SealMode = SealModeDisabled }},
		{"default seal mode", func(m *Manifest) { m.Config.SealMode = "" }},
		{"feature gates in any case", func(m *Manifest) { m.Config.FeatureGates = []string{"signquoteendpoint", "SignQuoteEndpoint"} }},
		{"largest secrets", func(m *Manifest) {
			setSecret(m, "rsaCert", func(s *Secret) { s.Size = MaxRSASecretSize })
			setSecret(m, "symmetricShared", func(s *Secret) { s.Size = MaxSymmetricSecretSize })
		}},
		{"ecdsa curves", func(m *Manifest) {
			for _, size := range []uint{224, 384, 521} {
				m.Secrets["ec"+string(rune('0'+size%10))] = Secret{Type: SecretTypeCertECDSA, Size: size}
			}
		}},
		{"user-defined certificates without size", func(m *Manifest) {
			m.Secrets["ec"] = Secret{Type: SecretTypeCertECDSA, UserDefined: true}
			m.Secrets["ed"] = Secret{Type: SecretTypeCertED25519, UserDefined: true}
		}},
		{"plain secret ignores size", func(m *Manifest) { setSecret(m, "apiKey", func(s *Secret) { s.Size = 3 }) }},
		{"NotAfter without ValidFor", func(m *Manifest) {
			setSecret(m, "serverCert", func(s *Secret) { s.ValidFor, s.Cert.NotAfter = 0, time.Now().Add(time.Hour) })
		}},
		{"incoming Addr is ignored", func(m *Manifest) { setTLS(m, "web", func(tag *TLSTag) { tag.Incoming[0].Addr = "x" }) }},
		{"templates with builtins", func(m *Manifest) {
			setFile(m, "frontend", "/b", `{{printf "%s-%d" .Secrets.serverCert.Type (len .Secrets)}}{{index .Secrets "apiKey" | raw}}{{range $k, $v := .Secrets}}{{$k}}{{end}}`)
		}},
		{"templates of Previous secrets", func(m *Manifest) { setFile(m, "frontend", "/p", `{{pem .Previous.Secrets.serverCert.Cert}}`) }},
		{"Marble certificate keys", func(m *Manifest) {
			setEnv(m, "frontend", "K", File{Data: `{{pem .MarbleRun.MarbleCert.Public}}{{pem .MarbleRun.CoordinatorIntermediate.Cert}}`})
		}},
		{"NUL in a file", func(m *Manifest) { setFile(m, "frontend", "/n", "a\x00b") }},
		{"invalid template with NoTemplates", func(m *Manifest) {
			setMarble(m, "frontend", func(mb *Marble) { mb.Parameters.Files = map[string]File{"/t": {Data: "{{", NoTemplates: true}} })
		}},
		{"same user certificate text is DER-compared only", func(m *Manifest) {
			// Two different certificates are different users, whatever their PEM text.
			setUser(m, "carol", func(u *User) { u.Certificate = rewrapPEM(t, u.Certificate) })
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := loadFixture(t, "manifest.json")
			tt.mutate(m)
			if err := m.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

func TestValidationErrorUnwrap(t *testing.T) {
	err := error(&ValidationError{Section: "Config", Message: "m"})
	if !errors.Is(err, ErrInvalid) || err.Error() != "m" {
		t.Errorf("err = %v, Is(ErrInvalid) = %v", err, errors.Is(err, ErrInvalid))
	}
	if got := (&ValidationError{}).Stage(); got != "checking manifest" {
		t.Errorf("Stage() of a literal = %q", got)
	}
}

func TestParseUserCertificate(t *testing.T) {
	m := loadFixture(t, "manifest.json")
	cert, err := ParseUserCertificate(m.Users["alice"].Certificate)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "alice" {
		t.Errorf("CommonName = %q", cert.Subject.CommonName)
	}
	for _, bad := range []string{"", "x", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"} {
		if _, err := ParseUserCertificate(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseUserCertificate(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
