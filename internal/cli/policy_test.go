package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestGatewayAPIRollbackPolicy: a release of Gateway API's standard CRDs, upgraded from
// v1.4.1 to v1.5.1, is rolled back. Without the safe-upgrades policy the rollback is ok.
// With it, check --rollback and release rollback-check predict the policy's denial of
// every CRD v1.4.1 writes (verdict policy, the policy, binding and message named, Gateway
// API's documented way on, exit 1), for an admin and for a user who may only read, and
// the denial is reported once (not also as a refusal). The real helm rollback is then
// refused by the same policy.
func TestGatewayAPIRollbackPolicy(t *testing.T) {
	needCluster(t)
	gatewayAPIUpgraded(t, "gw", "gw")
	oldCRDs, err := testenv.GatewayAPICRDNames(testenv.GatewayAPIOld)
	if err != nil {
		t.Fatal(err)
	}
	reader := readOnlyUser(t, "gw-reader")

	// Without the policy: every CRD is ok, and the rollback-check agrees.
	r := ug(t, "check", "--rollback", "--release", "gw", "-n", "gw", "-o", "json")
	rep := report(t, r)
	if r.code != cli.ExitSafe || !rep.Safe || len(rep.Unasked) != 0 {
		t.Fatalf("without the policy: exit %d safe %v unasked %+v; want 0, safe\n%s%s", r.code, rep.Safe, rep.Unasked, r.stdout, r.stderr)
	}
	for _, c := range rep.CRDs {
		if c.Verdict != predict.OK {
			t.Errorf("without the policy: %s is %s (%s), want ok", c.Name, c.Verdict, c.Reason)
		}
	}

	cp.InstallSafeUpgrades(t)
	for _, who := range []struct{ name, kubeconfig string }{{"admin", cp.Kubeconfig}, {"reader", reader}} {
		r := asUser(t, who.kubeconfig, "check", "--rollback", "--release", "gw", "-n", "gw", "-o", "json")
		rep := report(t, r)
		assertPolicyDenied(t, who.name+": check --rollback", r, rep, oldCRDs)
		r = asUser(t, who.kubeconfig, "check", "--rollback", "--release", "gw", "-n", "gw")
		for _, want := range []string{
			"BLOCKED: 6 of 8 CRDs need action before the rollback.",
			"ValidatingAdmissionPolicy " + testenv.SafeUpgrades + " (binding " + testenv.SafeUpgrades + ") denies writing " + strings.Join(oldCRDs, ", ") + ":\n  " + testenv.SafeUpgradesRefusal,
			"way on (documented): Gateway API's policy refuses CRDs of a bundle older than v1.5.0",
			"kubectl delete validatingadmissionpolicy " + testenv.SafeUpgrades,
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("%s: check --rollback lacks %q:\n%s%s", who.name, want, r.stdout, r.stderr)
			}
		}
		if r.code != cli.ExitFindings || strings.Contains(r.stdout, "SAFE") || strings.Contains(r.stdout, "upgrade the control plane") {
			t.Errorf("%s: check --rollback: exit %d (want 1), SAFE or a schema refusal's advice:\n%s", who.name, r.code, r.stdout)
		}
	}
	// rollback-check replays the rollback with a dry run, which only the admin may make.
	r = ug(t, "release", "rollback-check", "gw", "1", "-n", "gw", "-o", "json")
	var pr struct {
		Safe     bool          `json:"safe"`
		CRDCheck *check.Report `json:"crdCheck"`
	}
	decode(t, r, &pr)
	assertPolicyDenied(t, "admin: release rollback-check", r, pr.CRDCheck, oldCRDs)
	if pr.Safe {
		t.Errorf("release rollback-check: safe, want not")
	}

	// The reader may not make the replay's dry runs: the CRD check is the verdict, and the
	// replay is named as not asked.
	r = asUser(t, reader, "release", "rollback-check", "gw", "1", "-n", "gw", "-o", "json")
	var unasked struct {
		Safe   bool `json:"safe"`
		Replay struct {
			Asked bool   `json:"asked"`
			Why   string `json:"why"`
		} `json:"replay"`
		CRDCheck *check.Report `json:"crdCheck"`
	}
	decode(t, r, &unasked)
	assertPolicyDenied(t, "reader: release rollback-check", r, unasked.CRDCheck, oldCRDs)
	if unasked.Safe || unasked.Replay.Asked || !strings.Contains(unasked.Replay.Why, "forbidden") {
		t.Errorf("reader: release rollback-check: safe %v replay %+v; want not safe, the replay not asked because forbidden", unasked.Safe, unasked.Replay)
	}
	r = asUser(t, reader, "release", "rollback-check", "gw", "1", "-n", "gw")
	for _, want := range []string{"BLOCKED by the CRD check below. The replay of the operation was NOT ASKED", "ValidatingAdmissionPolicy " + testenv.SafeUpgrades} {
		if !strings.Contains(r.stdout, want) || r.code != cli.ExitFindings {
			t.Errorf("reader: release rollback-check: exit %d, lacks %q:\n%s%s", r.code, want, r.stdout, r.stderr)
		}
	}

	// The real rollback is refused by the policy, as predicted.
	out, err := helm(t, nil, "rollback", "gw", "1", "-n", "gw")
	if err == nil || !strings.Contains(out, "ValidatingAdmissionPolicy '"+testenv.SafeUpgrades+"' with binding '"+testenv.SafeUpgrades+"' denied request: "+testenv.SafeUpgradesRefusal) {
		t.Errorf("helm rollback: %v; want the policy's denial:\n%s", err, out)
	}
}

// gatewayAPIUpgraded installs release in ns from a chart of Gateway API v1.4.1's standard
// CRDs and upgrades it to v1.5.1's (revision 2), uninstalled when the test ends; it
// returns both charts.
func gatewayAPIUpgraded(t *testing.T, release, ns string) (oldChart, newChart string) {
	t.Helper()
	oldChart, err := testenv.GatewayAPIChart(t.TempDir(), testenv.GatewayAPIOld)
	if err != nil {
		t.Fatal(err)
	}
	newChart, err = testenv.GatewayAPIChart(t.TempDir(), testenv.GatewayAPINew)
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", release, oldChart, "-n", ns, "--create-namespace")
	uninstallOnCleanup(t, nil, release, ns)
	mustHelm(t, nil, "upgrade", release, newChart, "-n", ns)
	return oldChart, newChart
}

// assertPolicyDenied checks a report of the Gateway API rollback: every CRD v1.4.1
// writes is denied by safe-upgrades, once, and nothing else blocks.
func assertPolicyDenied(t *testing.T, what string, r result, rep *check.Report, denied []string) {
	t.Helper()
	if r.code != cli.ExitFindings || rep == nil || rep.Safe {
		t.Fatalf("%s: exit %d; want 1 and not safe\n%s%s", what, r.code, r.stdout, r.stderr)
	}
	var got []string
	for _, c := range rep.CRDs {
		switch c.Verdict {
		case predict.OK:
		case predict.PolicyDenied:
			got = append(got, c.Name)
			if len(c.Policies) != 1 || c.Policies[0].Policy != testenv.SafeUpgrades || c.Policies[0].Binding != testenv.SafeUpgrades ||
				c.Policies[0].Message != testenv.SafeUpgradesRefusal || c.Refusal != nil {
				t.Errorf("%s: %s: policies %+v refusal %+v; want safe-upgrades' denial, once", what, c.Name, c.Policies, c.Refusal)
			}
		default:
			t.Errorf("%s: %s is %s (%s)", what, c.Name, c.Verdict, c.Reason)
		}
	}
	if strings.Join(got, ",") != strings.Join(denied, ",") {
		t.Errorf("%s: denied %v, want %v", what, got, denied)
	}
	if len(rep.Unasked) != 0 {
		t.Errorf("%s: unasked %+v; a policy that denies leaves nothing else to ask", what, rep.Unasked)
	}
}

// decode reads a command's JSON output into v.
func decode(t *testing.T, r result, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("JSON output: %v\nstdout: %s\nstderr: %s", err, r.stdout, r.stderr)
	}
}
