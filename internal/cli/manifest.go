package cli

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quarry-cc/quarry/client"
)

func (a *app) manifestCommand() *cobra.Command {
	g := groupCommand("manifest", "Set, read, verify and update the manifest",
		a.manifestSetCommand(),
		a.manifestGetCommand(),
		a.manifestVerifyCommand(),
		a.manifestSignatureCommand(),
		a.manifestLogCommand(),
		groupCommand("update", "Update the manifest (package or complete update, with acknowledgements)",
			a.updateApplyCommand(),
			a.updateAcknowledgeCommand(),
			a.updateCancelCommand(),
			a.updateGetCommand(),
		),
	)
	return g
}

// recoverySecretsFile is the JSON written by --recovery-secrets-file: the
// data of the manifest set response (MarbleRun's recovery data format).
type recoverySecretsFile struct {
	RecoverySecrets map[string][]byte `json:"RecoverySecrets"`
}

// saveRecoverySecrets writes recovery secrets to file (0600), or, without a
// file and in text mode, prints them to standard output (as the JSON the file
// would hold) with a note on standard error.
func (a *app) saveRecoverySecrets(file string, secrets map[string][]byte) error {
	if len(secrets) == 0 {
		return nil
	}
	names := sortedKeys(secrets)
	buf, err := recoverySecretsJSON(secrets)
	if err != nil {
		return err
	}
	if file == "" {
		if !a.jsonOutput() {
			a.notef("The encrypted recovery secrets (for %s) follow: store them (next time use --recovery-secrets-file; 'quarry recover secrets' fetches them again).\n", strings.Join(names, ", "))
			_, err := a.out.Write(buf)
			return err
		}
		return nil // part of the JSON output
	}
	if err := writeFile(file, buf, 0o600); err != nil {
		return err
	}
	if !a.jsonOutput() {
		a.printf("Recovery secrets for %s written to %s.\n", strings.Join(names, ", "), file)
	}
	return nil
}

// recoverySecretsJSON is the content of a recovery secrets file.
func recoverySecretsJSON(secrets map[string][]byte) ([]byte, error) {
	buf, err := json.MarshalIndent(recoverySecretsFile{RecoverySecrets: secrets}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(buf, '\n'), nil
}

// status prints a text-mode status line: to standard output, or to standard
// error when standard output is to hold only recovery secrets (no file).
func (a *app) status(secretsFile string, secrets map[string][]byte, format string, args ...any) {
	if secretsFile == "" && len(secrets) > 0 {
		a.notef(format, args...)
		return
	}
	a.printf(format, args...)
}

func (a *app) manifestSetCommand() *cobra.Command {
	var secretsFile string
	c := &cobra.Command{
		Use:   "set FILE",
		Short: "Set the manifest (JSON or YAML; - for standard input)",
		Long: `Set the manifest. A YAML file is converted once to compact JSON; the JSON
bytes are uploaded and fingerprinted. If the manifest has RecoveryKeys, the
Coordinator returns one encrypted recovery secret per key, once: they are
written to --recovery-secrets-file (JSON, mode 0600) or else printed.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := a.loadManifest(args[0])
			if err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), needNothing)
			if err != nil {
				return err
			}
			secrets, err := s.c.SetManifest(cmd.Context(), raw)
			if err != nil {
				return fmt.Errorf("setting the manifest: %w", err)
			}
			fp := client.ManifestFingerprint(raw)
			if a.jsonOutput() {
				out := map[string]any{"manifestFingerprint": fp}
				if secretsFile != "" {
					out["recoverySecretsFile"] = secretsFile
				} else if len(secrets) > 0 {
					out["recoverySecrets"] = secrets
				}
				if err := a.saveRecoverySecrets(secretsFile, secrets); err != nil {
					return err
				}
				return a.printJSON(out)
			}
			a.status(secretsFile, secrets, "Manifest set (SHA-256 %s).\n", fp)
			return a.saveRecoverySecrets(secretsFile, secrets)
		},
	}
	c.Flags().StringVar(&secretsFile, "recovery-secrets-file", "", "write the encrypted recovery secrets to this JSON file")
	return c
}

func (a *app) manifestGetCommand() *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "get",
		Short: "Print the manifest that is set, exactly as it was uploaded",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.connect(cmd.Context(), needNothing)
			if err != nil {
				return err
			}
			m, err := s.c.GetManifest(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the manifest: %w", err)
			}
			if err := client.VerifyManifest(s.root, m); err != nil {
				return fmt.Errorf("the Coordinator's manifest: %w", err)
			}
			if a.jsonOutput() && file == "" {
				return a.printJSON(m)
			}
			return a.writeOutput(file, m.Manifest, 0o644)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "write the manifest to this file instead of standard output")
	return c
}

// verifyResult is the JSON output of manifest verify.
type verifyResult struct {
	File                string `json:"file"`
	FileFingerprint     string `json:"fileFingerprint"`
	ManifestFingerprint string `json:"manifestFingerprint"`
	Match               bool   `json:"match"`
	SignatureValid      bool   `json:"signatureValid"`
}

func (a *app) manifestVerifyCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "verify FILE",
		Short: "Check that the Coordinator's manifest is FILE and is signed by the trusted root",
		Long: `Compare the SHA-256 of FILE (JSON verbatim, YAML converted as by 'manifest set')
with the fingerprint of the manifest the Coordinator has set, and check the
Coordinator's signature of the manifest with the trusted root certificate.
Exit code 3 if they differ or the signature does not verify.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := a.loadManifest(args[0])
			if err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), needNothing)
			if err != nil {
				return err
			}
			m, err := s.c.GetManifest(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the manifest: %w", err)
			}
			res := verifyResult{File: args[0], FileFingerprint: client.ManifestFingerprint(raw), ManifestFingerprint: m.ManifestFingerprint}
			if err := client.VerifyManifest(s.root, m); err != nil {
				return fmt.Errorf("the Coordinator's manifest: %w", err)
			}
			res.SignatureValid = true
			res.Match = strings.EqualFold(res.FileFingerprint, m.ManifestFingerprint)
			if !res.Match {
				return fmt.Errorf("%w: the Coordinator's manifest (SHA-256 %s) is not %s (SHA-256 %s)", client.ErrVerification, m.ManifestFingerprint, args[0], res.FileFingerprint)
			}
			if a.jsonOutput() {
				return a.printJSON(res)
			}
			a.printf("OK: the Coordinator's manifest is %s (SHA-256 %s), signed by the trusted root.\n", args[0], res.FileFingerprint)
			return nil
		},
	}
}

func (a *app) manifestSignatureCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "signature",
		Short: "Print the root's ECDSA signature of the manifest (base64)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.connect(cmd.Context(), needNothing)
			if err != nil {
				return err
			}
			m, err := s.c.GetManifest(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the manifest: %w", err)
			}
			if err := client.VerifyManifest(s.root, m); err != nil {
				return fmt.Errorf("the Coordinator's manifest: %w", err)
			}
			if a.jsonOutput() {
				return a.printJSON(map[string]any{
					"manifestSignatureRootECDSA": m.ManifestSignatureRootECDSA,
					"manifestFingerprint":        m.ManifestFingerprint,
				})
			}
			a.printf("%s\n", base64.StdEncoding.EncodeToString(m.ManifestSignatureRootECDSA))
			return nil
		},
	}
}

func (a *app) manifestLogCommand() *cobra.Command {
	var vf logVerifyFlags
	c := &cobra.Command{
		Use:   "log",
		Short: "Print the update log, one JSON entry per line (--verify: check it against the root)",
		Long: `Print the update log, one JSON entry per line.

With --verify, fetch the verifiable log (GET /api/v2/update-log) and check the
whole hash chain and the signed checkpoint against the pinned root certificate
(--root, or the attested one), then print a summary: entries, first and last
time, manifest fingerprints seen. --since-checkpoint FILE proves that the log
extends a checkpoint saved earlier (--save-checkpoint FILE saves the verified
one). A failed check exits non-zero and names what was found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !vf.verify && (vf.sinceFile != "" || vf.saveCheckpoint != "") {
				return usagef("--since-checkpoint and --save-checkpoint need --verify")
			}
			s, err := a.connect(cmd.Context(), needNothing)
			if err != nil {
				return err
			}
			if vf.verify {
				return a.verifyLog(vf, func(since *client.LogCheckpoint) (*client.VerifiedLog, error) {
					return s.c.VerifyUpdateLog(cmd.Context(), since)
				})
			}
			entries, err := s.c.UpdateLog(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the update log: %w", err)
			}
			if a.jsonOutput() {
				// Entries that are JSON are embedded as objects.
				out := make([]json.RawMessage, 0, len(entries))
				for _, e := range entries {
					if json.Valid([]byte(e)) {
						out = append(out, json.RawMessage(e))
					} else {
						q, _ := json.Marshal(e)
						out = append(out, q)
					}
				}
				return a.printJSON(map[string]any{"updateLog": out})
			}
			for _, e := range entries {
				a.printf("%s\n", e)
			}
			return nil
		},
	}
	c.Flags().BoolVar(&vf.verify, "verify", false, "verify the hash chain and the signed checkpoint against the pinned root and print a summary")
	c.Flags().StringVar(&vf.sinceFile, "since-checkpoint", "", "with --verify: prove that the log extends the checkpoint saved in `FILE`")
	c.Flags().StringVar(&vf.saveCheckpoint, "save-checkpoint", "", "with --verify: save the verified checkpoint to `FILE` (for a later --since-checkpoint)")
	return c
}

// plural returns "n one" for n = 1, else "n many": the plural is given,
// not made by appending "s" ("1 entry", "2 entries").
func plural[N int | uint64](n N, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func (a *app) updateApplyCommand() *cobra.Command {
	var secretsFile string
	c := &cobra.Command{
		Use:   "apply FILE",
		Short: "Send a manifest update: packages only, or a complete manifest",
		Long: `Send a manifest update as a manifest user (--cert, --key). A manifest that sets
only Packages (with new SecurityVersions) is a package update, applied at once.
Any other manifest is a complete update: it is applied when enough users with
the UpdateManifest permission have acknowledged it ('manifest update
acknowledge'). If the applied update changes the recovery keys, or changes
SealMode from ProductKey (the default) to UniqueKey, it makes a new data key
and the new encrypted recovery secrets are written to --recovery-secrets-file.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := a.loadManifest(args[0])
			if err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), needClientCert)
			if err != nil {
				return err
			}
			res, err := s.c.Update(cmd.Context(), raw)
			if err != nil {
				return fmt.Errorf("updating the manifest: %w", err)
			}
			if a.jsonOutput() {
				if err := a.saveRecoverySecrets(secretsFile, res.RecoverySecrets); err != nil {
					return err
				}
				return a.printJSON(res)
			}
			if res.MissingAcknowledgments == 0 {
				a.status(secretsFile, res.RecoverySecrets, "Update applied.\n")
			} else {
				a.status(secretsFile, res.RecoverySecrets, "Update pending: %s missing (users who may acknowledge: %s).\n",
					plural(res.MissingAcknowledgments, "acknowledgement", "acknowledgements"), strings.Join(res.MissingUsers, ", "))
			}
			return a.saveRecoverySecrets(secretsFile, res.RecoverySecrets)
		},
	}
	c.Flags().StringVar(&secretsFile, "recovery-secrets-file", "", "write new encrypted recovery secrets to this JSON file")
	return c
}

func (a *app) updateAcknowledgeCommand() *cobra.Command {
	var secretsFile string
	c := &cobra.Command{
		Use:     "acknowledge FILE",
		Aliases: []string{"ack"},
		Short:   "Acknowledge the pending update by uploading the same manifest",
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := a.loadManifest(args[0])
			if err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), needClientCert)
			if err != nil {
				return err
			}
			res, err := s.c.AcknowledgeUpdate(cmd.Context(), raw)
			if err != nil {
				return fmt.Errorf("acknowledging the update: %w", err)
			}
			if a.jsonOutput() {
				if err := a.saveRecoverySecrets(secretsFile, res.RecoverySecrets); err != nil {
					return err
				}
				return a.printJSON(res)
			}
			a.status(secretsFile, res.RecoverySecrets, "%s\n", res.Message)
			return a.saveRecoverySecrets(secretsFile, res.RecoverySecrets)
		},
	}
	c.Flags().StringVar(&secretsFile, "recovery-secrets-file", "", "write new encrypted recovery secrets to this JSON file")
	return c
}

func (a *app) updateCancelCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "cancel",
		Short: "Cancel the pending update",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.connect(cmd.Context(), needClientCert)
			if err != nil {
				return err
			}
			msg, err := s.c.CancelUpdate(cmd.Context())
			if err != nil {
				return fmt.Errorf("cancelling the update: %w", err)
			}
			if a.jsonOutput() {
				return a.printJSON(map[string]string{"message": msg})
			}
			a.printf("%s\n", msg)
			return nil
		},
	}
}

func (a *app) updateGetCommand() *cobra.Command {
	var file string
	c := &cobra.Command{
		Use:   "get",
		Short: "Print the pending update's manifest; the missing users go to standard error",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := a.connect(cmd.Context(), needNothing)
			if err != nil {
				return err
			}
			p, err := s.c.PendingUpdate(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the pending update: %w", err)
			}
			if a.jsonOutput() && file == "" {
				return a.printJSON(p)
			}
			msg := p.Message
			if len(p.MissingUsers) > 0 {
				msg += " (missing: " + strings.Join(p.MissingUsers, ", ") + ")"
			}
			if msg != "" {
				a.notef("%s\n", strings.TrimSpace(msg))
			}
			return a.writeOutput(file, p.Manifest, 0o644)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "write the pending manifest to this file instead of standard output")
	return c
}

// exactArgs is cobra.ExactArgs with a usage error.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %s, got %d", cmd.CommandPath(), plural(n, "argument", "arguments"), len(args))
		}
		return nil
	}
}
