package cli

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/upgradeguard/upgradeguard/internal/output"
)

// Version is set at build time with -ldflags "-X .../internal/cli.Version=v1.2.3".
var Version = "dev"

// versionInfo is what version prints.
type versionInfo struct {
	Version string `json:"version"`
}

func (v versionInfo) text(w io.Writer) error {
	_, err := fmt.Fprintln(w, "upgradeguard", v.Version)
	return err
}

func newVersionCmd(streams Streams) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the upgradeguard version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := versionInfo{Version: buildVersion()}
			return output.Write(streams.Out, format, v, v.text)
		},
	}
	output.AddFlag(cmd.Flags(), &format)
	return cmd
}

// buildVersion is Version, or the module version when built with go install.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return Version
}
