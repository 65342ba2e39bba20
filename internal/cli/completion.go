package cli

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
)

// completionTimeout bounds a completion that asks the cluster: a shell waiting on a
// Tab key press must not hang on an unreachable API server.
const completionTimeout = 5 * time.Second

// registerCompletions adds dynamic shell completion to the command tree (cobra's
// `completion bash|zsh|fish|powershell` command loads it): release names for the
// positional NAME and --release, CRD names for --crd, namespaces for -n, and the fixed
// choices of -o (those of --helm-driver and --crd-policy come with the flags, from
// internal/cliflag). Cluster lookups use the same kubeconfig flags as the
// command line being completed.
func registerCompletions(root *cobra.Command, kube *genericclioptions.ConfigFlags) {
	_ = root.RegisterFlagCompletionFunc("namespace", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return complete(cmd, toComplete, func(ctx context.Context) ([]string, error) { return namespaceNames(ctx, kube) })
	})
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		releases := func(cmd *cobra.Command, toComplete string) ([]string, cobra.ShellCompDirective) {
			return complete(cmd, toComplete, func(ctx context.Context) ([]string, error) { return releaseNames(ctx, kube, cmd) })
		}
		if takesReleaseArg(c) && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
				if len(args) > 0 {
					return nil, cobra.ShellCompDirectiveNoFileComp
				}
				return releases(cmd, toComplete)
			}
		}
		if c.Flags().Lookup("release") != nil {
			_ = c.RegisterFlagCompletionFunc("release", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				return releases(cmd, toComplete)
			})
		}
		if c.Flags().Lookup("crd") != nil {
			_ = c.RegisterFlagCompletionFunc("crd", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
				return complete(cmd, toComplete, func(ctx context.Context) ([]string, error) { return crdNames(ctx, kube) })
			})
		}
		if c.Flags().Lookup("output") != nil {
			_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// takesReleaseArg reports whether a command's first positional argument is a release
// name: its usage line reads `NAME ...` or `[RELEASE] ...` after the command name.
func takesReleaseArg(c *cobra.Command) bool {
	f := strings.Fields(c.Use)
	return len(f) > 1 && (f[1] == "NAME" || f[1] == "RELEASE" || f[1] == "[RELEASE]")
}

func complete(cmd *cobra.Command, toComplete string, list func(context.Context) ([]string, error)) ([]string, cobra.ShellCompDirective) {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	names, err := list(ctx)
	if err != nil {
		cobra.CompDebugln("upgradeguard completion: "+err.Error(), true)
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	names = slices.DeleteFunc(names, func(n string) bool { return !strings.HasPrefix(n, toComplete) })
	return names, cobra.ShellCompDirectiveNoFileComp
}

func releaseNames(ctx context.Context, kube *genericclioptions.ConfigFlags, cmd *cobra.Command) ([]string, error) {
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	ns, _, err := kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	r, err := helmrelease.NewReader(cs, ns, cliflag.DriverOf(cmd.Flags()))
	if err != nil {
		return nil, err
	}
	rels, err := r.Releases(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(rels))
	for _, rel := range rels {
		names = append(names, rel.Name)
	}
	return names, nil
}

func crdNames(ctx context.Context, kube *genericclioptions.ConfigFlags) ([]string, error) {
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	mc, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// Metadata only: CRD schemas are large, and a completion needs the names.
	list, err := mc.Resource(apiextv1.SchemeGroupVersion.WithResource("customresourcedefinitions")).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list.Items))
	for _, crd := range list.Items {
		names = append(names, crd.Name)
	}
	slices.Sort(names)
	return names, nil
}

func namespaceNames(ctx context.Context, kube *genericclioptions.ConfigFlags) ([]string, error) {
	cfg, err := kube.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	list, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(list.Items))
	for _, ns := range list.Items {
		names = append(names, ns.Name)
	}
	return names, nil
}
