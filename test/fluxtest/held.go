package fluxtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	eventsv1 "k8s.io/api/events/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// What a scenario looks like with upgradeguard running, wherever it runs (in the test
// process for test/fluxgate, as the chart's Pod behind its Service for test/e2e): held at
// the current revision with the gate's reason on the HelmRelease, migrated, then upgraded
// by helm-controller. These need Env.UG.

// annotationResetAt asks helm-controller to reset its failure counters when it equals
// requestedAt (what `flux reconcile helmrelease --reset` sets).
const annotationResetAt = "reconcile.fluxcd.io/resetAt"

// droppedCRD is the CRD kyverno To no longer renders, and the gate's reason for it (it
// holds the AdmissionReports install creates).
const (
	droppedCRD    = "admissionreports.kyverno.io"
	droppedReason = droppedCRD + ": the upgrade target no longer renders it, so Helm deletes the CRD and"
)

// ReadyMessage is the HelmRelease's Ready condition message, or "".
func ReadyMessage(hr *helmv2.HelmRelease) string {
	if c := apimeta.FindStatusCondition(hr.Status.Conditions, meta.ReadyCondition); c != nil {
		return c.Message
	}
	return ""
}

// WaitUpgraded waits until helm-controller reports Ready=True at chart version To.
func (s *Scenario) WaitUpgraded(t testing.TB) *helmv2.HelmRelease {
	t.Helper()
	hr, err := s.Flux.WaitHelmRelease(t.Context(), s.HelmRelease.Namespace, s.HelmRelease.Name, 4*time.Minute, func(hr *helmv2.HelmRelease) bool {
		l := hr.Status.History.Latest()
		return flux.ReadyAtGeneration(metav1.ConditionTrue)(hr) && l != nil && flux.ChartSemver(l.ChartVersion) == To
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Flux.LogTail(40))
	}
	return hr
}

// AssertUpgraded checks what a held-then-upgraded release must look like: To deployed
// with no failed revision on the way (nothing of To was applied before the migration),
// the breaking CRDs at To's spec with v2alpha1 pruned from storedVersions, every object
// readable, and To's ordinary objects applied.
func (s *Scenario) AssertUpgraded(t testing.TB, before int) {
	t.Helper()
	var statuses []string
	for _, r := range s.History(t) {
		if r.Revision > before {
			// An OCI chart's version carries its digest (3.3.7+abc...).
			chart, _, _ := strings.Cut(r.Chart, "+")
			statuses = append(statuses, fmt.Sprintf("%s %s", r.Status, chart))
		}
	}
	if want := []string{"deployed kyverno-" + To}; !slices.Equal(statuses, want) {
		t.Errorf("revisions after %d = %v, want %v (a denied upgrade stores no revision)", before, statuses, want)
	}
	crds := s.CRDs(t)
	for _, name := range BreakingCRDs {
		if st := crds[name]; slices.Contains(st.StoredVersions, "v2alpha1") || slices.Contains(st.Versions, "v2alpha1") {
			t.Errorf("%s after the upgrade: %+v, want v2alpha1 gone from spec.versions and storedVersions", name, st)
		}
	}
	if errs := s.ReadObjects(t); len(errs) > 0 {
		t.Errorf("objects unreadable after the upgrade: %v", errs)
	}
	if v := s.ChartVersionInCluster(t); v != To {
		t.Errorf("ConfigMap version = %s, want %s", v, To)
	}
}

// Migration waits for the HelmRelease's StorageMigration to succeed, checks that it
// covered exactly the breaking CRDs, and returns it.
func (s *Scenario) Migration(t testing.TB) *v1alpha1.StorageMigration {
	t.Helper()
	sm := s.MigrationSucceeded(t)
	slices.Sort(sm.Spec.Resources)
	if !slices.Equal(sm.Spec.Resources, BreakingCRDs) {
		// Say which decision made it, to tell a replaced StorageMigration from a short one.
		t.Errorf("StorageMigration %s resources = %v, want %v (created %s, holds %q, status %+v)", sm.Name, sm.Spec.Resources, BreakingCRDs,
			sm.CreationTimestamp, sm.Annotations[webhook.AnnotationHolds], sm.Status.Resources)
	}
	return sm
}

// MigrationSucceeded waits for the HelmRelease's StorageMigration to succeed.
func (s *Scenario) MigrationSucceeded(t testing.TB) *v1alpha1.StorageMigration {
	t.Helper()
	name := webhook.MigrationName(s.HelmRelease.Namespace, s.HelmRelease.Name)
	var sm v1alpha1.StorageMigration
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := s.UG.Get(ctx, client.ObjectKey{Name: name}, &sm); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return sm.Status.Phase == v1alpha1.PhaseSucceeded, nil
	})
	if err != nil {
		t.Fatalf("StorageMigration %s did not succeed: %v (%+v)", name, err, sm.Status)
	}
	return &sm
}

// RecordedOnHelmRelease checks what the gate left on the HelmRelease across a hold: an
// event for each reason (the note is the gate's message), and the gate annotation, which
// says admitted once the upgrade went through.
func (s *Scenario) RecordedOnHelmRelease(t testing.TB, reasons ...string) {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(s.CP.Config)
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		if webhook.ParseState(s.HelmReleaseNow(t)).Decision != webhook.OutcomeAdmitted {
			return false, nil
		}
		evs, err := cs.EventsV1().Events(s.Name).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, r := range reasons {
			if !slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
				return e.Regarding.Kind == helmv2.HelmReleaseKind && e.Regarding.Name == s.Name && e.Reason == r && strings.Contains(e.Note, "upgradeguard")
			}) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("the HelmRelease lacks the gate's events %v or its admitted annotation (%+v): %v", reasons, webhook.ParseState(s.HelmReleaseNow(t)), err)
	}
}

// Retried checks that the controller asked helm-controller to retry at once once the
// migration succeeded, and that helm-controller retried on that request: the
// HelmRelease's requestedAt and resetAt carry a token the controller wrote (its event on
// the StorageMigration names it; the test's own token, when it wrote one, is another),
// and helm-controller's status says it handled that token, as a request and as a reset.
func (s *Scenario) Retried(t testing.TB, testToken string) {
	t.Helper()
	ann := s.HelmReleaseNow(t).Annotations
	token := ann[meta.ReconcileRequestAnnotation]
	if token == "" || token == testToken || ann[annotationResetAt] != token {
		t.Fatalf("HelmRelease annotations = %v, want requestedAt and resetAt set by the controller to one token (the test wrote %q)", ann, testToken)
	}
	cs := kubernetes.NewForConfigOrDie(s.CP.Config)
	sm := webhook.MigrationName(s.HelmRelease.Namespace, s.HelmRelease.Name)
	hr := s.HelmReleaseNow(t)
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cs.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		asked := slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Kind == "StorageMigration" && e.Regarding.Name == sm && e.Reason == controller.EventRetryRequested && strings.Contains(e.Note, token)
		})
		hr = s.HelmReleaseNow(t)
		return asked && hr.Status.LastHandledReconcileAt == token && hr.Status.LastHandledResetAt == token, nil
	})
	if err != nil {
		t.Errorf("helm-controller did not retry on the controller's request %s (event %s on StorageMigration %s): lastHandledReconcileAt %q, lastHandledResetAt %q: %v",
			token, controller.EventRetryRequested, sm, hr.Status.LastHandledReconcileAt, hr.Status.LastHandledResetAt, err)
	}
}

// WaitHeldMessage waits until helm-controller's Ready condition carries the gate's
// denial (helm-controller reports the failed upgrade with the API server's answer). It
// watches the HelmRelease from resourceVersion since (read before the trigger), so it
// sees every status write: a hold that a fast migration ends within a second leaves
// its message for less than any poll interval.
func (s *Scenario) WaitHeldMessage(t testing.TB, since, want string) string {
	t.Helper()
	wc, err := client.NewWithWatch(s.CP.Config, client.Options{Scheme: flux.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	w, err := wc.Watch(ctx, &helmv2.HelmReleaseList{}, client.InNamespace(s.HelmRelease.Namespace),
		client.MatchingFields{"metadata.name": s.HelmRelease.Name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: since}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var msgs []string
	for ev := range w.ResultChan() {
		hr, ok := ev.Object.(*helmv2.HelmRelease)
		if !ok {
			t.Fatalf("watching HelmRelease %s: %v event %v", s.HelmRelease, ev.Type, ev.Object)
		}
		m := ReadyMessage(hr)
		if len(msgs) == 0 || msgs[len(msgs)-1] != m {
			msgs = append(msgs, m)
		}
		if strings.Contains(m, want) {
			return m
		}
	}
	t.Fatalf("no Ready message with %q within 3 minutes; messages seen:\n%s", want, strings.Join(msgs, "\n"))
	return ""
}

// RecordHeld runs a scenario whose trigger reaches helm-controller without any chart
// change of the HelmRelease (a source that moves, or a values change): helm-controller's
// upgrade is denied at its release record, the StorageMigration runs, the controller asks
// helm-controller to retry, and the release ends Ready=True at To with nothing failed on
// the way.
//
// The kyverno To chart no longer renders admissionreports.kyverno.io, which From renders:
// Helm would delete that CRD and its objects, and no migration fixes that. So the record
// gate first holds the upgrade with that reason, visible on the HelmRelease (the gate
// annotation and helm-controller's Ready message), and stores nothing. The operator does
// what the message says (keep the CRD, then `flux reconcile helmrelease --reset`); the next
// attempt is held for the migration only.
func (s *Scenario) RecordHeld(t testing.TB) {
	t.Helper()
	before, since := s.ReleaseRevision, s.HelmReleaseNow(t).ResourceVersion
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	asked := s.BlockedOnDeletion(t, `admission webhook "release.upgradeguard.io" denied the request`, before, since)
	sm := s.Migration(t)
	if !strings.Contains(sm.Annotations[webhook.AnnotationHolds], fmt.Sprintf("upgrade of release %s/%s", s.Name, s.Name)) {
		t.Errorf("StorageMigration holds annotation = %q", sm.Annotations[webhook.AnnotationHolds])
	}
	hr := s.WaitUpgraded(t)
	t.Logf("Ready: %s", ReadyMessage(hr))
	s.AssertUpgraded(t, before)
	s.Retried(t, asked)
	s.RecordedOnHelmRelease(t, webhook.ReasonReleaseBlocked, webhook.ReasonReleaseHeld, webhook.ReasonReleaseAdmitted)
}

// BumpThroughHelmReleaseGate applies the version bump the way GitOps does, again after
// each denial: a pinned version bump is a chart change of the HelmRelease, decided by the
// HelmRelease gate before helm-controller sees it. The first denial is the deletion of
// admissionreports.kyverno.io (see RecordHeld), which the operator answers by keeping the
// CRD; the second holds the change for the migration; once it succeeded the bump is
// admitted.
func (s *Scenario) BumpThroughHelmReleaseGate(t testing.TB) {
	t.Helper()
	err := s.Trigger(t.Context())
	if err == nil || !strings.Contains(err.Error(), `admission webhook "helmrelease.upgradeguard.io" denied the request`) ||
		!strings.Contains(err.Error(), droppedReason) {
		t.Fatalf("the version bump: %v, want the HelmRelease gate's denial for the dropped CRD", err)
	}
	s.keepDroppedCRD(t)
	s.ReapplyUntilAdmitted(t)
}

// ReapplyUntilAdmitted re-applies the trigger the way GitOps does until the HelmRelease
// gate admits it: held while the StorageMigration runs (a conflict with helm-controller's
// own writes is retried too). The StorageMigration must have succeeded.
func (s *Scenario) ReapplyUntilAdmitted(t testing.TB) {
	t.Helper()
	var answers []string
	err := wait.PollUntilContextTimeout(t.Context(), 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := s.Trigger(ctx)
		switch {
		case err == nil:
			return true, nil
		case strings.Contains(err.Error(), "denied the request: upgradeguard is holding the upgrade"), apierrors.IsConflict(err):
			answers = append(answers, err.Error())
			return false, nil
		case strings.Contains(err.Error(), droppedReason) && len(answers) == 0:
			// The gate reads CRDs from its informers: the keep annotation of the answer to
			// the first denial reaches them a moment after the patch, and a re-apply in that
			// moment is denied again, as Flux's next reconcile would be. Once held, the
			// deletion must not come back.
			return false, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("the re-applied version bump: %v; answers: %v", err, answers)
	}
	// The gate started the migration, which succeeded before the bump was admitted.
	sm := s.Migration(t)
	if !strings.Contains(sm.Annotations[webhook.AnnotationHolds], "upgrade of release "+s.Name) {
		t.Errorf("StorageMigration holds annotation = %q", sm.Annotations[webhook.AnnotationHolds])
	}
}

// HeldByCRDGate runs a scenario whose chart keeps its CRDs in crds/ with upgrade.crds
// Create: helm-controller server-side applies them (a forced upsert) before its release
// record, the CRD gate denies the update that drops v2alpha1 and starts the migration,
// and helm-controller's retry upgrades.
func (s *Scenario) HeldByCRDGate(t testing.TB) {
	t.Helper()
	before, since := s.ReleaseRevision, s.HelmReleaseNow(t).ResourceVersion
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatalf("the version bump: %v", err)
	}
	msg := s.WaitHeldMessage(t, since, `admission webhook "crd.upgradeguard.io" denied the request`)
	t.Logf("held: %s", msg)
	// helm-controller applies crds/ one CRD at a time and stops at the first denial: the
	// gate sees (and migrates) one breaking CRD per attempt, and the retry after each
	// migration meets the next one.
	s.MigrationSucceeded(t)
	s.WaitUpgraded(t)
	s.AssertUpgraded(t, before)
	s.Retried(t, "")
}

// BlockedOnDeletion waits until the gate, answering helm-controller, has refused the
// upgrade because Helm would delete admissionreports.kyverno.io: helm-controller's Ready
// message carries the denial (from the gate named by denial), the gate annotation on the
// HelmRelease says blocked with the reason, and no revision was stored. It then does what
// the message says: keep the CRD, and ask helm-controller to retry with its failure
// counters reset (what `flux reconcile helmrelease --reset` does), and returns the token
// it asked with.
func (s *Scenario) BlockedOnDeletion(t testing.TB, denial string, before int, since string) string {
	t.Helper()
	msg := s.WaitHeldMessage(t, since, droppedReason)
	t.Logf("helm-controller Ready message while blocked: %s", msg)
	if !strings.Contains(msg, denial) || !strings.Contains(msg, "kubectl annotate crd "+droppedCRD+" helm.sh/resource-policy=keep") {
		t.Errorf("Ready message %q lacks the denial or its next step", msg)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		st := webhook.ParseState(s.HelmReleaseNow(t))
		return st.Decision == webhook.OutcomeBlocked && strings.Contains(st.Message, droppedReason), nil
	})
	if err != nil {
		t.Errorf("the gate annotation does not say blocked with the reason: %+v", webhook.ParseState(s.HelmReleaseNow(t)))
	}
	for _, r := range s.History(t) {
		if r.Revision > before {
			t.Errorf("revision %d (%s %s) stored while the upgrade was refused", r.Revision, r.Status, r.Chart)
		}
	}
	s.keepDroppedCRD(t)
	token := time.Now().UTC().Format(time.RFC3339Nano)
	hr := s.HelmReleaseNow(t)
	if err := s.Flux.Update(t.Context(), hr, func() {
		if hr.Annotations == nil {
			hr.Annotations = map[string]string{}
		}
		hr.Annotations[meta.ReconcileRequestAnnotation], hr.Annotations[annotationResetAt] = token, token
	}); err != nil {
		t.Fatal(err)
	}
	return token
}

// keepDroppedCRD does what the gate's denial for the dropped CRD says: annotate it
// helm.sh/resource-policy=keep, so that Helm leaves it and its objects.
func (s *Scenario) keepDroppedCRD(t testing.TB) {
	t.Helper()
	crd := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: droppedCRD}}
	keep := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"helm.sh/resource-policy":"keep"}}}`))
	if err := s.Flux.Client.Patch(t.Context(), crd, keep); err != nil {
		t.Fatalf("annotate CRD %s: %v", droppedCRD, err)
	}
}
