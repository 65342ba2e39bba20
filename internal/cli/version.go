package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/upgradeguard/upgradeguard/internal/output"
)

// Build information, set by the release build (make build, make dist, make image) with
//
//	-ldflags "-X github.com/upgradeguard/upgradeguard/internal/cli.Version=v1.2.3
//	          -X github.com/upgradeguard/upgradeguard/internal/cli.Commit=<sha>
//	          -X github.com/upgradeguard/upgradeguard/internal/cli.BuildDate=<RFC 3339>"
//
// BuildDate is the commit time (SOURCE_DATE_EPOCH), not the wall clock, so that two
// builds of one commit are byte for byte the same.
var (
	Version   = "dev"
	Commit    = ""
	BuildDate = ""
)

// BuildInfo is what `upgradeguard version` prints.
type BuildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	BuildDate string `json:"buildDate,omitempty"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// CurrentBuild returns the build information of this binary. A `go install`ed binary has
// no ldflags: its version and commit come from the module and VCS data Go embeds.
func CurrentBuild() BuildInfo {
	b := BuildInfo{Version: Version, Commit: Commit, BuildDate: BuildDate, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if b.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision" && b.Commit == "":
			b.Commit = s.Value
		case s.Key == "vcs.time" && b.BuildDate == "":
			b.BuildDate = s.Value
		}
	}
	return b
}

// text is the human form of BuildInfo.
func (b BuildInfo) text(w io.Writer) error {
	_, err := fmt.Fprintf(w, "upgradeguard %s\ncommit: %s\nbuilt: %s\ngo: %s %s\n",
		b.Version, orUnknown(b.Commit), orUnknown(b.BuildDate), b.GoVersion, b.Platform)
	return err
}

func newVersionCmd(streams Streams) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the upgradeguard version, commit and build date",
		Example: `  upgradeguard version
  upgradeguard version -o json`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			b := CurrentBuild()
			return output.Write(streams.Out, format, b, b.text)
		},
	}
	output.AddFlag(cmd.Flags(), &format)
	return cmd
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
