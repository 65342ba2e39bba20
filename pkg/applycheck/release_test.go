package applycheck_test

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// webChart is a chart Helm applies in this order: Secret, ConfigMaps (by name),
// Deployment. b-guarded carries the release's password, so that an admission message
// that quotes it must be redacted.
type webChart struct {
	mode, x, v, selector string
	withOld, withNew     bool
}

func (w webChart) write(t *testing.T, version string) string {
	t.Helper()
	cm := func(name, data string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n" + data
	}
	files := map[string]string{
		"values.yaml":           "password: unset\n",
		"templates/secret.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ntype: Opaque\nstringData:\n  password: {{ .Values.password | quote }}\n",
		"templates/a.yaml":      cm("a-settings", "  mode: "+w.mode+"\n  note: about-"+w.mode+"\n"),
		"templates/b.yaml":      cm("b-guarded", "  x: \""+w.x+"\"\n  token: {{ .Values.password | quote }}\n"),
		"templates/z.yaml":      cm("z-after", "  v: \""+w.v+"\"\n"),
		"templates/web.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  selector:\n    matchLabels:\n      app: " + w.selector +
			"\n  template:\n    metadata:\n      labels:\n        app: " + w.selector + "\n    spec:\n      containers:\n      - name: web\n        image: busybox:1.36\n",
	}
	if w.withOld {
		files["templates/old.yaml"] = cm("old", "  o: \"1\"\n")
	}
	if w.withNew {
		files["templates/new.yaml"] = cm("n-new", "  n: \"1\"\n")
	}
	dir, err := testenv.WriteChart(t.TempDir(), "web", version, files)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// checkRelease predicts the upgrade to chart, rendered as helm upgrade renders it (with
// the stored values), or, for chart "", the rollback to toRevision: one
// applycheck.Predict, whose replay it returns. No string of the prediction holds the
// release's password.
func (c cluster) checkRelease(t *testing.T, chart, rel, ns string, toRevision int, flags applycheck.Flags) *applycheck.ReleaseReport {
	t.Helper()
	r := applycheck.Request{Release: rel, Namespace: ns, Operation: applycheck.OpRollback, ToRevision: toRevision, Flags: flags}
	if chart != "" {
		r.Operation, r.Chart = applycheck.OpUpgrade, chartsource.Options{Ref: chart}
	}
	p, err := applycheck.Predict(t.Context(), c.sources(t, ns), r)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), sentinel) {
		t.Errorf("the prediction holds the release's password:\n%s", data)
	}
	if p.Safe != (p.ReleaseReport.Safe && p.CRDCheck.Safe) {
		t.Errorf("safe %v, but the replay says %v and the CRD check %v", p.Safe, p.ReleaseReport.Safe, p.CRDCheck.Safe)
	}
	return p.ReleaseReport
}

// sources are what Predict reads in namespace ns.
func (c cluster) sources(t *testing.T, ns string) applycheck.Sources {
	t.Helper()
	reader, err := helmrelease.NewReader(c.cs, ns, "secret")
	if err != nil {
		t.Fatal(err)
	}
	live, err := livecluster.NewKubeCluster(c.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	return applycheck.Sources{Releases: reader, Dynamic: c.dyn, Mapper: c.mapper, Cluster: live}
}

func (c cluster) helm3(t *testing.T, args ...string) {
	t.Helper()
	c.cp.NeedHelm3(t)
	if out, err := c.cp.Helm3(args...).CombinedOutput(); err != nil {
		t.Fatalf("helm3 %v: %v\n%s", args, err, out)
	}
}

// record reads one stored revision.
func (c cluster) record(t *testing.T, rel, ns string, version int) (status, description, applyMethod string) {
	t.Helper()
	reader, err := helmrelease.NewReader(c.cs, ns, "secret")
	if err != nil {
		t.Fatal(err)
	}
	hist, err := reader.History(t.Context(), rel)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range hist {
		if r.Version == version {
			return r.Info.Status.String(), r.Info.Description, r.ApplyMethod
		}
	}
	t.Fatalf("release %s has no revision %d", rel, version)
	return "", "", ""
}

// guardB makes a ValidatingAdmissionPolicy reject b-guarded with x = "2" in namespace ns,
// quoting the object's token in its message, and waits until the API server enforces it.
func (c cluster) guardB(t *testing.T, ns string) {
	t.Helper()
	ctx := t.Context()
	fail := admissionv1.Fail
	policy := &admissionv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "guard-" + ns},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{RuleWithOperations: admissionv1.RuleWithOperations{
				Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
				Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}}}},
			Validations: []admissionv1.Validation{{
				Expression:        "object.metadata.name != 'b-guarded' || !has(object.data) || !('x' in object.data) || object.data.x != '2'",
				MessageExpression: "'x may not be 2 (token ' + object.data.token + ')'"}}}}
	if _, err := c.cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: "guard-" + ns},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "guard-" + ns, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
			MatchResources: &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}}}
	if _, err := c.cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "b-guarded", Namespace: ns}, Data: map[string]string{"x": "2", "token": "probe"}}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.cs.CoreV1().ConfigMaps(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), nil
	})
	if err != nil {
		t.Fatalf("the admission policy is not enforced: %v", err)
	}
}

func kubectlPatch(t *testing.T, c cluster, ns string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(c.cp.KubeBin, "kubectl"), append([]string{"--kubeconfig", c.cp.Kubeconfig, "-n", ns, "patch"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
}

// TestHelm3ReleaseUpgradedByHelm4ClientSide is the path most users are on: a release
// installed by Helm 3 (no apply_method recorded), upgraded by Helm 4.3.1 with the default
// --server-side=auto, which stays client-side. The new chart changes a Deployment's
// selector (immutable) and a ConfigMap that a ValidatingAdmissionPolicy rejects, with
// ConfigMaps that do apply before and after them, one new ConfigMap and one dropped.
// The prediction must name the failing objects and Helm's own error, the partial state
// (read back from the API server) and the failed revision Helm records.
func TestHelm3ReleaseUpgradedByHelm4ClientSide(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	const ns, rel = "csa", "web"
	v1 := webChart{mode: "one", x: "1", v: "1", selector: "web", withOld: true}.write(t, "1.0.0")
	v2 := webChart{mode: "two", x: "2", v: "2", selector: "web-v2", withNew: true}.write(t, "2.0.0")
	c.helm3(t, "install", rel, v1, "-n", ns, "--create-namespace", "--set", "password="+sentinel)
	if _, _, method := c.record(t, rel, ns, 1); method != "" {
		t.Fatalf("Helm 3 recorded apply_method %q", method)
	}
	c.guardB(t, ns)
	kubectlPatch(t, c, ns, "configmap", "a-settings", "-p", `{"data":{"mode":"manual"}}`)

	rep := c.checkRelease(t, v2, rel, ns, 0, applycheck.Flags{})
	if rep.Mode.ServerSide || rep.Mode.Method != applycheck.MethodCSA || rep.Mode.FlagError != "" || !strings.Contains(rep.Mode.Reason, "recorded no apply_method") {
		t.Errorf("mode %+v", rep.Mode)
	}
	a := rep.Apply
	want := map[string]applycheck.Outcome{
		"Secret/csa/creds": applycheck.Unchanged, "ConfigMap/csa/a-settings": applycheck.Updated, "ConfigMap/csa/b-guarded": applycheck.Failed,
		"ConfigMap/csa/n-new": applycheck.Created, "ConfigMap/csa/z-after": applycheck.Updated, "Deployment/csa/web": applycheck.Failed,
		"ConfigMap/csa/old": applycheck.NotDeleted,
	}
	if diff := cmp.Diff(want, outcomes(a)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	if a.Method != applycheck.MethodCSA || a.Result != applycheck.Fails || rep.Safe {
		t.Errorf("method %s result %s safe %v", a.Method, a.Result, rep.Safe)
	}
	if !strings.Contains(a.Error, `cannot patch "b-guarded" with kind ConfigMap: configmaps "b-guarded" is forbidden: ValidatingAdmissionPolicy 'guard-csa'`) ||
		!strings.Contains(a.Error, `cannot patch "web" with kind Deployment: Deployment.apps "web" is invalid: spec.selector`) ||
		!strings.Contains(a.Error, "field is immutable") || !strings.Contains(a.Error, "[redacted]") {
		t.Errorf("predicted error: %s", a.Error)
	}
	if rep.ServerSide == nil || rep.ServerSide.Method != applycheck.MethodSSA {
		t.Errorf("no server-side prediction for a client-side release: %+v", rep.ServerSide)
	}
	// Client-side, the field kubectl-patch set is overwritten without a conflict.
	for _, o := range a.Objects {
		if o.Object == "ConfigMap/csa/a-settings" && !cmp.Equal(o.Overwrites, []applycheck.FieldConflict{{Field: ".data.mode", Manager: "kubectl-patch"}}) {
			t.Errorf("a-settings overwrites %+v", o.Overwrites)
		}
	}

	before := c.snapshot(t, a)
	out, err := c.helm(t, "upgrade", rel, v2, "-n", ns)
	if err == nil {
		t.Fatalf("helm upgrade succeeded:\n%s", out)
	}
	// Helm prints the password the admission message quotes; the prediction never does.
	if got := strings.ReplaceAll(out, sentinel, "[redacted]"); !strings.Contains(got, "Error: UPGRADE FAILED: "+a.Error+"\n") {
		t.Errorf("helm's error is not the predicted one\nhelm:      %s\npredicted: %s", got, a.Error)
	}
	after := c.snapshot(t, a)
	if diff := cmp.Diff(sorted(a.Landed), changedBetween(before, after)); diff != "" {
		t.Errorf("landed: predicted (-) vs changed on the cluster (+):\n%s", diff)
	}
	if !cmp.Equal(sorted(a.Landed), []string{"ConfigMap/csa/a-settings", "ConfigMap/csa/n-new", "ConfigMap/csa/z-after"}) {
		t.Errorf("landed %v", a.Landed)
	}
	if data, _ := after["ConfigMap/csa/a-settings"]["data"].(map[string]any); data["mode"] != "two" {
		t.Errorf("a-settings data.mode is %v after the real upgrade, predicted overwritten to two", data["mode"])
	}
	status, desc, method := c.record(t, rel, ns, 2)
	if status != a.Record.Status || method != applycheck.MethodCSA ||
		strings.ReplaceAll(desc, sentinel, "[redacted]") != a.Record.Description {
		t.Errorf("revision 2: %s %q %s\npredicted %s %q", status, desc, method, a.Record.Status, a.Record.Description)
	}
	if status, _, _ := c.record(t, rel, ns, 1); status != a.Record.PreviousStatus {
		t.Errorf("revision 1 is %s, predicted %s", status, a.Record.PreviousStatus)
	}
}

// TestHelm3ReleaseFlagErrorAndServerSideMove: the same Helm 3 release, upgraded by Helm 4
// with --force-conflicts (the kubermatic#16209 error, predicted before Helm runs), then
// moved to server-side apply on purpose with --server-side=true after `kubectl patch`
// took a field the chart sets: the fields Helm's client-side applies own move to its
// server-side apply, and the patched field conflicts.
func TestHelm3ReleaseFlagErrorAndServerSideMove(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	const ns, rel = "move", "web"
	v1 := webChart{mode: "one", x: "1", v: "1", selector: "web"}.write(t, "1.0.0")
	v2 := webChart{mode: "two", x: "1", v: "2", selector: "web"}.write(t, "2.0.0")
	c.helm3(t, "install", rel, v1, "-n", ns, "--create-namespace", "--set", "password="+sentinel)
	kubectlPatch(t, c, ns, "configmap", "a-settings", "-p", `{"data":{"mode":"manual"}}`)

	// --force-conflicts on a client-side release.
	rep := c.checkRelease(t, v2, rel, ns, 0, applycheck.Flags{ForceConflicts: true})
	const flagErr = "invalid client update option(s): forceConflicts enabled when serverSideApply disabled"
	if rep.Mode.FlagError != flagErr || rep.Mode.FlagErrorStage != applycheck.AfterHooks || rep.Safe || len(rep.Mode.Alternatives) != 2 {
		t.Fatalf("mode %+v", rep.Mode)
	}
	if rep.Apply.Result != applycheck.Fails || rep.Apply.Error != flagErr || len(rep.Apply.Landed) != 0 || rep.Apply.Record.Revision != 2 {
		t.Errorf("apply %+v", rep.Apply)
	}
	before := c.snapshot(t, rep.Apply)
	out, err := c.helm(t, "upgrade", rel, v2, "-n", ns, "--force-conflicts")
	if err == nil || !strings.Contains(out, "Error: UPGRADE FAILED: "+flagErr+"\n") {
		t.Errorf("helm upgrade --force-conflicts: %v\n%s", err, out)
	}
	if diff := changedBetween(before, c.snapshot(t, rep.Apply)); len(diff) != 0 {
		t.Errorf("the flag error changed %v", diff)
	}
	if status, desc, _ := c.record(t, rel, ns, 2); status != "failed" || desc != rep.Apply.Record.Description {
		t.Errorf("revision 2: %s %q, predicted %q", status, desc, rep.Apply.Record.Description)
	}
	if got := rep.Mode.Command([]string{rel, v2, "-n", ns}, rep.Mode.Alternatives[1].Flags); !strings.HasSuffix(got, "--server-side=true --force-conflicts") {
		t.Errorf("alternative %s", got)
	}

	// --server-side=true: the move, with kubectl-patch holding .data.mode.
	rep = c.checkRelease(t, v2, rel, ns, 0, applycheck.Flags{ServerSide: "true"})
	if !rep.Mode.ServerSide || !rep.Mode.TakesOverClientSide || rep.ServerSide != nil {
		t.Fatalf("mode %+v", rep.Mode)
	}
	a := rep.Apply
	want := map[string]applycheck.Outcome{
		"Secret/move/creds": applycheck.Unchanged, "ConfigMap/move/a-settings": applycheck.Conflict, "ConfigMap/move/b-guarded": applycheck.Unchanged,
		"ConfigMap/move/z-after": applycheck.Updated, "Deployment/move/web": applycheck.Unchanged,
	}
	if diff := cmp.Diff(want, outcomes(a)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	for _, o := range a.Objects {
		// .data.note changes too and is Helm's own (client-side): it moves, it does not
		// conflict, and Helm's error names kubectl-patch only.
		if o.Object == "ConfigMap/move/a-settings" && (!cmp.Equal(o.Conflicts, []applycheck.FieldConflict{{Field: ".data.mode", Manager: "kubectl-patch"}}) ||
			!contains(o.TakenOver, ".data.note") || !strings.Contains(o.Error, `Apply failed with 1 conflict: conflict with "kubectl-patch" using v1: .data.mode`)) {
			t.Errorf("a-settings: conflicts %+v, moving %v, error %s", o.Conflicts, o.TakenOver, o.Error)
		}
		if o.Object == "ConfigMap/move/z-after" && !contains(o.TakenOver, ".data.v") {
			t.Errorf("z-after: the fields moving to Helm's apply are %v", o.TakenOver)
		}
	}
	before = c.snapshot(t, a)
	out, err = c.helm(t, "upgrade", rel, v2, "-n", ns, "--server-side=true")
	if err == nil || !strings.Contains(out, "Error: UPGRADE FAILED: "+a.Error+"\n") {
		t.Errorf("helm's error is not the predicted one\nhelm:      %s\npredicted: %s", out, a.Error)
	}
	if diff := cmp.Diff(sorted(a.Landed), changedBetween(before, c.snapshot(t, a))); diff != "" {
		t.Errorf("landed: predicted (-) vs changed on the cluster (+):\n%s", diff)
	}
	if status, desc, method := c.record(t, rel, ns, 3); status != "failed" || desc != a.Record.Description || method != applycheck.MethodSSA {
		t.Errorf("revision 3: %s %q %s, predicted %q", status, desc, method, a.Record.Description)
	}
}

// TestServerSideRollbackLeavesForeignField is rancher/fleet#4879 with the real Helm 4: a
// server-side rollback is not a revert. Revision 2 adds data.extra and a ConfigMap;
// `kubectl patch` then changes data.extra, which makes kubectl-patch its owner. Rolling
// back to revision 1 deletes the added ConfigMap, but leaves data.extra as the patch set
// it: the prediction names the field and its manager, and the real rollback agrees. A
// client-side rollback (--server-side=false) would remove it.
func TestServerSideRollbackLeavesForeignField(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	ctx := t.Context()
	const ns, rel = "rb", "app"
	cm := func(name, data string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n" + data
	}
	v1, err := testenv.WriteChart(t.TempDir(), "app", "1.0.0", map[string]string{"templates/cfg.yaml": cm("cfg", "  mode: a\n")})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "app", "2.0.0", map[string]string{"templates/cfg.yaml": cm("cfg", "  mode: a\n  extra: chart\n"),
		"templates/added.yaml": cm("added", "  k: v\n")})
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"install", rel, v1, "-n", ns, "--create-namespace"}, {"upgrade", rel, v2, "-n", ns}} {
		if out, err := c.helm(t, args...); err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
	}
	kubectlPatch(t, c, ns, "configmap", "cfg", "-p", `{"data":{"extra":"hand-set"}}`)

	rep := c.checkRelease(t, "", rel, ns, 1, applycheck.Flags{})
	if !rep.Mode.ServerSide || rep.Mode.DecidingRevision != 1 || rep.To != 1 || rep.From != 2 {
		t.Fatalf("mode %+v from %d to %d", rep.Mode, rep.From, rep.To)
	}
	a := rep.Apply
	if diff := cmp.Diff(map[string]applycheck.Outcome{"ConfigMap/rb/cfg": applycheck.Unchanged, "ConfigMap/rb/added": applycheck.Deleted}, outcomes(a)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	var notReverted []applycheck.FieldConflict
	for _, o := range a.Objects {
		if o.Object == "ConfigMap/rb/cfg" {
			notReverted = o.NotReverted
		}
	}
	if !cmp.Equal(notReverted, []applycheck.FieldConflict{{Field: ".data.extra", Manager: "kubectl-patch"}}) {
		t.Errorf("not reverted: %+v", notReverted)
	}
	if a.Result != applycheck.Succeeds || a.Record.Revision != 3 || rep.Safe {
		t.Errorf("result %s record %+v safe %v", a.Result, a.Record, rep.Safe)
	}
	// Client-side, the same rollback removes the field.
	csa := c.checkRelease(t, "", rel, ns, 1, applycheck.Flags{ServerSide: "false"})
	if outcomes(csa.Apply)["ConfigMap/rb/cfg"] != applycheck.Updated || !csa.Safe {
		t.Errorf("client-side rollback: safe %v %+v", csa.Safe, csa.Apply.Objects)
	}

	if out, err := c.helm(t, "rollback", rel, "1", "-n", ns); err != nil {
		t.Fatalf("helm rollback: %v\n%s", err, out)
	}
	got, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, "cfg", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Data["extra"] != "hand-set" {
		t.Errorf("the rollback reverted data.extra to %q, the prediction says it stays", got.Data["extra"])
	}
	if _, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, "added", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the rollback did not delete the added ConfigMap: %v", err)
	}
	if status, _, method := c.record(t, rel, ns, 3); status != "deployed" || method != applycheck.MethodSSA {
		t.Errorf("revision 3: %s %s", status, method)
	}

	// Forward again to revision 2, after kubectl-patch took data.mode: the rollback
	// conflicts, records revision 4 failed and supersedes revision 3.
	kubectlPatch(t, c, ns, "configmap", "cfg", "-p", `{"data":{"mode":"manual"}}`)
	rep = c.checkRelease(t, "", rel, ns, 2, applycheck.Flags{})
	a = rep.Apply
	if a.Result != applycheck.Fails || outcomes(a)["ConfigMap/rb/cfg"] != applycheck.Conflict || outcomes(a)["ConfigMap/rb/added"] != applycheck.Created {
		t.Fatalf("rollback to 2: %s %+v", a.Result, a.Objects)
	}
	before := c.snapshot(t, a)
	out, err := c.helm(t, "rollback", rel, "2", "-n", ns)
	if err == nil || !strings.Contains(out, a.HelmPrints()+"\n") {
		t.Errorf("helm rollback: %v\n%s\npredicted: %s", err, out, a.HelmPrints())
	}
	if diff := cmp.Diff(sorted(a.Landed), changedBetween(before, c.snapshot(t, a))); diff != "" {
		t.Errorf("landed: predicted (-) vs changed on the cluster (+):\n%s", diff)
	}
	status, desc, _ := c.record(t, rel, ns, 4)
	if status != a.Record.Status || desc != a.Record.Description || a.Record.Revision != 4 {
		t.Errorf("revision 4: %s %q, predicted %+v", status, desc, a.Record)
	}
	if status, _, _ := c.record(t, rel, ns, 3); status != a.Record.PreviousStatus || status != "superseded" {
		t.Errorf("revision 3 is %s, predicted %s", status, a.Record.PreviousStatus)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestUpgradePrunesObjectAnotherReleaseTookOver is helm/helm#32218 with the real Helm 4:
// release "taker" adopted a ConfigMap of release "owner" (helm install --take-ownership);
// the next upgrade of owner no longer renders it and deletes it all the same, taker's or
// not. The prune pre-flight (the uninstall's ownership model) flags it, and the other
// dangerous deletes of the same upgrade: a Secret holding credentials, and keep only in
// the old manifest (an upgrade reads the live annotation); keep only on the live object
// protects. Helm deletes and keeps exactly what was predicted.
func TestUpgradePrunesObjectAnotherReleaseTookOver(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	ctx := t.Context()
	const ns = "prune"
	cm := func(name, annotations string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\n" + annotations + "data:\n  k: v\n"
	}
	const keep = "  annotations:\n    helm.sh/resource-policy: keep\n"
	write := func(name, version string, files map[string]string) string {
		dir, err := testenv.WriteChart(t.TempDir(), name, version, files)
		if err != nil {
			t.Fatal(err)
		}
		return dir
	}
	v1 := write("owner", "1.0.0", map[string]string{"templates/a.yaml": cm("a", ""), "templates/shared.yaml": cm("shared", ""), "templates/plain.yaml": cm("plain", ""),
		"templates/keepboth.yaml": cm("keepboth", keep), "templates/manifestkeep.yaml": cm("manifestkeep", keep), "templates/livekeep.yaml": cm("livekeep", ""),
		"templates/creds.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\nstringData:\n  password: " + sentinel + "\n"})
	v2 := write("owner", "2.0.0", map[string]string{"templates/a.yaml": cm("a", "")})
	taker := write("taker", "1.0.0", map[string]string{"templates/shared.yaml": cm("shared", "")})
	for _, args := range [][]string{{"install", "owner", v1, "-n", ns, "--create-namespace"}, {"install", "taker", taker, "-n", ns, "--take-ownership"}} {
		if out, err := c.helm(t, args...); err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
	}
	kubectl := func(args ...string) {
		cmd := exec.CommandContext(ctx, filepath.Join(c.cp.KubeBin, "kubectl"), append([]string{"--kubeconfig", c.cp.Kubeconfig, "-n", ns}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	kubectl("annotate", "configmap", "manifestkeep", "helm.sh/resource-policy-")
	kubectl("annotate", "configmap", "livekeep", "helm.sh/resource-policy=keep")

	clients, err := uninstall.NewClients(c.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := helmrelease.NewReader(c.cs, ns, "secret")
	if err != nil {
		t.Fatal(err)
	}
	hist, err := reader.History(ctx, "owner")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := chartsource.Load(ctx, chartsource.Options{Ref: v2, ReleaseName: "owner", Namespace: ns, IsUpgrade: true})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := applycheck.CheckRelease(ctx, c.dyn, c.mapper, applycheck.ReleaseCheck{Release: "owner", Namespace: ns, History: hist,
		Operation: applycheck.OpUpgrade, TargetManifest: ch.Manifest, TargetHooks: ch.Hooks, Clients: clients})
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := json.Marshal(rep); strings.Contains(string(data), sentinel) {
		t.Errorf("the report holds the Secret's data:\n%s", data)
	}
	if rep.Apply.Result != applycheck.Succeeds || rep.Safe || rep.Prune == nil {
		t.Fatalf("result %s safe %v prune %+v", rep.Apply.Result, rep.Safe, rep.Prune)
	}
	wantOutcomes := map[string]applycheck.Outcome{"ConfigMap/prune/a": applycheck.Unchanged, "ConfigMap/prune/shared": applycheck.Deleted,
		"ConfigMap/prune/plain": applycheck.Deleted, "ConfigMap/prune/keepboth": applycheck.Kept, "ConfigMap/prune/manifestkeep": applycheck.Deleted,
		"ConfigMap/prune/livekeep": applycheck.Kept, "Secret/prune/creds": applycheck.Deleted}
	if diff := cmp.Diff(wantOutcomes, outcomes(rep.Apply)); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	actions := map[string]uninstall.Action{}
	for _, o := range rep.Prune.Objects {
		actions[o.Subject] = o.Action
	}
	wantActions := map[string]uninstall.Action{"ConfigMap/prune/shared": uninstall.Delete, "ConfigMap/prune/plain": uninstall.Delete,
		"ConfigMap/prune/keepboth": uninstall.Keep, "ConfigMap/prune/manifestkeep": uninstall.Delete, "ConfigMap/prune/livekeep": uninstall.Keep,
		"Secret/prune/creds": uninstall.Delete}
	if diff := cmp.Diff(wantActions, actions); diff != "" {
		t.Errorf("prune actions (-want +got):\n%s", diff)
	}
	found := map[string]string{}
	for _, f := range rep.Prune.Findings {
		found[f.Subject] = f.Check
	}
	wantFound := map[string]string{"ConfigMap/prune/shared": uninstall.CheckTakenOver, "ConfigMap/prune/manifestkeep": uninstall.CheckManifestOnlyKeep,
		"Secret/prune/creds": uninstall.CheckSecret}
	if diff := cmp.Diff(wantFound, found); diff != "" {
		t.Errorf("prune findings (-want +got):\n%s\n%+v", diff, rep.Prune.Findings)
	}
	for _, f := range rep.Prune.Findings {
		if f.Check == uninstall.CheckTakenOver && !strings.Contains(f.Message, "release prune/taker has taken it over") {
			t.Errorf("taken-over finding: %s", f.Message)
		}
	}

	if out, err := c.helm(t, "upgrade", "owner", v2, "-n", ns); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	for subject, want := range wantOutcomes {
		kind, rest, _ := strings.Cut(subject, "/")
		_, name, _ := strings.Cut(rest, "/")
		var err error
		if kind == "Secret" {
			_, err = c.cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		} else {
			_, err = c.cs.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		}
		if gone := apierrors.IsNotFound(err); gone != (want == applycheck.Deleted) {
			t.Errorf("%s: predicted %s, gone after the real upgrade: %v (%v)", subject, want, gone, err)
		}
	}
}

// TestClientSideRollbackRemovesForeignField: the fix rollback-check prints for a rollback
// that is not a revert, run for real. The same history as above; `helm rollback
// --server-side=false` removes data.extra through the three-way merge.
func TestClientSideRollbackRemovesForeignField(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	const ns, rel = "rbcsa", "app"
	cm := func(data string) map[string]string {
		return map[string]string{"templates/cfg.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  mode: a\n" + data}
	}
	v1, err := testenv.WriteChart(t.TempDir(), "app", "1.0.0", cm(""))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "app", "2.0.0", cm("  extra: chart\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"install", rel, v1, "-n", ns, "--create-namespace"}, {"upgrade", rel, v2, "-n", ns}} {
		if out, err := c.helm(t, args...); err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
	}
	kubectlPatch(t, c, ns, "configmap", "cfg", "-p", `{"data":{"extra":"hand-set"}}`)
	rep := c.checkRelease(t, "", rel, ns, 1, applycheck.Flags{ServerSide: "false"})
	if rep.Mode.ServerSide || !rep.Safe || outcomes(rep.Apply)["ConfigMap/rbcsa/cfg"] != applycheck.Updated {
		t.Fatalf("mode %+v safe %v objects %+v", rep.Mode, rep.Safe, rep.Apply.Objects)
	}
	if out, err := c.helm(t, "rollback", rel, "1", "-n", ns, "--server-side=false"); err != nil {
		t.Fatalf("helm rollback: %v\n%s", err, out)
	}
	got, err := c.cs.CoreV1().ConfigMaps(ns).Get(t.Context(), "cfg", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Data["extra"]; ok {
		t.Errorf("the client-side rollback left data.extra = %q", got.Data["extra"])
	}
	if _, _, method := c.record(t, rel, ns, 3); method != applycheck.MethodCSA {
		t.Errorf("revision 3 recorded %q", method)
	}
}
