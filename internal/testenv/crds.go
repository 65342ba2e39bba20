package testenv

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apiextv1client "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/config"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// ReadCRDs reads CRDs from fixture files, given relative to the fixtures directory.
func ReadCRDs(files ...string) ([]*apiextv1.CustomResourceDefinition, error) {
	dir, err := Fixtures()
	if err != nil {
		return nil, err
	}
	var out []*apiextv1.CustomResourceDefinition
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, err
		}
		crds, err := crdversions.FromManifest(f, data)
		if err != nil {
			return nil, err
		}
		out = append(out, crds...)
	}
	return out, nil
}

// ApplyCRD creates the CRD or replaces the spec of the live one, as an apply does, and
// returns the API server's answer. A created CRD is waited for until it is Established.
func ApplyCRD(ctx context.Context, cs apiextclient.Interface, crd *apiextv1.CustomResourceDefinition) error {
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	_, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		obj := crd.DeepCopy()
		obj.ResourceVersion, obj.Status = "", apiextv1.CustomResourceDefinitionStatus{}
		if _, err := api.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return err
		}
		return WaitEstablished(ctx, cs, crd.Name)
	case err != nil:
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		live, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		live.Spec = crd.Spec
		if live.Annotations == nil {
			live.Annotations = map[string]string{}
		}
		for k, v := range crd.Annotations {
			live.Annotations[k] = v
		}
		_, err = api.Update(ctx, live, metav1.UpdateOptions{})
		return err
	})
}

// SetStoredVersions sets status.storedVersions through the status subresource, which the
// API server accepts for any subset of spec.versions holding the storage version. Tests
// use it to stand for a long-lived cluster that ran every release.
func SetStoredVersions(ctx context.Context, cs apiextclient.Interface, name string, stored ...string) error {
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		live, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		live.Status.StoredVersions = stored
		_, err = api.UpdateStatus(ctx, live, metav1.UpdateOptions{})
		return err
	})
}

// WaitEstablished waits until the CRD's Established condition is true.
func WaitEstablished(ctx context.Context, cs apiextclient.Interface, name string) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// AllowCRDDeletion annotates the CRDs match selects upgradeguard.io/allow-delete=true, so
// that a client that deletes them with their objects (helm-controller uninstalling a
// scenario's release) gets past upgradeguard's CRD deletion guard.
func (cp *ControlPlane) AllowCRDDeletion(ctx context.Context, match func(*apiextv1.CustomResourceDefinition) bool) error {
	cs, err := apiextclient.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"true"}}}`, predict.AllowDeleteAnnotation)
	for i := range list.Items {
		if !match(&list.Items[i]) {
			continue
		}
		if _, err := api.Patch(ctx, list.Items[i].Name, types.MergePatchType, patch, metav1.PatchOptions{}); ignoreNotFound(err) != nil {
			return fmt.Errorf("allow the deletion of CRD %s: %w", list.Items[i].Name, err)
		}
	}
	return nil
}

// DeleteAllCRDs deletes every custom resource, then every CRD, and waits until they are
// gone, so that the next scenario starts from an empty cluster. Instances are deleted
// explicitly: on this control plane they can outlive their CRD in etcd, and a later CRD of
// the same name would then meet objects stored at versions it does not know.
func (cp *ControlPlane) DeleteAllCRDs(ctx context.Context) error { return cp.DeleteCRDs(ctx, nil) }

// DeleteCRDs is DeleteAllCRDs for the CRDs keep does not keep (nil keeps none).
func (cp *ControlPlane) DeleteCRDs(ctx context.Context, keep func(*apiextv1.CustomResourceDefinition) bool) error {
	cs, err := apiextclient.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	md, err := metadata.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var doomed []string
	for _, crd := range list.Items {
		if keep != nil && keep(&crd) {
			continue
		}
		doomed = append(doomed, crd.Name)
		if crd.DeletionTimestamp != nil {
			continue // being deleted: the API server's finalizer deletes its instances
		}
		if crd.Spec.Conversion != nil && crd.Spec.Conversion.Strategy == apiextv1.WebhookConverter {
			// A conversion webhook that is not running would make the instances unlistable.
			crd.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.NoneConverter}
			if _, err := api.Update(ctx, &crd, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("drop the conversion webhook of %s before deleting it: %w", crd.Name, err)
			}
		}
		gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: crdversions.ServedVersion(&crd), Resource: crd.Spec.Names.Plural}
		var objs *metav1.PartialObjectMetadataList
		var last error
		// A version added a moment ago may not be served yet, and a conversion webhook
		// dropped a moment ago may still be called (the API server switches converters
		// asynchronously, and retries a refused webhook): try again, each attempt bounded.
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			attempt, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			objs, last = md.Resource(gvr).List(attempt, metav1.ListOptions{})
			if apierrors.IsNotFound(last) && deleting(ctx, api, crd.Name) {
				// Deleted meanwhile (by a test's clean-up, or Helm): the API server's
				// finalizer deletes its instances.
				objs, last = &metav1.PartialObjectMetadataList{}, nil
			}
			return last == nil, nil
		})
		if err != nil {
			return fmt.Errorf("list %s before deleting it: %w (last answer: %w)", crd.Name, err, last)
		}
		namespaces := map[string]bool{}
		for _, o := range objs.Items {
			namespaces[o.Namespace] = true
		}
		for ns := range namespaces {
			ri := md.Resource(gvr).Namespace(ns)
			if ns == "" {
				ri = md.Resource(gvr)
			}
			if err := ri.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				return fmt.Errorf("delete %s in %q: %w", crd.Name, ns, err)
			}
		}
	}
	for _, name := range doomed {
		if err := api.Delete(ctx, name, metav1.DeleteOptions{}); ignoreNotFound(err) != nil {
			return fmt.Errorf("delete CRD %s: %w", name, err)
		}
	}
	var left *apiextv1.CustomResourceDefinition
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, name := range doomed {
			crd, err := api.Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				left = crd
			}
			if !apierrors.IsNotFound(err) {
				return false, ignoreNotFound(err)
			}
		}
		return true, nil
	})
	if err != nil && left != nil {
		// Say what holds the deletion: the finalizer's conditions name it.
		return fmt.Errorf("CRD %s is not gone 2 minutes after its deletion (finalizers %v, conditions %+v): %w",
			left.Name, left.Finalizers, left.Status.Conditions, err)
	}
	return err
}

// deleting says whether CRD name is gone or being deleted.
func deleting(ctx context.Context, api apiextv1client.CustomResourceDefinitionInterface, name string) bool {
	crd, err := api.Get(ctx, name, metav1.GetOptions{})
	return apierrors.IsNotFound(err) || (err == nil && crd.DeletionTimestamp != nil)
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// ApplyCRDServerSide applies a CRD with server-side apply as the given field manager,
// without forcing conflicts: what Helm 4 does (manager "helm").
func ApplyCRDServerSide(ctx context.Context, cfg *rest.Config, crd *apiextv1.CustomResourceDefinition, manager string) error {
	if err := applyCRDServerSide(ctx, cfg, crd, metav1.ApplyOptions{FieldManager: manager}); err != nil {
		return err
	}
	cs, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return WaitEstablished(ctx, cs, crd.Name)
}

// DryRunApplyCRDServerSide is ApplyCRDServerSide as a server-side dry run (what
// `kubectl apply --server-side --dry-run=server` and Argo CD's server-side diff send):
// admission runs, nothing is stored.
func DryRunApplyCRDServerSide(ctx context.Context, cfg *rest.Config, crd *apiextv1.CustomResourceDefinition, manager string) error {
	return applyCRDServerSide(ctx, cfg, crd, metav1.ApplyOptions{FieldManager: manager, DryRun: []string{metav1.DryRunAll}})
}

func applyCRDServerSide(ctx context.Context, cfg *rest.Config, crd *apiextv1.CustomResourceDefinition, o metav1.ApplyOptions) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	obj := crd.DeepCopy()
	obj.Status = apiextv1.CustomResourceDefinitionStatus{}
	obj.ResourceVersion, obj.ManagedFields = "", nil
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	un := &unstructured.Unstructured{Object: u}
	un.SetAPIVersion(apiextv1.SchemeGroupVersion.String())
	un.SetKind("CustomResourceDefinition")
	unstructured.RemoveNestedField(un.Object, "status")
	unstructured.RemoveNestedField(un.Object, "metadata", "creationTimestamp")
	gvr := apiextv1.SchemeGroupVersion.WithResource("customresourcedefinitions")
	_, err = dyn.Resource(gvr).Apply(ctx, crd.Name, un, o)
	return err
}

// ApplyUpgradeguardCRDs installs upgradeguard's own CRDs (config/crd) and waits until
// they are established.
func ApplyUpgradeguardCRDs(ctx context.Context, cfg *rest.Config) error {
	cs, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var served []string // group/version resource, for discovery
	err = fs.WalkDir(config.CRDs, "crd", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := config.CRDs.ReadFile(path)
		if err != nil {
			return err
		}
		crd := &apiextv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if err := ApplyCRD(ctx, cs, crd); err != nil {
			return err
		}
		for _, v := range crd.Spec.Versions {
			if v.Served {
				served = append(served, crd.Spec.Group+"/"+v.Name+" "+crd.Spec.Names.Plural)
			}
		}
		return WaitEstablished(ctx, cs, crd.Name)
	})
	if err != nil {
		return err
	}
	// Established is not yet served by discovery, which the controller checks at start.
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		for _, s := range served {
			gv, plural, _ := strings.Cut(s, " ")
			list, err := disco.ServerResourcesForGroupVersion(gv)
			if err != nil || !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == plural }) {
				return false, nil //nolint:nilerr // not served yet: poll again
			}
		}
		return true, nil
	})
}

// FixtureSet lists the CRD files of one fixture set, e.g.
// FixtureSet("flux-source-controller/v1.6.0"), as paths ReadCRDs takes.
func FixtureSet(set string) ([]string, error) {
	root, err := Fixtures()
	if err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(root, "crds", set))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, filepath.Join("crds", set, e.Name()))
	}
	return out, nil
}

// ApplyFixtureCRDs reads CRD files (see ReadCRDs), applies them and waits until each is
// established.
func ApplyFixtureCRDs(ctx context.Context, cs apiextclient.Interface, files ...string) error {
	crds, err := ReadCRDs(files...)
	if err != nil {
		return err
	}
	for _, c := range crds {
		if err := ApplyCRD(ctx, cs, c); err != nil {
			return fmt.Errorf("apply %s: %w", c.Name, err)
		}
		if err := WaitEstablished(ctx, cs, c.Name); err != nil {
			return err
		}
	}
	return nil
}

// TwoVersionCRD is a namespaced CRD <plural>.<group> of kind with versions v1alpha1
// (storage) and v1, both served, and a schema that keeps any field: the smallest CRD that
// can hold objects at an old storage version.
func TwoVersionCRD(group, plural, kind string) *apiextv1.CustomResourceDefinition {
	keepAll := true
	schemaAny := &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: &keepAll}}
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: group, Scope: apiextv1.NamespaceScoped,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: plural, Singular: strings.ToLower(kind), Kind: kind, ListKind: kind + "List"},
			Versions: []apiextv1.CustomResourceDefinitionVersion{
				{Name: "v1alpha1", Served: true, Storage: true, Schema: schemaAny},
				{Name: "v1", Served: true, Storage: false, Schema: schemaAny.DeepCopy()},
			},
		},
	}
}
