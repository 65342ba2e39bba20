package plan

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// state is a predicted cluster: the CRDs as they will be after some steps, the CRDs the
// release deploys then, and the chart version it runs.
type state struct {
	crds    map[string]*apiextv1.CustomResourceDefinition
	current []chartcrds.CRD
	version string
}

// key names a state for the search: the chart version and, per CRD, the storage version,
// the stored versions and the keep annotation.
func (s *state) key() string {
	var b strings.Builder
	b.WriteString(s.version)
	for _, name := range sortedNames(s.crds) {
		c := s.crds[name]
		fmt.Fprintf(&b, "|%s:%s:%s:%s", name, crdversions.StorageVersion(c), strings.Join(c.Status.StoredVersions, ","), c.Annotations[predict.KeepAnnotation])
	}
	return b.String()
}

// clone copies the map; CRDs are copied on write (edit).
func (s *state) clone() *state {
	m := make(map[string]*apiextv1.CustomResourceDefinition, len(s.crds))
	for k, v := range s.crds {
		m[k] = v
	}
	return &state{crds: m, current: s.current, version: s.version}
}

// edit returns a private copy of one CRD of s to change.
func (s *state) edit(name string) *apiextv1.CustomResourceDefinition {
	c := s.crds[name].DeepCopy()
	s.crds[name] = c
	return c
}

// migrated is s after `upgradeguard migrate` of the named CRDs: every object is stored at
// the storage version, and storedVersions is pruned to it.
func (s *state) migrated(names []string) *state {
	n := s.clone()
	for _, name := range names {
		c := n.edit(name)
		c.Status.StoredVersions = []string{crdversions.StorageVersion(c)}
	}
	return n
}

// switched is s after a storage switch of one CRD to version to, with migration and prune.
func (s *state) switched(name, to string) *state {
	n := s.clone()
	c := n.edit(name)
	for i := range c.Spec.Versions {
		c.Spec.Versions[i].Storage = c.Spec.Versions[i].Name == to
	}
	c.Status.StoredVersions = []string{to}
	return n
}

// kept is s after annotating CRDs with helm.sh/resource-policy=keep.
func (s *state) kept(names []string) *state {
	n := s.clone()
	for _, name := range names {
		c := n.edit(name)
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations[predict.KeepAnnotation] = predict.KeepValue
	}
	return n
}

// upgraded is s after Helm applies a chart version (predict.Apply).
func (s *state) upgraded(version string, incoming []chartcrds.CRD, policy predict.Policy) *state {
	return &state{crds: predict.Apply(s.crds, incoming, s.current, policy), current: incoming, version: version}
}

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// predicted is a check.Cluster over a predicted state: check's decision runs on it
// unchanged. Object counts come from the live cluster, once per CRD (a plan changes
// where objects are stored, not how many there are).
type predicted struct {
	s      *state
	counts *counter
}

func (p predicted) CRDs(context.Context) (map[string]*apiextv1.CustomResourceDefinition, error) {
	return p.s.crds, nil
}

func (p predicted) CountObjects(ctx context.Context, crd *apiextv1.CustomResourceDefinition) (int64, error) {
	return p.counts.count(ctx, crd.Name)
}

// ListObjects reads the live cluster's objects for the schema check of each step: a
// field that the real objects hold and a step's schema drops is lost at that step, since
// no later step brings it back. Each page is read once per plan.
func (p predicted) ListObjects(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	return p.counts.list(ctx, gvr, opts)
}

func (c *counter) list(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	ol, ok := c.live.(check.ObjectLister)
	if !ok {
		return &unstructured.UnstructuredList{}, nil
	}
	key := gvr.String() + "|" + opts.Continue
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.pages[key]; ok {
		return l, nil
	}
	l, err := ol.ListObjects(ctx, gvr, opts)
	if err != nil {
		return nil, err
	}
	if c.pages == nil {
		c.pages = map[string]*unstructured.UnstructuredList{}
	}
	c.pages[key] = l
	return l, nil
}

// counter counts a CRD's objects on the live cluster once; a CRD the cluster does not
// have yet has none.
type counter struct {
	live    check.Cluster
	liveMap map[string]*apiextv1.CustomResourceDefinition
	mu      sync.Mutex
	memo    map[string]countResult
	pages   map[string]*unstructured.UnstructuredList
}

type countResult struct {
	n   int64
	err error
}

func (c *counter) count(ctx context.Context, name string) (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.memo[name]; ok {
		return r.n, r.err
	}
	l := c.liveMap[name]
	var r countResult
	if l != nil {
		r.n, r.err = c.live.CountObjects(ctx, l)
	}
	c.memo[name] = r
	return r.n, r.err
}
