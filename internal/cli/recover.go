package cli

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/client"
)

func (a *app) recoverCommand() *cobra.Command {
	var keyFile, name string
	var ephemeral, exposeSecret bool
	c := &cobra.Command{
		Use:   "recover SECRETS_FILE [ADDRESS] -k KEY",
		Short: "Recover a Coordinator in recovery mode with a recovery secret",
		Long: `Upload one recovery secret to a Coordinator in recovery mode (state 1).

SECRETS_FILE is the JSON file written by 'manifest set --recovery-secrets-file'
or -r (the secret that KEY decrypts is used, or the one named by --name), or
one secret, encrypted or already decrypted, raw or base64 (what marblerun's
'recover' takes). quarry decrypts it with the recovery private
key (RSA-OAEP, SHA-256; PEM, PKCS #8 or PKCS #1), signs the plain secret with
the same key (PKCS #1 v1.5, SHA-256) and uploads both. With --ephemeral the
secret is encrypted to the Coordinator's ephemeral public key for the upload.
With several recovery keys, every key owner runs this; the output says how
many secrets are still missing.

In recovery mode the Coordinator serves a temporary root certificate, so
--root does not match: verify the Coordinator with --era-config instead (its
quote covers the temporary root). After the recovery the original root is
back.

--insecure is refused here unless --expose-recovery-secret confirms it.
Without verification, whoever answers at the address gets the recovery
secret: a man in the middle reads it in the connection or, with --ephemeral,
serves its own ephemeral key and decrypts it, and with a single recovery key
that secret is the data key of the whole state. Confirm only for a
Coordinator in simulation mode on a network you trust. (marblerun's 'recover
-i' sends the secret without asking: a script that calls it must add
--expose-recovery-secret.)

With the address as the last argument (marblerun's command line) the answer
is marblerun's: "Recovery successful." or "Secret was processed successfully.
Upload the next secret. Remaining secrets: N".`,
		Args: addressArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := a.takeAddress(cmd, args, 1)
			if err != nil {
				return err
			}
			if err := a.checkInsecureRecover(exposeSecret); err != nil {
				return err
			}
			if keyFile == "" {
				return usagef("-k/--key (or --recovery-key) is required: the recovery private key that decrypts and signs the secret")
			}
			keyPEM, err := readFile(keyFile)
			if err != nil {
				return err
			}
			key, err := client.ParseRSAPrivateKeyPEM(keyPEM)
			if err != nil {
				return usagef("--recovery-key %s: %w", keyFile, err)
			}
			raw, err := a.readInput(args[0])
			if err != nil {
				return err
			}
			secret, err := recoverySecret(raw, name, key)
			if err != nil {
				return usagef("%s: %w", args[0], err)
			}
			sig, err := client.SignRecoverySecret(key, secret)
			if err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), attesting)
			if err != nil {
				return err
			}
			upload := secret
			if ephemeral {
				pub, err := s.c.RecoveryPublicKey(cmd.Context())
				if err != nil {
					return fmt.Errorf("getting the ephemeral key: %w", err)
				}
				if upload, err = client.EncryptRecoverySecret(pub, secret); err != nil {
					return err
				}
			}
			res, err := s.c.Recover(cmd.Context(), upload, sig)
			if err != nil {
				return fmt.Errorf("recovering: %w", err)
			}
			return a.printRecovered(res)
		},
	}
	c.Flags().StringVarP(&keyFile, "key", "k", "", "PEM file with the recovery private key (RSA, PKCS #8 or PKCS #1)")
	c.Flags().StringVar(&keyFile, "recovery-key", "", "the same as --key")
	c.Flags().StringVar(&name, "name", "", "the RecoveryKeys name of the secret in SECRETS_FILE")
	c.Flags().BoolVar(&ephemeral, "ephemeral", false, "encrypt the secret to the Coordinator's ephemeral key for the upload")
	c.Flags().BoolVar(&exposeSecret, "expose-recovery-secret", false, "confirm --insecure: send the recovery secret to a Coordinator that is not verified (simulation mode on a trusted network only)")
	c.AddCommand(a.recoverPublicKeyCommand(), a.recoverSecretsCommand())
	return c
}

// errInsecureRecover refuses 'recover --insecure' without
// --expose-recovery-secret.
var errInsecureRecover = errors.New("recover --insecure would send the recovery secret to a Coordinator that is not verified: " +
	"a man in the middle can read it, or serve its own ephemeral key (--ephemeral) and decrypt it, and with a single recovery key " +
	"that secret is the data key of the whole state. Verify the Coordinator with --era-config instead (in recovery mode its quote " +
	"covers the temporary root); only for a Coordinator in simulation mode on a network you trust, add --expose-recovery-secret " +
	"(unlike marblerun, whose -i sends it without asking)")

// checkInsecureRecover refuses to send a recovery secret with --insecure
// unless --expose-recovery-secret confirms it.
func (a *app) checkInsecureRecover(expose bool) error {
	switch {
	case a.insecure && !expose:
		return usagef("%w", errInsecureRecover)
	case expose && !a.insecure:
		return usagef("--expose-recovery-secret only confirms --insecure; leave it out when the Coordinator is verified")
	}
	return nil
}

// printRecovered prints the answer to a recovery upload: marblerun's
// message with its command line, else the Coordinator's.
func (a *app) printRecovered(res *v2.RecoverResponse) error {
	switch {
	case a.jsonOutput():
		return a.printJSON(res)
	case a.mr && res.Remaining == 0:
		a.printf("Recovery successful.\n")
	case a.mr:
		a.printf("Secret was processed successfully. Upload the next secret. Remaining secrets: %d\n", res.Remaining)
	default:
		a.printf("%s\n", res.Message)
	}
	return nil
}

func (a *app) recoverSecretsCommand() *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "secrets [ADDRESS]",
		Short: "Fetch the encrypted recovery secrets again (a manifest user with UpdateManifest)",
		Long: `Fetch the encrypted recovery secrets that the Coordinator last handed out:
those of the manifest set, or of the update that last changed RecoveryKeys.
Use it when that answer was lost. The Coordinator must be running (state 3)
and the caller a manifest user with UpdateManifest (--cert, --key). Each
secret is encrypted to its recovery key, so only the key owners can use it.

The secrets are written to --file (JSON, mode 0600, the format of
'manifest set --recovery-secrets-file', which 'quarry recover' reads) or
else printed.`,
		Args: addressArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.takeAddress(cmd, args, 0); err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), needClientCert)
			if err != nil {
				return err
			}
			secrets, err := s.c.RecoverySecrets(cmd.Context())
			if err != nil {
				return fmt.Errorf("fetching the recovery secrets: %w", err)
			}
			if a.jsonOutput() && file == "" {
				return a.printJSON(map[string]any{"recoverySecrets": secrets})
			}
			buf, err := recoverySecretsJSON(secrets)
			if err != nil {
				return err
			}
			if file == "" || file == "-" {
				_, err := a.out.Write(buf)
				return err
			}
			if err := writeFile(file, buf, 0o600); err != nil {
				return err
			}
			if a.jsonOutput() {
				return a.printJSON(map[string]any{"recoverySecretsFile": file, "keys": sortedKeys(secrets)})
			}
			a.printf("Recovery secrets for %s written to %s.\n", strings.Join(sortedKeys(secrets), ", "), file)
			return nil
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "write the secrets to this JSON file (mode 0600) instead of standard output")
	return c
}

// recoverySecret returns the plain recovery secret from the content of a
// secrets file: a recovery-secrets JSON file, or one secret (raw or base64),
// encrypted or already plain.
func recoverySecret(raw []byte, name string, key *rsa.PrivateKey) ([]byte, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) > 0 && trimmed[0] == '{' && json.Valid(trimmed) {
		return secretFromJSON(trimmed, name, key)
	}
	if name != "" {
		return nil, errors.New("--name applies only to a JSON recovery-secrets file")
	}
	data := raw
	if dec, err := base64.StdEncoding.DecodeString(string(trimmed)); err == nil && len(dec) > 0 {
		data = dec
	}
	if len(data) == 0 {
		return nil, errors.New("the file is empty")
	}
	if client.IsPlainRecoverySecret(data) {
		return data, nil // already decrypted
	}
	return client.DecryptRecoverySecret(key, data)
}

// secretFromJSON picks the secret for key from {"RecoverySecrets":{...}},
// {"recoverySecrets":{...}} or a bare name → base64 object.
func secretFromJSON(raw []byte, name string, key *rsa.PrivateKey) ([]byte, error) {
	var wrapped struct {
		RecoverySecrets map[string][]byte `json:"RecoverySecrets"` // matches recoverySecrets too
	}
	secrets := map[string][]byte{}
	if err := json.Unmarshal(raw, &wrapped); err == nil && len(wrapped.RecoverySecrets) > 0 {
		secrets = wrapped.RecoverySecrets
	} else if err := json.Unmarshal(raw, &secrets); err != nil {
		return nil, fmt.Errorf("not a recovery-secrets file: %w", err)
	}
	if len(secrets) == 0 {
		return nil, errors.New("no recovery secrets in the file")
	}
	if name != "" {
		ct, ok := secrets[name]
		if !ok {
			return nil, fmt.Errorf("no recovery secret named %q (the file has %s)", name, strings.Join(sortedKeys(secrets), ", "))
		}
		return client.DecryptRecoverySecret(key, ct)
	}
	names := sortedKeys(secrets)
	sort.Strings(names)
	for _, n := range names {
		if plain, err := client.DecryptRecoverySecret(key, secrets[n]); err == nil {
			return plain, nil
		}
	}
	return nil, fmt.Errorf("the recovery key decrypts none of the secrets (%s)", strings.Join(names, ", "))
}

func (a *app) recoverPublicKeyCommand() *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "public-key [ADDRESS]",
		Short: "Print the Coordinator's ephemeral public key for encrypting recovery secrets (PEM)",
		Args:  addressArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.takeAddress(cmd, args, 0); err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), attesting)
			if err != nil {
				return err
			}
			pub, err := s.c.RecoveryPublicKey(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the ephemeral key: %w", err)
			}
			der, err := x509.MarshalPKIXPublicKey(pub)
			if err != nil {
				return err
			}
			pemText := pemBlock("PUBLIC KEY", der)
			switch {
			case a.jsonOutput() && file == "":
				return a.printJSON(map[string]any{"algorithm": "RSA", "ephemeralPublicKey": der})
			case a.mr && file != "":
				return writeNew(file, pemText) // marblerun does not overwrite it
			case a.mr:
				a.printf("%s\n", pemText)
				return nil
			}
			return a.writeOutput(file, pemText, 0o644)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "write the PEM to this file instead of standard output")
	c.Flags().StringVarP(&file, "output", "o", "", "the same as --file (marblerun's flag; with the address as the last argument an existing file is not overwritten)")
	return c
}
