package cli

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// Front door names: how a user started this binary, which is how help and examples
// must spell the command back to them.
const (
	nameStandalone = "upgradeguard"
	nameKubectl    = "kubectl upgradeguard"
	nameHelm       = "helm upgradeguard"
	// helmPluginName is the name in the Helm plugin's plugin.yaml; Helm passes it to the
	// plugin as HELM_PLUGIN_NAME.
	helmPluginName = "upgradeguard"
)

// commandName returns how the binary was invoked: as a Helm plugin (Helm sets
// HELM_PLUGIN_NAME), as a kubectl plugin (kubectl runs kubectl-upgradeguard from PATH),
// or on its own.
func commandName(argv0 string, getenv func(string) string) string {
	if getenv("HELM_PLUGIN_NAME") == helmPluginName {
		return nameHelm
	}
	if strings.TrimSuffix(filepath.Base(argv0), ".exe") == "kubectl-upgradeguard" {
		return nameKubectl
	}
	return nameStandalone
}

func currentCommandName() string { return commandName(os.Args[0], os.Getenv) }

// applyHelmEnv makes the Helm plugin see the cluster Helm sees. Helm strips its own global
// flags (--namespace, --kube-context, --kubeconfig, --kube-token, ...) from a plugin's
// arguments and passes them as HELM_* variables (KUBECONFIG for --kubeconfig, which
// client-go reads itself). It must run before the flags are registered: the values become
// the flags' defaults, so an explicit flag after the plugin name still wins.
func applyHelmEnv(kube *genericclioptions.ConfigFlags, getenv func(string) string) {
	set := func(dst *string, env string) {
		if v := getenv(env); v != "" && dst != nil {
			*dst = v
		}
	}
	set(kube.Namespace, "HELM_NAMESPACE")
	set(kube.Context, "HELM_KUBECONTEXT")
	set(kube.BearerToken, "HELM_KUBETOKEN")
	set(kube.APIServer, "HELM_KUBEAPISERVER")
	set(kube.Impersonate, "HELM_KUBEASUSER")
	set(kube.CAFile, "HELM_KUBECAFILE")
	set(kube.TLSServerName, "HELM_KUBETLS_SERVER_NAME")
	if v := getenv("HELM_KUBEASGROUPS"); v != "" && kube.ImpersonateGroup != nil {
		*kube.ImpersonateGroup = strings.Split(v, ",")
	}
	if v, err := strconv.ParseBool(getenv("HELM_KUBEINSECURE_SKIP_TLS_VERIFY")); err == nil && v && kube.Insecure != nil {
		*kube.Insecure = true
	}
}

// helmReleaseCommands are the `release` subcommands the Helm plugin also offers at its
// top level, as Helm users expect: `helm upgradeguard apply-check RELEASE`.
var helmReleaseCommands = []string{"apply-check", "uninstall-check", "diff-failed"}

// adaptFrontDoor names the command tree after the front door the user came through: help,
// usage lines and examples say `kubectl upgradeguard` or `helm upgradeguard`. For Helm,
// the release commands also sit at the top level, taking the release name as Helm does.
func adaptFrontDoor(root *cobra.Command, name string, release func() *cobra.Command) {
	if name == nameStandalone {
		return
	}
	if root.Annotations == nil {
		root.Annotations = map[string]string{}
	}
	root.Annotations[cobra.CommandDisplayNameAnnotation] = name
	if name == nameHelm {
		rel := release()
		for _, c := range rel.Commands() {
			for _, want := range helmReleaseCommands {
				if c.Name() == want {
					rel.RemoveCommand(c)
					root.AddCommand(c)
				}
			}
		}
	}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		c.Example = renameExamples(c.Example, name)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// renameExamples rewrites the command at the start of each example line.
func renameExamples(example, name string) string {
	lines := strings.Split(example, "\n")
	for i, l := range lines {
		trimmed := strings.TrimLeft(l, " ")
		if strings.HasPrefix(trimmed, nameStandalone+" ") {
			indent := l[:len(l)-len(trimmed)]
			rest := strings.TrimPrefix(trimmed, nameStandalone+" ")
			if name == nameHelm {
				for _, hoisted := range helmReleaseCommands {
					if strings.HasPrefix(rest, "release "+hoisted+" ") {
						rest = strings.TrimPrefix(rest, "release ")
					}
				}
			}
			lines[i] = indent + name + " " + rest
		}
	}
	return strings.Join(lines, "\n")
}
