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

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
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

// testDoor is one door of the gate whose change a migration can fix, built as the gate
// builds it, with the event reasons and wording its answers must carry, and the
// decisions it can give.
type testDoor struct {
	name                             string
	door                             upgradeDoor
	admitted, blocked, held, started string
	// again and retry are how the deployer applies the change again, and retries it
	// after the migration; target is where the next steps run.
	again, retry, target string
	// before is what the door says of its denials.
	before string
	// decisions are the names of the upgradeDecisions the door can give.
	decisions []string
}

// Decisions of an upgrade door: everything but a CRD update's, which brings the one
// CRD it updates (no deletion) and is judged by the API server itself in the same
// request (no refusal).
// A remote target's field loss is refused by its StorageMigration, not before one is
// created (refusedForFieldLoss reads only the local cluster's objects).
var (
	everyUpgrade = []string{"admitted", "admitted after its migration", "bridge", "delete", "data loss", "refused", "no policy",
		"migration failed", "migration refused", "held, created", "held, in progress", "held, dry run", "held, dry run, in progress"}
	remoteUpgrade = slices.DeleteFunc(slices.Clone(everyUpgrade), func(n string) bool { return n == "migration refused" })
	crdUpdate     = slices.DeleteFunc(slices.Clone(everyUpgrade), func(n string) bool { return n == "delete" || n == "refused" })
)

const testCRD = "widgets.example.io"

// testOwners are the owners a door words its advice for.
var (
	fluxOwned  = owner{hrNamespace: "apps", hrName: "web", namespace: "apps", release: "web"}
	helmOwned  = owner{namespace: "apps", release: "web"}
	argoSynced = owner{release: testCRD, appNamespace: "argocd", app: "widgets"}
	unowned    = owner{release: testCRD}
)

const (
	fluxAgain = "then let helm-controller retry (flux reconcile helmrelease web -n apps --reset)"
	fluxRetry = "when it has succeeded, upgradeguard asks helm-controller to retry HelmRelease apps/web at once (reconcile.fluxcd.io/resetAt)"
)

func testDoors(dryRun bool) []testDoor {
	const crd = testCRD
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
	crdDoor := func(o owner, what string, sms *storageMigrations) upgradeDoor {
		dr := o.door(what, "", crdRep, sms)
		dr.crd = crd
		return dr
	}
	const (
		helmAgain = "then run the helm command again"
		helmRetry = "run the same helm command again when it has succeeded"
		crdRetry  = "retry the update when it has succeeded"
	)
	hrReasons := []string{ReasonChartChangeAdmitted, ReasonChartChangeBlocked, ReasonChartChangeHeld, ReasonMigrationStarted}
	recReasons := []string{ReasonReleaseAdmitted, ReasonReleaseBlocked, ReasonReleaseHeld, ReasonReleaseHeld}
	mk := func(name string, dr upgradeDoor, reasons []string, again, retry, target, before string, decisions []string) testDoor {
		return testDoor{name: name, door: dr, admitted: reasons[0], blocked: reasons[1], held: reasons[2], started: reasons[3],
			again: again, retry: retry, target: target, before: before, decisions: decisions}
	}
	const hrAgain, hrRetry = "then re-apply the change (Flux retries on its next reconcile)", "Flux's retries of this change will then succeed"
	return []testDoor{
		mk("HelmRelease", hrDoor(hr, res, false, sms("hr-apps-web")), hrReasons, hrAgain, hrRetry, "", beforeApplied, everyUpgrade),
		mk("HelmRelease remote", hrDoor(remote, &remoteRes, false, sms("hr-apps-web")), hrReasons, hrAgain, hrRetry,
			" (against the cluster of the kubeConfig Secret apps/shoot-kubeconfig)", beforeApplied, remoteUpgrade),
		mk("release record, Helm", helmOwned.door(record, beforeApplied, &check.Report{}, sms("release-apps-web")), recReasons, helmAgain, helmRetry, "", beforeApplied, everyUpgrade),
		mk("release record, Flux", fluxOwned.door(record, beforeApplied, &check.Report{}, sms("hr-apps-web")), recReasons, fluxAgain, fluxRetry, "", beforeApplied, everyUpgrade),
		mk("CRD update, no owner", crdDoor(unowned, update, sms("crd-"+crd)), recReasons, "then retry the update", crdRetry, "", "", crdUpdate),
		mk("CRD update, Helm", crdDoor(helmOwned, update, sms("release-apps-web")), recReasons, helmAgain, helmRetry, "", "", crdUpdate),
		mk("CRD update, Flux", crdDoor(fluxOwned, update+", applied for HelmRelease apps/web", sms("hr-apps-web")), recReasons, fluxAgain, fluxRetry, "", "", crdUpdate),
		mk("CRD update, Argo CD", crdDoor(argoSynced, update+", applied for Argo CD Application argocd/widgets", sms("crd-"+crd)), recReasons,
			"then sync Application argocd/widgets again (or roll it back again)", crdRetry, "", "", crdUpdate),
	}
}

// testDeletionDoor is one door of the gate whose change deletes CRDs, with the wording its
// answers must carry and the deletionDecisions it can give.
type testDeletionDoor struct {
	name              string
	door              deletionDoor
	admitted, blocked string
	again             string
	// warning is what the warning of a denial says after the denial's sentence; "" for
	// the whole answer.
	warning   string
	decisions []string
}

func testDeletionDoors() []testDeletionDoor {
	const crd = testCRD
	deletion := "deletion of CustomResourceDefinition " + crd + " by user admin"
	// The live CRD being deleted, which already lists a sync option: the Argo CD keep
	// merges Prune=false into it.
	liveCRD := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: crd,
		Annotations: map[string]string{predict.ArgoSyncOptionsAnnotation: "ServerSideApply=true"}}}
	uninstall := "uninstalling mark of release apps/web (revision 2, chart web@2.0.0), which helm uninstall writes before it deletes anything"
	const (
		keep = ". To keep the CRD and its objects outside the release instead: kubectl annotate crd " + crd +
			" helm.sh/resource-policy=keep makes Helm's next upgrade leave them (an uninstall reads that policy from the release's stored manifest only)"
		goesOn = ". Helm only logs this refusal and goes on deleting the release's other objects; upgradeguard's CRD deletion guard, where it is on, " +
			"refuses the DELETE of " + crd + ", so the uninstall fails and leaves the CRDs and their objects in place"
		dryRun = "kubectl delete crd " + crd + " --dry-run=server shows the next steps"
	)
	// The guard judges one CRD; an uninstall judges every CRD it deletes, and may
	// delete none.
	guard, uninstalls := []string{"holds none", "holds objects"}, []string{"deletes no CRD", "holds none", "holds objects"}
	mk := func(name string, dr deletionDoor, reasons []string, again, warning string, decisions []string) testDeletionDoor {
		return testDeletionDoor{name: name, door: dr, admitted: reasons[0], blocked: reasons[1], again: again, warning: warning, decisions: decisions}
	}
	delReasons := []string{ReasonCRDDeletionAdmitted, ReasonCRDDeletionBlocked}
	uninstallReasons := []string{ReasonReleaseAdmitted, ReasonUninstallBlocked}
	return []testDeletionDoor{
		mk("CRD deletion, no owner", unowned.deletionDoor(deletion, liveCRD), delReasons, "then delete the CRD again", dryRun, guard),
		mk("CRD deletion, Helm", helmOwned.deletionDoor(deletion+" (a CRD of Helm release apps/web)", liveCRD), delReasons,
			"then delete the CRD again (or run the helm command that deletes it again)"+keep, dryRun, guard),
		mk("CRD deletion, Flux", fluxOwned.deletionDoor(deletion+" (a CRD that HelmRelease apps/web applies)", liveCRD), delReasons, fluxAgain+keep, dryRun, guard),
		mk("CRD deletion, Argo CD", argoSynced.deletionDoor(deletion+" (a CRD that Argo CD Application argocd/widgets syncs)", liveCRD), delReasons,
			"then sync Application argocd/widgets again with prune. To keep the CRD and its objects instead: kubectl annotate --overwrite crd "+crd+
				" argocd.argoproj.io/sync-options=ServerSideApply=true,Prune=false, then sync Application argocd/widgets again: Argo CD skips the CRD's prune, "+
				"and the Application stays OutOfSync with the CRD requiring pruning", dryRun, guard),
		mk("uninstall, Helm", helmOwned.uninstallDoor(uninstall, []string{crd}), uninstallReasons, "then run helm uninstall again"+goesOn, "", uninstalls),
		mk("uninstall, Flux", fluxOwned.uninstallDoor(uninstall, []string{crd}), uninstallReasons, fluxAgain+goesOn, "", uninstalls),
	}
}

// upgradeCase is one decision an upgrade door can give.
type upgradeCase struct {
	report   *check.Report
	progress func(m *storageMigrations, crds []string) *gate.Progress
	dryRun   bool
	migrated bool // an admitted change whose StorageMigration has succeeded
	kind     kind
	verb     string // what the answer says the gate did
	want     []string
	// never is what the answer must not say.
	never []string
	// noMigration: the answer names no StorageMigration (none was created).
	noMigration bool
}

func verdicts(vs ...predict.Verdict) *check.Report {
	const a, b = "a.example.io", "b.example.io"
	rep := &check.Report{Safe: true, NextSteps: []string{"step one", "step two"}}
	for i, v := range vs {
		rep.CRDs = append(rep.CRDs, check.CRDReport{Decision: predict.Decision{Name: []string{a, b}[i], Verdict: v, Reason: "because " + string(v)}})
		rep.Safe = rep.Safe && v == predict.OK
	}
	return rep
}

// upgradeDecisions are every decision of gate.Judge, with the progress the gate's
// Migrator reports.
var upgradeDecisions = map[string]upgradeCase{
	"admitted":                     {report: verdicts(predict.OK), kind: kindAdmitted, verb: "admitted"},
	"admitted after its migration": {report: verdicts(predict.OK), migrated: true, kind: kindAdmitted, verb: "admitted"},
	"bridge":                       {report: verdicts(predict.Bridge), kind: kindUnfixable, verb: "denied", want: []string{gate.WhyBridge}},
	"delete":                       {report: verdicts(predict.Delete, predict.Migrate), kind: kindUnfixable, verb: "denied", want: []string{gate.WhyDelete}},
	"data loss":                    {report: verdicts(predict.DataLoss), kind: kindUnfixable, verb: "denied", want: []string{gate.WhyDataLoss}},
	"refused":                      {report: verdicts(predict.Refused, predict.Migrate), kind: kindUnfixable, verb: "denied", want: []string{gate.WhyRefused}},
	"no policy": {report: verdicts(predict.Migrate, predict.Migrate), kind: kindNoPolicy, verb: "denied",
		progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.notAllowed(crds) },
		want:     []string{"no StorageMigrationPolicy with autoMigrate selects a.example.io, b.example.io", "Or create a StorageMigrationPolicy with autoMigrate: true that selects these CRDs"}},
	"migration failed": {report: verdicts(predict.Migrate), kind: kindMigrationFailed, verb: "denied",
		progress: func(m *storageMigrations, _ []string) *gate.Progress {
			return m.failed(m.name, "a.example.io: 3 objects could not be migrated")
		},
		want: []string{"failed: a.example.io: 3 objects could not be migrated", "kubectl delete storagemigration "}},
	"migration refused": {report: verdicts(predict.Migrate), kind: kindMigrationFailed, verb: "denied", noMigration: true,
		progress: func(m *storageMigrations, _ []string) *gate.Progress {
			return m.failed("", "a.example.io: a migration would be refused for field loss")
		},
		want:  []string{"a.example.io: a migration would be refused for field loss"},
		never: []string{"StorageMigration ", "kubectl delete storagemigration"}},
	"held, created": {report: verdicts(predict.Migrate, predict.Migrate), kind: kindHeld, verb: "is holding",
		progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.running(crds, true) },
		want:     []string{"was created to migrate 2 CRDs", "The change is held until StorageMigration "}},
	"held, in progress": {report: verdicts(predict.Migrate), kind: kindHeld, verb: "is holding",
		progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.running(crds, false) },
		want:     []string{"is in progress, migrating 1 CRD", "kubectl get storagemigration "}},
	"held, dry run": {report: verdicts(predict.Migrate), dryRun: true, kind: kindHeld, verb: "would hold",
		progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.running(crds, true) },
		want:     []string{"would be created to migrate 1 CRD", "This was a dry run, so no StorageMigration was created"}},
	"held, dry run, in progress": {report: verdicts(predict.Migrate), dryRun: true, kind: kindHeld, verb: "would hold",
		progress: func(m *storageMigrations, crds []string) *gate.Progress { return m.running(crds, false) },
		want:     []string{"is in progress, migrating 1 CRD", "The change is held until StorageMigration "}},
}

// deletionDecisions are every decision of gate.JudgeDeletion.
var deletionDecisions = map[string]*check.Report{
	"deletes no CRD": {Operation: predict.DeleteCRD, Safe: true},
	"holds none": {Operation: predict.DeleteCRD, Safe: true, CRDs: []check.CRDReport{{Decision: predict.Decision{Name: testCRD, Verdict: predict.OK,
		Reason: "it holds no Widget objects, so nothing is lost"}}}},
	"holds objects": {Operation: predict.DeleteCRD, NextSteps: []string{"step one", "step two"}, CRDs: []check.CRDReport{{Decision: predict.Decision{Name: testCRD,
		Verdict: predict.Delete, Reason: "the API server deletes all 3 Widget objects with it, for good"}}}},
}

// TestAnswer words every decision each door can give, and only those: an upgrade door's
// are gate.Judge's, a deletion door's gate.JudgeDeletion's. The decisions are the
// library's own (with the progress the gate's Migrator reports), and every answer must
// carry the library's sentence as it is (its Message, which holds every condition's
// message) and the conditions unchanged. Around it a door adds only its own: the change,
// when it denies, its next steps and how its deployer goes on; a deletion door's denial
// is also its warning.
func TestAnswer(t *testing.T) {
	for _, dryRun := range []bool{false, true} {
		for _, td := range testDoors(dryRun) {
			for _, name := range td.decisions {
				tc := upgradeDecisions[name]
				if tc.dryRun != dryRun {
					continue
				}
				t.Run("upgrade/"+td.name+"/"+name, func(t *testing.T) { testUpgradeAnswer(t, td, name, tc) })
			}
		}
	}
	for _, td := range testDeletionDoors() {
		for _, name := range td.decisions {
			t.Run("deletion/"+td.name+"/"+name, func(t *testing.T) { testDeletionAnswer(t, td, name, deletionDecisions[name]) })
		}
	}
}

func testDeletionAnswer(t *testing.T, td testDeletionDoor, name string, rep *check.Report) {
	gd := gate.JudgeDeletion(rep)
	d := td.door.answer(gd)
	want := decision{kind: kindAdmitted, reason: td.admitted, message: "upgradeguard admitted the " + td.door.change + ": " + gd.Message}
	if name == "holds objects" {
		denied := "upgradeguard denied the " + td.door.change + ": " + gd.Message
		want = decision{kind: kindUnfixable, reason: td.blocked, message: denied + ". Next steps: step one; then step two; " + td.again}
		want.warnings = []string{want.message}
		if td.warning != "" {
			want.warnings = []string{denied + "; " + td.warning}
		}
	}
	if diff := cmp.Diff(want, d, cmp.AllowUnexported(decision{})); diff != "" {
		t.Errorf("answer (-want +got):\n%s", diff)
	}
}

func testUpgradeAnswer(t *testing.T, td testDoor, name string, tc upgradeCase) {
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
	if len(d.warnings) > 0 {
		t.Errorf("an upgrade's answer warns %q; its door adds the warnings of what it read", d.warnings)
	}

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

	// What the door adds: a CRD update's dry run it would hold begins with the mark
	// programs read, and no other answer carries one.
	mark := ""
	if dr.crd != "" && tc.dryRun && tc.kind == kindHeld {
		mark = MarkDryRunHeld(testCRD) + " "
	}
	if got := dryRunHeldCRDs(msg); (mark != "") != slices.Equal(got, []string{testCRD}) || (mark == "" && len(got) > 0) {
		t.Errorf("the answer marks %q as held by a dry run, want the mark %q:\n%s", got, mark, msg)
	}
	before := td.before
	if tc.verb != "denied" && tc.verb != "is holding" {
		before = ""
	}
	if want := mark + "upgradeguard " + tc.verb + " the " + dr.change + before + ": " + gd.Message; !strings.HasPrefix(msg, want) {
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
	for _, n := range tc.never {
		if strings.Contains(msg, n) {
			t.Errorf("the answer says %q:\n%s", n, msg)
		}
	}
	// A bridge names the door's plan command, unless the door has none.
	if name == "bridge" && !dr.options.NoPlan && (gd.Plan == "" || !strings.Contains(msg, "The whole safe path: "+gd.Plan)) {
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
		if tc.noMigration {
			wantMigration = ""
		}
	case kindHeld:
		wantReason, wantMigration = td.held, dr.migrations.name
		if d.created && !tc.dryRun {
			wantReason = td.started
		}
	}
	if d.reason != wantReason || d.migration != wantMigration {
		t.Errorf("event reason %q and StorageMigration %q, want %q and %q", d.reason, d.migration, wantReason, wantMigration)
	}
}

// TestDryRunHeldMark: argoDiffs finds a held CRD by the mark alone. The sentence around
// it may say anything (here, every word of the real answer reworded), and the old
// sentence without the mark is no longer read.
func TestDryRunHeldMark(t *testing.T) {
	dr := unowned.door("update of CustomResourceDefinition "+testCRD, "", &check.Report{Chart: crdGateChart},
		&storageMigrations{name: "crd-" + testCRD, dryRun: true})
	dr.crd = testCRD
	o := dr.options
	o.Migrator = migratorFunc(func(crds []string) *gate.Progress { return dr.migrations.running(crds, true) })
	gd, err := gate.Judge(t.Context(), verdicts(predict.Migrate), o)
	if err != nil {
		t.Fatal(err)
	}
	answer := dr.answer(gd, "").message
	mark := MarkDryRunHeld(testCRD)
	reworded := mark + " " + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' {
			return 'a' + ('z' - r) // every letter of the sentence changed
		}
		return r
	}, strings.TrimPrefix(answer, mark+" "))
	unmarked := strings.TrimPrefix(answer, mark+" ")
	condition := func(msg string) *argoapp.Application {
		app := &argoapp.Application{}
		app.Status.Conditions = []argoapp.Condition{{Type: "ComparisonError", Message: "error running server side apply in dryrun mode: admission webhook \"crd.upgradeguard.io\" denied the request: " + msg}}
		return app
	}
	for _, tc := range []struct {
		name, message string
		want          []string
	}{
		{"the answer", answer, []string{testCRD}},
		{"the answer reworded", reworded, []string{testCRD}},
		{"the sentence without its mark", unmarked, nil},
	} {
		if got := heldCRDs(condition(tc.message)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: heldCRDs = %q, want %q:\n%s", tc.name, got, tc.want, tc.message)
		}
	}
}
