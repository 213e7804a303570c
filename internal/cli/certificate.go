package cli

import (
	"crypto/x509"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/quarry-cc/quarry/client"
)

func (a *app) certificateCommand() *cobra.Command {
	var file string
	// sub makes one of the commands; mrFile and mrWhat are marblerun's
	// default file and the name in its message.
	sub := func(use, short, mrFile, mrWhat string, pick func(inter, root *x509.Certificate) []byte) *cobra.Command {
		c := &cobra.Command{
			Use:   use + " [ADDRESS]",
			Short: short,
			Args:  addressArgs(0),
			RunE: func(cmd *cobra.Command, args []string) error {
				if _, err := a.takeAddress(cmd, args, 0); err != nil {
					return err
				}
				s, err := a.connect(cmd.Context(), attesting)
				if err != nil {
					return err
				}
				inter, root, _, err := s.chain(cmd.Context())
				if err != nil {
					return err
				}
				if a.mr && !a.insecure && s.att != nil {
					// marblerun refuses a root other than the cached one.
					if p := a.certCachePath(); p != "" && fileExists(p) {
						cached, _, err := a.loadCertCache()
						if err != nil {
							return err
						}
						if !cached.Equal(root) {
							return fmt.Errorf("%w: the Coordinator's root certificate is not the one cached in %s: run 'quarry manifest verify MANIFEST ADDRESS' to verify the Coordinator and update the cache",
								client.ErrVerification, p)
						}
					}
				}
				out := pick(inter, root)
				if a.jsonOutput() && file == "" {
					return a.printJSON(map[string]string{"pem": string(out)})
				}
				if a.mr {
					if file == "" {
						file = mrFile
					}
					if err := writeFile(file, out, 0o600); err != nil {
						return err
					}
					a.printf("%s written to %s\n", mrWhat, file)
					return nil
				}
				return a.writeOutput(file, out, 0o644)
			},
		}
		c.Flags().StringVarP(&file, "file", "f", "", "write the PEM to this file instead of standard output")
		c.Flags().StringVarP(&file, "output", "o", "", "the same as --file (marblerun's flag; with the address as the last argument the default is "+mrFile+")")
		return c
	}
	g := groupCommand("certificate", "Print the Coordinator's certificates (PEM)",
		sub("root", "Print the root certificate: the one to pin with --root", "marblerunRootCA.crt", "Root certificate", func(_, root *x509.Certificate) []byte {
			return certPEM(root)
		}),
		sub("intermediate", "Print the current intermediate CA certificate", "marblerunIntermediateCA.crt", "Intermediate certificate", func(inter, _ *x509.Certificate) []byte {
			return certPEM(inter)
		}),
		sub("chain", "Print the chain: intermediate, then root", "marblerunChainCA.crt", "Certificate chain", func(inter, root *x509.Certificate) []byte {
			return append(certPEM(inter), certPEM(root)...)
		}),
	)
	g.Long = `Print the Coordinator's certificates as PEM. Without --root, the Coordinator is
verified first (or, with --insecure, trusted in simulation mode); 'quarry
certificate root -f root.pem' then saves the root to pin with --root.

With the address as the last argument (marblerun's command line) the PEM is
written to a file, by default marblerunRootCA.crt, marblerunIntermediateCA.crt
or marblerunChainCA.crt, and a verified root must be the one cached in
--coordinator-cert if that file exists.`
	return g
}

func certPEM(c *x509.Certificate) []byte {
	return pemBlock("CERTIFICATE", c.Raw)
}
