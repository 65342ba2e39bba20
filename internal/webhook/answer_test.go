package webhook

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestKindOf: the engine's five decisions map to the gate's five answers, unfixable
// findings first whatever the migration's state.
func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		gd   gate.Decision
		want kind
	}{
		{"proceed", gate.Decision{Outcome: gate.Proceed}, kindAdmitted},
		{"proceed after a migration", gate.Decision{Outcome: gate.Proceed, Migration: &gate.Progress{State: gate.MigrationDone}}, kindAdmitted},
		{"unfixable", gate.Decision{Outcome: gate.Blocked, Unfixable: []string{"a: bridge"}}, kindUnfixable},
		{"unfixable while migrating", gate.Decision{Outcome: gate.Blocked, Unfixable: []string{"a: bridge"},
			Migration: &gate.Progress{State: gate.MigrationRunning}}, kindUnfixable},
		{"no policy", gate.Decision{Outcome: gate.Blocked, Migration: &gate.Progress{State: gate.MigrationNotAllowed}}, kindNoPolicy},
		{"migration failed", gate.Decision{Outcome: gate.Blocked, Migration: &gate.Progress{State: gate.MigrationFailed}}, kindMigrationFailed},
		{"migrating", gate.Decision{Outcome: gate.Migrating, Migration: &gate.Progress{State: gate.MigrationRunning}}, kindHeld},
	} {
		if got := kindOf(&tc.gd); got != tc.want {
			t.Errorf("%s: kindOf = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestRespond: every answer becomes the admission response its kind says, with the
// message, the warnings, the HTTP code and the outcome label.
func TestRespond(t *testing.T) {
	warnings := []string{"a warning"}
	for _, tc := range []struct {
		kind    kind
		allowed bool
		code    int32
		outcome string
	}{
		{kindAdmitted, true, http.StatusOK, OutcomeAdmitted},
		{kindNotChecked, true, http.StatusOK, OutcomeAdmitted},
		{kindErrorAdmitted, true, http.StatusOK, OutcomeError},
		{kindUnfixable, false, http.StatusForbidden, OutcomeBlocked},
		{kindNoPolicy, false, http.StatusForbidden, OutcomeBlocked},
		{kindMigrationFailed, false, http.StatusForbidden, OutcomeBlocked},
		{kindInvalid, false, http.StatusForbidden, OutcomeBlocked},
		{kindHeld, false, http.StatusForbidden, OutcomeMigrating},
		{kindErrorDenied, false, http.StatusForbidden, OutcomeError},
	} {
		r := respond(decision{kind: tc.kind, message: "the message", warnings: warnings})
		if r.Allowed != tc.allowed || r.Result == nil || r.Result.Code != tc.code || r.Result.Message != "the message" {
			t.Errorf("kind %d: allowed %v, result %+v; want allowed %v, code %d and the message", tc.kind, r.Allowed, r.Result, tc.allowed, tc.code)
		}
		if !tc.allowed && r.Result.Reason != metav1.StatusReasonForbidden {
			t.Errorf("kind %d: reason %q, want %q", tc.kind, r.Result.Reason, metav1.StatusReasonForbidden)
		}
		if !slices.Equal(r.Warnings, warnings) {
			t.Errorf("kind %d: warnings %q, want %q", tc.kind, r.Warnings, warnings)
		}
		if got := tc.kind.outcome(); got != tc.outcome {
			t.Errorf("kind %d: outcome %q, want %q", tc.kind, got, tc.outcome)
		}
	}
}

// migratorFunc is a gate.Migrator that reports what the function says.
type migratorFunc func(crds []string) *gate.Progress

func (f migratorFunc) Migrate(_ context.Context, crds []string) (*gate.Progress, error) {
	return f(crds), nil
}

// testDoor is one door of the gate, built as the gate builds it, with the event reasons
// and wording its answers must carry.
type testDoor struct {
	name                             string
	door                             door
	admitted, blocked, held, started string
	// again and retry are how the deployer applies the change again, and retries it
	// after the migration; target is where the next steps run.
	again, retry, target string
	// before is what the door says of its denials.
	before string
}

func testDoors(dryRun bool) []testDoor {
	const crd = "widgets.example.io"
	sms := func(name string) *storageMigrations { return &storageMigrations{name: name, dryRun: dryRun} }
	hr := &helmv2.HelmRelease{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web", Generation: 3}}
	res := &fluxrelease.Result{Report: &check.Report{ChartVersion: "2.0.0"}, Operation: predict.Upgrade, Release: "web", StorageNamespace: "apps",
		Chart: "web", Version: "2.0.0", CurrentVersion: "1.0.0"}
	remote := hr.DeepCopy()
	remote.Spec.KubeConfig = &meta.KubeConfigReference{SecretRef: &meta.SecretKeyReference{Name: "shoot-kubeconfig"}}
	remoteRes := *res
	remoteRes.Remote = true
	record := "upgrade of release apps/web to revision 2 (chart web@2.0.0) from chart version 1.0.0"
	update := "update of CustomResourceDefinition " + crd + ", which drops v1alpha1 from spec.versions while status.storedVersions still lists it (the API server rejects it)"
	crdRep := &check.Report{Chart: crdGateChart}
	flux := owner{hrNamespace: "apps", hrName: "web", namespace: "apps", release: "web"}
	helm := owner{namespace: "apps", release: "web"}
	argo := owner{release: crd, appNamespace: "argocd", app: "widgets"}
	alone := owner{release: crd}
	const (
		fluxAgain = "then let helm-controller retry (flux reconcile helmrelease web -n apps --reset)"
		fluxRetry = "when it has succeeded, upgradeguard asks helm-controller to retry HelmRelease apps/web at once (reconcile.fluxcd.io/resetAt)"
		helmAgain = "then run the helm command again"
		helmRetry = "run the same helm command again when it has succeeded"
		crdRetry  = "retry the update when it has succeeded"
	)
	hrReasons := []string{ReasonChartChangeAdmitted, ReasonChartChangeBlocked, ReasonChartChangeHeld, ReasonMigrationStarted}
	recReasons := []string{ReasonReleaseAdmitted, ReasonReleaseBlocked, ReasonReleaseHeld, ReasonReleaseHeld}
	delReasons := []string{ReasonCRDDeletionAdmitted, ReasonCRDDeletionBlocked, ReasonCRDDeletionBlocked, ReasonCRDDeletionBlocked}
	uninstallReasons := []string{ReasonReleaseAdmitted, ReasonUninstallBlocked, ReasonReleaseHeld, ReasonReleaseHeld}
	deletion := "deletion of CustomResourceDefinition " + crd + " by user admin"
	// The live CRD being deleted, which already lists a sync option: the Argo CD keep
	// merges Prune=false into it.
	liveCRD := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: crd,
		Annotations: map[string]string{predict.ArgoSyncOptionsAnnotation: "ServerSideApply=true"}}}
	uninstall := "uninstalling mark of release apps/web (revision 2, chart web@2.0.0), which helm uninstall writes before it deletes anything"
	const (
		delRetry = "delete the CRD again when it has succeeded"
		keep     = ". To keep the CRD and its objects outside the release instead: kubectl annotate crd " + crd +
			" helm.sh/resource-policy=keep makes Helm's next upgrade leave them (an uninstall reads that policy from the release's stored manifest only)"
		goesOn = ". Helm only logs this refusal and goes on deleting the release's other objects; upgradeguard's CRD deletion guard, where it is on, " +
			"refuses the DELETE of " + crd + ", so the uninstall fails and leaves the CRDs and their objects in place"
	)
	mk := func(name string, dr door, reasons []string, again, retry, target, before string) testDoor {
		return testDoor{name: name, door: dr, admitted: reasons[0], blocked: reasons[1], held: reasons[2], started: reasons[3],
			again: again, retry: retry, target: target, before: before}
	}
	const hrAgain, hrRetry = "then re-apply the change (Flux retries on its next reconcile)", "Flux's retries of this change will then succeed"
	return []testDoor{
		mk("HelmRelease", hrDoor(hr, res, false, sms("hr-apps-web")), hrReasons, hrAgain, hrRetry, "", beforeApplied),
		mk("HelmRelease remote", hrDoor(remote, &remoteRes, false, sms("hr-apps-web")), hrReasons, hrAgain, hrRetry,
			" (against the cluster of the kubeConfig Secret apps/shoot-kubeconfig)", beforeApplied),
		mk("release record, Helm", helm.door(record, beforeApplied, &check.Report{}, sms("release-apps-web")), recReasons, helmAgain, helmRetry, "", beforeApplied),
		mk("release record, Flux", flux.door(record, beforeApplied, &check.Report{}, sms("hr-apps-web")), recReasons, fluxAgain, fluxRetry, "", beforeApplied),
		mk("CRD update, no owner", alone.door(update, "", crdRep, sms("crd-"+crd)), recReasons, "then retry the update", crdRetry, "", ""),
		mk("CRD update, Helm", helm.door(update, "", crdRep, sms("release-apps-web")), recReasons, helmAgain, helmRetry, "", ""),
		mk("CRD update, Flux", flux.door(update+", applied for HelmRelease apps/web", "", crdRep, sms("hr-apps-web")), recReasons, fluxAgain, fluxRetry, "", ""),
		mk("CRD update, Argo CD", argo.door(update+", applied for Argo CD Application argocd/widgets", "", crdRep, sms("crd-"+crd)), recReasons,
			"then sync Application argocd/widgets again (or roll it back again)", crdRetry, "", ""),
		mk("CRD deletion, no owner", alone.deletionDoor(deletion, liveCRD, sms("crd-"+crd)), delReasons, "then delete the CRD again", delRetry, "", ""),
		mk("CRD deletion, Helm", helm.deletionDoor(deletion+" (a CRD of Helm release apps/web)", liveCRD, sms("release-apps-web")), delReasons,
			"then delete the CRD again (or run the helm command that deletes it again)"+keep, delRetry, "", ""),
		mk("CRD deletion, Flux", flux.deletionDoor(deletion+" (a CRD that HelmRelease apps/web applies)", liveCRD, sms("hr-apps-web")), delReasons,
			fluxAgain+keep, fluxRetry, "", ""),
		mk("CRD deletion, Argo CD", argo.deletionDoor(deletion+" (a CRD that Argo CD Application argocd/widgets syncs)", liveCRD, sms("crd-"+crd)), delReasons,
			"then sync Application argocd/widgets again with prune. To keep the CRD and its objects instead: kubectl annotate --overwrite crd "+crd+
				" argocd.argoproj.io/sync-options=ServerSideApply=true,Prune=false, then sync Application argocd/widgets again: Argo CD skips the CRD's prune, "+
				"and the Application stays OutOfSync with the CRD requiring pruning", delRetry, "", ""),
		mk("uninstall, Helm", helm.uninstallDoor(uninstall, []string{crd}, sms("release-apps-web")), uninstallReasons,
			"then run helm uninstall again"+goesOn, "run helm uninstall again when it has succeeded", "", ""),
		mk("uninstall, Flux", flux.uninstallDoor(uninstall, []string{crd}, sms("hr-apps-web")), uninstallReasons, fluxAgain+goesOn, fluxRetry, "", ""),
	}
}

// TestAnswer words every verdict at every door. The decisions are the library's own
// (gate.Judge on a report, with the progress the gate's Migrator reports), and every
// answer must carry the library's sentence as it is: gate.Decision.Message, which holds
// every condition's message, and the conditions unchanged. Around it a door adds only its
// own: the change, when it denies, its next steps and how its deployer goes on.
func TestAnswer(t *testing.T) {
	const a, b = "a.example.io", "b.example.io"
	verdicts := func(vs ...predict.Verdict) *check.Report {
		rep := &check.Report{Safe: true, NextSteps: []string{"step one", "step two"}}
		for i, v := range vs {
			rep.CRDs = append(rep.CRDs, check.CRDReport{Finding: predict.Finding{Name: []string{a, b}[i], Verdict: v, Reason: "because " + string(v)}})
			rep.Safe = rep.Safe && v == predict.OK
		}
		return rep
	}
	for _, tc := range []struct {
		name     string
		report   *check.Report
		progress func(m *storageMigrations, crds []string) *gate.Progress
		dryRun   bool
		migrated bool // an admitted change whose StorageMigration has succeeded
		kind     kind
		verb     string // what the answer says the gate did
		want     []string
	}{
		{name: "admitted", report: verdicts(predict.OK), kind: kindAdmitted, verb: "admitted"},
		{name: "admitted after its migration", report: verdicts(predict.OK), migrated: true, kind: kindAdmitted, verb: "admitted"},
		{name: "bridge", report: verdicts(predict.Bridge), kind: kindUnfixable, verb: "denied", want: []string{gate.WhyBridge}},
		{name: "delete", report: verdicts(predict.Delete, predict.Migrate), kind: kindUnfixable, verb: "denied", want: []string{gate.WhyDelete}},
		{name: "data loss", report: verdicts(predict.DataLoss), kind: kindUnfixable, verb: "denied", want: []string{gate.WhyDataLoss}},
		{name: "refused", report: verdicts(predict.Refused, predict.Migrate), kind: kindUnfixable, verb: "denied", want: []string{gate.WhyRefused}},
		{name: "no policy", report: verdicts(predict.Migrate, predict.Migrate), kind: kindNoPolicy, verb: "denied",
			progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.notAllowed(crds) },
			want:     []string{"no StorageMigrationPolicy with autoMigrate selects a.example.io, b.example.io", "Or create a StorageMigrationPolicy with autoMigrate: true that selects these CRDs"}},
		{name: "migration failed", report: verdicts(predict.Migrate), kind: kindMigrationFailed, verb: "denied",
			progress: func(m *storageMigrations, _ []string) *gate.Progress {
				return m.failed(m.name, a+": 3 objects could not be migrated")
			},
			want: []string{"failed: a.example.io: 3 objects could not be migrated", "kubectl delete storagemigration "}},
		{name: "held, created", report: verdicts(predict.Migrate, predict.Migrate), kind: kindHeld, verb: "is holding",
			progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.running(crds, true) },
			want:     []string{"was created to migrate 2 CRDs", "The change is held until StorageMigration "}},
		{name: "held, in progress", report: verdicts(predict.Migrate), kind: kindHeld, verb: "is holding",
			progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.running(crds, false) },
			want:     []string{"is in progress, migrating 1 CRD", "kubectl get storagemigration "}},
		{name: "held, dry run", report: verdicts(predict.Migrate), dryRun: true, kind: kindHeld, verb: "would hold",
			progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.running(crds, true) },
			want:     []string{"would be created to migrate 1 CRD", "This was a dry run, so no StorageMigration was created"}},
		{name: "held, dry run, in progress", report: verdicts(predict.Migrate), dryRun: true, kind: kindHeld, verb: "would hold",
			progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.running(crds, false) },
			want:     []string{"is in progress, migrating 1 CRD", "The change is held until StorageMigration "}},
	} {
		for _, td := range testDoors(tc.dryRun) {
			t.Run(tc.name+"/"+td.name, func(t *testing.T) {
				dr := td.door
				o := dr.options
				o.Migrator = migratorFunc(func(crds []string) *gate.Progress { return tc.progress(dr.migrations, crds) })
				gd, err := gate.Judge(t.Context(), tc.report, o)
				if err != nil {
					t.Fatal(err)
				}
				migrated := ""
				if tc.migrated {
					migrated = dr.migrations.name
				}
				d := dr.answer(gd, migrated)
				if d.kind != tc.kind {
					t.Fatalf("kind %d, want %d: %s", d.kind, tc.kind, d.message)
				}
				msg := d.message

				// The library's sentence, as it is, in the answer and in the conditions.
				wantConds := gd.Conditions
				if tc.migrated {
					wantConds = slices.Clone(gd.Conditions)
					wantConds[0].Reason = gate.ReasonMigrated
				}
				if diff := cmp.Diff(wantConds, d.conditions); diff != "" {
					t.Errorf("conditions differ from the library's (-want +got):\n%s", diff)
				}
				if !strings.Contains(msg, gd.Message) {
					t.Errorf("the answer lacks the library's message %q:\n%s", gd.Message, msg)
				}
				said := gd.Conditions[:1] // what is required
				if gd.Migration != nil {
					said = gd.Conditions // and where the migration stands
				}
				for _, c := range said {
					if !strings.Contains(gd.Message, c.Message) {
						t.Errorf("condition %s says %q, which the library's message %q does not", c.Type, c.Message, gd.Message)
					}
				}
				if len(gd.ToMigrate) > 0 && tc.kind != kindUnfixable && !strings.Contains(msg, gd.Required()) {
					t.Errorf("the answer lacks the library's %q:\n%s", gd.Required(), msg)
				}

				// What the door adds.
				before := td.before
				if tc.verb != "denied" && tc.verb != "is holding" {
					before = ""
				}
				if want := "upgradeguard " + tc.verb + " the " + dr.change + before + ": " + gd.Message; !strings.HasPrefix(msg, want) {
					t.Errorf("the answer does not begin %q:\n%s", want, msg)
				}
				want := slices.Clone(tc.want)
				if tc.kind != kindAdmitted && (tc.kind != kindHeld || strings.Contains(msg, "dry run")) {
					want = append(want, "Next steps"+td.target+": step one; then step two; "+td.again)
				}
				if tc.kind == kindHeld && !strings.Contains(msg, "This was a dry run") {
					want = append(want, "; "+td.retry)
				}
				for _, w := range want {
					if !strings.Contains(msg, w) {
						t.Errorf("the answer lacks %q:\n%s", w, msg)
					}
				}
				// A bridge names the door's plan command, unless the door has none.
				if tc.name == "bridge" && !dr.options.NoPlan && (gd.Plan == "" || !strings.Contains(msg, "The whole safe path: "+gd.Plan)) {
					t.Errorf("a bridge names no plan command: %s", msg)
				}

				wantReason, wantMigration := td.blocked, ""
				switch tc.kind {
				case kindAdmitted:
					wantReason = td.admitted
					if tc.migrated {
						wantMigration = dr.migrations.name
					}
				case kindMigrationFailed:
					wantReason, wantMigration = ReasonMigrationFailed, dr.migrations.name
				case kindHeld:
					wantReason, wantMigration = td.held, dr.migrations.name
					if d.created && !tc.dryRun {
						wantReason = td.started
					}
				}
				if d.reason != wantReason || d.migration != wantMigration {
					t.Errorf("event reason %q and StorageMigration %q, want %q and %q", d.reason, d.migration, wantReason, wantMigration)
				}
			})
		}
	}
}
