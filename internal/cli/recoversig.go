package cli

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/quarry-cc/quarry/client"
)

// recoverWithSignatureCommand is marblerun's recover-with-signature: the
// recovery secret and its signature are made elsewhere (an HSM, an offline
// machine: sign-secret and encrypt-secret below, or openssl) and only
// uploaded here.
func (a *app) recoverWithSignatureCommand() *cobra.Command {
	var sigFile string
	var exposeSecret bool
	c := &cobra.Command{
		Use:   "recover-with-signature SECRET_FILE [ADDRESS] -s SIGNATURE_FILE",
		Short: "Recover a Coordinator with a recovery secret and its signature made elsewhere",
		Long: `Upload one recovery secret with its signature to a Coordinator in recovery mode.

SECRET_FILE holds the plain recovery secret (16, 32 or 33 bytes), or that
secret encrypted with RSA-OAEP (SHA-256) to the Coordinator's ephemeral key
('recover-with-signature public-key', then 'encrypt-secret'), raw or base64.
SIGNATURE_FILE holds the RSA PKCS #1 v1.5 SHA-256 signature of the plain
secret by the recovery key ('sign-secret', an HSM, or
openssl pkeyutl -sign -pkeyopt digest:sha256), raw or base64.

--insecure is refused unless --expose-recovery-secret confirms it, as for
'quarry recover' (marblerun's -i sends the secret without asking).`,
		Args: addressArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := a.takeAddress(cmd, args, 1)
			if err != nil {
				return err
			}
			if err := a.checkInsecureRecover(exposeSecret); err != nil {
				return err
			}
			if sigFile == "" {
				return usagef("-s/--signature is required: the file with the signature of the recovery secret")
			}
			secret, err := a.readBinary(args[0])
			if err != nil {
				return err
			}
			sig, err := a.readBinary(sigFile)
			if err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), attesting)
			if err != nil {
				return err
			}
			res, err := s.c.Recover(cmd.Context(), secret, sig)
			if err != nil {
				return fmt.Errorf("recovering: %w", err)
			}
			return a.printRecovered(res)
		},
	}
	c.Flags().StringVarP(&sigFile, "signature", "s", "", "file with the signature of the recovery secret")
	c.Flags().BoolVar(&exposeSecret, "expose-recovery-secret", false, "confirm --insecure: send the recovery secret to a Coordinator that is not verified (simulation mode on a trusted network only)")
	c.AddCommand(a.recoverPublicKeyCommand(), a.encryptSecretCommand(), a.signSecretCommand())
	return c
}

// readBinary reads a file of binary data that may also be given in base64.
func (a *app) readBinary(path string) ([]byte, error) {
	raw, err := a.readInput(path)
	if err != nil {
		return nil, err
	}
	if len(raw) == 0 {
		return nil, usagef("%s is empty", path)
	}
	if t := bytes.TrimSpace(raw); len(t) > 0 {
		if dec, err := base64.StdEncoding.DecodeString(string(t)); err == nil && len(dec) > 0 {
			return dec, nil
		}
	}
	return raw, nil
}

// plainRecoverySecret reads a recovery secret as 'recover' takes it and
// returns it decrypted (with the recovery key of keyFile when it is
// encrypted), and that key (nil without keyFile).
func (a *app) plainRecoverySecret(file, keyFile string) ([]byte, *rsa.PrivateKey, error) {
	var key *rsa.PrivateKey
	if keyFile != "" {
		keyPEM, err := readFile(keyFile)
		if err != nil {
			return nil, nil, err
		}
		if key, err = client.ParseRSAPrivateKeyPEM(keyPEM); err != nil {
			return nil, nil, usagef("-k/--key %s: %w", keyFile, err)
		}
	}
	raw, err := a.readInput(file)
	if err != nil {
		return nil, nil, err
	}
	if key == nil {
		plain, err := a.readBinary(file)
		if err != nil {
			return nil, nil, err
		}
		if !client.IsPlainRecoverySecret(plain) {
			return nil, nil, usagef("the recovery secret in %s is encrypted (%d bytes): pass -k/--key with the recovery private key to decrypt it", file, len(plain))
		}
		return plain, nil, nil
	}
	secret, err := recoverySecret(raw, "", key)
	if err != nil {
		return nil, nil, usagef("%s: %w", file, err)
	}
	return secret, key, nil
}

func (a *app) encryptSecretCommand() *cobra.Command {
	var out, pubFile, keyFile string
	c := &cobra.Command{
		Use:   "encrypt-secret SECRET_FILE --coordinator-pub-key PEM -o FILE [-k KEY]",
		Short: "Encrypt a recovery secret to the Coordinator's ephemeral key (nothing is sent)",
		Long: `Encrypt a recovery secret with RSA-OAEP (SHA-256) to the Coordinator's ephemeral
public key (from 'recover-with-signature public-key') and write it to the new
file -o. SECRET_FILE is the plain secret, or the secret as the manifest
set's answer encrypted it, which -k/--key (the recovery private key) then
decrypts first.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" || pubFile == "" {
				return usagef("-o/--output and --coordinator-pub-key are required")
			}
			pubPEM, err := readFile(pubFile)
			if err != nil {
				return err
			}
			pub, err := parseRSAPublicKeyPEM(pubPEM)
			if err != nil {
				return usagef("--coordinator-pub-key %s: %w", pubFile, err)
			}
			secret, _, err := a.plainRecoverySecret(args[0], keyFile)
			if err != nil {
				return err
			}
			ct, err := client.EncryptRecoverySecret(pub, secret)
			if err != nil {
				return err
			}
			return writeNew(out, ct)
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "the new file to write the encrypted secret to")
	c.Flags().StringVar(&pubFile, "coordinator-pub-key", "", "PEM file with the Coordinator's ephemeral public key")
	c.Flags().StringVarP(&keyFile, "key", "k", "", "PEM file with the recovery private key, if SECRET_FILE is encrypted")
	return c
}

func (a *app) signSecretCommand() *cobra.Command {
	var out, keyFile string
	c := &cobra.Command{
		Use:   "sign-secret SECRET_FILE -o FILE -k KEY",
		Short: "Sign a recovery secret with the recovery key (nothing is sent)",
		Long: `Sign the plain recovery secret with the recovery private key (RSA PKCS #1 v1.5,
SHA-256) and write the signature to the new file -o. SECRET_FILE is the plain
secret, or the encrypted one, which the same key then decrypts first.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" || keyFile == "" {
				return usagef("-o/--output and -k/--key are required")
			}
			secret, key, err := a.plainRecoverySecret(args[0], keyFile)
			if err != nil {
				return err
			}
			sig, err := client.SignRecoverySecret(key, secret)
			if err != nil {
				return err
			}
			return writeNew(out, sig)
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "the new file to write the signature to")
	c.Flags().StringVarP(&keyFile, "key", "k", "", "PEM file with the recovery private key")
	return c
}

// parseRSAPublicKeyPEM parses a PEM PUBLIC KEY (PKIX) that must be RSA.
func parseRSAPublicKeyPEM(pemText []byte) (*rsa.PublicKey, error) {
	b, _ := pem.Decode(pemText)
	if b == nil || b.Type != "PUBLIC KEY" {
		return nil, errors.New("no PEM PUBLIC KEY block")
	}
	k, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	rk, ok := k.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("the public key is a %T, not RSA", k)
	}
	return rk, nil
}
