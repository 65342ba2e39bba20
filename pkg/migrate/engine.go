package migrate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	authv1 "k8s.io/api/authorization/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

// Engine says who re-persists the objects of a CRD.
type Engine string

const (
	// EngineAuto picks EngineClient when the caller may patch the custom resources, and
	// EngineBuiltin when it may not but may create StorageVersionMigrations.
	EngineAuto Engine = "auto"
	// EngineClient patches every object from this process: the fastest, and it needs
	// patch on the custom resources.
	EngineClient Engine = "client"
	// EngineBuiltin creates a StorageVersionMigration and lets the built-in migrator in
	// kube-controller-manager (storage-version-migrator-controller) patch the objects:
	// least privilege, at the controller manager's pace.
	EngineBuiltin Engine = "builtin"
)

// Engines are the engines, in the order --help lists them.
var Engines = []Engine{EngineAuto, EngineClient, EngineBuiltin}

// RoleEngines are the engines with a role of their own (RBACFor), in the order --help
// lists them. EngineAuto has none: it runs one of them, and needs that one's role.
var RoleEngines = []Engine{EngineClient, EngineBuiltin}

// ParseEngine reads an engine name; "" is EngineAuto. It is the one check of an engine
// name: every front end that takes one parses it here.
func ParseEngine(s string) (Engine, error) {
	if s == "" {
		return EngineAuto, nil
	}
	if i := slices.Index(Engines, Engine(s)); i >= 0 {
		return Engines[i], nil
	}
	return "", fmt.Errorf("unknown migration engine %q: use auto, client or builtin", s)
}

// ParseRoleEngine reads the engine a role is for (one of RoleEngines): ParseEngine,
// refusing auto, which has no role of its own.
func ParseRoleEngine(s string) (Engine, error) {
	e, err := ParseEngine(s)
	if err == nil && !slices.Contains(RoleEngines, e) {
		return "", fmt.Errorf("migration engine %q has no role of its own: use client or builtin (auto runs one of them; grant that one's role)", e)
	}
	return e, err
}

// DefaultBuiltinStartTimeout is how long the builtin engine waits for the built-in
// migrator to act on a new StorageVersionMigration (set Running, Succeeded or Failed)
// before it decides that nobody runs it.
const DefaultBuiltinStartTimeout = 10 * time.Second

// BuiltinController names the kube-controller-manager controller that runs
// StorageVersionMigrations, for messages.
const BuiltinController = "kube-controller-manager's storage-version-migrator-controller"

// StorageMigrationGroup is the API group of the built-in StorageVersionMigration.
const StorageMigrationGroup = svm.Group

// BuiltinNotServedError says the StorageVersionMigration API is not served, so the builtin
// engine cannot run (Kubernetes before 1.35, or 1.35 and 1.36 with the beta API off).
type BuiltinNotServedError struct{ CRD string }

func (e *BuiltinNotServedError) Error() string {
	return fmt.Sprintf("%s: the builtin engine needs StorageVersionMigrations (%s v1, or v1beta1), which are not served on this server", e.CRD, StorageMigrationGroup)
}

// BuiltinNotRunningError says a StorageVersionMigration got no condition within the
// start timeout: nobody acts on it, so the run stopped and deleted it rather than hang.
type BuiltinNotRunningError struct {
	CRD, StorageVersionMigration string
	Waited                       time.Duration
}

func (e *BuiltinNotRunningError) Error() string {
	return fmt.Sprintf("%s: nothing acted on StorageVersionMigration %s within %s, so the built-in migrator (%s) is not running on this cluster; the StorageVersionMigration was deleted and nothing was migrated",
		e.CRD, e.StorageVersionMigration, e.Waited, BuiltinController)
}

// chooseEngine settles which engine migrates crd and why, into res.
func (m *Migrator) chooseEngine(ctx context.Context, crd *apiextv1.CustomResourceDefinition, o Options, res *Result) error {
	engine, err := ParseEngine(string(o.Engine))
	if err != nil {
		return err
	}
	res.Engine = engine
	switch engine {
	case EngineClient:
		res.EngineReason = "asked for"
		return nil
	case EngineBuiltin:
		gvr, err := m.svmResource(ctx)
		if err != nil {
			return err
		}
		if gvr.Empty() {
			return &BuiltinNotServedError{CRD: crd.Name}
		}
		res.EngineReason = "asked for; " + gvr.GroupVersion().String() + " served"
		return nil
	}
	return m.auto(ctx, crd, res)
}

// auto chooses the client engine when the caller may patch the objects, and the builtin
// engine when it may not but may create StorageVersionMigrations.
func (m *Migrator) auto(ctx context.Context, crd *apiextv1.CustomResourceDefinition, res *Result) error {
	gr := schema.GroupResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}
	canPatch, err := m.allowed(ctx, "patch", gr)
	if err != nil {
		return err
	}
	res.Engine = EngineClient
	if canPatch {
		res.EngineReason = "auto: may patch " + gr.String() + " (SelfSubjectAccessReview)"
		return nil
	}
	gvr, err := m.svmResource(ctx)
	if err != nil {
		return err
	}
	if gvr.Empty() {
		res.EngineReason = "auto: may not patch " + gr.String() + ", and StorageVersionMigrations are not served on this server"
		return nil
	}
	canCreate, err := m.allowed(ctx, "create", gvr.GroupResource())
	if err != nil {
		return err
	}
	if !canCreate {
		res.EngineReason = "auto: may neither patch " + gr.String() + " nor create StorageVersionMigrations (SelfSubjectAccessReview)"
		return nil
	}
	res.Engine = EngineBuiltin
	res.EngineReason = "auto: may not patch " + gr.String() + " but may create StorageVersionMigrations (" + gvr.GroupVersion().String() + "; SelfSubjectAccessReview)"
	return nil
}

// allowed asks the API server whether the caller may do verb on every object of gr.
func (m *Migrator) allowed(ctx context.Context, verb string, gr schema.GroupResource) (bool, error) {
	review := &authv1.SelfSubjectAccessReview{Spec: authv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authv1.ResourceAttributes{Verb: verb, Group: gr.Group, Resource: gr.Resource}}}
	out, err := m.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("ask whether this user may %s %s (SelfSubjectAccessReview): %w", verb, gr, err)
	}
	return out.Status.Allowed, nil
}

// svmResource is the StorageVersionMigration resource the server serves (svm.Resource).
func (m *Migrator) svmResource(_ context.Context) (schema.GroupVersionResource, error) {
	return svm.Resource(m.discovery)
}

// InProgressError says that a StorageVersionMigration upgradeguard did not create (made by
// hand, or by another tool) is migrating the CRD: a run waits for it (Options.Wait) or
// stops, as for a held Lease.
type InProgressError struct {
	CRD                      string
	StorageVersionMigrations []string
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("%s is being migrated by StorageVersionMigration %s (the built-in migrator in kube-controller-manager): wait for it (Options.Wait) or check it",
		e.CRD, strings.Join(e.StorageVersionMigrations, ", "))
}

// awaitOthers returns once no StorageVersionMigration of someone else's is migrating crd,
// waiting while wait is true and ctx allows; otherwise *InProgressError.
func (m *Migrator) awaitOthers(ctx context.Context, crd string, wait bool) error {
	for {
		active, err := svm.Active(ctx, m.dynamic)
		if err != nil {
			return err
		}
		var others []string
		for _, a := range active[crd] {
			if !a.Upgradeguard {
				others = append(others, a.Name)
			}
		}
		if len(others) == 0 {
			return nil
		}
		inProgress := &InProgressError{CRD: crd, StorageVersionMigrations: others}
		if !wait {
			return inProgress
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %w: %w", inProgress, ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
}
