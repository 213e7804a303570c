package manifest

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/quarry-cc/quarry/internal/testpki"
)

// benchManifest builds a valid manifest with n marbles, n secrets and n users
// (each with its own certificate), plus the fixture's recovery keys.
func benchManifest(b *testing.B, n int) []byte {
	b.Helper()
	m := loadFixture(b, "manifest.json")
	m.Marbles = make(map[string]Marble, n)
	m.Secrets = make(map[string]Secret, n)
	m.Users = make(map[string]User, n)
	m.Roles = map[string]Role{
		"update": {ResourceType: ResourceManifest, Actions: []string{ActionUpdateManifest}},
		"read":   {ResourceType: ResourceSecrets, Actions: []string{ActionReadSecret}},
	}
	m.TLS = nil
	m.Config.UpdateThreshold = 1
	read := m.Roles["read"]
	for i := range n {
		secret := fmt.Sprintf("secret%d", i)
		switch i % 3 {
		case 0:
			m.Secrets[secret] = Secret{Type: SecretTypeSymmetric, Size: 256, Shared: true}
		case 1:
			m.Secrets[secret] = Secret{Type: SecretTypeCertECDSA, Size: 256, Shared: true, ValidFor: 30}
		default:
			m.Secrets[secret] = Secret{Type: SecretTypePlain, UserDefined: true}
		}
		read.ResourceNames = append(read.ResourceNames, secret)
		m.Marbles[fmt.Sprintf("marble%d", i)] = Marble{
			Package: "backend",
			Parameters: Parameters{
				Files: map[string]File{"/secret": {Data: fmt.Sprintf("{{hex .Secrets.%s}}", secret)}},
				// Most values of real manifests are plain (no action).
				Env:  map[string]File{"ROOT": {Data: "{{pem .MarbleRun.RootCA.Cert}}"}, "MODE": {Data: "production"}, "PORT": {Data: "8443"}},
				Argv: []string{"./app"},
			},
		}
		m.Users[fmt.Sprintf("user%d", i)] = User{Certificate: benchCertificate(b, i), Roles: []string{"update", "read"}}
	}
	m.Roles["read"] = read
	raw, err := json.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

func benchCertificate(b *testing.B, i int) string {
	b.Helper()
	return string(testpki.SelfSigned(b, fmt.Sprintf("user%d", i), testpki.Ed25519(), testpki.Serial(int64(i+1))).CertPEM())
}

func BenchmarkParseValidate(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			raw := benchManifest(b, n)
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				m, err := Parse(raw)
				if err != nil {
					b.Fatal(err)
				}
				if err := m.Validate(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
