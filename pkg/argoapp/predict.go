package argoapp

import (
	"context"

	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

// Upgrade words moving the Application to a chart version: commit its targetRevision
// (or argocd app set, at the Helm source's position in spec.sources).
func (c *Chart) Upgrade(chartVersion string) string {
	return cmdline.ApplicationRevision{Name: c.app.Name, Namespace: c.app.Namespace, Version: chartVersion, SourcePosition: c.SourcePosition}.String()
}

// Predict predicts Argo CD syncing the Application to the chart on cluster (a live one,
// or a record of one such as a snapshot), as check --argocd-app does: the chart rendered
// as the repo-server renders it, every CRD applied under the Application's CRD policy,
// and what leaves the Application (Deployer, Current). Errors of the chart's repository
// are explained (Explain).
func (c *Chart) Predict(ctx context.Context, cluster check.Cluster) (*check.Prediction, error) {
	p, err := check.Predict(ctx, check.Sources{Cluster: cluster, Namespace: c.Options.Namespace, Policy: c.Policy,
		Upgrade: c.Upgrade, Deployer: c.Deployer, Current: c.Current,
		Chart: chartsource.CheckChart(chartsource.Helm{}, c.Options), SteppingStones: &chartsource.History{Options: c.Options}})
	return p, c.Explain(err)
}
