package cli

import (
	"crypto/x509"
	"encoding/pem"

	"github.com/spf13/cobra"
)

func (a *app) certificateCommand() *cobra.Command {
	var file string
	sub := func(use, short string, pick func(inter, root *x509.Certificate, chain []byte) []byte) *cobra.Command {
		c := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, args []string) error {
				s, err := a.connect(cmd.Context(), needNothing)
				if err != nil {
					return err
				}
				inter, root, chain, err := s.chain(cmd.Context())
				if err != nil {
					return err
				}
				out := pick(inter, root, chain)
				if a.jsonOutput() && file == "" {
					return a.printJSON(map[string]string{"pem": string(out)})
				}
				return a.writeOutput(file, out, 0o644)
			},
		}
		c.Flags().StringVarP(&file, "file", "f", "", "write the PEM to this file instead of standard output")
		return c
	}
	g := groupCommand("certificate", "Print the Coordinator's certificates (PEM)",
		sub("root", "Print the root certificate: the one to pin with --root", func(_, root *x509.Certificate, _ []byte) []byte {
			return certPEM(root)
		}),
		sub("intermediate", "Print the current intermediate CA certificate", func(inter, _ *x509.Certificate, _ []byte) []byte {
			return certPEM(inter)
		}),
		sub("chain", "Print the chain: intermediate, then root", func(inter, root *x509.Certificate, _ []byte) []byte {
			return append(certPEM(inter), certPEM(root)...)
		}),
	)
	g.Long = `Print the Coordinator's certificates as PEM. Without --root, the Coordinator is
verified first (or, with --insecure, trusted in simulation mode); 'quarry
certificate root -f root.pem' then saves the root to pin with --root.`
	return g
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}
