package gate

import (
	"context"
	"errors"
	"fmt"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// Chart is a chart as the caller will install it: the loaded chart and the release it
// goes into. The CRDs a chart brings can depend on its values (flux2's installCRDs, a
// crds.enabled toggle), so the gate renders the chart exactly as the install will.
type Chart struct {
	// Chart is the loaded chart, from chartsource.Fetch or the Helm SDK's loader.
	Chart *chart.Chart
	// Values are the release's values; the chart's defaults apply under them.
	Values map[string]any
	// ReleaseName and Namespace are the .Release fields the templates see.
	ReleaseName string
	Namespace   string
}

// ChartCRDs renders c as `helm upgrade` would against the target cluster's Kubernetes
// version, and returns the CRDs it brings: the crds/ folders of the chart and its
// subcharts, and the CRDs its templates render with c.Values. Use it to fill
// Options.Current from the chart version that is deployed today.
func ChartCRDs(ctx context.Context, target *rest.Config, c Chart) ([]chartcrds.CRD, error) {
	if c.Chart == nil {
		return nil, errors.New("gate: no chart given: load it with chartsource.Fetch or the Helm SDK loader")
	}
	cluster, err := livecluster.NewKubeCluster(target)
	if err != nil {
		return nil, err
	}
	kubeVersion, err := cluster.ServerVersion(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the target cluster's Kubernetes version to render chart %s: %w", c.Chart.Name(), err)
	}
	rendered, err := chartsource.Render(ctx, c.Chart, chartsource.Options{
		Ref:         c.Chart.Name() + "-" + c.Chart.Metadata.Version,
		BaseValues:  c.Values,
		ReleaseName: c.ReleaseName,
		Namespace:   c.Namespace,
		KubeVersion: kubeVersion,
		IsUpgrade:   true,
	})
	if err != nil {
		return nil, err
	}
	return rendered.CRDs, nil
}

// DecideChart is Decide for a whole chart: it renders incoming with ChartCRDs and decides
// on every CRD it brings. It is the call to make before installing or upgrading a chart
// with the Helm SDK; errors are "could not decide", as with Decide.
func DecideChart(ctx context.Context, target *rest.Config, incoming Chart, o Options) (*Decision, error) {
	crds, err := ChartCRDs(ctx, target, incoming)
	if err != nil {
		return nil, err
	}
	return Decide(ctx, target, crds, o)
}
