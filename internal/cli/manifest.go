package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
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

// recoveryFlags are where a command writes new recovery secrets: quarry's
// --recovery-secrets-file (indented JSON) or marblerun's -r/--recoverydata
// (compact JSON, as marblerun writes it).
type recoveryFlags struct{ file, mrFile string }

func (r *recoveryFlags) register(c *cobra.Command, what string) {
	c.Flags().StringVar(&r.file, "recovery-secrets-file", "", "write "+what+" to this JSON file (mode 0600)")
	c.Flags().StringVarP(&r.mrFile, "recoverydata", "r", "", "the same as --recovery-secrets-file, written as marblerun writes it (compact JSON)")
}

func (r recoveryFlags) check() error {
	if r.file != "" && r.mrFile != "" {
		return usagef("--recovery-secrets-file and --recoverydata name the same file: give one")
	}
	return nil
}

// name is the file to write, "" for none.
func (r recoveryFlags) name() string { return r.file + r.mrFile }

// saveRecoverySecrets writes recovery secrets to the file of f (0600), or,
// without a file and in text mode, prints them to standard output (as the
// JSON the file would hold; in quarry's form with a note on standard
// error). With marblerun's command line the messages are marblerun's.
func (a *app) saveRecoverySecrets(f recoveryFlags, secrets map[string][]byte) error {
	if len(secrets) == 0 {
		return nil
	}
	names := sortedKeys(secrets)
	buf, err := recoverySecretsJSON(secrets)
	if err != nil {
		return err
	}
	if f.mrFile != "" || (a.mr && f.file == "") {
		if buf, err = json.Marshal(recoverySecretsFile{RecoverySecrets: secrets}); err != nil {
			return err
		}
	}
	file := f.name()
	if file == "" {
		if a.jsonOutput() {
			return nil // part of the JSON output
		}
		if a.mr {
			a.printf("%s\n", buf)
			return nil
		}
		a.notef("The encrypted recovery secrets (for %s) follow: store them (next time use --recovery-secrets-file; 'quarry recover secrets' fetches them again).\n", strings.Join(names, ", "))
		_, err := a.out.Write(buf)
		return err
	}
	if err := writeFile(file, buf, 0o600); err != nil {
		return err
	}
	switch {
	case a.jsonOutput():
	case a.mr:
		a.printf("Recovery data saved to: %s\n", file)
	default:
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
func (a *app) status(f recoveryFlags, secrets map[string][]byte, format string, args ...any) {
	if f.name() == "" && len(secrets) > 0 && !a.mr {
		a.notef(format, args...)
		return
	}
	a.printf(format, args...)
}

func (a *app) manifestSetCommand() *cobra.Command {
	var rf recoveryFlags
	c := &cobra.Command{
		Use:   "set FILE [ADDRESS]",
		Short: "Set the manifest (JSON or YAML; - for standard input)",
		Long: `Set the manifest. A YAML file is converted once to compact JSON; the JSON
bytes are uploaded and fingerprinted. If the manifest has RecoveryKeys, the
Coordinator returns one encrypted recovery secret per key, once: they are
written to --recovery-secrets-file (JSON, mode 0600) or else printed.

With the address as the last argument (marblerun's command line) quarry
prints marblerun's messages, writes -r/--recoverydata as marblerun does, and
caches the Coordinator's chain in --coordinator-cert.`,
		Args: addressArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := a.takeAddress(cmd, args, 1)
			if err != nil {
				return err
			}
			if err := rf.check(); err != nil {
				return err
			}
			raw, err := a.loadManifest(args[0])
			if err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), attesting)
			if err != nil {
				return err
			}
			fp := client.ManifestFingerprint(raw)
			if a.mr && !a.jsonOutput() {
				a.printf("Successfully verified Coordinator, now uploading manifest\n")
				a.printf("Manifest signature: %s\n", fp)
			}
			done := a.progress("generating the manifest's secrets")
			secrets, err := s.c.SetManifest(cmd.Context(), raw)
			done()
			if err != nil {
				return fmt.Errorf("setting the manifest: %w", err)
			}
			if err := a.saveCertCache(cmd.Context(), s, false); err != nil {
				return err
			}
			if a.jsonOutput() {
				out := map[string]any{"manifestFingerprint": fp}
				if f := rf.name(); f != "" {
					out["recoverySecretsFile"] = f
				} else if len(secrets) > 0 {
					out["recoverySecrets"] = secrets
				}
				if err := a.saveRecoverySecrets(rf, secrets); err != nil {
					return err
				}
				return a.printJSON(out)
			}
			if a.mr {
				a.printf("Manifest successfully set\n")
			} else {
				a.status(rf, secrets, "Manifest set (SHA-256 %s).\n", fp)
			}
			return a.saveRecoverySecrets(rf, secrets)
		},
	}
	rf.register(c, "the encrypted recovery secrets")
	return c
}

func (a *app) manifestGetCommand() *cobra.Command {
	var file string
	var signature, displayUpdate, keepCert bool
	c := &cobra.Command{
		Use:   "get [ADDRESS]",
		Short: "Print the manifest that is set, exactly as it was uploaded",
		Long: `Print the manifest that is set, exactly as it was uploaded, after checking the
root's signature of it.

  -s, --signature        wrap it as {"ManifestSignature": SHA-256, "Manifest": ...} (marblerun's form)
  -u, --display-update   apply the SecurityVersions of later package updates (from the update
                         log), printed indented by 4 spaces (keys sorted)
  --keep-cert            cache the Coordinator's chain in --coordinator-cert`,
		Args: addressArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.takeAddress(cmd, args, 0); err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), attesting)
			if err != nil {
				return err
			}
			if a.mr && !a.jsonOutput() {
				a.printf("Successfully verified Coordinator, now requesting manifest\n")
			}
			m, err := s.c.GetManifest(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the manifest: %w", err)
			}
			if err := client.VerifyManifest(s.root, m); err != nil {
				return fmt.Errorf("the Coordinator's manifest: %w", err)
			}
			out := m.Manifest
			if displayUpdate {
				entries, err := s.c.UpdateLog(cmd.Context())
				if err != nil {
					return fmt.Errorf("getting the update log: %w", err)
				}
				if out, err = consolidateManifest(out, entries); err != nil {
					return fmt.Errorf("applying the package updates of the log: %w", err)
				}
			}
			if signature {
				out = fmt.Appendf(nil, "{\n\"ManifestSignature\": \"%s\",\n\"Manifest\": %s}", m.ManifestFingerprint, out)
			}
			if keepCert {
				if err := a.saveCertCache(cmd.Context(), s, true); err != nil {
					return err
				}
			}
			switch {
			case a.jsonOutput() && file == "":
				if signature || displayUpdate {
					return a.printJSON(map[string]any{"manifest": out, "manifestFingerprint": m.ManifestFingerprint})
				}
				return a.printJSON(m)
			case file != "" && a.mr:
				return writeFile(file, out, 0o600)
			case a.mr:
				out = append(out, '\n')
			}
			return a.writeOutput(file, out, 0o644)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "write the manifest to this file instead of standard output")
	c.Flags().StringVarP(&file, "output", "o", "", "the same as --file (marblerun's flag)")
	c.Flags().BoolVarP(&signature, "signature", "s", false, "wrap the manifest with its SHA-256, as marblerun's -s does")
	c.Flags().BoolVarP(&displayUpdate, "display-update", "u", false, "apply the SecurityVersions of later package updates")
	c.Flags().BoolVar(&keepCert, "keep-cert", false, "cache the Coordinator's chain in --coordinator-cert")
	return c
}

// consolidateManifest returns the manifest with the SecurityVersion of each
// package raised as the update log's package updates ("package", "new
// version") say, indented by 4 spaces.
func consolidateManifest(raw []byte, log []string) ([]byte, error) {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	pkgs, _ := m["Packages"].(map[string]any)
	for _, line := range log {
		var e struct {
			Package    *string      `json:"package"`
			NewVersion *json.Number `json:"new version"`
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Package == nil || e.NewVersion == nil {
			continue
		}
		p, ok := pkgs[*e.Package].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("package %s of the log is not in the manifest", *e.Package)
		}
		p["SecurityVersion"] = *e.NewVersion
	}
	return json.MarshalIndent(m, "", "    ")
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
		Use:   "verify FILE|SHA256 [ADDRESS]",
		Short: "Check that the Coordinator's manifest is FILE and is signed by the trusted root",
		Long: `Compare the SHA-256 of FILE (JSON verbatim, YAML converted as by 'manifest set'),
or a SHA-256 given in hex, with the fingerprint of the manifest the Coordinator
has set, and check the Coordinator's signature of the manifest with the trusted
root certificate. Exit code 3 if they differ or the signature does not verify.

With the address as the last argument (marblerun's command line) it prints
"OK" and caches the verified chain in --coordinator-cert, as marblerun does.`,
		Args: addressArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := a.takeAddress(cmd, args, 1)
			if err != nil {
				return err
			}
			want, err := a.manifestHash(args[0])
			if err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), attesting)
			if err != nil {
				return err
			}
			m, err := s.c.GetManifest(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the manifest: %w", err)
			}
			res := verifyResult{File: args[0], FileFingerprint: want, ManifestFingerprint: m.ManifestFingerprint}
			if err := client.VerifyManifest(s.root, m); err != nil {
				return fmt.Errorf("the Coordinator's manifest: %w", err)
			}
			res.SignatureValid = true
			res.Match = strings.EqualFold(res.FileFingerprint, m.ManifestFingerprint)
			if !res.Match {
				return fmt.Errorf("%w: the Coordinator's manifest (SHA-256 %s) is not %s (SHA-256 %s)", client.ErrVerification, m.ManifestFingerprint, args[0], res.FileFingerprint)
			}
			if err := a.saveCertCache(cmd.Context(), s, false); err != nil {
				return err
			}
			switch {
			case a.jsonOutput():
				return a.printJSON(res)
			case a.mr:
				a.printf("OK\n")
			default:
				a.printf("OK: the Coordinator's manifest is %s (SHA-256 %s), signed by the trusted root.\n", args[0], res.FileFingerprint)
			}
			return nil
		},
	}
}

// manifestHash returns the hex SHA-256 of the manifest file arg, or arg
// itself when it is no file but 64 hex digits (as marblerun takes it).
func (a *app) manifestHash(arg string) (string, error) {
	if _, err := os.Stat(arg); errors.Is(err, os.ErrNotExist) && arg != "-" {
		if b, err := hex.DecodeString(arg); err == nil && len(b) == sha256.Size {
			return strings.ToLower(arg), nil
		}
		return "", usagef("%s is neither a manifest file nor a SHA-256 in hex (64 digits)", arg)
	}
	raw, err := a.loadManifest(arg)
	if err != nil {
		return "", err
	}
	return client.ManifestFingerprint(raw), nil
}

func (a *app) manifestSignatureCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "signature [FILE | ADDRESS]",
		Short: "Print the root's ECDSA signature of the manifest (base64), or the SHA-256 of a manifest FILE",
		Long: `Without a file, print the root's ECDSA signature of the manifest that is set
(base64), after checking it.

With a manifest FILE (marblerun's 'manifest signature FILE'), print the hex
SHA-256 of the bytes 'manifest set' would upload; nothing is sent.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && (fileExists(args[0]) || args[0] == "-" || !looksLikeAddress(args[0])) {
				raw, err := a.loadManifest(args[0])
				if err != nil {
					return err
				}
				fp := client.ManifestFingerprint(raw)
				if a.jsonOutput() {
					return a.printJSON(map[string]string{"manifestFingerprint": fp})
				}
				a.printf("%s\n", fp)
				return nil
			}
			if _, err := a.takeAddress(cmd, args, 0); err != nil {
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
	var file string
	c := &cobra.Command{
		Use:   "log [ADDRESS]",
		Short: "Print the update log, one JSON entry per line (--verify: check it against the root)",
		Long: `Print the update log, one JSON entry per line.

With --verify, fetch the verifiable log (GET /api/v2/update-log) and check the
whole hash chain and the signed checkpoint against the pinned root certificate
(--root, or the attested one), then print a summary: entries, first and last
time, manifest fingerprints seen. --since-checkpoint FILE proves that the log
extends a checkpoint saved earlier (--save-checkpoint FILE saves the verified
one). A failed check exits non-zero and names what was found.

-o/--output FILE writes the entries to FILE instead (one per line, as
marblerun does).`,
		Args: addressArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.takeAddress(cmd, args, 0); err != nil {
				return err
			}
			if vf.verify && file != "" {
				return usagef("--verify prints a summary: it takes no --output file")
			}
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
			if a.mr && !a.jsonOutput() {
				a.printf("Successfully verified Coordinator, now requesting update log\n")
			}
			entries, err := s.c.UpdateLog(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the update log: %w", err)
			}
			if file != "" {
				return writeFile(file, []byte(strings.Join(entries, "\n")), 0o600)
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
			if a.mr {
				a.printf("Update log:\n")
			}
			for _, e := range entries {
				a.printf("%s\n", e)
			}
			return nil
		},
	}
	c.Flags().StringVarP(&file, "output", "o", "", "write the log to this file instead of standard output")
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

// updateUpload is one of the two commands that upload an update manifest
// as a manifest user: 'apply' proposes it, 'acknowledge' agrees to the
// pending one. Both read FILE, connect with the client certificate, send,
// and print the answer and any new recovery secrets the same way; they
// differ only in what is set here.
type updateUpload struct {
	cmd      cobra.Command // Use, Aliases, Short, Long
	progress string        // shown while the Coordinator works
	failure  string        // what failed, for the error ("updating the manifest")
	// send uploads the manifest and words the answer.
	send func(ctx context.Context, c *client.Client, raw []byte) (updateAnswer, error)
}

// updateAnswer is the Coordinator's answer to an update upload and its
// wording.
type updateAnswer struct {
	response        any               // printed with --output json
	recoverySecrets map[string][]byte // new, when the upload applied an update that changed the data key
	mrMessage       string            // marblerun's wording
	message         string            // quarry's status line
}

// updateUploadCommand builds the command of u.
func (a *app) updateUploadCommand(u updateUpload) *cobra.Command {
	var rf recoveryFlags
	c := &u.cmd
	c.Args = addressArgs(1)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		args, err := a.takeAddress(cmd, args, 1)
		if err != nil {
			return err
		}
		if err := rf.check(); err != nil {
			return err
		}
		raw, err := a.loadManifest(args[0])
		if err != nil {
			return err
		}
		s, err := a.connect(cmd.Context(), needClientCert)
		if err != nil {
			return err
		}
		done := a.progress(u.progress)
		res, err := u.send(cmd.Context(), s.c, raw)
		done()
		if err != nil {
			return fmt.Errorf("%s: %w", u.failure, err)
		}
		switch {
		case a.jsonOutput():
			if err := a.saveRecoverySecrets(rf, res.recoverySecrets); err != nil {
				return err
			}
			return a.printJSON(res.response)
		case a.mr:
			a.printf("%s\n", res.mrMessage)
		default:
			a.status(rf, res.recoverySecrets, "%s\n", res.message)
		}
		return a.saveRecoverySecrets(rf, res.recoverySecrets)
	}
	rf.register(c, "new encrypted recovery secrets")
	return c
}

func (a *app) updateApplyCommand() *cobra.Command {
	return a.updateUploadCommand(updateUpload{
		cmd: cobra.Command{
			Use:   "apply FILE [ADDRESS]",
			Short: "Send a manifest update: packages only, or a complete manifest",
			Long: `Send a manifest update as a manifest user (--cert, --key). A manifest that sets
only Packages (with new SecurityVersions) is a package update, applied at once.
Any other manifest is a complete update: it is applied when enough users with
the UpdateManifest permission have acknowledged it ('manifest update
acknowledge'). If the applied update changes the recovery keys, or changes
SealMode from ProductKey (the default) to UniqueKey, it makes a new data key
and the new encrypted recovery secrets are written to --recovery-secrets-file.`,
		},
		progress: "applying the update (a complete update generates the manifest's secrets)",
		failure:  "updating the manifest",
		send: func(ctx context.Context, c *client.Client, raw []byte) (updateAnswer, error) {
			res, err := c.Update(ctx, raw)
			if err != nil {
				return updateAnswer{}, err
			}
			msg := "Update applied."
			if res.MissingAcknowledgments > 0 {
				msg = fmt.Sprintf("Update pending: %s missing (users who may acknowledge: %s).",
					plural(res.MissingAcknowledgments, "acknowledgement", "acknowledgements"), strings.Join(res.MissingUsers, ", "))
			}
			return updateAnswer{response: res, recoverySecrets: res.RecoverySecrets,
				mrMessage: mrApplyMessage(res.MissingAcknowledgments, res.MissingUsers), message: msg}, nil
		},
	})
}

// mrApplyMessage is marblerun's answer to 'manifest update apply'.
func mrApplyMessage(missing int, users []string) string {
	const pending = "Update manifest submitted successfully.\nChanges are pending and have not been applied yet.\n"
	switch missing {
	case 0:
		return "Update manifest set successfully"
	case 1:
		return pending + "1 user still needs to acknowledge the update manifest.\nThe following users may acknowledge the update: " + strings.Join(users, ", ")
	}
	return pending + fmt.Sprintf("%d users still need to acknowledge the update manifest.\nThe following users may acknowledge the update: %s", missing, strings.Join(users, ", "))
}

// mrAckMessage is marblerun's answer to 'manifest update acknowledge'.
func mrAckMessage(missing int, users []string) string {
	switch missing {
	case 0:
		return "Acknowledgement successful:\nAll users have acknowledged the update manifest. Update successfully applied"
	case 1:
		return "Acknowledgement successful:\n1 user still needs to acknowledge the update manifest.\nThe following users have not yet accepted: " + strings.Join(users, ", ")
	}
	return fmt.Sprintf("Acknowledgement successful:\n%d users still need to acknowledge the update manifest.\nThe following users have not yet accepted: %s", missing, strings.Join(users, ", "))
}

func (a *app) updateAcknowledgeCommand() *cobra.Command {
	return a.updateUploadCommand(updateUpload{
		cmd: cobra.Command{
			Use:     "acknowledge FILE [ADDRESS]",
			Aliases: []string{"ack"},
			Short:   "Acknowledge the pending update by uploading the same manifest",
		},
		progress: "acknowledging (the last acknowledgement applies the update and generates the manifest's secrets)",
		failure:  "acknowledging the update",
		send: func(ctx context.Context, c *client.Client, raw []byte) (updateAnswer, error) {
			res, err := c.AcknowledgeUpdate(ctx, raw)
			if err != nil {
				return updateAnswer{}, err
			}
			return updateAnswer{response: res, recoverySecrets: res.RecoverySecrets,
				mrMessage: mrAckMessage(res.MissingAcknowledgments, res.MissingUsers), message: res.Message}, nil
		},
	})
}

func (a *app) updateCancelCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "cancel [ADDRESS]",
		Short: "Cancel the pending update",
		Args:  addressArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.takeAddress(cmd, args, 0); err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), needClientCert)
			if err != nil {
				return err
			}
			msg, err := s.c.CancelUpdate(cmd.Context())
			if err != nil {
				return fmt.Errorf("cancelling the update: %w", err)
			}
			switch {
			case a.jsonOutput():
				return a.printJSON(map[string]string{"message": msg})
			case a.mr:
				a.printf("Cancellation successful\n")
			default:
				a.printf("%s\n", msg)
			}
			return nil
		},
	}
}

func (a *app) updateGetCommand() *cobra.Command {
	var file string
	var missing bool
	c := &cobra.Command{
		Use:   "get [ADDRESS]",
		Short: "Print the pending update's manifest; the missing users go to standard error",
		Long: `Print the pending update's manifest exactly as it was uploaded; the users who
have not acknowledged it yet go to standard error. --missing prints instead
"The following users have not yet acknowledged the update: [a b]", as
marblerun does.`,
		Args: addressArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.takeAddress(cmd, args, 0); err != nil {
				return err
			}
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
			out := p.Manifest
			if missing {
				out = fmt.Appendf(nil, "The following users have not yet acknowledged the update: %s\n", p.MissingUsers)
			} else if !a.mr {
				msg := p.Message
				if len(p.MissingUsers) > 0 {
					msg += " (missing: " + strings.Join(p.MissingUsers, ", ") + ")"
				}
				if msg != "" {
					a.notef("%s\n", strings.TrimSpace(msg))
				}
			}
			return a.writeOutput(file, out, 0o644)
		},
	}
	c.Flags().StringVarP(&file, "file", "f", "", "write the pending manifest to this file instead of standard output")
	c.Flags().StringVarP(&file, "output", "o", "", "the same as --file (marblerun's flag)")
	c.Flags().BoolVar(&missing, "missing", false, "print the users who have not acknowledged instead of the manifest")
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
