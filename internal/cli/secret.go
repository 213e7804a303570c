package cli

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	v2 "github.com/quarry-cc/quarry/api/v2"
)

func (a *app) secretCommand() *cobra.Command {
	g := groupCommand("secret", "Read and upload secrets (needs a manifest user's --cert and --key)",
		a.secretGetCommand(),
		a.secretSetCommand(),
	)
	return g
}

func isCertType(t string) bool { return strings.HasPrefix(t, "cert-") }

// secretFiles returns the files secret get --dir writes for one secret:
// file name → content and mode.
func secretFiles(name string, s v2.Secret) map[string][]byte {
	if isCertType(s.Type) {
		files := map[string][]byte{}
		if len(s.Cert) > 0 {
			files[name+".crt"] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Cert})
		}
		if len(s.Private) > 0 {
			files[name+".key"] = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: s.Private})
		}
		if len(s.Public) > 0 {
			files[name+".pub"] = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: s.Public})
		}
		return files
	}
	value := s.Private
	if len(value) == 0 {
		value = s.Public
	}
	return map[string][]byte{name: value}
}

// checkSecretName refuses names that cannot be file names in --dir.
func checkSecretName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) || strings.ContainsRune(name, 0) {
		return fmt.Errorf("secret name %q cannot be used as a file name", name)
	}
	return nil
}

func (a *app) secretGetCommand() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "get NAME...",
		Short: "Read secrets",
		Long: `Read secrets as a manifest user (--cert, --key).

Without --dir, the secrets are printed: certificates as PEM (certificate,
then private key), symmetric keys in hex, plain secrets in base64.
With --dir, each secret is written to files in that directory (mode 0600):
  NAME.crt, NAME.key, NAME.pub   certificate, PKCS #8 private key and public key, PEM
  NAME                           the raw key or data of symmetric-key and plain secrets
With --output json, the secrets are printed as the Client API returns them.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s needs at least one secret name", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir != "" {
				for _, n := range args {
					if err := checkSecretName(n); err != nil {
						return usageError{err}
					}
				}
			}
			s, err := a.connect(cmd.Context(), needClientCert)
			if err != nil {
				return err
			}
			secrets, err := s.c.GetSecrets(cmd.Context(), args...)
			if err != nil {
				return fmt.Errorf("getting secrets: %w", err)
			}
			for _, n := range args {
				if _, ok := secrets[n]; !ok {
					return fmt.Errorf("the Coordinator did not return secret %q", n)
				}
			}
			if dir != "" {
				if err := os.MkdirAll(dir, 0o700); err != nil {
					return err
				}
				var written []string
				for _, n := range args {
					files := secretFiles(n, secrets[n])
					names := sortedKeys(files)
					for _, f := range names {
						if err := writeFile(filepath.Join(dir, f), files[f], 0o600); err != nil {
							return err
						}
						written = append(written, filepath.Join(dir, f))
					}
				}
				if a.jsonOutput() {
					return a.printJSON(map[string]any{"files": written})
				}
				a.printf("Wrote %s.\n", strings.Join(written, ", "))
				return nil
			}
			if a.jsonOutput() {
				return a.printJSON(secrets)
			}
			for i, n := range args {
				if i > 0 {
					a.printf("\n")
				}
				a.printSecret(n, secrets[n])
			}
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", "", "write each secret to files in this directory")
	return c
}

// printSecret prints one secret for humans.
func (a *app) printSecret(name string, s v2.Secret) {
	var attrs []string
	attrs = append(attrs, s.Type)
	if s.Size > 0 {
		attrs = append(attrs, fmt.Sprintf("%d bits", s.Size))
	}
	if s.Shared {
		attrs = append(attrs, "shared")
	}
	if s.UserDefined {
		attrs = append(attrs, "user-defined")
	}
	a.printf("%s (%s):\n", name, strings.Join(attrs, ", "))
	switch {
	case isCertType(s.Type):
		if len(s.Cert) > 0 {
			a.printf("%s", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Cert}))
		}
		if len(s.Private) > 0 {
			a.printf("%s", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: s.Private}))
		}
		if len(s.Cert) == 0 && len(s.Private) == 0 {
			a.printf("(not set)\n")
		}
	default:
		value := s.Private
		if len(value) == 0 {
			value = s.Public
		}
		switch {
		case len(value) == 0:
			a.printf("(not set)\n")
		case s.Type == "symmetric-key":
			a.printf("%s\n", hex.EncodeToString(value))
		default:
			a.printf("%s\n", base64.StdEncoding.EncodeToString(value))
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (a *app) secretSetCommand() *cobra.Command {
	var fromFile, fromPEM, fromJSON string
	c := &cobra.Command{
		Use:   "set [NAME] (--from-file FILE | --from-pem FILE | --from-json FILE)",
		Short: "Upload user-defined secrets",
		Long: `Upload user-defined secrets as a manifest user (--cert, --key). One of:
  set NAME --from-file FILE   the file's bytes are the key (symmetric-key) or data (plain)
  set NAME --from-pem FILE    a certificate secret: a PEM file with the CERTIFICATE and
                              optionally its PRIVATE KEY (PKCS #8, or EC / RSA PRIVATE KEY)
                              and PUBLIC KEY
  set --from-json FILE        several secrets: a JSON object mapping names to
                              {"key": base64} or {"cert": base64 DER, "private": base64
                              PKCS #8, "public": base64 PKIX}`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n := 0
			for _, f := range []string{fromFile, fromPEM, fromJSON} {
				if f != "" {
					n++
				}
			}
			if n != 1 {
				return usagef("give exactly one of --from-file, --from-pem and --from-json")
			}
			if fromJSON != "" && len(args) == 1 {
				return usagef("--from-json names the secrets itself; give no NAME")
			}
			if fromJSON == "" && len(args) != 1 {
				return usagef("give the secret's NAME")
			}
			var secrets map[string]v2.UserSecret
			switch {
			case fromJSON != "":
				raw, err := a.readInput(fromJSON)
				if err != nil {
					return err
				}
				if secrets, err = parseSecretsJSON(raw); err != nil {
					return usagef("%s: %w", fromJSON, err)
				}
			case fromFile != "":
				raw, err := a.readInput(fromFile)
				if err != nil {
					return err
				}
				if len(raw) == 0 {
					return usagef("%s is empty", fromFile)
				}
				secrets = map[string]v2.UserSecret{args[0]: {Key: raw}}
			default:
				raw, err := a.readInput(fromPEM)
				if err != nil {
					return err
				}
				us, err := parseSecretPEM(raw)
				if err != nil {
					return usagef("%s: %w", fromPEM, err)
				}
				secrets = map[string]v2.UserSecret{args[0]: us}
			}
			s, err := a.connect(cmd.Context(), needClientCert)
			if err != nil {
				return err
			}
			if err := s.c.SetSecrets(cmd.Context(), secrets); err != nil {
				return fmt.Errorf("setting secrets: %w", err)
			}
			names := sortedKeys(secrets)
			if a.jsonOutput() {
				return a.printJSON(map[string]any{"secrets": names})
			}
			a.printf("Uploaded %s: %s.\n", plural(len(names), "secret", "secrets"), strings.Join(names, ", "))
			return nil
		},
	}
	c.Flags().StringVar(&fromFile, "from-file", "", "file with the raw key or data (- for standard input)")
	c.Flags().StringVar(&fromPEM, "from-pem", "", "PEM file with a certificate and optionally its keys")
	c.Flags().StringVar(&fromJSON, "from-json", "", "JSON file with several secrets")
	return c
}

// parseSecretsJSON decodes a JSON object of user secrets (member names are
// case-insensitive; unknown members are an error).
func parseSecretsJSON(raw []byte) (map[string]v2.UserSecret, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var m map[string]v2.UserSecret
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("not a JSON object of secrets: %w", err)
	}
	if len(m) == 0 {
		return nil, errors.New("no secrets in the file")
	}
	return m, nil
}

// parseSecretPEM builds a certificate secret from PEM blocks.
func parseSecretPEM(raw []byte) (v2.UserSecret, error) {
	var us v2.UserSecret
	rest := raw
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			if us.Cert != nil {
				return us, errors.New("more than one CERTIFICATE block")
			}
			if _, err := x509.ParseCertificate(b.Bytes); err != nil {
				return us, fmt.Errorf("parsing the certificate: %w", err)
			}
			us.Cert = b.Bytes
		case "PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY":
			if us.Private != nil {
				return us, errors.New("more than one private key block")
			}
			der, err := pkcs8(b)
			if err != nil {
				return us, err
			}
			us.Private = der
		case "PUBLIC KEY":
			if _, err := x509.ParsePKIXPublicKey(b.Bytes); err != nil {
				return us, fmt.Errorf("parsing the public key: %w", err)
			}
			us.Public = b.Bytes
		case "ENCRYPTED PRIVATE KEY":
			return us, errors.New("the private key is encrypted; decrypt it first")
		}
	}
	if us.Cert == nil {
		return us, errors.New("no PEM CERTIFICATE block found")
	}
	return us, nil
}

// pkcs8 returns the PKCS #8 DER of a PEM private key block.
func pkcs8(b *pem.Block) ([]byte, error) {
	var key any
	var err error
	switch b.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(b.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parsing the %s: %w", strings.ToLower(b.Type), err)
	}
	if b.Type == "PRIVATE KEY" {
		return b.Bytes, nil
	}
	return x509.MarshalPKCS8PrivateKey(key)
}
