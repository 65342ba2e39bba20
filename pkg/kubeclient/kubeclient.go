// Package kubeclient owns building the set of API clients upgradeguard's operations share
// from one REST config: CRDs, object metadata, discovery and Leases. Operations take the
// narrow interfaces they need from it.
package kubeclient

import (
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/discovery"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// Clients are the API clients built from one config.
type Clients struct {
	CRDs      apiextclient.Interface
	Metadata  metadata.Interface
	Discovery discovery.DiscoveryInterface
	Leases    coordclient.CoordinationV1Interface
}

// New builds the clients. Deprecated-version warnings are dropped: operations that touch
// every object of an old version would repeat the same warning thousands of times.
func New(cfg *rest.Config) (*Clients, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = rest.NoWarnings{}
	crds, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	leases, err := coordclient.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Clients{CRDs: crds, Metadata: md, Discovery: disco, Leases: leases}, nil
}
