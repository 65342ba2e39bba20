package argocd

import (
	"context"
	"fmt"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// This file is the one definition of Argo CD's Application that the tests share: the
// resource (ApplicationGVR), the stand-in CRD for tests where no Argo CD runs
// (ApplicationCRD, which test/argocd's TestApplicationCRDIsArgoCDs holds to the real
// CRD's names, scope and versions), and what a test reads of an Application, whichever wrote its status
// (Application, read by ArgoCD.Get and ArgoCD.WaitApplication).

// ApplicationGVR is Argo CD's Application resource.
var ApplicationGVR = schema.GroupVersionResource{Group: "argoproj.io", Version: "v1alpha1", Resource: "applications"}

// ApplicationCRD stands for Argo CD's Application CRD where a test only writes and
// reads Applications (no Argo CD runs): the same group, version, names and scope as
// Argo CD's own (Start installs that one), and like it no status subresource, so
// status is written with the object. The schema is left open
// (x-kubernetes-preserve-unknown-fields).
func ApplicationCRD() *apiextv1.CustomResourceDefinition {
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: ApplicationGVR.Resource + "." + ApplicationGVR.Group},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: ApplicationGVR.Group,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: ApplicationGVR.Resource, Singular: "application", Kind: "Application",
				ListKind: "ApplicationList", ShortNames: []string{"app", "apps"}},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: ApplicationGVR.Version, Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true),
				}},
			}},
		},
	}
}

// InstallApplicationCRD applies ApplicationCRD and waits until it is Established.
func InstallApplicationCRD(ctx context.Context, cs apiextclient.Interface) error {
	return testenv.ApplyCRD(ctx, cs, ApplicationCRD())
}

// Application is what a test reads of an Application: its revision, and the status Argo
// CD writes.
type Application struct {
	Name            string
	ResourceVersion string
	TargetRevision  string
	// Operating says that the Application holds an operation (its operation field) that
	// the controller has not finished: a sync asked for is done once it is false again.
	Operating bool
	Status    ApplicationStatus
}

// ApplicationStatus is the part of an Application's status the tests assert (the field
// names are Argo CD's).
type ApplicationStatus struct {
	Sync struct {
		Status   string `json:"status"`
		Revision string `json:"revision"`
	} `json:"sync"`
	Health struct {
		Status string `json:"status"`
	} `json:"health"`
	Conditions []struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"conditions"`
	OperationState *OperationState `json:"operationState"`
	// ReconciledAt is when Argo CD last compared the Application (RFC 3339).
	ReconciledAt string `json:"reconciledAt"`
	// History are the syncs that succeeded, oldest first: what `argocd app history`
	// lists and `argocd app rollback` picks from.
	History   []HistoryEntry `json:"history"`
	Resources []struct {
		Group     string `json:"group"`
		Kind      string `json:"kind"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		Status    string `json:"status"`
		// RequiresPruning is set on an object the sources no longer render that Argo
		// CD tracks as the Application's: a sync with prune deletes it.
		RequiresPruning bool `json:"requiresPruning"`
		// Health is what Argo CD's health assessment says of the object; nil for a kind
		// it has no check for, and unless Options.PersistResourceHealth is set.
		Health *Health `json:"health"`
	} `json:"resources"`
}

// OperationState is the last (or running) sync operation.
type OperationState struct {
	Phase      string `json:"phase"`
	Message    string `json:"message"`
	RetryCount int64  `json:"retryCount"`
	Operation  struct {
		Sync struct {
			Revision string `json:"revision"`
		} `json:"sync"`
	} `json:"operation"`
	SyncResult *struct {
		Revision  string `json:"revision"`
		Resources []struct {
			Group     string `json:"group"`
			Kind      string `json:"kind"`
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
			Status    string `json:"status"`
			Message   string `json:"message"`
			SyncPhase string `json:"syncPhase"`
		} `json:"resources"`
	} `json:"syncResult"`
	StartedAt  string `json:"startedAt"`
	FinishedAt string `json:"finishedAt"`
}

// HistoryEntry is one entry of an Application's status.history: a sync that succeeded,
// with the revision and the source it synced.
type HistoryEntry struct {
	ID       int64          `json:"id"`
	Revision string         `json:"revision"`
	Source   map[string]any `json:"source"`
}

// Entry returns the history entry of revision, the last one when several synced it.
func (s ApplicationStatus) Entry(revision string) (HistoryEntry, bool) {
	for i := len(s.History) - 1; i >= 0; i-- {
		if s.History[i].Revision == revision {
			return s.History[i], true
		}
	}
	return HistoryEntry{}, false
}

// Condition returns the message of the Application's condition typ, and whether it is
// there.
func (s ApplicationStatus) Condition(typ string) (string, bool) {
	for _, c := range s.Conditions {
		if c.Type == typ {
			return c.Message, true
		}
	}
	return "", false
}

// ResourceStatus is the sync status (Synced, OutOfSync) Argo CD reports for the
// Application's resource of kind and name, "" when it lists none.
func (app *Application) ResourceStatus(kind, name string) string {
	for _, r := range app.Status.Resources {
		if r.Kind == kind && r.Name == name {
			return r.Status
		}
	}
	return ""
}

// ResourceHealth is the health status Argo CD reports for the Application's resource of
// kind and name, "" when it lists none or assesses none.
func (app *Application) ResourceHealth(kind, name string) string {
	for _, r := range app.Status.Resources {
		if r.Kind == kind && r.Name == name && r.Health != nil {
			return r.Health.Status
		}
	}
	return ""
}

// String sums the status up for failure messages.
func (app *Application) String() string {
	s := fmt.Sprintf("Application %s/%s at %s: sync %s (revision %s), health %s", Namespace, app.Name, app.TargetRevision,
		app.Status.Sync.Status, app.Status.Sync.Revision, app.Status.Health.Status)
	if op := app.Status.OperationState; op != nil {
		s += fmt.Sprintf("; operation %s (retry %d, revision %s): %s", op.Phase, op.RetryCount, op.Operation.Sync.Revision, op.Message)
	}
	for _, c := range app.Status.Conditions {
		s += fmt.Sprintf("; condition %s: %s", c.Type, c.Message)
	}
	for _, r := range app.Status.Resources {
		s += fmt.Sprintf("; %s %s/%s %s", r.Kind, r.Namespace, r.Name, r.Status)
		if r.RequiresPruning {
			s += " (requires pruning)"
		}
	}
	return s
}

func applicationOf(obj *unstructured.Unstructured) (*Application, error) {
	app := &Application{Name: obj.GetName(), ResourceVersion: obj.GetResourceVersion()}
	app.TargetRevision, _, _ = unstructured.NestedString(obj.Object, "spec", "source", "targetRevision")
	_, app.Operating, _ = unstructured.NestedFieldNoCopy(obj.Object, "operation")
	if st, ok := obj.Object["status"].(map[string]any); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(st, &app.Status); err != nil {
			return nil, fmt.Errorf("Application %s status: %w", obj.GetName(), err)
		}
	}
	return app, nil
}
