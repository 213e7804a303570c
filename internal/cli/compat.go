package cli

// MarbleRun's command line. marblerun takes the Coordinator's address as the
// last argument of each command; quarry recognises that form by the extra
// argument and then prints and writes what marblerun does, takes its default
// trust (./era-config.json, the cached chain at --coordinator-cert's default
// location) and writes that cache where marblerun does. docs/cli.md, "quarry
// in place of marblerun", lists the deliberate differences.

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quarry-cc/quarry/client"
)

// eraDefaultConfig is the era config that marblerun's command line uses
// from the working directory when --era-config is not given.
const eraDefaultConfig = "era-config.json"

// qcnlConfPath is Intel's QCNL configuration, whose pccs_url the quote
// verification library that marblerun uses reads.
var qcnlConfPath = "/etc/sgx_default_qcnl.conf"

// displayCertCache is the default of --coordinator-cert as the help shows it.
const displayCertCache = "$XDG_CONFIG_HOME/marblerun/coordinator-cert.pem, else ~/.config/marblerun/coordinator-cert.pem"

// pkcs11Flags are marblerun's flags for keys in a PKCS #11 token.
var pkcs11Flags = []string{"pkcs11-config", "pkcs11-key-id", "pkcs11-key-label", "pkcs11-cert-id", "pkcs11-cert-label"}

// errPKCS11 refuses marblerun's PKCS #11 flags.
var errPKCS11 = errors.New("quarry does not load keys from PKCS #11 tokens: export the certificate and give --cert and --key, " +
	"or make the recovery signature in the token and upload it with 'quarry recover-with-signature'")

// checkCompatFlags refuses flags that quarry does not support or that mean
// something else than the user may think.
func (a *app) checkCompatFlags(cmd *cobra.Command) error {
	for _, name := range pkcs11Flags {
		if cmd.Flags().Changed(name) {
			return usagef("--%s: %w", name, errPKCS11)
		}
	}
	f := cmd.Flags().Lookup("output")
	if f == nil || !f.Changed {
		return nil
	}
	switch v := f.Value.String(); v {
	case "json", "text":
		// quarry's former -o/--output FORMAT, still taken: a file of that
		// name is written as ./json.
		if cmd.Flags().Changed("format") && a.output != v {
			return usagef("--format %s and -o/--output %s contradict each other", a.output, v)
		}
		a.output = v
		if err := f.Value.Set(""); err != nil {
			return err
		}
		a.warn(fmt.Sprintf("-o/--output %s is --format %s now: -o names the file to write, as in marblerun (a file named %s: -o ./%s)", v, v, v, v))
		return nil
	}
	// The root's hidden --output is reached only on commands that write
	// no file.
	if f.Value == cmd.Root().PersistentFlags().Lookup("output").Value {
		return usagef("-o/--output names the file to write, on the commands that write one (as in marblerun); %s writes none. For JSON output use --format json", cmd.CommandPath())
	}
	return nil
}

// takeAddress splits a command's arguments: n of its own, and optionally
// the Coordinator's address as one more (marblerun's command line), which
// then replaces --coordinator and QUARRY_COORDINATOR.
func (a *app) takeAddress(cmd *cobra.Command, args []string, n int) ([]string, error) {
	switch len(args) {
	case n:
		return args, nil
	case n + 1:
		return args[:n], a.setAddress(cmd, args[n])
	}
	return nil, usagef("%s takes %s, or %d with the Coordinator's address last; got %d", cmd.CommandPath(), plural(n, "argument", "arguments"), n+1, len(args))
}

// setAddress makes addr, the last argument, the Coordinator's address.
func (a *app) setAddress(cmd *cobra.Command, addr string) error {
	if cmd.Flags().Changed("coordinator") {
		return usagef("the Coordinator's address is given twice: as the argument %q and with --coordinator", addr)
	}
	a.coordinator, a.mr = addr, true
	return nil
}

// addressArgs returns cobra's argument check for a command with n arguments
// of its own and optionally the address.
func addressArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n && len(args) != n+1 {
			return usagef("%s takes %s, or %d with the Coordinator's address last; got %d", cmd.CommandPath(), plural(n, "argument", "arguments"), n+1, len(args))
		}
		return nil
	}
}

// looksLikeAddress reports whether s is host:port, or several of them
// comma-separated, with numeric ports.
func looksLikeAddress(s string) bool {
	if s == "" {
		return false
	}
	for part := range strings.SplitSeq(s, ",") {
		_, port, err := net.SplitHostPort(strings.TrimSpace(part))
		if err != nil {
			return false
		}
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return false
		}
	}
	return true
}

// defaultCertCache returns marblerun's default --coordinator-cert: the
// user's configuration directory (as Go's os.UserConfigDir finds it),
// marblerun/coordinator-cert.pem; "" if there is none.
func (a *app) defaultCertCache() string {
	var dir string
	switch runtime.GOOS {
	case "windows", "darwin", "ios", "plan9":
		d, err := os.UserConfigDir()
		if err != nil {
			return ""
		}
		dir = d
	default:
		if x := a.getenv("XDG_CONFIG_HOME"); filepath.IsAbs(x) {
			dir = x
		} else if h := a.getenv("HOME"); h != "" {
			dir = filepath.Join(h, ".config")
		} else {
			return ""
		}
	}
	return filepath.Join(dir, "marblerun", "coordinator-cert.pem")
}

// certCachePath is the file of --coordinator-cert: the flag's value, or
// with marblerun's command line its default location.
func (a *app) certCachePath() string {
	if a.coordinatorCert != "" || !a.mr {
		return a.coordinatorCert
	}
	return a.defaultCertCache()
}

// eraConfigFile returns the era config to verify the quote with:
// --era-config, or with marblerun's command line ./era-config.json when it
// exists and neither a pinned root nor --insecure is given (reused is then
// true). For commands that marblerun does not attest, the cached chain
// comes first (useCertCache).
func (a *app) eraConfigFile(n needs) (file string, reused bool, err error) {
	if a.eraConfig != "" || !a.mr || a.insecure || a.rootFile != "" {
		return a.eraConfig, false, nil
	}
	if n&attesting == 0 {
		if p := a.certCachePath(); p != "" && fileExists(p) {
			return "", false, nil
		}
	}
	if fileExists(eraDefaultConfig) {
		return eraDefaultConfig, true, nil
	}
	return "", false, nil
}

// useCertCache reports whether the cached chain gives the root: named with
// --coordinator-cert, or with marblerun's command line found at its default
// location, when no era config is used.
func (a *app) useCertCache(n needs, eraConfig string) bool {
	if eraConfig != "" {
		return false
	}
	if a.cmd.Flags().Changed("coordinator-cert") {
		return true
	}
	if !a.mr {
		return false
	}
	if p := a.certCachePath(); p != "" && fileExists(p) {
		return true
	}
	// Nothing to trust: marblerun fails reading the cache here; so does
	// quarry (loadCertCache), naming the ways to trust the Coordinator.
	return n&attesting == 0
}

// loadCertCache reads the chain of --coordinator-cert (intermediate, then
// root, as marblerun writes it; a file with the root alone is accepted).
func (a *app) loadCertCache() (root, intermediate *x509.Certificate, err error) {
	p := a.certCachePath()
	if p == "" {
		return nil, nil, usagef("no Coordinator certificate to trust: there is no configuration directory for --coordinator-cert's default; pass --coordinator-cert, --root, --era-config or -i")
	}
	pemText, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, usagef("no Coordinator certificate to trust: %s does not exist. Verify the Coordinator first ('quarry manifest verify MANIFEST ADDRESS --era-config FILE' writes it, as marblerun does), "+
			"or pass --root, --era-config, or -i for a Coordinator in simulation mode", p)
	}
	if err != nil {
		return nil, nil, usageError{err}
	}
	if intermediate, root, err = client.ParseCertificateChain(pemText); err == nil {
		return root, intermediate, nil
	}
	if root, err2 := client.ParseRootPEM(pemText); err2 == nil {
		return root, nil, nil
	}
	return nil, nil, usagef("--coordinator-cert %s: %w", p, err)
}

// saveCertCache writes the Coordinator's chain (intermediate, then root) to
// --coordinator-cert, as marblerun does after 'manifest set', 'manifest
// verify' and 'manifest get --keep-cert': with marblerun's command line or
// an explicit --coordinator-cert.
func (a *app) saveCertCache(ctx context.Context, s *session, always bool) error {
	if !always && !a.mr && !a.cmd.Flags().Changed("coordinator-cert") {
		return nil
	}
	p := a.certCachePath()
	if p == "" {
		return usagef("no configuration directory for --coordinator-cert's default: pass --coordinator-cert")
	}
	inter, root, _, err := s.chain(ctx)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	if err := writeFile(p, append(certPEM(inter), certPEM(root)...), 0o600); err != nil {
		return err
	}
	if a.insecure {
		a.warn("the Coordinator's chain cached in " + p + " comes from a Coordinator that was not verified (--insecure); later commands trust it")
	}
	return nil
}

// saveCoordinatorQuote writes the Coordinator's quote to --save-sgx-quote:
// the one verified, or with a pinned root one fetched now.
func (a *app) saveCoordinatorQuote(ctx context.Context, s *session) error {
	var quote []byte
	if s.att != nil {
		quote = s.att.Quote
	} else {
		var nonce []byte
		if a.nonce != "" {
			nonce = []byte(a.nonce)
		}
		q, err := s.c.Quote(ctx, nonce)
		if err != nil {
			return fmt.Errorf("fetching the quote for --save-sgx-quote: %w", err)
		}
		quote = q.Quote
	}
	return writeFile(a.saveQuote, quote, 0o600)
}

// qcnlPCCSURL returns the pccs_url of Intel's QCNL configuration at path
// (JSON, or the older KEY=VALUE form); "" if there is none.
func qcnlPCCSURL(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if m := qcnlJSON.FindSubmatch(b); m != nil {
		return string(m[1])
	}
	if m := qcnlKV.FindSubmatch(b); m != nil {
		return strings.TrimSpace(string(m[1]))
	}
	return ""
}

var (
	qcnlJSON = regexp.MustCompile(`"pccs_url"\s*:\s*"([^"]+)"`)
	qcnlKV   = regexp.MustCompile(`(?m)^\s*PCCS_URL\s*=\s*(\S+)`)
)

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir()
}

// writeNew writes a file that must not exist yet (marblerun's signature,
// encrypted secret and public key files), mode 0600.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return usageError{err}
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// pemBlock encodes one PEM block.
func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
