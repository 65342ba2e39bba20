package cli

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
)

// argoAppFlag is --argocd-app NAMESPACE/NAME: check and plan read the chart source from
// an Argo CD Application.
const argoAppFlag = "argocd-app"

// argoAppOptions are --argocd-app and --argocd-namespace.
type argoAppOptions struct {
	ref       string // NAMESPACE/NAME
	namespace string // where Argo CD runs: its repository Secrets and its settings (argocd-cm)
}

func (a *argoAppOptions) addFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&a.ref, argoAppFlag, "", "an Argo CD Application NAMESPACE/NAME: its Helm source (chart, targetRevision, values, parameters, "+
		"release name, destination namespace) is the chart, with every CRD applied as Argo CD syncs (create-replace)")
	f.StringVar(&a.namespace, "argocd-namespace", argoapp.DefaultNamespace, "the namespace of Argo CD: its repository Secrets (credentials for --"+argoAppFlag+") and its settings (argocd-cm: how it tracks an Application's objects)")
}

// validate refuses what the Application already says: its chart, values, release and
// CRD policy (the flags in allow excepted).
func (a *argoAppOptions) validate(fs *pflag.FlagSet, allow []string, others ...string) error {
	if a.ref == "" {
		return nil
	}
	if ns, name, ok := strings.Cut(a.ref, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return couldNot("--%s takes NAMESPACE/NAME, got %q (Argo CD keeps Applications in its own namespace, usually %s)", argoAppFlag, a.ref, argoapp.DefaultNamespace)
	}
	set := slices.DeleteFunc(cliflag.ChartSourceSet(fs, append([]string{cliflag.ManifestsFlag, cliflag.CRDPolicyFlag, cliflag.HelmDriverFlag}, others...)...),
		func(f string) bool { return slices.Contains(allow, strings.TrimPrefix(f, "--")) })
	if len(set) > 0 {
		return couldNot("--%s and %s do not go together: the Application names the chart, its version, values, release name, namespace "+
			"and CRD policy (Argo CD applies every CRD); drop %s", argoAppFlag, strings.Join(set, ", "), strings.Join(set, ", "))
	}
	return nil
}

// resolve reads the Application and turns its source into a chart source. The caller
// closes the chart.
func (a *argoAppOptions) resolve(ctx context.Context, command string, conn *connection) (*argoapp.Chart, error) {
	ns, name, _ := strings.Cut(a.ref, "/")
	dyn, err := dynamic.NewForConfig(conn.config)
	if err != nil {
		return nil, couldNot("build client: %w", err)
	}
	app, err := argoapp.Get(ctx, dyn, ns, name)
	var nf *argoapp.NotFoundError
	if errors.As(err, &nf) {
		if nf.NoCRD {
			return nil, couldNot("%w (point --kubeconfig/--context at it)", err)
		}
		return nil, couldNot("%w", err)
	}
	if err != nil {
		return nil, classifyAs(command, err, conn)
	}
	c, err := argoapp.Resolve(ctx, app, argoapp.Options{Secrets: conn.clientset.CoreV1(), ConfigMaps: conn.clientset.CoreV1(), Namespace: a.namespace})
	switch {
	case errors.As(err, new(*argoapp.UnsupportedError)):
		return nil, couldNot("%w", err)
	case errors.As(err, new(*chartsource.LoadError)):
		return nil, chartFailed(command, err)
	case errors.As(err, new(apierrors.APIStatus)):
		return nil, classifyAs(command, err, conn)
	case err != nil: // a git source that could not be cloned or checked out
		return nil, couldNot("%w", err)
	}
	if c.Options.KubeVersion == "" {
		c.Options.KubeVersion = conn.serverVersion
	}
	return c, nil
}
