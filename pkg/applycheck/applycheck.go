// Package applycheck owns the server-side-apply pre-flight of a Helm 4 upgrade. Helm 4
// applies each object with server-side apply as field manager "helm" (Flux:
// "helm-controller") and, for helm, without forcing conflicts: a field another manager
// owns makes the upgrade stop at that object, leaving the objects before it applied. A
// server-side apply with dryRun=All, the same manager and no force returns the same 409
// with the conflicting fields and their managers, and writes nothing; Run does that for
// every object, in Helm's apply order.
package applycheck

import (
	"context"
	"errors"
	"fmt"
	"strings"

	releaseutil "helm.sh/helm/v4/pkg/release/v1/util"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// Status of one object's dry run.
type Status string

const (
	// Applies means the dry run succeeded.
	Applies Status = "applies"
	// Conflicts means another field manager owns fields the chart sets.
	Conflicts Status = "conflict"
	// Fails means the dry run failed for another reason (validation, admission).
	Fails Status = "error"
	// NotReached means a real upgrade would stop before this object.
	NotReached Status = "notReached"
)

// FieldConflict is one field another manager owns.
type FieldConflict struct {
	Field   string `json:"field"`
	Manager string `json:"manager"`
}

// Object is the dry-run result for one object, in apply order.
type Object struct {
	Object    string          `json:"object"` // Kind/namespace/name
	Status    Status          `json:"status"`
	Conflicts []FieldConflict `json:"conflicts,omitempty"`
	Error     string          `json:"error,omitempty"`
	// DryRunStatus is what the dry run itself answered, for objects a real upgrade
	// would not reach.
	DryRunStatus Status `json:"dryRunStatus,omitempty"`
}

// Report is the pre-flight of one upgrade.
type Report struct {
	FieldManager string   `json:"fieldManager"`
	Safe         bool     `json:"safe"`
	Objects      []Object `json:"objects"`
	// StopsAt is the object a real upgrade stops at, and PartialState what it would have
	// applied before: the half-applied state a failed upgrade leaves.
	StopsAt      string   `json:"stopsAt,omitempty"`
	PartialState []string `json:"partialState"`
}

// Options for Run.
type Options struct {
	FieldManager string
	// Force forces conflicts, as Flux's helm-controller does: conflicts then only warn.
	Force bool
	// Namespace is the release namespace, for namespaced objects that name none.
	Namespace string
}

// Run dry-runs every object of a rendered manifest in Helm's install order.
func Run(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, manifest string, o Options) (*Report, error) {
	objs, err := Objects(manifest)
	if err != nil {
		return nil, err
	}
	rep := &Report{FieldManager: o.FieldManager, Safe: true, Objects: []Object{}, PartialState: []string{}}
	stopped := false
	for _, obj := range objs {
		res, err := dryRun(ctx, dyn, mapper, obj, o)
		if err != nil {
			return nil, err
		}
		if res.Status != Applies {
			rep.Safe = false
		}
		switch {
		case stopped:
			res.DryRunStatus, res.Status = res.Status, NotReached
		case res.Status == Applies:
			rep.PartialState = append(rep.PartialState, res.Object)
		default:
			stopped, rep.StopsAt = true, res.Object
		}
		rep.Objects = append(rep.Objects, res)
	}
	if !stopped {
		rep.PartialState = []string{}
	}
	return rep, nil
}

func dryRun(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured, o Options) (Object, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return Object{Object: Subject(obj), Status: Fails, Error: fmt.Sprintf("the cluster does not serve %s: %v", gvk, err)}, nil
	}
	ri := dynamic.ResourceInterface(dyn.Resource(mapping.Resource))
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(o.Namespace)
		}
		ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	res := Object{Object: Subject(obj), Status: Applies}
	_, err = ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: o.FieldManager, Force: o.Force, DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
	case apierrors.IsConflict(err):
		res.Status, res.Conflicts = Conflicts, conflicts(err)
		res.Error = err.Error()
	case apierrors.IsForbidden(err) && !strings.Contains(err.Error(), "admission webhook"):
		return Object{}, fmt.Errorf("dry-run apply of %s: %w", res.Object, err)
	default:
		res.Status, res.Error = Fails, err.Error()
	}
	return res, nil
}

// conflicts reads the field manager conflicts out of a 409.
func conflicts(err error) []FieldConflict {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return nil
	}
	var out []FieldConflict
	for _, c := range status.Status().Details.Causes {
		if c.Type != metav1.CauseTypeFieldManagerConflict {
			continue
		}
		manager := c.Message
		if _, rest, ok := strings.Cut(c.Message, `conflict with "`); ok {
			manager, _, _ = strings.Cut(rest, `"`)
		}
		out = append(out, FieldConflict{Field: c.Field, Manager: manager})
	}
	return out
}

// Subject names an object as Kind/namespace/name (Kind/name when cluster-scoped).
func Subject(obj *unstructured.Unstructured) string {
	if obj.GetNamespace() == "" {
		return obj.GetKind() + "/" + obj.GetName()
	}
	return obj.GetKind() + "/" + obj.GetNamespace() + "/" + obj.GetName()
}

// Subjects lists the Kind/namespace/name of every object of a manifest, in apply order.
func Subjects(manifest string) []string {
	objs, _ := Objects(manifest)
	out := make([]string, 0, len(objs))
	for _, obj := range objs {
		out = append(out, Subject(obj))
	}
	return out
}

// Objects splits a rendered manifest into objects in Helm's install order.
func Objects(manifest string) ([]*unstructured.Unstructured, error) {
	_, manifests, err := releaseutil.SortManifests(releaseutil.SplitManifests(manifest), nil, releaseutil.InstallOrder)
	if err != nil {
		return nil, fmt.Errorf("split manifest: %w", err)
	}
	out := make([]*unstructured.Unstructured, 0, len(manifests))
	for _, m := range manifests {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(m.Content), &obj.Object); err != nil || obj.Object == nil {
			continue
		}
		out = append(out, obj)
	}
	return out, nil
}
