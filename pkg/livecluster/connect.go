package livecluster

import (
	"context"
	"fmt"

	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// Connect builds a Target for one decision, kept nowhere: its clients (one
// kubeclient.Clients serves the Cluster and Helm's storage) and its Kubernetes version,
// which also proves that the API server answers. (*Clusters).Get on a nil Clusters calls
// it, so that every front end connects to a target one way.
func Connect(ctx context.Context, cfg *rest.Config) (*Target, error) {
	t, err := newTarget(cfg)
	if err != nil {
		return nil, err
	}
	if t.Version, err = t.Cluster.ServerVersion(ctx); err != nil {
		return nil, fmt.Errorf("cannot reach the target API server at %s: %w", cfg.Host, err)
	}
	return t, nil
}

// newTarget builds a target's clients from cfg, through pkg/kubeclient.
func newTarget(cfg *rest.Config) (*Target, error) {
	c, err := kubeclient.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("target cluster: %w", err)
	}
	kc, err := newKubeCluster(c, cfg)
	if err != nil {
		return nil, fmt.Errorf("target cluster: %w", err)
	}
	return &Target{Cluster: kc, Clientset: c.Kube, Config: cfg, Metadata: c.Metadata}, nil
}
