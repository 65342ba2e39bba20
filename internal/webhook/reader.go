package webhook

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// memoryReader is the reader a decision uses when the gate keeps state between
// decisions: every kind it reads (Flux sources, StorageMigrationPolicies,
// StorageMigrations, HelmReleases) from the manager's cache, whose informers lag the API
// server by what their watches have not delivered yet; Secrets (values, repository
// credentials, kubeConfig) through a metadata-only informer that says whether a Secret
// kept from an earlier read is still at the same resourceVersion, so an unchanged Secret
// is not read again and a changed one is; ConfigMaps through to the API server. No Secret
// data is kept beyond maxKeptSecrets Secrets, and none is ever cached cluster-wide.
type memoryReader struct {
	cache   client.Reader // the manager's cache
	api     client.Reader // reads through to the API server
	secrets *lru.Cache    // namespace/name -> *corev1.Secret
}

// maxKeptSecrets bounds the Secrets a gate keeps.
const maxKeptSecrets = 64

func newMemoryReader(cache, api client.Reader) *memoryReader {
	return &memoryReader{cache: cache, api: api, secrets: lru.New(maxKeptSecrets)}
}

// freshKey marks a decision that reads through to the API server (readFresh).
type freshKey struct{}

// readFresh makes a memoryReader read through to the API server for the decision of
// ctx: the CRD door's, the last line for what the other doors admitted on lagging state.
func readFresh(ctx context.Context) context.Context { return context.WithValue(ctx, freshKey{}, true) }

func isFresh(ctx context.Context) bool { return ctx.Value(freshKey{}) != nil }

func (r *memoryReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if isFresh(ctx) {
		return r.api.Get(ctx, key, obj, opts...)
	}
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		return r.api.Get(ctx, key, obj, opts...)
	case *corev1.Secret:
		return r.secret(ctx, key, o, opts...)
	}
	return r.cache.Get(ctx, key, obj, opts...)
}

func (r *memoryReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if isFresh(ctx) {
		return r.api.List(ctx, list, opts...)
	}
	switch list.(type) {
	case *corev1.ConfigMapList, *corev1.SecretList:
		return r.api.List(ctx, list, opts...)
	}
	return r.cache.List(ctx, list, opts...)
}

// secret reads a Secret, from memory when the metadata informer has it at the
// resourceVersion of the copy kept.
func (r *memoryReader) secret(ctx context.Context, key client.ObjectKey, s *corev1.Secret, opts ...client.GetOption) error {
	var meta metav1.PartialObjectMetadata
	meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if err := r.cache.Get(ctx, key, &meta); err == nil {
		if v, ok := r.secrets.Get(key.String()); ok {
			if kept := v.(*corev1.Secret); kept.UID == meta.UID && kept.ResourceVersion == meta.ResourceVersion {
				kept.DeepCopyInto(s)
				return nil
			}
		}
	}
	if err := r.api.Get(ctx, key, s, opts...); err != nil {
		return err
	}
	r.secrets.Add(key.String(), s.DeepCopy())
	return nil
}
