//go:build argocd

package argocd_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

// gateDenial is how Argo CD shows a CRD write the gate refused, up to the CRD's name.
const gateDenial = `admission webhook "crd.upgradeguard.io" denied the request: upgradeguard denied the update of CustomResourceDefinition `

// migrateCRDs runs upgradeguard's migration of the breaking CRDs (to storage, a storage
// switch when it is not the live one) and fails the test unless each ends migrated.
func migrateCRDs(t *testing.T, s *scenario, storage string) {
	t.Helper()
	m, err := migrate.New(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	var targets []migrate.Target
	for _, n := range fluxtest.BreakingCRDs {
		targets = append(targets, migrate.Target{Name: n, StorageVersion: storage})
	}
	results, err := m.Run(t.Context(), targets, migrate.Options{Deadline: time.Minute, LeaseNamespace: "default", AllowStorageSwitch: storage != ""})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Status != migrate.Migrated {
			t.Fatalf("migration of %s: %s (%s)", r.Name, r.Status, r.Message)
		}
	}
}

// promotedScenario is an Application synced from Old (kyverno 1.10, the objects stored
// at v2alpha1) to Promoted (kyverno 1.11, storage v2beta1), whose objects were then
// migrated to v2beta1 and storedVersions pruned to [v2beta1] (what upgradeguard migrate,
// or a proactive StorageMigrationPolicy, does after a storage promotion), with automated
// sync turned off, as `argocd app rollback` requires.
func promotedScenario(t *testing.T, cp *testenv.ControlPlane, argo *argocd.ArgoCD, name string) *scenario {
	t.Helper()
	s := startScenario(t, cp, argo, name, fromGit, argocd.SyncRetry{Limit: 2, Backoff: time.Second, Factor: 2, MaxBackoff: 4 * time.Second},
		[]string{fluxtest.Old, Promoted})
	s.expectCRDs(t, fluxtest.Old, "v2alpha1", "v2alpha1")
	s.bump(t, Promoted)
	s.waitSynced(t, Promoted)
	s.expectCRDs(t, Promoted, "v2beta1", "v2alpha1", "v2beta1")
	migrateCRDs(t, s, "")
	s.expectCRDs(t, Promoted, "v2beta1", "v2beta1")
	if err := argo.DisableAutomatedSync(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	return s
}

// rollBack rolls the Application back to its history entry of chart version v, as
// `argocd app rollback NAME ID` does, and waits until the operation ended.
func (s *scenario) rollBack(t *testing.T, v string) *argocd.Application {
	t.Helper()
	ctx := t.Context()
	app, err := s.argo.Get(ctx, s.name)
	if err != nil {
		t.Fatal(err)
	}
	entry, ok := app.Status.Entry(s.commits[v])
	if !ok {
		t.Fatalf("no history entry of %s (%s): %+v", v, s.commits[v], app.Status.History)
	}
	if err := s.argo.Rollback(ctx, s.name, entry.ID); err != nil {
		t.Fatal(err)
	}
	app, err = s.argo.WaitApplication(ctx, s.name, 3*time.Minute, func(app *argocd.Application) bool {
		op := app.Status.OperationState
		return op != nil && op.Operation.Sync.Revision == s.commits[v] && slices.Contains([]string{"Succeeded", "Failed", "Error"}, op.Phase)
	})
	if err != nil {
		t.Fatalf("the rollback to %s did not end: %v\n%s", v, err, s.argo.LogTail(30))
	}
	t.Logf("%s", app)
	return app
}

// TestRollbackAcrossPromotionFails: without upgradeguard, `argocd app rollback` from a
// chart whose CRDs promoted a new storage version (and whose objects were migrated to
// it) to the chart before the promotion fails. The old CRDs do not list v2beta1, which
// status.storedVersions holds alone: the API server refuses each, and the rollback, an
// operation without retries, fails at once with the API server's text. The CRDs and the
// objects stay as they were, but the ConfigMap of the same wave is rolled back: the
// release is half at Old.
func TestRollbackAcrossPromotionFails(t *testing.T) {
	needCluster(t)
	cp := testenv.ForTest(t)
	argo := argocd.Start(t, cp)
	s := promotedScenario(t, cp, argo, "rollback")

	app := s.rollBack(t, fluxtest.Old)
	op := app.Status.OperationState
	wording := crdversions.WordingFor(cp.Minor)
	if op.Phase != "Failed" || op.RetryCount != 0 || !strings.HasPrefix(op.Message, "one or more synchronization tasks completed unsuccessfully") {
		t.Errorf("rollback: phase %s, retry count %d, message %q; want Failed at once with Argo CD's failed-tasks message", op.Phase, op.RetryCount, op.Message)
	}
	if got, want := rejectedCRDs(op.Message, wording), []string{"cleanuppolicies.kyverno.io@v2beta1", "policyexceptions.kyverno.io@v2beta1"}; !slices.Equal(got, want) {
		t.Errorf("operation message %q: storedVersions rejections (%q wording) %v, want %v", op.Message, wording, got, want)
	}
	results := resourceResults(op)
	for _, n := range fluxtest.BreakingCRDs {
		if r := results[n]; !strings.HasPrefix(r, "SyncFailed: ") || !slices.Equal(rejectedCRDs(r, wording), []string{n + "@v2beta1"}) {
			t.Errorf("sync result of %s = %q, want SyncFailed with the API server's rejection of v2beta1", n, r)
		}
	}
	// The CRDs stay at Promoted; the ConfigMap of the same wave is rolled back.
	s.expectLeft(t, "after the failed rollback", promotedMigrated, fluxtest.Old)
}

// promotedMigrated is what Promoted's CRDs hold once the objects were migrated to
// v2beta1; at10 what Old's hold, v2alpha1 alone.
var (
	promotedMigrated = crdState{Storage: "v2beta1", Versions: []string{"v2alpha1", "v2beta1"}, StoredVersions: []string{"v2beta1"}}
	at10             = crdState{Storage: "v2alpha1", Versions: []string{"v2alpha1"}, StoredVersions: []string{"v2alpha1"}}
)

// TestCRDGateBlocksRollbackAcrossPromotion: the same rollback with upgradeguard's CRD gate.
// The gate does not know the write is a rollback (it sees one CRD update); it finds the
// live storage version v2beta1 dropped, a bridge, which no migration fixes, so it denies
// each CRD with its reason and the storage switch to v2alpha1 (served by both: the
// reverse migration) as the next step, and starts no StorageMigration. Argo CD's failed
// operation carries that message, never the API server's. Running the step the message
// names and rolling back again succeeds: the CRDs are 1.10's and every object reads.
func TestCRDGateBlocksRollbackAcrossPromotion(t *testing.T) {
	needCluster(t)
	cp, ug := startGated(t)
	argo := argocd.Start(t, cp)
	s := promotedScenario(t, cp, argo, "gated-rollback")

	app := s.rollBack(t, fluxtest.Old)
	op := app.Status.OperationState
	if op.Phase != "Failed" {
		t.Fatalf("rollback %s, want Failed: %s", op.Phase, op.Message)
	}
	if got := crdversions.StoredVersionRejections(op.Message); len(got) > 0 {
		t.Errorf("the API server's own rejection reached Argo CD (%v): the gate should answer first", got)
	}
	results := resourceResults(op)
	for _, n := range fluxtest.BreakingCRDs {
		step := "upgradeguard migrate --crd " + n + " --storage-version v2alpha1 --allow-storage-switch"
		for _, msg := range []string{op.Message, results[n]} {
			for _, want := range []string{
				gateDenial + n + ", which drops v2beta1 from spec.versions while status.storedVersions still lists it (the API server rejects it), applied for Argo CD Application argocd/gated-rollback",
				n + ": live storage version v2beta1 is dropped by the incoming CRD ([v2alpha1]): a migration alone cannot help; switch live storage to v2alpha1 (served by both), migrate, prune",
				"Next steps: " + step + "; then sync Application argocd/gated-rollback again (or roll it back again)",
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("Argo CD's sync result lacks %q:\n%s", want, msg)
				}
			}
		}
		if !strings.HasPrefix(results[n], "SyncFailed: ") {
			t.Errorf("sync result of %s = %q, want SyncFailed", n, results[n])
		}
	}
	var sms v1alpha1.StorageMigrationList
	if err := ug.List(t.Context(), &sms, client.Limit(10)); err != nil || len(sms.Items) > 0 {
		t.Errorf("StorageMigrations after a blocked rollback: %d (%v), want none: no automatic migration fixes a bridge", len(sms.Items), err)
	}
	s.expectLeft(t, "after the blocked rollback", promotedMigrated, fluxtest.Old)

	// The next step the denial names, then the same rollback again.
	migrateCRDs(t, s, "v2alpha1")
	s.expectCRDs(t, Promoted, "v2alpha1", "v2alpha1")
	app = s.rollBack(t, fluxtest.Old)
	if op := app.Status.OperationState; op.Phase != "Succeeded" {
		t.Fatalf("rollback after the storage switch: %s: %s", op.Phase, op.Message)
	}
	s.expectLeft(t, "after the rollback", at10, fluxtest.Old)
}

// TestCRDGateDeniesBridge: with the CRD gate, automated sync moves an Application of a
// Helm repository (Old, From and To published) from Old (kyverno 1.10: v2alpha1 alone,
// stored) straight to To (kyverno 1.13: v2 and v2beta1). The live storage version itself
// is dropped, so no migration can help: a bridge. The gate denies every attempt, says
// what a stepping stone must be, names the Application and the plan command that
// computes the whole path, and starts no StorageMigration. Argo CD's failed operation,
// each CRD's sync result and its SyncError condition carry the message; the CRDs and the
// objects stay as they were. The plan command, run as the message words it, names From
// as the stepping stone; following it (targetRevision From, migrate, targetRevision To)
// ends synced at To with every object readable.
func TestCRDGateDeniesBridge(t *testing.T) {
	needCluster(t)
	cp, ug := startGated(t)
	argo := argocd.Start(t, cp)
	s := startScenario(t, cp, argo, "bridge", fromHelmRepo, argocd.SyncRetry{Limit: 2, Backoff: time.Second, Factor: 2, MaxBackoff: 4 * time.Second},
		[]string{fluxtest.Old, fluxtest.From, fluxtest.To})
	s.expectCRDs(t, fluxtest.Old, "v2alpha1", "v2alpha1")

	app := s.bumpFails(t, fluxtest.To)
	op := app.Status.OperationState
	if op.RetryCount != 2 {
		t.Errorf("retry count %d, want 2: every attempt denied", op.RetryCount)
	}
	if got := crdversions.StoredVersionRejections(op.Message); len(got) > 0 {
		t.Errorf("the API server's own rejection reached Argo CD (%v): the gate should answer first", got)
	}
	const planCmd = "upgradeguard plan --argocd-app " + argocd.Namespace + "/bridge"
	syncError, _ := app.Status.Condition("SyncError")
	results := resourceResults(op)
	for _, n := range fluxtest.BreakingCRDs {
		for _, msg := range []string{op.Message, results[n], syncError} {
			for _, want := range []string{
				gateDenial + n + ", which drops v2alpha1 from spec.versions while status.storedVersions still lists it (the API server rejects it), applied for Argo CD Application argocd/bridge",
				n + ": live storage version v2alpha1 is dropped by the incoming CRD ([v2 v2beta1]): a migration alone cannot help; go through a chart version whose CRD serves v2alpha1 and stores at one of [v2 v2beta1]",
				"then sync Application argocd/bridge again",
				"The whole safe path: " + planCmd,
			} {
				if !strings.Contains(msg, want) {
					t.Errorf("Argo CD's status lacks %q:\n%s", want, msg)
				}
			}
		}
	}
	var sms v1alpha1.StorageMigrationList
	if err := ug.List(t.Context(), &sms, client.Limit(10)); err != nil || len(sms.Items) > 0 {
		t.Errorf("StorageMigrations after a bridge: %d (%v), want none", len(sms.Items), err)
	}
	// The CRDs stay at Old; the ConfigMap of the same wave is at To.
	s.expectLeft(t, "after the denied sync", at10, fluxtest.To)

	// The plan command the denial names, then its steps.
	steps := runPlan(t, cp, planCmd)
	if want := []string{"upgrade " + fluxtest.From, "migrate ", "upgrade " + fluxtest.To}; !slices.Equal(steps, want) {
		t.Fatalf("%s: steps %v, want %v", planCmd, steps, want)
	}
	s.bump(t, fluxtest.From)
	s.waitSynced(t, fluxtest.From)
	migrateCRDs(t, s, "")
	s.bump(t, fluxtest.To)
	s.waitSynced(t, fluxtest.To)
	s.expectLeft(t, "at "+fluxtest.To, at13, fluxtest.To)
}

// runPlan runs the upgradeguard command line (a plan) and returns its steps as "kind
// version", checking that each upgrade step names the targetRevision to commit.
func runPlan(t *testing.T, cp *testenv.ControlPlane, command string) []string {
	t.Helper()
	var out, errOut bytes.Buffer
	args := append([]string{"--kubeconfig", cp.Kubeconfig}, strings.Fields(command)[1:]...)
	code := cli.Execute(t.Context(), append(args, "-o", "json"), cli.Streams{Out: &out, ErrOut: &errOut})
	if code != cli.ExitFindings {
		t.Fatalf("%s: exit %d, want %d\n%s%s", command, code, cli.ExitFindings, out.String(), errOut.String())
	}
	var p plan.Plan
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatalf("%s -o json: %v\n%s", command, err, out.String())
	}
	t.Logf("%s: from %s: %s", command, p.From, out.String())
	var steps []string
	for _, st := range p.Steps {
		steps = append(steps, string(st.Kind)+" "+st.ChartVersion)
		if st.Kind == plan.Upgrade && !strings.Contains(st.Commands[0], `targetRevision: "`+st.ChartVersion+`"`) {
			t.Errorf("step %q does not name the targetRevision to commit", st.Commands[0])
		}
	}
	return steps
}
