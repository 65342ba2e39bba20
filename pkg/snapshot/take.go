package snapshot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	release "helm.sh/helm/v4/pkg/release/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// KeptMetadata are the label and annotation keys (or, ending in "/", key prefixes) a
// snapshot keeps of a CRD, and of a CRD in a release's manifest: those the verdicts read.
// Any other key is left out, since metadata can carry data
// (kubectl.kubernetes.io/last-applied-configuration holds a whole object).
var KeptMetadata = []string{
	"helm.sh/resource-policy", "meta.helm.sh/", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
	"argocd.argoproj.io/", "upgradeguard.io/",
}

// Options say what Take needs to know of the cluster beyond what it reads.
type Options struct {
	// ArgoCDNamespace is the namespace of Argo CD, whose argocd-cm says how it tracks an
	// Application's objects; "" is argoapp.DefaultNamespace.
	ArgoCDNamespace string
}

// Take reads the cluster's state. It only reads: it needs list on
// customresourcedefinitions, on every CRD's objects and on Secrets (Helm's release
// storage), and, when served, on Flux HelmReleases and Argo CD Applications; get on the
// ConfigMap argocd-cm in Argo CD's namespace (o.ArgoCDNamespace), where allowed
// (argoapp.ReadSettings).
func Take(ctx context.Context, cfg *rest.Config, o Options) (*Snapshot, error) {
	start := time.Now()
	t, err := livecluster.Connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{SchemaVersion: SchemaVersion, TakenAt: start.UTC().Truncate(time.Second), CRDs: []CRD{}, Releases: []Release{}}
	s.Server.Version = t.Version
	if v, err := version.ParseGeneric(t.Version); err == nil {
		s.Server.Minor = int(v.Minor())
	}
	live, err := t.Cluster.CRDs(ctx)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(live)) {
		c, err := takeCRD(ctx, t.Cluster, live[name])
		if err != nil {
			return nil, err
		}
		s.CRDs = append(s.CRDs, c)
	}
	if s.Releases, err = takeReleases(ctx, t); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if s.HelmReleases, err = takeHelmReleases(ctx, dyn, live); err != nil {
		return nil, err
	}
	if s.Applications, err = takeApplications(ctx, dyn, live); err != nil {
		return nil, err
	}
	s.ArgoCD = &ArgoCD{Namespace: cmp.Or(o.ArgoCDNamespace, argoapp.DefaultNamespace)}
	if s.ArgoCD.Settings, err = argoapp.ReadSettings(ctx, t.Clientset.CoreV1(), s.ArgoCD.Namespace); err != nil {
		return nil, err
	}
	s.Took = Duration(time.Since(start).Round(time.Millisecond))
	return s, nil
}

// kept is m with only the KeptMetadata keys; nil when none is left.
func kept(m map[string]string) map[string]string {
	var out map[string]string
	for k, v := range m {
		if slices.ContainsFunc(KeptMetadata, func(p string) bool { return k == p || strings.HasSuffix(p, "/") && strings.HasPrefix(k, p) }) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

func takeCRD(ctx context.Context, k *livecluster.KubeCluster, live *apiextv1.CustomResourceDefinition) (CRD, error) {
	c := CRD{Name: live.Name, Labels: kept(live.Labels), Annotations: kept(live.Annotations), Spec: *live.Spec.DeepCopy(),
		StoredVersions: slices.Clone(live.Status.StoredVersions)}
	if w := c.Spec.Conversion; w != nil && w.Webhook != nil && w.Webhook.ClientConfig != nil {
		w.Webhook.ClientConfig.CABundle = nil
	}
	n, err := k.CountObjects(ctx, live)
	switch {
	case apierrors.IsForbidden(err):
		return c, fmt.Errorf("count objects of %s: %w (the snapshot needs list on every CRD's objects)", live.Name, err)
	case err != nil:
		c.ObjectsError = err.Error()
	default:
		c.Objects = n
	}
	if n == 0 || err != nil {
		return c, nil
	}
	counter, err := crdschema.NewFieldCounter(live)
	if err != nil {
		c.FieldsError = err.Error()
		return c, nil
	}
	c.Fields = map[string][]crdschema.FieldPath{}
	for _, v := range live.Spec.Versions {
		if !v.Served {
			continue
		}
		gvr := schema.GroupVersionResource{Group: live.Spec.Group, Version: v.Name, Resource: live.Spec.Names.Plural}
		list := func(ctx context.Context, o metav1.ListOptions) (*unstructured.UnstructuredList, error) {
			return k.ListObjects(ctx, gvr, o)
		}
		for page, err := range kubeclient.Pages(ctx, list, metav1.ListOptions{Limit: crdschema.DefaultPageSize}) {
			if err != nil {
				if apierrors.IsForbidden(err) {
					return c, fmt.Errorf("list %s at %s: %w", gvr.GroupResource(), v.Name, err)
				}
				c.FieldsError = fmt.Sprintf("list %s at %s: %v", gvr.GroupResource(), v.Name, err)
				c.Fields = nil
				return c, nil
			}
			for i := range page.Items {
				counter.Add(v.Name, page.Items[i].Object)
			}
		}
		c.Fields[v.Name] = counter.Paths(v.Name)
	}
	return c, nil
}

// takeReleases reads every namespace's Helm releases from their Secrets.
func takeReleases(ctx context.Context, t *livecluster.Target) ([]Release, error) {
	all, err := helmrelease.NewReader(t.Clientset, "", helmrelease.DriverSecret)
	if err != nil {
		return nil, err
	}
	current, err := all.Releases(ctx)
	if err != nil {
		return nil, err
	}
	out := []Release{}
	for _, cur := range current {
		r, err := helmrelease.NewReader(t.Clientset, cur.Namespace, helmrelease.DriverSecret)
		if err != nil {
			return nil, err
		}
		h, err := r.History(ctx, cur.Name)
		if err != nil {
			return nil, err
		}
		rel := Release{Name: cur.Name, Namespace: cur.Namespace, Revisions: []Revision{}}
		for _, rev := range h {
			rel.Revisions = append(rel.Revisions, revision(rev))
		}
		d := helmrelease.Deployed(h)
		rel.Current = d.Version
		crds, err := chartcrds.All(d.Chart, d.Manifest)
		if err != nil {
			return nil, fmt.Errorf("revision %d of release %s/%s: %w", d.Version, d.Namespace, d.Name, err)
		}
		for _, c := range crds {
			r := ReleaseCRD{Name: c.CRD.Name, File: c.File, Source: string(c.Source), Annotations: kept(c.CRD.Annotations), Storage: crdversions.StorageVersion(c.CRD)}
			for _, v := range c.CRD.Spec.Versions {
				r.Versions = append(r.Versions, v.Name)
			}
			rel.CRDs = append(rel.CRDs, r)
		}
		out = append(out, rel)
	}
	return out, nil
}

func revision(r *release.Release) Revision {
	out := Revision{Revision: r.Version}
	if r.Chart != nil && r.Chart.Metadata != nil {
		out.Chart, out.Version = r.Chart.Metadata.Name, r.Chart.Metadata.Version
	}
	if r.Info != nil {
		out.Status = r.Info.Status.String()
	}
	return out
}

// listServed lists the objects of a CRD at its storage version, when the cluster has it.
func listServed(ctx context.Context, dyn dynamic.Interface, live map[string]*apiextv1.CustomResourceDefinition, name string) ([]unstructured.Unstructured, error) {
	crd := live[name]
	if crd == nil {
		return nil, nil
	}
	var out []unstructured.Unstructured
	for _, v := range crd.Spec.Versions {
		if !v.Storage {
			continue
		}
		gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: v.Name, Resource: crd.Spec.Names.Plural}
		for page, err := range kubeclient.Pages(ctx, dyn.Resource(gvr).List, metav1.ListOptions{Limit: 500}) {
			if err != nil {
				var se apierrors.APIStatus
				if errors.As(err, &se) && apierrors.IsNotFound(err) {
					return nil, nil
				}
				return nil, fmt.Errorf("list %s: %w", gvr.GroupResource(), err)
			}
			out = append(out, page.Items...)
		}
	}
	return out, nil
}

func takeHelmReleases(ctx context.Context, dyn dynamic.Interface, live map[string]*apiextv1.CustomResourceDefinition) ([]HelmRelease, error) {
	items, err := listServed(ctx, dyn, live, "helmreleases.helm.toolkit.fluxcd.io")
	if err != nil {
		return nil, err
	}
	var out []HelmRelease
	for _, o := range items {
		h := HelmRelease{Namespace: o.GetNamespace(), Name: o.GetName()}
		h.StorageNamespace, _, _ = unstructured.NestedString(o.Object, "status", "storageNamespace")
		if hist, _, _ := unstructured.NestedSlice(o.Object, "status", "history"); len(hist) > 0 {
			if m, ok := hist[0].(map[string]any); ok {
				h.Release, _, _ = unstructured.NestedString(m, "name")
				h.Chart, _, _ = unstructured.NestedString(m, "chartName")
				h.Version, _, _ = unstructured.NestedString(m, "chartVersion")
			}
		}
		h.Ready = condition(o, "Ready")
		out = append(out, h)
	}
	return out, nil
}

// takeApplications records every Application: its Helm source and the part of its
// status a prediction reads (argoapp.Status.Recorded).
func takeApplications(ctx context.Context, dyn dynamic.Interface, live map[string]*apiextv1.CustomResourceDefinition) ([]Application, error) {
	items, err := listServed(ctx, dyn, live, argoapp.GVR.GroupResource().String())
	if err != nil {
		return nil, err
	}
	var out []Application
	for i := range items {
		app, err := argoapp.FromUnstructured(&items[i])
		if err != nil {
			return nil, err
		}
		a := Application{Namespace: app.Namespace, Name: app.Name, Destination: app.Spec.Destination.Namespace, Sync: app.Status.Sync.Status,
			Status: app.Status.Recorded()}
		if src, err := app.HelmSource(); err == nil {
			a.RepoURL, a.Chart, a.Path, a.TargetRevision = withoutCredentials(src.RepoURL), src.Chart, src.Path, src.TargetRevision
		}
		out = append(out, a)
	}
	return out, nil
}

// withoutCredentials is a repository URL without the user information or query an URL
// can carry credentials in.
func withoutCredentials(repoURL string) string {
	if !strings.Contains(repoURL, "://") { // a bare OCI host and path, or git's user@host:path
		return repoURL[strings.LastIndex(repoURL, "@")+1:]
	}
	u, err := url.Parse(repoURL)
	if err != nil {
		return ""
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// condition is the status of the object's condition of type typ, "" when it has none.
func condition(o unstructured.Unstructured, typ string) string {
	conds, _, _ := unstructured.NestedSlice(o.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			s, _ := m["status"].(string)
			return s
		}
	}
	return ""
}
