package livecluster

import (
	"context"
	"fmt"
	"sync"

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
	// A config that sets no client rate limit gets none (see NewKubeCluster).
	limited := kubeclient.DefaultRateLimit(cfg)
	c, err := kubeclient.New(limited)
	if err != nil {
		return nil, fmt.Errorf("target cluster: %w", err)
	}
	kc, err := newKubeCluster(c, limited)
	if err != nil {
		return nil, fmt.Errorf("target cluster: %w", err)
	}
	return &Target{Cluster: kc, Clientset: c.Kube, Config: cfg, Metadata: c.Metadata}, nil
}

// Connections keeps the targets of one run that judges many changes (a review): each is
// connected once (Connect) and shared by every decision of the run, so those decisions
// share its clients, its discovery and the API server's answers to the dry runs
// (KubeCluster.AdmitCRD). Unlike Clusters it starts no informer and keeps no memory
// between decisions beyond what a KubeCluster keeps itself: every decision reads the
// cluster as one check does. The zero value is ready to use, and a nil Connections keeps
// nothing (Connect per call). It is safe for concurrent use.
type Connections struct {
	mu      sync.Mutex
	targets map[string]*runTarget
}

// runTarget is one target of Connections, connected at its first Get.
type runTarget struct {
	mu     sync.Mutex
	target *Target
}

// Get returns the target named key (Key), connected from cfg at the first call; a target
// that could not be reached is tried again at the next. local is unused: a run's targets
// keep no informer (it makes Connections a stand-in for Clusters).
func (c *Connections) Get(ctx context.Context, key string, cfg *rest.Config, _ bool) (*Target, error) {
	if c == nil {
		return Connect(ctx, cfg)
	}
	c.mu.Lock()
	t, ok := c.targets[key]
	if !ok {
		if c.targets == nil {
			c.targets = map[string]*runTarget{}
		}
		t = &runTarget{}
		c.targets[key] = t
	}
	c.mu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.target == nil {
		tgt, err := Connect(ctx, cfg)
		if err != nil {
			return nil, err
		}
		t.target = tgt
	}
	out := *t.target
	return &out, nil
}

// LocalKey names the cluster of cfg itself (not one a kubeconfig Secret names) in
// Clusters and Connections.
func LocalKey(cfg *rest.Config) string { return Key(cfg.Host, "local") }
