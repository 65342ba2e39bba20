package cli

import (
	"context"
	"slices"
	"strings"

	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/upgradeguard/upgradeguard/pkg/review"
)

// allTargets are the clusters of --snapshot and --cluster: a --cluster PATH=NAME whose
// NAME is a --snapshot's maps the path to that snapshot, any other to a kubeconfig
// context. Without --cluster, every snapshot takes every HelmRelease, and no kubeconfig
// is read.
func (o *reviewOptions) allTargets(ctx context.Context, kube *genericclioptions.ConfigFlags) ([]review.Cluster, error) {
	if len(o.snapshots) == 0 {
		return o.targets(kube)
	}
	var out []review.Cluster
	for _, s := range o.snapshots {
		name, ref, ok := strings.Cut(s, "=")
		if !ok || name == "" || ref == "" {
			return nil, couldNot("--snapshot %q: want NAME=FILE or NAME=oci://REGISTRY/REPOSITORY:TAG, for example --snapshot prod-eu=prod-eu.json", s)
		}
		if slices.ContainsFunc(out, func(c review.Cluster) bool { return c.Name == name }) {
			return nil, couldNot("--snapshot %s: the name %s is given twice", s, name)
		}
		snap, err := loadSnapshot(ctx, o.registry, ref)
		if err != nil {
			return nil, couldNot("--snapshot %s: %w", s, err)
		}
		out = append(out, review.Cluster{Name: name, Snapshot: snap})
	}
	if len(o.clusters) == 0 {
		return out, nil
	}
	var live []string
	for _, c := range o.clusters {
		path, name, ok := strings.Cut(c, "=")
		i := slices.IndexFunc(out, func(cl review.Cluster) bool { return cl.Name == name })
		if !ok || path == "" || i < 0 {
			live = append(live, c)
			continue
		}
		out[i].Paths = append(out[i].Paths, path)
	}
	for _, c := range out {
		if len(c.Paths) == 0 {
			return nil, couldNot("--snapshot %s: no --cluster PATH=%s maps a folder to it (with --cluster, every snapshot needs one)", c.Name, c.Name)
		}
	}
	if len(live) == 0 {
		return out, nil
	}
	rest := *o
	rest.clusters = live
	more, err := rest.targets(kube)
	if err != nil {
		return nil, err
	}
	return append(out, more...), nil
}
