//go:build nocontroller

package cli

import (
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// newControllerCmd is absent from a CLI-only build (-tags nocontroller): the controller,
// the webhook server and their metrics are not linked. See docs/benchmarks.md.
func newControllerCmd(Streams, *genericclioptions.ConfigFlags) *cobra.Command { return nil }
