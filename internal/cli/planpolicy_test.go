package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/output/citest"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// oneChange is a platform team's ValidatingAdmissionPolicy on Flux's source CRDs: an
// update may move a CRD's storage version or remove versions, not both at once, so that
// the release before each write still serves every version the one after it stores.
const (
	oneChange        = "one-storage-change.platform.example.com"
	oneChangeMessage = "a CRD update may move the storage version or remove versions, not both: ship the storage move in one release and the removal in a later one"
)

// installOneChange creates oneChange and its binding until the test ends, and returns once
// the API server enforces it: a server-side dry-run apply of crd, which it denies, is
// refused by the policy (the policy reaches admission through an informer, a moment after
// it is stored).
func installOneChange(t *testing.T, denied string) {
	t.Helper()
	ctx := t.Context()
	kc := kubernetes.NewForConfigOrDie(cp.Config)
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: oneChange},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"apiextensions.k8s.io"}, APIVersions: []string{"v1"},
						Resources: []string{"customresourcedefinitions"}},
				}}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "flux-source", Expression: "object.spec.group == 'source.toolkit.fluxcd.io'"}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "object.spec.versions.filter(v, v.storage).map(v, v.name) == oldObject.spec.versions.filter(v, v.storage).map(v, v.name) || " +
					"oldObject.spec.versions.all(o, object.spec.versions.exists(n, n.name == o.name))",
				Message: oneChangeMessage,
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: oneChange},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: oneChange,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
	vaps, bindings := kc.AdmissionregistrationV1().ValidatingAdmissionPolicies(), kc.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if _, err := vaps.Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := bindings.Delete(ctx, oneChange, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		if err := vaps.Delete(ctx, oneChange, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
	})
	crds, err := testenv.ReadCRDs("charts/flux2-2.17.2/rendered/crds.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		if c.Name != denied {
			continue
		}
		var last error
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			last = testenv.DryRunApplyCRDServerSide(ctx, cp.Config, c, "helm")
			return last != nil && strings.Contains(last.Error(), oneChangeMessage), nil
		})
		if err != nil {
			t.Fatalf("the API server does not enforce %s on %s: %v", oneChange, denied, last)
		}
		return
	}
	t.Fatalf("no CRD %s in flux2 2.17.2", denied)
}

// TestPlanRoutesAroundPolicy: a release of Flux's source CRDs on 2.12.0 (storage
// v1beta2) plans to 2.17.2, which moves the storage version to v1 and removes v1beta1 in
// one write. Without a policy that is one safe step. With oneChange, which denies moving
// the storage and removing a version in one update, the plan goes around the denial
// through 2.16.0 (the storage move, every version still served), then 2.17.2 (the
// removal); the direct upgrade is named as denied, with the policy and its way on, and
// the real API server refuses it. Offered no version in between, the plan is denied by
// the policy (exit 1, its way on printed). A user who may not read the policies gets the
// direct step and NOT ALL ASKED. The path is then walked with the real helm CLI, check
// agreeing at each step.
func TestPlanRoutesAroundPolicy(t *testing.T) {
	needCluster(t)
	cleanCRDs(t, "fluxcd.io")
	src := func(tag string, kinds ...string) []string {
		var out []string
		for _, k := range kinds {
			out = append(out, "crds/flux-source-controller/"+tag+"/source.toolkit.fluxcd.io_"+k+".yaml")
		}
		return out
	}
	c212 := fixtureChart(t, "flux2", "2.12.0", src("v1.2.0", "buckets", "helmcharts", "helmrepositories")...)
	c216 := fixtureChart(t, "flux2", "2.16.0", src("v1.6.0", "buckets", "gitrepositories", "helmcharts", "helmrepositories", "ocirepositories")...)
	c2172 := fixtureChart(t, "flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml")
	const ns = "plan-policy"
	mustHelm(t, nil, "install", "fluxpol", c212, "-n", ns, "--create-namespace")
	t.Cleanup(func() { _, _ = helm(t, nil, "uninstall", "fluxpol", "-n", ns) })
	if err := testenv.WaitEstablished(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), helmrepos); err != nil {
		t.Fatal(err)
	}
	kinds := func(p *plan.Plan) []string {
		var out []string
		for _, s := range p.Steps {
			out = append(out, string(s.Kind)+" "+s.ChartVersion)
		}
		return out
	}
	all := []string{"--release", "fluxpol", "-n", ns, "--version", "2.17.2", c212, c216, c2172}

	// Without the policy: one step.
	p := planOf(t, cli.ExitSafe, all...)
	if diff := cmp.Diff([]string{"upgrade 2.17.2"}, kinds(p)); diff != "" {
		t.Fatalf("without the policy, steps (-want +got):\n%s", diff)
	}

	installOneChange(t, buckets)
	denied := []string{buckets, charts, helmrepos}

	// With it: around the denial, through 2.16.0.
	p = planOf(t, cli.ExitFindings, all...)
	if diff := cmp.Diff([]string{"upgrade 2.16.0", "upgrade 2.17.2"}, kinds(p)); diff != "" {
		t.Fatalf("with %s, steps (-want +got):\n%s", oneChange, diff)
	}
	assertDeniedBy(t, "the detour's direct upgrade", p.Detour(), denied)
	if len(p.Unasked) != 0 || p.DeniedByPolicy() {
		t.Errorf("unasked %+v, denied by policy %v; want every question asked and a path", p.Unasked, p.DeniedByPolicy())
	}
	text := ug(t, append([]string{"plan"}, all...)...)
	for _, w := range []string{
		"2 step(s), 2 chart upgrade(s)",
		"The direct upgrade to 2.17.2 is denied by the cluster's admission policies; the path goes around it.",
		"ValidatingAdmissionPolicy " + oneChange + " (binding " + oneChange + ") denies writing " + strings.Join(denied, ", ") + ":\n  " + oneChangeMessage,
		"1. upgrade to chart version 2.16.0",
	} {
		if !strings.Contains(text.stdout, w) {
			t.Errorf("text plan lacks %q:\n%s", w, text.stdout)
		}
	}

	// CI reads the detour as a warning per denied CRD on the direct upgrade: nothing fails.
	var want []string
	for _, b := range p.Detour() {
		want = append(want, string(predict.PolicyDenied)+" warning "+b.CRD)
	}
	sarif := ug(t, append([]string{"plan", "-o", "sarif"}, all...)...)
	if diff := cmp.Diff(want, citest.SARIF(t, sarif.stdout)); diff != "" || sarif.code != cli.ExitFindings {
		t.Errorf("the detour, -o sarif: exit %d (want 1), results (-want +got):\n%s", sarif.code, diff)
	}

	// Offered no version in between: denied by the policy, a finding with its way on.
	direct := []string{"--release", "fluxpol", "-n", ns, "--version", "2.17.2", c212, c2172}
	blocked := planOf(t, cli.ExitFindings, direct...)
	if blocked.Reachable || !blocked.DeniedByPolicy() || len(blocked.Steps) != 0 {
		t.Errorf("without 2.16.0: reachable %v, denied by policy %v, steps %v; want denied by the policy", blocked.Reachable, blocked.DeniedByPolicy(), kinds(blocked))
	}
	assertDeniedBy(t, "without 2.16.0", blocked.Blocking, denied)
	want = nil
	for _, b := range blocked.Blocking {
		want = append(want, string(predict.PolicyDenied)+" error "+b.CRD)
	}
	sarif = ug(t, append([]string{"plan", "-o", "sarif"}, direct...)...)
	if diff := cmp.Diff(want, citest.SARIF(t, sarif.stdout)); diff != "" || sarif.code != cli.ExitFindings {
		t.Errorf("without 2.16.0, -o sarif: exit %d (want 1), results (-want +got):\n%s", sarif.code, diff)
	}
	text = ug(t, append([]string{"plan"}, direct...)...)
	for _, w := range []string{
		"DENIED BY POLICY: the cluster's admission policies deny every path to 2.17.2",
		"blocked by " + buckets + " at 2.17.2 (policy): ValidatingAdmissionPolicy " + oneChange,
		"way on (chart): change the chart so that the CRD it writes satisfies the policy's rule",
		"kubectl get validatingadmissionpolicy " + oneChange + " -o yaml",
	} {
		if text.code != cli.ExitFindings || !strings.Contains(text.stdout, w) {
			t.Errorf("text plan without 2.16.0: exit %d, lacks %q:\n%s%s", text.code, w, text.stdout, text.stderr)
		}
	}

	// A user who may read everything the plan reads but the policies: the direct step,
	// and the policies named as not asked.
	const blind = "plan-policy-blind"
	cp.Grant(t, blind, rbacv1.PolicyRule{APIGroups: []string{"", "apiextensions.k8s.io", "source.toolkit.fluxcd.io", "storagemigration.k8s.io"},
		Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}})
	kc, err := cp.UserKubeconfig(blind)
	if err != nil {
		t.Fatal(err)
	}
	r := asUser(t, kc, append([]string{"plan", "-o", "json"}, all...)...)
	var unasked plan.Plan
	decode(t, r, &unasked)
	if r.code != cli.ExitSafe || len(unasked.Unasked) != 1 || unasked.Unasked[0].What != check.UnaskedPolicies ||
		!strings.Contains(unasked.Unasked[0].Why, "forbidden") || !slicesEqual(kinds(&unasked), []string{"upgrade 2.17.2"}) {
		t.Errorf("blind user: exit %d, steps %v, unasked %+v; want the direct step, exit 0, and the policies not asked because forbidden\n%s",
			r.code, kinds(&unasked), unasked.Unasked, r.stderr)
	}
	r = asUser(t, kc, append([]string{"plan"}, all...)...)
	if !strings.Contains(r.stdout, "NOT ALL ASKED: the cluster's ValidatingAdmissionPolicies could not be read") {
		t.Errorf("blind user: the text plan does not say NOT ALL ASKED:\n%s%s", r.stdout, r.stderr)
	}

	// The way around, walked: each step is admitted, and check agrees with the plan.
	walk(t, p)
}

// assertDeniedBy checks that blockers are oneChange's denial of exactly the CRDs denied,
// with the way on a policy with no parameter and no documented exception has.
func assertDeniedBy(t *testing.T, what string, blockers []plan.Blocker, denied []string) {
	t.Helper()
	var got []string
	for _, b := range blockers {
		got = append(got, b.CRD)
		if b.Verdict != string(predict.PolicyDenied) || b.Version != "2.17.2" || len(b.Policies) != 1 {
			t.Errorf("%s: %s blocked at %s by %s (%d denials); want the policy verdict at 2.17.2, one denial", what, b.CRD, b.Version, b.Verdict, len(b.Policies))
			continue
		}
		d := b.Policies[0]
		if d.Policy != oneChange || d.Binding != oneChange || d.Message != oneChangeMessage || d.WayOn.Kind != admissionpolicy.WayChart {
			t.Errorf("%s: %s: denial %+v; want %s's, with the chart as the way on", what, b.CRD, d, oneChange)
		}
	}
	if diff := cmp.Diff(denied, got); diff != "" {
		t.Errorf("%s: denied CRDs (-want +got):\n%s", what, diff)
	}
}

func slicesEqual(a, b []string) bool { return strings.Join(a, "\x00") == strings.Join(b, "\x00") }

// TestPlanGatewayAPIRollbackDenied: a release of Gateway API's standard CRDs upgraded
// from v1.4.1 to v1.5.1, with v1.5.1's safe-upgrades policy installed. plan --rollback
// names revision 1 denied-by-policy: every CRD v1.4.1 writes, the policy's message and
// Gateway API's documented way on (delete the policy first), for an identity that only
// reads. With the policy deleted (that way on), the rollback is reachable now.
func TestPlanGatewayAPIRollbackDenied(t *testing.T) {
	needCluster(t)
	cleanCRDs(t, "gateway.networking.k8s.io")
	const ns = "plan-gw"
	oldChart, newChart := gatewayAPIUpgraded(t, "gwplan", ns)
	oldCRDs, err := testenv.GatewayAPICRDNames(testenv.GatewayAPIOld)
	if err != nil {
		t.Fatal(err)
	}
	cp.InstallSafeUpgrades(t)
	reader := readOnlyUser(t, "plan-gw-reader")
	args := []string{"plan", "--release", "gwplan", "-n", ns, "--rollback", oldChart, newChart}

	r := asUser(t, reader, append(args, "-o", "json")...)
	var p plan.Plan
	decode(t, r, &p)
	if r.code != cli.ExitSafe || len(p.Rollbacks) != 1 {
		t.Fatalf("plan --rollback: exit %d, rollbacks %+v; want 0 (nothing to upgrade) and revision 1\n%s", r.code, p.Rollbacks, r.stderr)
	}
	rb := p.Rollbacks[0]
	if rb.Revision != 1 || rb.Reach != plan.DeniedByPolicy || len(rb.Steps) != 0 || len(rb.Why) != 0 || !slicesEqual(rb.Denied, oldCRDs) {
		t.Errorf("revision 1: %s, steps %q, why %q, denied %v; want denied-by-policy for %v, no steps", rb.Reach, rb.Steps, rb.Why, rb.Denied, oldCRDs)
	}
	if len(rb.Policies) != 1 || rb.Policies[0].Policy != testenv.SafeUpgrades || rb.Policies[0].Message != testenv.SafeUpgradesRefusal ||
		rb.Policies[0].WayOn.Kind != admissionpolicy.WayDocumented {
		t.Errorf("revision 1: policies %+v; want safe-upgrades' denial once, with Gateway API's documented way on", rb.Policies)
	}
	r = asUser(t, reader, args...)
	for _, w := range []string{
		"revision 1 (chart 1.4.1, superseded): denied-by-policy",
		"denied: " + strings.Join(oldCRDs, ", "),
		"by ValidatingAdmissionPolicy " + testenv.SafeUpgrades + " (binding " + testenv.SafeUpgrades + "): " + testenv.SafeUpgradesRefusal,
		"way on (documented): Gateway API's policy refuses CRDs of a bundle older than v1.5.0",
		"kubectl delete validatingadmissionpolicy " + testenv.SafeUpgrades,
		"documented: https://github.com/kubernetes-sigs/gateway-api/",
	} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("text plan --rollback lacks %q:\n%s%s", w, r.stdout, r.stderr)
		}
	}

	// The way on taken: the policy deleted, the rollback is reachable now.
	kc := kubernetes.NewForConfigOrDie(cp.Config)
	if err := kc.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(t.Context(), testenv.SafeUpgrades, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p = *planOf(t, cli.ExitSafe, args[1:]...)
	if len(p.Rollbacks) != 1 || p.Rollbacks[0].Reach != plan.ReachableNow {
		t.Errorf("with the policy deleted: rollbacks %+v, want revision 1 reachable now", p.Rollbacks)
	}
}
