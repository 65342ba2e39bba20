package livecluster

import (
	"context"
	"fmt"

	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// Connect builds a Target for one decision, kept nowhere: its clients (one
// kubeclient.Clients serves the Cluster and Helm's storage) and its Kubernetes version,
// which also proves that the API server answers (else an *UnreachableError). The CLI
// calls it, and so does (*Clusters).Get on a nil Clusters, so that every front end
// connects to a target one way.
func Connect(ctx context.Context, cfg *rest.Config) (*Target, error) {
	t, err := newTarget(cfg)
	if err != nil {
		return nil, err
	}
	if t.Version, err = t.Cluster.ServerVersion(ctx); err != nil {
		return nil, &UnreachableError{Host: cfg.Host, Err: err}
	}
	return t, nil
}

// UnreachableError says that a target's API server did not answer: the decision could
// not be made. The front end names how the target was chosen (a kubeconfig, a Secret).
type UnreachableError struct {
	Host string
	Err  error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the Kubernetes API server at %s: %v", e.Host, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

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
