package cli

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/quarry-cc/quarry/internal/buildinfo"
)

func (a *app) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status [ADDRESS]",
		Short: "Show the Coordinator's state",
		Long: `Show the Coordinator's state code and message:
  1  recovery mode: upload recovery secrets (quarry recover) or set a new manifest
  2  ready to accept a manifest
  3  running: the manifest is set and Marbles may activate`,
		Args: addressArgs(0),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := a.takeAddress(cmd, args, 0); err != nil {
				return err
			}
			s, err := a.connect(cmd.Context(), needNothing)
			if err != nil {
				return err
			}
			st, err := s.c.Status(cmd.Context())
			if err != nil {
				return fmt.Errorf("getting the status: %w", err)
			}
			if a.jsonOutput() {
				return a.printJSON(st)
			}
			a.printf("%d: %s\n", st.Code, st.Message)
			return nil
		},
	}
}

// versionInfo is the output of quarry version.
type versionInfo struct {
	Version   string `json:"version"`
	Revision  string `json:"revision,omitempty"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
	ClientAPI string `json:"clientAPI"`
}

func buildVersion() versionInfo {
	return versionInfo{Version: buildinfo.Version(), Revision: buildinfo.Commit(), GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, ClientAPI: "/api/v2"}
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show quarry's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := buildVersion()
			if a.jsonOutput() {
				return a.printJSON(v)
			}
			a.printf("quarry %s", v.Version)
			if v.Revision != "" {
				a.printf(" (%s)", v.Revision)
			}
			a.printf(", %s %s, Client API %s\n", v.GoVersion, v.Platform, v.ClientAPI)
			return nil
		},
	}
}
