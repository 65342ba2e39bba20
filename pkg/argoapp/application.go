// Package argoapp owns reading an Argo CD Application (argoproj.io/v1alpha1) the way Argo
// CD's repo-server reads it, and turning its Helm source into the chart source the rest of
// upgradeguard predicts with: the chart (a Helm repository, an OCI registry, or a path in a
// git repository), the target revision, the release name, the destination namespace and
// the Helm values, parameters and values files. Argo CD renders with `helm template
// --include-crds` and applies every CRD on each sync, so the CRD policy is create-replace
// (helm with skipCrds). Only Helm sources are read; other shapes are an *UnsupportedError
// that says what to run instead. The package reads through the Kubernetes API and never
// prints; it does not depend on Argo CD's own module.
package argoapp

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// GVR is Argo CD's Application resource.
var GVR = schema.GroupVersionResource{Group: "argoproj.io", Version: "v1alpha1", Resource: "applications"}

// Application is the part of an Argo CD Application that upgradeguard reads. The field
// names and JSON tags are Argo CD's.
type Application struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              Spec   `json:"spec"`
	Status            Status `json:"status,omitempty"`
}

// Spec is the Application's spec: what it deploys, and where.
type Spec struct {
	Source      *Source     `json:"source,omitempty"`
	Sources     []Source    `json:"sources,omitempty"`
	Destination Destination `json:"destination"`
	Project     string      `json:"project,omitempty"`
	SyncPolicy  *SyncPolicy `json:"syncPolicy,omitempty"`
}

// SyncPolicy is how the Application syncs: automatically or not, and with which options.
type SyncPolicy struct {
	Automated *Automated `json:"automated,omitempty"`
	// SyncOptions are the Application's sync options ("Prune=false",
	// "PrunePropagationPolicy=orphan", "ServerSideApply=true", ...).
	SyncOptions []string `json:"syncOptions,omitempty"`
}

// Automated is the automated sync policy.
type Automated struct {
	// Prune deletes, on each automated sync, what the sources no longer render.
	Prune    bool `json:"prune,omitempty"`
	SelfHeal bool `json:"selfHeal,omitempty"`
	// Enabled false turns automated sync off while keeping its settings (nil: on).
	Enabled *bool `json:"enabled,omitempty"`
}

// Destination is where the Application deploys.
type Destination struct {
	Server    string `json:"server,omitempty"`
	Name      string `json:"name,omitempty"`
	Namespace string `json:"namespace,omitempty"`
}

// Source is one source of an Application.
type Source struct {
	RepoURL        string `json:"repoURL"`
	Path           string `json:"path,omitempty"`
	TargetRevision string `json:"targetRevision,omitempty"`
	Chart          string `json:"chart,omitempty"`
	// Ref names the source for $ref/ values files of other sources.
	Ref  string `json:"ref,omitempty"`
	Helm *Helm  `json:"helm,omitempty"`
	// The other source types: only whether they are set is read.
	Kustomize *runtime.RawExtension `json:"kustomize,omitempty"`
	Directory *runtime.RawExtension `json:"directory,omitempty"`
	Plugin    *runtime.RawExtension `json:"plugin,omitempty"`
}

// Helm is a source's Helm options.
type Helm struct {
	ValueFiles              []string              `json:"valueFiles,omitempty"`
	Parameters              []Parameter           `json:"parameters,omitempty"`
	FileParameters          []FileParameter       `json:"fileParameters,omitempty"`
	ReleaseName             string                `json:"releaseName,omitempty"`
	Values                  string                `json:"values,omitempty"`
	ValuesObject            *runtime.RawExtension `json:"valuesObject,omitempty"`
	IgnoreMissingValueFiles bool                  `json:"ignoreMissingValueFiles,omitempty"`
	SkipCrds                bool                  `json:"skipCrds,omitempty"`
	Namespace               string                `json:"namespace,omitempty"`
	KubeVersion             string                `json:"kubeVersion,omitempty"`
	APIVersions             []string              `json:"apiVersions,omitempty"`
	PassCredentials         bool                  `json:"passCredentials,omitempty"`
}

// Parameter is a --set (or, with ForceString, --set-string) value.
type Parameter struct {
	Name        string `json:"name"`
	Value       string `json:"value"`
	ForceString bool   `json:"forceString,omitempty"`
}

// FileParameter is a --set-file value: the file's path, relative to the chart.
type FileParameter struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Status is the part of the Application's status that audit and plan read.
type Status struct {
	Resources []ResourceStatus `json:"resources,omitempty"`
	Sync      struct {
		Status    string   `json:"status,omitempty"`
		Revision  string   `json:"revision,omitempty"`
		Revisions []string `json:"revisions,omitempty"`
	} `json:"sync,omitempty"`
	// History has one entry per successful sync, the newest last.
	History []HistoryEntry `json:"history,omitempty"`
	// Conditions are Argo CD's errors and warnings about the Application
	// (ComparisonError, SyncError, ...).
	Conditions []Condition `json:"conditions,omitempty"`
}

// Condition is one of status.conditions.
type Condition struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// HistoryEntry is one sync in status.history: the revision it deployed (Revisions, one
// per source, for an Application with spec.sources).
type HistoryEntry struct {
	Revision  string   `json:"revision,omitempty"`
	Revisions []string `json:"revisions,omitempty"`
}

// Where Application.Deployed read the deployed revision.
const (
	FromHistory      = "status.history"
	FromSyncRevision = "status.sync.revision"
)

// Deployed is the revision of the Helm source that Argo CD last deployed, and where it
// was read: the newest status.history entry (Argo CD adds one per successful sync, so a
// sync that failed is not in it), else status.sync.revision when the Application is
// Synced and has no history. For a chart source the revision is the chart version; a
// git source's is a commit, and Deployed then says nothing, as it does when neither
// field holds one.
func (a *Application) Deployed() (revision, from string) {
	src, pos := a.helmSourcePosition()
	if src == nil || src.Chart == "" {
		return "", ""
	}
	pick := func(rev string, revs []string) string {
		if pos < 0 {
			return rev
		}
		if pos < len(revs) {
			return revs[pos]
		}
		return ""
	}
	if n := len(a.Status.History); n > 0 {
		if r := pick(a.Status.History[n-1].Revision, a.Status.History[n-1].Revisions); r != "" {
			return r, FromHistory
		}
		return "", ""
	}
	if a.Status.Sync.Status == "Synced" {
		if r := pick(a.Status.Sync.Revision, a.Status.Sync.Revisions); r != "" {
			return r, FromSyncRevision
		}
	}
	return "", ""
}

// Recorded is the part of the status a prediction reads, and nothing else, for a record
// of the cluster (a snapshot): the sync state and revisions, the newest history entry
// (Deployed), and the CRDs of the resource tree (ManagedCRDs). It leaves out the
// conditions (their messages can quote values), the older history and every other
// resource, whose names are data.
func (s Status) Recorded() Status {
	out := Status{Sync: s.Sync}
	out.Sync.Revisions = slices.Clone(s.Sync.Revisions)
	if n := len(s.History); n > 0 {
		h := s.History[n-1]
		out.History = []HistoryEntry{{Revision: h.Revision, Revisions: slices.Clone(h.Revisions)}}
	}
	for _, r := range s.Resources {
		if r.Group == CRDGroup && r.Kind == CRDKind {
			out.Resources = append(out.Resources, r)
		}
	}
	return out
}

// ResourceStatus is one resource of the Application's resource tree.
type ResourceStatus struct {
	Group     string `json:"group,omitempty"`
	Version   string `json:"version,omitempty"`
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
	Status    string `json:"status,omitempty"`
}

// AutoPrune says whether the Application's automated sync prunes: automated sync is on
// (spec.syncPolicy.automated set, and enabled not false) with prune: true.
func (a *Application) AutoPrune() bool {
	p := a.Spec.SyncPolicy
	return p != nil && p.Automated != nil && (p.Automated.Enabled == nil || *p.Automated.Enabled) && p.Automated.Prune
}

// Deployer is Argo CD syncing the Application: its automated prune, sync options and the
// Helm source's helm.skipCrds, which say what leaves the Application and what its syncs
// delete (predict.ArgoCD).
func (a *Application) Deployer() predict.ArgoCDDeployer {
	var options []string
	if a.Spec.SyncPolicy != nil {
		options = a.Spec.SyncPolicy.SyncOptions
	}
	skip := false
	if src, _ := a.helmSourcePosition(); src != nil && src.Helm != nil {
		skip = src.Helm.SkipCrds
	}
	return predict.ArgoCD(a.AutoPrune(), options, skip)
}

// CRDGroup and CRDKind name a CustomResourceDefinition in the resource tree.
const (
	CRDGroup = "apiextensions.k8s.io"
	CRDKind  = "CustomResourceDefinition"
)

// ManagedCRDs names the CRDs in the Application's resource tree (status.resources): the
// CRDs it manages today, which its next sync prunes if the target no longer renders them.
func (a *Application) ManagedCRDs() []string {
	var out []string
	for _, r := range a.Status.Resources {
		if r.Group == CRDGroup && r.Kind == CRDKind && r.Name != "" && !slices.Contains(out, r.Name) {
			out = append(out, r.Name)
		}
	}
	return out
}

// Subject is Application/<namespace>/<name>, the subject of findings about it.
func (a *Application) Subject() string { return manifest.SubjectOf("Application", a.Namespace, a.Name) }

// NotFoundError says that the Application, or Argo CD's Application CRD, is missing.
type NotFoundError struct {
	Namespace, Name string
	// NoCRD is true when the cluster does not serve argoproj.io/v1alpha1 Applications.
	NoCRD bool
}

func (e *NotFoundError) Error() string {
	if e.NoCRD {
		return fmt.Sprintf("Application %s/%s: the cluster serves no %s (Argo CD's Application CRD is not installed): "+
			"read it from the cluster that runs Argo CD", e.Namespace, e.Name, GVR.GroupResource())
	}
	return fmt.Sprintf("Application %s/%s not found: check the namespace and name (%s)", e.Namespace, e.Name, cmdline.Get{Resource: GVR.GroupResource().String(), AllNamespaces: true})
}

// Get reads the Application namespace/name.
func Get(ctx context.Context, dyn dynamic.Interface, namespace, name string) (*Application, error) {
	u, err := dyn.Resource(GVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case kubeclient.IsNotServed(err):
		return nil, &NotFoundError{Namespace: namespace, Name: name, NoCRD: true}
	case apierrors.IsNotFound(err):
		return nil, &NotFoundError{Namespace: namespace, Name: name}
	case err != nil:
		return nil, fmt.Errorf("Application %s/%s: read: %w", namespace, name, err)
	}
	return FromUnstructured(u)
}

// List reads every Application in namespace ("" for all). A cluster without Argo CD's
// Application CRD has none: that is not an error.
func List(ctx context.Context, dyn dynamic.Interface, namespace string) ([]*Application, error) {
	items, err := kubeclient.ListAll(ctx, dyn.Resource(GVR).Namespace(namespace), metav1.ListOptions{})
	if kubeclient.IsNotServed(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list Argo CD Applications (%s): %w", GVR.GroupVersion(), err)
	}
	var out []*Application
	for i := range items {
		app, err := FromUnstructured(&items[i])
		if err != nil {
			return nil, err
		}
		out = append(out, app)
	}
	return out, nil
}

// FromUnstructured decodes an Application.
func FromUnstructured(u *unstructured.Unstructured) (*Application, error) {
	var app Application
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &app); err != nil {
		return nil, fmt.Errorf("Application %s/%s: decode: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &app, nil
}
