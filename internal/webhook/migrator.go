package webhook

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/storagemigration"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/kubename"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// storageMigrations is the gate's Migrator, at every upgrade door: a StorageMigration the
// controller runs, when a StorageMigrationPolicy with autoMigrate selects every CRD.
type storageMigrations struct {
	g    *Gate
	name string
	// labels name what the StorageMigration holds (a HelmRelease or a Helm release);
	// kubeConfig is the target, nil for the local cluster.
	labels     map[string]string
	kubeConfig *v1alpha1.KubeConfigReference
	// holds says what is held until the migration completes, and why (the annotation
	// AnnotationHolds on the StorageMigration).
	holds  string
	live   map[string]*apiextv1.CustomResourceDefinition
	dryRun bool
	// succeededBefore is the UID of the StorageMigration if it had already succeeded
	// when the decision started, before the prediction read the CRDs (readBefore).
	succeededBefore types.UID
}

// readBefore notes whether m's StorageMigration has already succeeded, before the
// prediction reads the CRDs. Only such a one may be replaced by a new migration: one
// that succeeds while the prediction reads (its last CRD pruned between the CRD reads
// and now) has done what the prediction, made partly before it, asks again. Replacing it
// would start a migration of CRDs that need none and hold a safe upgrade; returning it
// holds the change once more, and the retry is decided on the migrated CRDs.
func (m *storageMigrations) readBefore(ctx context.Context) {
	if sm, err := storagemigration.Get(ctx, m.g.reader, m.name); err == nil && sm != nil && storagemigration.Succeeded(sm) {
		m.succeededBefore = sm.UID
	}
}

// AnnotationHolds on a StorageMigration the gate created says what it holds and why:
// the release or HelmRelease whose upgrade waits for it, and what happens next.
const AnnotationHolds = "upgradeguard.io/holds"

func (m *storageMigrations) Migrate(ctx context.Context, crds []string) (*gate.Progress, error) {
	policy, unselected, err := m.g.policyFor(ctx, m.live, crds)
	if err != nil {
		return nil, err
	}
	if policy == nil {
		return m.notAllowed(unselected), nil
	}
	if p, err := m.refusedForFieldLoss(ctx, crds, policy); p != nil || err != nil {
		return p, err
	}
	sm, created, err := m.g.ensureMigration(ctx, m, crds, policy)
	if err != nil {
		return nil, err
	}
	if sm != nil && storagemigration.Failed(sm) {
		return m.failed(m.name, storagemigration.FailureMessage(sm)), nil
	}
	return m.running(crds, created), nil
}

// refusedForFieldLoss judges, before a StorageMigration is created or named, whether the
// migration would drop fields that objects hold and nothing accepts the loss (the
// policy's allowFieldLoss, the CRD's annotation): such a migration is refused, writes
// nothing and would be refused again, so the change must not wait for it. The answer
// then names the fields and the ways on, and no StorageMigration. Only the local
// cluster's objects are read here; a remote target's StorageMigration reports the refusal.
func (m *storageMigrations) refusedForFieldLoss(ctx context.Context, crds []string, policy *v1alpha1.StorageMigrationPolicy) (*gate.Progress, error) {
	if m.kubeConfig != nil || policy.Spec.AllowFieldLoss {
		return nil, nil
	}
	var lister crdschema.Lister
	var refusals []string
	for _, name := range crds {
		crd := m.live[name]
		if crd == nil || migrate.FieldLossAllowed(crd, migrate.Options{}) {
			continue
		}
		if lister == nil {
			dyn, err := dynamic.NewForConfig(m.g.local)
			if err != nil {
				return nil, err
			}
			lister = crdschema.DynamicLister{Client: dyn}
		}
		storage := crdversions.StorageVersion(crd)
		rep, err := migrate.FieldLoss(ctx, lister, crd, storage, 0)
		if err != nil {
			return nil, err
		}
		if rep != nil {
			refusals = append(refusals, name+": a migration would be "+migrate.FieldLossRefusal(storage, rep))
		}
	}
	if len(refusals) == 0 {
		return nil, nil
	}
	return m.failed("", strings.Join(refusals, " ")), nil
}

// notAllowed, failed and running are where m's migration stands, in the words the
// conditions and the answer carry (gate.Decision.Message ends with them).
func (m *storageMigrations) notAllowed(unselected []string) *gate.Progress {
	return &gate.Progress{State: gate.MigrationNotAllowed, NotAllowed: unselected,
		Message: "no StorageMigrationPolicy with autoMigrate selects " + strings.Join(unselected, ", ")}
}

// failed is a StorageMigration name that failed, or, with name "", a migration refused
// before one was created.
func (m *storageMigrations) failed(name, why string) *gate.Progress {
	if name == "" {
		return &gate.Progress{State: gate.MigrationFailed, Message: why}
	}
	return &gate.Progress{State: gate.MigrationFailed, Name: name, Message: fmt.Sprintf("StorageMigration %s failed: %s", name, why)}
}

func (m *storageMigrations) running(crds []string, created bool) *gate.Progress {
	msg := fmt.Sprintf("StorageMigration %s is in progress, migrating %s", m.name, countCRDs(crds))
	switch {
	case created && m.dryRun:
		msg = fmt.Sprintf("StorageMigration %s would be created to migrate %s", m.name, countCRDs(crds))
	case created:
		msg = fmt.Sprintf("StorageMigration %s was created to migrate %s", m.name, countCRDs(crds))
	}
	return &gate.Progress{State: gate.MigrationRunning, Name: m.name, Created: created, Message: msg}
}

// countCRDs is "1 CRD" or "N CRDs": Required names them.
func countCRDs(crds []string) string {
	if len(crds) == 1 {
		return "1 CRD"
	}
	return fmt.Sprintf("%d CRDs", len(crds))
}

// policyFor returns a StorageMigrationPolicy with autoMigrate that selects every named
// CRD (the one v1alpha1.Select chooses for the first), or nil and the names no such
// policy selects.
func (g *Gate) policyFor(ctx context.Context, live map[string]*apiextv1.CustomResourceDefinition, names []string) (*v1alpha1.StorageMigrationPolicy, []string, error) {
	var list v1alpha1.StorageMigrationPolicyList
	if err := g.reader.List(ctx, &list); err != nil {
		return nil, nil, fmt.Errorf("list StorageMigrationPolicies: %w", err)
	}
	crds := make([]*apiextv1.CustomResourceDefinition, 0, len(names))
	for _, n := range names {
		if crd := live[n]; crd != nil {
			crds = append(crds, crd)
		}
	}
	selected, err := v1alpha1.Select(list.Policies(), crds, (*v1alpha1.StorageMigrationPolicy).AutoMigrates)
	if err != nil {
		return nil, nil, err
	}
	var unselected []string
	for _, n := range names {
		if selected[n] == nil {
			unselected = append(unselected, n)
		}
	}
	if len(unselected) > 0 || len(names) == 0 {
		return nil, unselected, nil
	}
	return selected[names[0]], nil, nil
}

// migrationName is prefix<namespace>-<name>, shortened with a hash when it is too long
// (kubename.Shorten).
func migrationName(prefix, namespace, name string) string {
	n := prefix + name
	if namespace != "" {
		n = prefix + namespace + "-" + name
	}
	return kubename.Shorten(n, kubename.MaxName, namespace+"/"+name)
}

// ensureMigration returns the StorageMigration of m, creating it when there is none, or
// replacing it when it succeeded earlier and a new migration is needed. A running or
// failed one is returned as it is: a failed one waits for an operator to delete it.
func (g *Gate) ensureMigration(ctx context.Context, m *storageMigrations, crds []string,
	policy *v1alpha1.StorageMigrationPolicy) (*v1alpha1.StorageMigration, bool, error) {
	want := &v1alpha1.StorageMigration{
		ObjectMeta: metav1.ObjectMeta{Name: m.name, Labels: m.labels},
		Spec: v1alpha1.StorageMigrationSpec{Resources: slices.Sorted(slices.Values(crds)), Rate: policy.Spec.Rate, Deadline: policy.Spec.Deadline,
			KubeConfig: m.kubeConfig, Engine: policy.Spec.Engine, AllowFieldLoss: policy.Spec.AllowFieldLoss},
	}
	if m.holds != "" {
		want.Annotations = map[string]string{AnnotationHolds: truncate(m.holds, 4000)}
	}
	return storagemigration.Ensure(ctx, g.reader, g.writer, want, storagemigration.Options{DryRun: m.dryRun,
		ReplaceSucceeded: func(existing *v1alpha1.StorageMigration) (bool, error) {
			return m.succeededBefore != "" && existing.UID == m.succeededBefore, nil
		}})
}

// labelValue is v as a label value: shortened with a hash when it is too long.
func labelValue(v string) string { return kubename.Shorten(v, kubename.MaxLabelValue, v) }
