// Package storagemigration owns creating the StorageMigrations the front ends ask for
// (the admission gate for a held change, proactive and fleet mode for a stale CRD) and
// reading where one stands. Both front ends create through Ensure, so they agree on
// when an existing StorageMigration is kept and when it is replaced.
package storagemigration

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

// Options say how Ensure treats a StorageMigration of the same name that exists.
type Options struct {
	// Replace, when set, says whether an existing StorageMigration that has not succeeded
	// is replaced all the same (proactive mode: a failed one, once the CRD has changed).
	Replace func(existing *v1alpha1.StorageMigration) bool
	// ReplaceSucceeded, when set, says whether an existing StorageMigration that has
	// succeeded is replaced (the caller needs another migration) or returned as it is;
	// an error ends Ensure with nothing deleted. Unset, a succeeded one is always replaced.
	ReplaceSucceeded func(existing *v1alpha1.StorageMigration) (bool, error)
	// DryRun deletes and creates nothing: Ensure reports what it would do.
	DryRun bool
}

// Ensure makes sure a StorageMigration named want.Name stands for want: it returns an
// existing one that is pending, running or failed (unless o.Replace says otherwise), and
// otherwise creates want, deleting first an existing one that succeeded. created says
// whether it created want (or, on a dry run, would have; the StorageMigration is then
// nil). When another writer creates the same name first, Ensure returns theirs. r reads
// the existing StorageMigration; w deletes and creates.
func Ensure(ctx context.Context, r client.Reader, w client.Writer, want *v1alpha1.StorageMigration, o Options) (
	sm *v1alpha1.StorageMigration, created bool, err error) {
	existing, err := Get(ctx, r, want.Name)
	if err != nil {
		return nil, false, err
	}
	if existing != nil && !Succeeded(existing) && (o.Replace == nil || !o.Replace(existing)) {
		return existing, false, nil
	}
	if existing != nil && Succeeded(existing) && o.ReplaceSucceeded != nil {
		replace, err := o.ReplaceSucceeded(existing)
		if err != nil || !replace {
			return existing, false, err
		}
	}
	if o.DryRun {
		return nil, true, nil
	}
	if existing != nil {
		uid := existing.UID
		if err := w.Delete(ctx, existing, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return nil, false, fmt.Errorf("replace StorageMigration %s: %w", want.Name, err)
		}
	}
	if err := w.Create(ctx, want); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Another replica, or a finalizer keeping the old one, got there first.
			sm, err := Get(ctx, r, want.Name)
			return sm, false, err
		}
		return nil, false, fmt.Errorf("create StorageMigration %s: %w", want.Name, err)
	}
	return want, true, nil
}

// Get returns the StorageMigration named name, nil when there is none.
func Get(ctx context.Context, r client.Reader, name string) (*v1alpha1.StorageMigration, error) {
	var sm v1alpha1.StorageMigration
	if err := r.Get(ctx, client.ObjectKey{Name: name}, &sm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get StorageMigration %s: %w", name, err)
	}
	return &sm, nil
}

// Succeeded reports whether sm has succeeded: its phase, or its Succeeded condition.
func Succeeded(sm *v1alpha1.StorageMigration) bool {
	return sm.Status.Phase == v1alpha1.PhaseSucceeded || meta.IsStatusConditionTrue(sm.Status.Conditions, v1alpha1.ConditionSucceeded)
}

// Failed reports whether sm has failed: its phase, or its Failed condition.
func Failed(sm *v1alpha1.StorageMigration) bool {
	return sm.Status.Phase == v1alpha1.PhaseFailed || meta.IsStatusConditionTrue(sm.Status.Conditions, v1alpha1.ConditionFailed)
}

// FailureMessage says why sm failed: its Failed condition's message, else its
// resources' messages.
func FailureMessage(sm *v1alpha1.StorageMigration) string {
	if c := meta.FindStatusCondition(sm.Status.Conditions, v1alpha1.ConditionFailed); c != nil && c.Message != "" {
		return c.Message
	}
	var msgs []string
	for _, r := range sm.Status.Resources {
		if r.Message != "" {
			msgs = append(msgs, r.Name+": "+r.Message)
		}
	}
	if len(msgs) == 0 {
		return "no message (" + cmdline.Describe{Resource: "storagemigration", Name: sm.Name}.String() + ")"
	}
	return strings.Join(msgs, "; ")
}
