package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Version is set at build time with -ldflags "-X .../internal/cli.Version=v1.2.3".
var Version = "dev"

func newVersionCmd(streams Streams) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the upgradeguard version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			v := Version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				v = bi.Main.Version
			}
			_, err := fmt.Fprintln(streams.Out, "upgradeguard", v)
			return err
		},
	}
}
