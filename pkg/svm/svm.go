// Package svm owns reading Kubernetes' built-in StorageVersionMigrations
// (storagemigration.k8s.io, run by kube-controller-manager's
// storage-version-migrator-controller): which version a server serves, and which
// migrations are in progress for which CRD, whoever created them. check, the gate, audit
// and the migration engines all ask it, so "a migration is in progress" means one thing.
package svm

import (
	"context"
	"fmt"
	"slices"

	svmv1 "k8s.io/api/storagemigration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// Group is the API group of StorageVersionMigrations.
const Group = "storagemigration.k8s.io"

// Versions are the versions the builtin engine uses, preferred first: v1 (GA in 1.37),
// else v1beta1 (1.35 and 1.36, where enabled). The v1alpha1 of earlier minors has another
// shape and is not used.
var Versions = []string{"v1", "v1beta1"}

// Labels and annotations upgradeguard puts on the StorageVersionMigrations it creates.
const (
	LabelManagedBy       = "app.kubernetes.io/managed-by"
	ManagedBy            = "upgradeguard"
	AnnotationCRD        = "upgradeguard.io/crd"
	AnnotationGeneration = "upgradeguard.io/crd-generation"
)

// Resource is the StorageVersionMigration resource the server serves (see Versions), or
// an empty one when it serves none.
func Resource(disco discovery.DiscoveryInterface) (schema.GroupVersionResource, error) {
	for _, v := range Versions {
		gv := schema.GroupVersion{Group: Group, Version: v}
		list, err := disco.ServerResourcesForGroupVersion(gv.String())
		if kubeclient.IsNotServed(err) {
			continue
		}
		if err != nil {
			return schema.GroupVersionResource{}, fmt.Errorf("discover %s: %w", gv, err)
		}
		for _, r := range list.APIResources {
			if r.Name == "storageversionmigrations" {
				return gv.WithResource(r.Name), nil
			}
		}
	}
	return schema.GroupVersionResource{}, nil
}

// Migration is one StorageVersionMigration in progress.
type Migration struct {
	// Name of the StorageVersionMigration.
	Name string `json:"name"`
	// CRD it migrates (resource.group).
	CRD string `json:"crd"`
	// Upgradeguard says that upgradeguard's builtin engine created it.
	Upgradeguard bool `json:"upgradeguard,omitempty"`
}

// Convert reads a StorageVersionMigration of either served version (they have the same
// shape).
func Convert(obj map[string]any) (*svmv1.StorageVersionMigration, error) {
	s := &svmv1.StorageVersionMigration{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, s); err != nil {
		return nil, fmt.Errorf("read StorageVersionMigration: %w", err)
	}
	return s, nil
}

// Terminal says whether a StorageVersionMigration has succeeded or failed.
func Terminal(s *svmv1.StorageVersionMigration) bool {
	return meta.IsStatusConditionTrue(s.Status.Conditions, string(svmv1.MigrationSucceeded)) ||
		meta.IsStatusConditionTrue(s.Status.Conditions, string(svmv1.MigrationFailed))
}

// Active are the StorageVersionMigrations in progress (neither Succeeded nor Failed), by
// the CRD they migrate. None when the server serves no StorageVersionMigrations or the
// caller may not list them: that is "nothing known to be in progress", not an error.
func Active(ctx context.Context, dyn dynamic.Interface) (map[string][]Migration, error) {
	items, ok, err := list(ctx, dyn)
	if err != nil || !ok {
		return map[string][]Migration{}, err
	}
	return ActiveOf(items)
}

// list lists the StorageVersionMigrations of the first of Versions the server serves,
// without asking discovery first: a LIST of a version the server does not serve is
// answered "not served" (kubeclient.IsNotServed), so a check pays one request where
// discovery and a LIST were two in a row. ok is false when the server serves none or the
// caller may not list them (RBAC names no version: a LIST refused at one version is
// refused at every one).
func list(ctx context.Context, dyn dynamic.Interface) (items []unstructured.Unstructured, ok bool, err error) {
	for _, v := range Versions {
		gvr := schema.GroupVersionResource{Group: Group, Version: v, Resource: "storageversionmigrations"}
		l, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
		switch {
		case kubeclient.IsNotServed(err):
			continue
		case apierrors.IsForbidden(err):
			return nil, false, nil
		case err != nil:
			return nil, false, fmt.Errorf("list StorageVersionMigrations (%s): %w", gvr.GroupVersion(), err)
		}
		return l.Items, true, nil
	}
	return nil, false, nil
}

// ActiveOf is Active over StorageVersionMigrations already read (an informer's).
func ActiveOf(items []unstructured.Unstructured) (map[string][]Migration, error) {
	out := map[string][]Migration{}
	for i := range items {
		s, err := Convert(items[i].Object)
		if err != nil {
			return nil, err
		}
		if Terminal(s) {
			continue
		}
		crd := s.Spec.Resource.Resource + "." + s.Spec.Resource.Group
		ours := s.Labels[LabelManagedBy] == ManagedBy && s.Annotations[AnnotationCRD] == crd
		out[crd] = append(out[crd], Migration{Name: s.Name, CRD: crd, Upgradeguard: ours})
	}
	for crd := range out {
		slices.SortFunc(out[crd], func(a, b Migration) int {
			if a.Name < b.Name {
				return -1
			}
			return 1
		})
	}
	return out, nil
}

// Names are the migrations' names.
func Names(ms []Migration) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// States of a StorageVersionMigration (Existing).
const (
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateRunning   = "running"
	StatePending   = "pending"
)

// Existing is one StorageVersionMigration on the cluster, finished or not.
type Existing struct {
	Name string
	// CRD it covers (resource.group).
	CRD string
	// State is StateSucceeded, StateFailed, StateRunning or StatePending.
	State string
}

// All are the StorageVersionMigrations on the cluster, by name, whatever their state. ok
// is false when the server serves none or the caller may not list them: then nobody can
// tell which names are taken.
func All(ctx context.Context, dyn dynamic.Interface) (out map[string]Existing, ok bool, err error) {
	items, ok, err := list(ctx, dyn)
	if err != nil || !ok {
		return nil, false, err
	}
	out = make(map[string]Existing, len(items))
	for i := range items {
		s, err := Convert(items[i].Object)
		if err != nil {
			return nil, false, err
		}
		crd := s.Spec.Resource.Resource
		if s.Spec.Resource.Group != "" {
			crd += "." + s.Spec.Resource.Group
		}
		out[s.Name] = Existing{Name: s.Name, CRD: crd, State: State(s)}
	}
	return out, true, nil
}

// State says where a StorageVersionMigration is: StateSucceeded, StateFailed,
// StateRunning or StatePending (no migrator has acted on it yet).
func State(s *svmv1.StorageVersionMigration) string {
	switch {
	case meta.IsStatusConditionTrue(s.Status.Conditions, string(svmv1.MigrationSucceeded)):
		return StateSucceeded
	case meta.IsStatusConditionTrue(s.Status.Conditions, string(svmv1.MigrationFailed)):
		return StateFailed
	case meta.IsStatusConditionTrue(s.Status.Conditions, string(svmv1.MigrationRunning)):
		return StateRunning
	}
	return StatePending
}
