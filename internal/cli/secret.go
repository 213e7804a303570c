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
	var dir, file string
	c := &cobra.Command{
		Use:   "get NAME... [ADDRESS]",
		Short: "Read secrets",
		Long: `Read secrets as a manifest user (--cert, --key).

Without --dir, the secrets are printed: certificates as PEM (certificate,
then private key), symmetric keys in hex, plain secrets in base64.
With --dir, each secret is written to files in that directory (mode 0600):
  NAME.crt, NAME.key, NAME.pub   certificate, PKCS #8 private key and public key, PEM
  NAME                           the raw key or data of symmetric-key and plain secrets
With -o/--output FILE, all of them are written to FILE as one JSON object
(mode 0600), in marblerun's form.
With --format json, the secrets are printed as the Client API returns them.

A last argument of the form host:port is the Coordinator's address
(marblerun's command line; the secrets are then printed as marblerun prints
them) unless --coordinator is given.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s needs at least one secret name", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if last := args[len(args)-1]; len(args) > 1 && !cmd.Flags().Changed("coordinator") && looksLikeAddress(last) {
				if err := a.setAddress(cmd, last); err != nil {
					return err
				}
				args = args[:len(args)-1]
			}
			if dir != "" && file != "" {
				return usagef("--dir and --output exclude each other")
			}
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
			switch {
			case file != "":
				buf, err := mrSecretsJSON(secrets)
				if err != nil {
					return err
				}
				if err := writeFile(file, buf, 0o600); err != nil {
					return err
				}
				if a.jsonOutput() {
					return a.printJSON(map[string]any{"file": file})
				}
				a.printf("Saved secrets to: %s\n", file)
				return nil
			case dir != "":
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
			case a.jsonOutput():
				return a.printJSON(secrets)
			case a.mr:
				for _, n := range args {
					a.printf("%s", mrSecretText(n, secrets[n]))
				}
				return nil
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
	c.Flags().StringVarP(&file, "output", "o", "", "write the secrets to this file as one JSON object (marblerun's form)")
	return c
}

// mrSecret is a secret as marblerun's manifest.Secret marshals it: the
// certificate as base64 DER (null when unset), the keys as base64.
type mrSecret struct {
	Type        string
	Size        uint
	Shared      bool
	UserDefined bool
	Cert        []byte
	ValidFor    uint
	Private     []byte
	Public      []byte
}

func toMRSecret(s v2.Secret) mrSecret {
	return mrSecret{Type: s.Type, Size: s.Size, Shared: s.Shared, UserDefined: s.UserDefined, Cert: s.Cert, ValidFor: s.ValidFor, Private: s.Private, Public: s.Public}
}

// mrSecretsJSON is the file of 'secret get -o': name → secret, compact.
func mrSecretsJSON(secrets map[string]v2.Secret) ([]byte, error) {
	out := make(map[string]mrSecret, len(secrets))
	for n, s := range secrets {
		out[n] = toMRSecret(s)
	}
	return json.Marshal(out)
}

// mrSecretText is one secret as marblerun's 'secret get' prints it: a
// tab-indented line per field, values in Go's default format (byte slices as
// [1 2 3], the certificate as its parsed x509.Certificate), then a blank
// line.
func mrSecretText(name string, s v2.Secret) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:\n", name)
	line := func(label string, value any) { fmt.Fprintf(&b, "\t%-14s %v\n", label, value) }
	line("Type:", s.Type)
	switch s.Type {
	case "cert-rsa", "cert-ecdsa", "cert-ed25519":
		line("UserDefined:", s.UserDefined)
		if s.Type != "cert-ed25519" {
			line("Size:", s.Size)
		}
		line("Valid For:", s.ValidFor)
		var cert x509.Certificate
		if len(s.Cert) > 0 {
			if c, err := x509.ParseCertificate(s.Cert); err == nil {
				cert = *c
			}
		}
		line("Certificate:", cert)
		line("Public Key:", s.Public)
		line("Private Key:", s.Private)
	case "symmetric-key":
		line("UserDefined:", s.UserDefined)
		line("Size:", s.Size)
		line("Key:", s.Public)
	default:
		line("Data:", s.Public)
	}
	b.WriteString("\n")
	return b.String()
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
		Use:   "set [NAME] (--from-file FILE | --from-pem FILE | --from-json FILE)  or  set FILE ADDRESS [--from-pem NAME]",
		Short: "Upload user-defined secrets",
		Long: `Upload user-defined secrets as a manifest user (--cert, --key). One of:
  set NAME --from-file FILE   the file's bytes are the key (symmetric-key) or data (plain)
  set NAME --from-pem FILE    a certificate secret: a PEM file with the CERTIFICATE and
                              optionally its PRIVATE KEY (PKCS #8, or EC / RSA PRIVATE KEY)
                              and PUBLIC KEY
  set --from-json FILE        several secrets: a JSON object mapping names to
                              {"key": base64} or {"cert": base64 DER, "private": base64
                              PKCS #8, "public": base64 PKIX}

marblerun's command line, with the Coordinator's address last:
  set FILE ADDRESS                  FILE is the JSON object of --from-json
  set FILE ADDRESS --from-pem NAME  FILE is the PEM file, NAME the secret`,
		Args: cobra.MaximumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				// marblerun's form: the file, the address; --from-pem names
				// the secret.
				if fromFile != "" || fromJSON != "" {
					return usagef("with the address as the last argument (marblerun's form) FILE is a JSON file of secrets, or with --from-pem NAME a PEM file; --from-file and --from-json do not apply")
				}
				if err := a.setAddress(cmd, args[1]); err != nil {
					return err
				}
				if fromPEM != "" {
					args, fromPEM = []string{fromPEM}, args[0]
				} else {
					args, fromJSON = nil, args[0]
				}
			}
			n := 0
			for _, f := range []string{fromFile, fromPEM, fromJSON} {
				if f != "" {
					n++
				}
			}
			if n != 1 {
				return usagef("give exactly one of --from-file, --from-pem and --from-json (or marblerun's form: set FILE ADDRESS)")
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
			switch {
			case a.jsonOutput():
				return a.printJSON(map[string]any{"secrets": names})
			case a.mr:
				a.printf("Secret successfully set\n")
			default:
				a.printf("Uploaded %s: %s.\n", plural(len(names), "secret", "secrets"), strings.Join(names, ", "))
			}
			return nil
		},
	}
	c.Flags().StringVar(&fromFile, "from-file", "", "file with the raw key or data (- for standard input)")
	c.Flags().StringVar(&fromPEM, "from-pem", "", "PEM file with a certificate and optionally its keys (in marblerun's form: the secret's NAME)")
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
