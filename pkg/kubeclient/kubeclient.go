// Package kubeclient owns building the set of API clients upgradeguard's operations share
// from one REST config: core, CRDs, object metadata, discovery, a REST mapper and Leases.
// Operations take the narrow interfaces they need from it. It also owns the one paged
// LIST (Pages, and ListAll over it), and the rule for reading custom resources when a
// conversion webhook does not answer (IsConversionFailure, StorageFallback).
package kubeclient

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Clients are the API clients built from one config.
type Clients struct {
	Kube      kubernetes.Interface
	CRDs      apiextclient.Interface
	Metadata  metadata.Interface
	Discovery discovery.DiscoveryInterface
	// Mapper maps kinds to resources through cached discovery, refreshed on a miss.
	Mapper meta.RESTMapper
	Leases coordclient.CoordinationV1Interface
}

// New builds the clients. Deprecated-version warnings are dropped: operations that touch
// every object of an old version would repeat the same warning thousands of times. A
// conversion webhook's failure reaches the caller at once (FailFastOnConversion).
func New(cfg *rest.Config) (*Clients, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = rest.NoWarnings{}
	cfg.Wrap(FailFastOnConversion)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
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
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	return &Clients{Kube: kube, CRDs: crds, Metadata: md, Discovery: disco, Mapper: mapper, Leases: kube.CoordinationV1()}, nil
}

// DefaultRateLimit is cfg, with no client-side rate limit when it sets none (QPS 0 and no
// RateLimiter, where client-go would fall back to 5 requests per second): an operation
// that touches every object bounds its load by concurrency, and the API server's Priority
// and Fairness paces it (client-go honours its 429 and Retry-After). A limit the caller
// set is kept.
func DefaultRateLimit(cfg *rest.Config) *rest.Config {
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		return NoRateLimit(cfg)
	}
	return cfg
}

// NoRateLimit is a copy of cfg without any client-side rate limit.
func NoRateLimit(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	return c
}

// KubeconfigKeys are the Secret keys a kubeconfig is looked up under when a reference
// names none: Flux's (value, value.yaml; Cluster API uses value too), then a plain kubeconfig key.
var KubeconfigKeys = []string{"value", "value.yaml", "kubeconfig"}

// RemoteTimeout bounds each request to a cluster reached through a kubeconfig Secret (a
// kubeconfig file has no timeout of its own): a remote target that stops answering fails the
// request instead of holding a worker or an admission decision other targets need.
// (Watches of remote targets end sooner on their own: see check's watchTimeout.)
const RemoteTimeout = time.Minute

// ConfigFromSecretRef reads the Secret namespace/name through r and the kubeconfig in it
// (ConfigFromSecret). The Secret is returned too, for callers that key caches on its
// identity; its data is never in an error.
func ConfigFromSecretRef(ctx context.Context, r client.Reader, namespace, name, key string) (*rest.Config, *corev1.Secret, error) {
	s := &corev1.Secret{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, s); err != nil {
		return nil, nil, fmt.Errorf("read kubeconfig Secret %s/%s: %w", namespace, name, err)
	}
	s.Namespace = namespace
	cfg, err := ConfigFromSecret(s, key)
	return cfg, s, err
}

// ConfigFromSecret reads the kubeconfig in a Secret: under key, or under the first of
// KubeconfigKeys present when key is empty. Errors name the Secret and key, never data.
func ConfigFromSecret(s *corev1.Secret, key string) (*rest.Config, error) {
	cfg, _, err := ReadKubeconfig(s, key)
	return cfg, err
}

// Kubeconfig says which kubeconfig of a Secret a config was read from.
type Kubeconfig struct {
	// Key is the key it was read from; "" when the Secret has none of the keys.
	Key string
	// Hash is the first 12 hex digits of the SHA-256 of its bytes ("" without a key): a
	// rotated kubeconfig changes it, and it holds nothing of the content.
	Hash string
}

// ReadKubeconfig is ConfigFromSecret with which kubeconfig it read: the Kubeconfig is
// filled even when the kubeconfig does not parse, so a caller tells a rotated Secret.
// Requests are bounded by RemoteTimeout.
func ReadKubeconfig(s *corev1.Secret, key string) (*rest.Config, Kubeconfig, error) {
	keys := KubeconfigKeys
	if key != "" {
		keys = []string{key}
	}
	for _, k := range keys {
		if data := s.Data[k]; len(data) > 0 {
			sum := sha256.Sum256(data)
			kc := Kubeconfig{Key: k, Hash: hex.EncodeToString(sum[:])[:12]}
			cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
			if err != nil {
				return nil, kc, fmt.Errorf("kubeconfig Secret %s/%s key %s is not a valid kubeconfig: %w", s.Namespace, s.Name, k, err)
			}
			cfg.Timeout = RemoteTimeout
			return cfg, kc, nil
		}
	}
	return nil, Kubeconfig{}, fmt.Errorf("kubeconfig Secret %s/%s has none of the keys %s: name the key in the reference", s.Namespace, s.Name, strings.Join(keys, ", "))
}

// LabelCAPICluster is the label Cluster API puts on a <cluster>-kubeconfig Secret.
const LabelCAPICluster = "cluster.x-k8s.io/cluster-name"

// ClusterName is the cluster a kubeconfig Secret stands for: Cluster API's cluster name
// (its label, or the name of a <cluster>-kubeconfig Secret), else the Secret's name.
func ClusterName(s *corev1.Secret) string {
	if c := s.Labels[LabelCAPICluster]; c != "" {
		return c
	}
	if c, ok := strings.CutSuffix(s.Name, "-kubeconfig"); ok && c != "" {
		return c
	}
	return s.Name
}
