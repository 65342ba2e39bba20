package snapshot

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	chartcommon "helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Cluster is a snapshot read as check reads a live cluster: the CRDs, their object
// counts and, for the schema check, skeletons of their objects (crdschema.Skeletons).
// The API server cannot be asked whether it accepts a CRD (AdmitCRD says so), and no
// StorageVersionMigration in progress is known.
type Cluster struct {
	s    *Snapshot
	once sync.Once
	crds map[string]*apiextv1.CustomResourceDefinition
}

var (
	_ check.Cluster        = (*Cluster)(nil)
	_ check.ObjectLister   = (*Cluster)(nil)
	_ check.Server         = (*Cluster)(nil)
	_ check.SkeletonLister = (*Cluster)(nil)
	_ fluxrelease.Recorded = (*Cluster)(nil)
)

// Cluster is the snapshot as check reads a cluster.
func (s *Snapshot) Cluster() *Cluster { return &Cluster{s: s} }

// Snapshot is the snapshot read.
func (c *Cluster) Snapshot() *Snapshot { return c.s }

// CRDs returns the snapshot's CRDs as the API server served them, the metadata the
// snapshot keeps aside.
func (c *Cluster) CRDs(context.Context) (map[string]*apiextv1.CustomResourceDefinition, error) {
	c.once.Do(func() {
		c.crds = map[string]*apiextv1.CustomResourceDefinition{}
		for _, r := range c.s.CRDs {
			crd := &apiextv1.CustomResourceDefinition{
				TypeMeta:   metav1.TypeMeta{APIVersion: apiextv1.SchemeGroupVersion.String(), Kind: "CustomResourceDefinition"},
				ObjectMeta: metav1.ObjectMeta{Name: r.Name, Labels: r.Labels, Annotations: r.Annotations},
				Spec:       *r.Spec.DeepCopy(),
			}
			crd.Status.StoredVersions = append([]string(nil), r.StoredVersions...)
			c.crds[r.Name] = crd
		}
	})
	out := make(map[string]*apiextv1.CustomResourceDefinition, len(c.crds))
	for k, v := range c.crds {
		out[k] = v.DeepCopy()
	}
	return out, nil
}

func (c *Cluster) crd(name string) *CRD {
	for i := range c.s.CRDs {
		if c.s.CRDs[i].Name == name {
			return &c.s.CRDs[i]
		}
	}
	return nil
}

// CountObjects is the count the snapshot took.
func (c *Cluster) CountObjects(_ context.Context, crd *apiextv1.CustomResourceDefinition) (int64, error) {
	r := c.crd(crd.Name)
	switch {
	case r == nil:
		return 0, fmt.Errorf("%s is not in the snapshot", crd.Name)
	case r.ObjectsError != "":
		return 0, errors.New(r.ObjectsError)
	}
	return r.Objects, nil
}

// Memory is nil: a snapshot is read afresh.
func (c *Cluster) Memory() *check.Memory { return nil }

// SkeletonObjects is true: ListObjects returns skeletons.
func (c *Cluster) SkeletonObjects() bool { return true }

// ListObjects returns, in one page, skeletons of the objects of the CRD of gvr read at
// gvr's version: as many as the snapshot counted, holding the field paths it counted.
func (c *Cluster) ListObjects(_ context.Context, gvr schema.GroupVersionResource, _ metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	var r *CRD
	for i := range c.s.CRDs {
		if c.s.CRDs[i].Spec.Group == gvr.Group && c.s.CRDs[i].Spec.Names.Plural == gvr.Resource {
			r = &c.s.CRDs[i]
		}
	}
	switch {
	case r == nil:
		return nil, fmt.Errorf("%s is not in the snapshot", gvr.GroupResource())
	case r.FieldsError != "":
		return nil, fmt.Errorf("the snapshot could not read the objects: %s", r.FieldsError)
	}
	list := &unstructured.UnstructuredList{}
	paths, ok := r.Fields[gvr.Version]
	if r.Objects > 0 && !ok {
		return nil, fmt.Errorf("the snapshot holds no field paths of %s at %s", gvr.GroupResource(), gvr.Version)
	}
	apiVersion := schema.GroupVersion{Group: gvr.Group, Version: gvr.Version}.String()
	for _, o := range crdschema.Skeletons(apiVersion, r.Spec.Names.Kind, r.Objects, paths) {
		list.Items = append(list.Items, unstructured.Unstructured{Object: o})
	}
	return list, nil
}

// ServerVersion is the API server's version when the snapshot was taken.
func (c *Cluster) ServerVersion(context.Context) (string, error) { return c.s.Server.Version, nil }

// ErrNotAsked says a snapshot cannot ask the API server whether it accepts a CRD.
var ErrNotAsked = errors.New("a snapshot cannot ask the API server whether it accepts the CRD (a dry-run write): the live cluster decides that when the upgrade is applied")

// AdmitCRD cannot ask: ErrNotAsked. check then evaluates the CRD's own validation
// here (crdschema.Validate) and says the dry run (the webhooks) was not asked.
func (c *Cluster) AdmitCRD(context.Context, *apiextv1.CustomResourceDefinition, *apiextv1.CustomResourceDefinition) (*crdschema.Refusal, error) {
	return nil, ErrNotAsked
}

// Releases reads the namespace's releases as the snapshot holds them: each revision's
// chart and status, and the current revision's CRDs, through Helm's memory driver.
func (c *Cluster) Releases(namespace string) (*helmrelease.Reader, error) {
	mem := driver.NewMemory()
	store := storage.Init(mem)
	for _, r := range c.s.Releases {
		if r.Namespace != namespace {
			continue
		}
		for _, rev := range r.Revisions {
			rel := &release.Release{Name: r.Name, Namespace: r.Namespace, Version: rev.Revision,
				Info:  &release.Info{Status: common.Status(rev.Status)},
				Chart: &chart.Chart{Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: rev.Chart, Version: rev.Version}}}
			if rev.Revision == r.Current {
				if err := carry(rel, r.CRDs); err != nil {
					return nil, fmt.Errorf("release %s/%s in the snapshot: %w", r.Namespace, r.Name, err)
				}
			}
			if err := store.Create(rel); err != nil {
				return nil, fmt.Errorf("release %s/%s in the snapshot: %w", r.Namespace, r.Name, err)
			}
		}
	}
	mem.SetNamespace(namespace)
	return helmrelease.NewDriverReader(mem, namespace, helmrelease.DriverSecret), nil
}

// carry puts the CRDs into the revision where Helm keeps them: a crds/ file of its chart,
// or a document of its manifest, each a CRD with only its name and kept annotations.
func carry(rel *release.Release, crds []ReleaseCRD) error {
	for _, c := range crds {
		crd := apiextv1.CustomResourceDefinition{
			TypeMeta:   metav1.TypeMeta{APIVersion: apiextv1.SchemeGroupVersion.String(), Kind: "CustomResourceDefinition"},
			ObjectMeta: metav1.ObjectMeta{Name: c.Name, Annotations: c.Annotations},
		}
		plural, group, _ := strings.Cut(c.Name, ".")
		crd.Spec.Group, crd.Spec.Names.Plural = group, plural
		for _, v := range c.Versions {
			crd.Spec.Versions = append(crd.Spec.Versions, apiextv1.CustomResourceDefinitionVersion{Name: v, Served: true, Storage: v == c.Storage})
		}
		b, err := yaml.Marshal(crd)
		if err != nil {
			return err
		}
		if predict.Source(c.Source) == predict.CRDsDir {
			ch, name := chartOf(rel.Chart, c.File)
			ch.Files = append(ch.Files, &chartcommon.File{Name: name, Data: b})
			continue
		}
		rel.Manifest += fmt.Sprintf("---\n# Source: %s\n%s", c.File, b)
	}
	return nil
}

// chartOf is the chart or subchart of root whose crds/ folder holds file
// (root/charts/sub/crds/x.yaml: the subchart sub, made as needed), and the file's name in
// it (crds/x.yaml), so that the chart's CRDObjects name the file as the release's did.
func chartOf(root *chart.Chart, file string) (*chart.Chart, string) {
	i := strings.LastIndex(file, "/crds/")
	if i < 0 {
		return root, "crds/" + file
	}
	dir, name := file[:i], file[i+1:]
	parts := strings.Split(dir, "/")
	ch := root
	for j := 2; j < len(parts); j += 2 { // parts: root, charts, sub, charts, subsub...
		var next *chart.Chart
		for _, d := range ch.Dependencies() {
			if d.Name() == parts[j] {
				next = d
			}
		}
		if next == nil {
			next = &chart.Chart{Metadata: &chart.Metadata{APIVersion: chart.APIVersionV2, Name: parts[j]}}
			ch.AddDependency(next)
		}
		ch = next
	}
	return ch, name
}
