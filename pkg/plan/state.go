package plan

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// state is a predicted cluster: the CRDs as they will be after some steps, the CRDs the
// release deploys then, and the chart version it runs.
type state struct {
	crds    map[string]*apiextv1.CustomResourceDefinition
	current []chartcrds.CRD
	version string
	// svms are the StorageVersionMigrations the upgrade steps before applied, by name:
	// a later step that renders the same name applies it again to no effect. Advice only,
	// so not part of key.
	svms map[string]svm.Existing
}

// key names a state for the search: the chart version and, per CRD, the storage version,
// the stored versions, the keep annotation and the Helm release its ownership names.
func (s *state) key() string {
	var b strings.Builder
	b.WriteString(s.version)
	for _, name := range sortedNames(s.crds) {
		c := s.crds[name]
		fmt.Fprintf(&b, "|%s:%s:%s:%s:%s/%s", name, crdversions.StorageVersion(c), strings.Join(c.Status.StoredVersions, ","), c.Annotations[predict.KeepAnnotation],
			c.Annotations[predict.ReleaseNamespaceAnnotation], c.Annotations[predict.ReleaseNameAnnotation])
	}
	return b.String()
}

// clone copies the map; CRDs are copied on write (edit).
func (s *state) clone() *state {
	m := make(map[string]*apiextv1.CustomResourceDefinition, len(s.crds))
	for k, v := range s.crds {
		m[k] = v
	}
	return &state{crds: m, current: s.current, version: s.version, svms: s.svms}
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

// kept is s after the deployer's keep commands on CRDs (predict.Deployer.Kept:
// helm.sh/resource-policy=keep for Helm, the Prune=false sync option for Argo CD).
func (s *state) kept(d predict.Deployer, names []string) *state {
	n := s.clone()
	for _, name := range names {
		c := n.edit(name)
		c.Annotations = d.Kept(c.Annotations)
	}
	return n
}

// moved is s after the metadata steps of a move (predict.MoveMetadata): the CRD kept on
// the side it leaves, its Helm ownership naming the release it joins.
func (s *state) moved(m predict.CRDMove) *state {
	n := s.clone()
	c := n.edit(m.CRD)
	annotations, labels := predict.MoveMetadata(m)
	c.Annotations, c.Labels = merged(c.Annotations, annotations), merged(c.Labels, labels)
	return n
}

// merged is a copy of a with b's entries set.
func merged(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b))
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}

// live are the named CRDs of s (those it does not hold are left out).
func (s *state) live(names []string) []*apiextv1.CustomResourceDefinition {
	var out []*apiextv1.CustomResourceDefinition
	for _, name := range names {
		if c := s.crds[name]; c != nil {
			out = append(out, c)
		}
	}
	return out
}

// upgraded is s after the deployer upgrades to a chart version (predict.Apply: the CRDs
// it applies, and those it deletes). Each StorageVersionMigration it renders is applied
// too (and no longer new).
func (s *state) upgraded(d predict.Deployer, version string, incoming []chartcrds.CRD, migrations []chartcrds.Migration, policy predict.Policy) *state {
	svms := s.svms
	if len(migrations) > 0 {
		svms = make(map[string]svm.Existing, len(s.svms)+len(migrations))
		for k, v := range s.svms {
			svms[k] = v
		}
		for _, m := range migrations {
			if m.Name != "" {
				svms[m.Name] = svm.Existing{Name: m.Name, CRD: m.CRD(), State: "applied by the upgrade to " + version + " earlier in this plan"}
			}
		}
	}
	return &state{crds: predict.Apply(d, predict.Upgrade, s.crds, incoming, s.current, policy), current: incoming, version: version, svms: svms}
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

// A predicted state answers check's question about admission policies.
var _ check.PolicyEvaluator = predicted{}

// PolicyDenials evaluates the live cluster's admission policies for a planned CRD write:
// live is the CRD as the steps before it leave it (nil: the step creates it), next the
// CRD the step writes. The policies are those of the live cluster (read once, by it),
// and the writes are the plan's: a policy that denies one makes the step impassable.
func (p predicted) PolicyDenials(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) ([]admissionpolicy.Denial, error) {
	return p.counts.policyDenials(ctx, live, next)
}

// Memory is nil: a predicted CRD may carry the live one's UID and resourceVersion with
// another spec (after a storage switch), so a judge kept for the live CRD would be wrong
// for it.
func (p predicted) Memory() *check.Memory { return nil }

// ExistingMigrations are the live cluster's StorageVersionMigrations, with those the
// plan's earlier upgrade steps applied.
func (p predicted) ExistingMigrations(ctx context.Context) (map[string]svm.Existing, bool, error) {
	live, ok, err := p.counts.existingMigrations(ctx)
	if err != nil {
		return nil, false, err
	}
	out := make(map[string]svm.Existing, len(live)+len(p.s.svms))
	for k, v := range live {
		out[k] = v
	}
	for k, v := range p.s.svms {
		out[k] = v
	}
	return out, ok, nil
}

// existingMigrations reads the live cluster's StorageVersionMigrations once per plan.
func (c *counter) existingMigrations(ctx context.Context) (map[string]svm.Existing, bool, error) {
	el, ok := c.live.(check.ExistingMigrationLister)
	if !ok {
		return nil, false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.svms == nil {
		m, known, err := el.ExistingMigrations(ctx)
		if err != nil {
			return nil, false, err
		}
		c.svms = &liveMigrations{m: m, known: known}
	}
	return c.svms.m, c.svms.known, nil
}

type liveMigrations struct {
	m     map[string]svm.Existing
	known bool
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

// policyDenials asks the live cluster's policies (check.PolicyEvaluator; none when the
// cluster cannot evaluate them) about a planned write. When they cannot be read (RBAC),
// check keeps the error on the CRD's report, and the plan names the question as not
// asked (unasked): no dry run of a predicted write reaches the API server's own
// admission to ask it instead.
func (c *counter) policyDenials(ctx context.Context, live, next *apiextv1.CustomResourceDefinition) ([]admissionpolicy.Denial, error) {
	pe, ok := c.live.(check.PolicyEvaluator)
	if !ok {
		return nil, nil
	}
	d, err := pe.PolicyDenials(ctx, live, next)
	if err != nil && ctx.Err() == nil {
		c.mu.Lock()
		if c.policyErr == nil {
			c.policyErr = err
		}
		if !slices.Contains(c.policyCRDs, next.Name) {
			c.policyCRDs = append(c.policyCRDs, next.Name)
		}
		c.mu.Unlock()
	}
	return d, err
}

// unasked are the questions the plan could not ask: the policies, for the CRDs whose
// writes they were not evaluated for (the first error stands for the rest).
func (c *counter) unasked() []check.Unasked {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.policyErr == nil {
		return nil
	}
	crds := slices.Clone(c.policyCRDs)
	slices.Sort(crds)
	return []check.Unasked{{What: check.UnaskedPolicies, Why: c.policyErr.Error(), CRDs: crds}}
}

// counter counts a CRD's objects on the live cluster once; a CRD the cluster does not
// have yet has none. It also keeps what the plan could not ask the live cluster.
type counter struct {
	live    check.Cluster
	liveMap map[string]*apiextv1.CustomResourceDefinition
	mu      sync.Mutex
	memo    map[string]countResult
	pages   map[string]*unstructured.UnstructuredList
	svms    *liveMigrations
	// policyErr is why the admission policies could not be evaluated, and policyCRDs
	// the CRDs whose writes they were not evaluated for.
	policyErr  error
	policyCRDs []string
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
