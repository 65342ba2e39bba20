package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// lwsObjects is how many LeaderWorkerSets each case holds (the incident had 12).
const lwsObjects = 12

// helmBin is one real Helm CLI: bin/helm (Helm 4) or bin/helm3.
type helmBin struct {
	name string
	cmd  func(args ...string) *exec.Cmd
}

// bothHelms are the real Helm 4 and Helm 3 CLIs.
func bothHelms(t *testing.T) []helmBin {
	t.Helper()
	cp.NeedHelm3(t)
	return []helmBin{{"helm4", cp.Helm}, {"helm3", cp.Helm3}}
}

func (h helmBin) must(t *testing.T, args ...string) {
	t.Helper()
	if out, err := h.cmd(args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", h.name, strings.Join(args, " "), err, out)
	}
}

// install installs chart as release in ns with h, creates the case's LeaderWorkerSets
// (of the CRD of group) in ns, and uninstalls the release and deletes that CRD when the
// test ends.
func (h helmBin) install(t *testing.T, release, ns, chart, group string) {
	t.Helper()
	h.must(t, "install", release, chart, "-n", ns, "--create-namespace")
	t.Cleanup(func() {
		if out, err := h.cmd("uninstall", release, "-n", ns).CombinedOutput(); err != nil {
			t.Errorf("%s uninstall %s: %v\n%s", h.name, release, err, out)
		}
		other := func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group != group }
		if err := cp.DeleteCRDs(context.WithoutCancel(t.Context()), other); err != nil {
			t.Errorf("delete the CRD of %s: %v", group, err)
		}
	})
	if err := testenv.CreateLeaderWorkerSets(t.Context(), cp.Config, group, ns, lwsObjects); err != nil {
		t.Fatal(err)
	}
}

// kubectl runs the real kubectl against the control plane.
func kubectl(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(cp.KubeBin, "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// runNextStep runs the report's one next step, which must be a kubectl command, as a
// user would paste it.
func runNextStep(t *testing.T, rep *check.Report) {
	t.Helper()
	if len(rep.NextSteps) != 1 || !strings.HasPrefix(rep.NextSteps[0], "kubectl ") {
		t.Fatalf("next steps %q, want one kubectl command", rep.NextSteps)
	}
	kubectl(t, strings.Fields(rep.NextSteps[0])[1:]...)
}

// checkDeletes runs check with args, in JSON and as text, and asserts that it exits 1
// with a delete verdict on crd and its lwsObjects objects, naming both in the text, and
// with the keep annotation as the next step. It returns the JSON report.
func checkDeletes(t *testing.T, crd string, args ...string) *check.Report {
	t.Helper()
	r := ug(t, append(append([]string{"check"}, args...), "-o", "json")...)
	if r.code != cli.ExitFindings {
		t.Fatalf("check exit %d, want %d\n%s%s", r.code, cli.ExitFindings, r.stdout, r.stderr)
	}
	rep := report(t, r)
	var row *check.CRDReport
	for i := range rep.CRDs {
		if rep.CRDs[i].Name == crd {
			row = &rep.CRDs[i]
		}
	}
	if row == nil || row.Verdict != predict.Delete || row.Objects == nil || *row.Objects != lwsObjects {
		t.Fatalf("check: %s is %+v, want a delete verdict with %d objects", crd, row, lwsObjects)
	}
	if want := fmt.Sprintf("all %d LeaderWorkerSet objects", lwsObjects); !strings.Contains(row.Reason, want) {
		t.Errorf("reason %q does not say %q", row.Reason, want)
	}
	if want := "kubectl annotate crd " + crd + " helm.sh/resource-policy=keep"; !slices.Contains(rep.NextSteps, want) {
		t.Errorf("next steps %q lack %q", rep.NextSteps, want)
	}
	text := ug(t, append([]string{"check"}, args...)...)
	if text.code != cli.ExitFindings {
		t.Errorf("check (text) exit %d, want %d\n%s%s", text.code, cli.ExitFindings, text.stdout, text.stderr)
	}
	if !slices.ContainsFunc(strings.Split(text.stdout, "\n"), func(l string) bool {
		f := strings.Fields(l)
		return len(f) >= 3 && f[0] == crd && f[1] == string(predict.Delete) && f[2] == fmt.Sprint(lwsObjects)
	}) {
		t.Errorf("check's text does not list %s as delete with %d objects:\n%s", crd, lwsObjects, text.stdout)
	}
	return rep
}

// checkSafe runs check with args and asserts that it exits 0.
func checkSafe(t *testing.T, args ...string) {
	t.Helper()
	if r := ug(t, append([]string{"check"}, args...)...); r.code != cli.ExitSafe {
		t.Errorf("check exit %d, want 0\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// assertIntact asserts that crd and the case's objects of group are all there.
func assertIntact(t *testing.T, crd, group string) {
	t.Helper()
	if _, err := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), crd, metav1.GetOptions{}); err != nil {
		t.Fatalf("CRD %s: %v, want it kept", crd, err)
	}
	if n, err := testenv.CountLeaderWorkerSets(t.Context(), cp.Config, group); err != nil || n != lwsObjects {
		t.Errorf("%d LeaderWorkerSets of %s (%v), want all %d", n, group, err, lwsObjects)
	}
}

// waitDeleted waits until crd is gone, the API server having deleted its objects.
func waitDeleted(t *testing.T, crd string) {
	t.Helper()
	api := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := api.Get(ctx, crd, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("CRD %s still there: %v", crd, err)
	}
}

// TestCRDMovedToCRDsDir is kubernetes-sigs/lws#880 with the real lws charts and the real
// Helm 4 and Helm 3: 0.7.0 renders the LeaderWorkerSet CRD from templates/, 0.8.0 moves it
// to crds/. check exits 1 and names the CRD and its 12 objects, and so does release
// apply-check; the real upgrade then deletes them, as predicted. With the keep annotation
// that check names on the live CRD, check is safe, and the real upgrade leaves the CRD and
// every object.
func TestCRDMovedToCRDsDir(t *testing.T) {
	needCluster(t)
	fx := fixturesDir(t)
	v07, v08 := filepath.Join(fx, "charts/lws-0.7.0"), filepath.Join(fx, "charts/lws-0.8.0")
	const ns = "lws-system"
	args := []string{"--chart", v08, "--release", "lws", "-n", ns}
	for _, h := range bothHelms(t) {
		t.Run(h.name+"/deletes", func(t *testing.T) {
			h.install(t, "lws", ns, v07, testenv.LWSGroup)
			rep := checkDeletes(t, testenv.LWSCRD, args...)
			if c := rep.CRDs[0]; !strings.Contains(c.Reason, "moves it from templates/ to crds/") || !strings.Contains(c.Reason, "now lws/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml") {
				t.Errorf("reason %q does not say the CRD moved to crds/", c.Reason)
			}
			ac := ug(t, "release", "apply-check", "lws", "--chart", v08, "-n", ns, "-o", "json")
			if ac.code != cli.ExitFindings || !strings.Contains(ac.stdout, `"check": "crd-cascade"`) ||
				!strings.Contains(ac.stdout, fmt.Sprintf("all %d LeaderWorkerSet objects", lwsObjects)) {
				t.Errorf("release apply-check: exit %d, want 1 with the crd-cascade finding and the count\n%s%s", ac.code, ac.stdout, ac.stderr)
			}
			h.must(t, "upgrade", "lws", v08, "-n", ns)
			waitDeleted(t, testenv.LWSCRD)
		})
		t.Run(h.name+"/kept", func(t *testing.T) {
			h.install(t, "lws", ns, v07, testenv.LWSGroup)
			runNextStep(t, checkDeletes(t, testenv.LWSCRD, args...))
			checkSafe(t, args...)
			h.must(t, "upgrade", "lws", v08, "-n", ns)
			assertIntact(t, testenv.LWSCRD, testenv.LWSGroup)
		})
	}
}

// TestCRDLeavesTheRelease covers the other ways a CRD leaves a Helm release, each with
// the real LeaderWorkerSet CRD (renamed per case) and the real Helm 4 and Helm 3: a values
// toggle switched off (crds.enabled, installCRDs, crd.create), a subchart removed, and a
// move to another chart. check exits 1 and names the CRD and its 12 objects; with the
// keep annotation check names on the live CRD, check is safe and the real upgrade leaves
// the CRD and every object.
func TestCRDLeavesTheRelease(t *testing.T) {
	needCluster(t)
	for i, tc := range testenv.CRDLeavingCases() {
		for _, h := range bothHelms(t) {
			t.Run(tc.Name+"/"+h.name, func(t *testing.T) {
				group := fmt.Sprintf("case%d.%s.deletion.test", i, h.name)
				crd := "leaderworkersets." + group
				text, err := testenv.LWSCRDText(group)
				if err != nil {
					t.Fatal(err)
				}
				ns := fmt.Sprintf("leave-%d-%s", i, h.name)
				from, err := tc.From(t.TempDir(), text)
				if err != nil {
					t.Fatal(err)
				}
				to, err := tc.To(t.TempDir(), text)
				if err != nil {
					t.Fatal(err)
				}
				h.install(t, "widgets", ns, from, group)
				args := []string{"--chart", to, "--release", "widgets", "-n", ns}
				upgrade := []string{"upgrade", "widgets", to, "-n", ns}
				for _, s := range tc.Set {
					args, upgrade = append(args, "--set", s), append(upgrade, "--set", s)
				}
				runNextStep(t, checkDeletes(t, crd, args...))
				checkSafe(t, args...)
				h.must(t, upgrade...)
				assertIntact(t, crd, group)
			})
		}
	}
}

// TestCRDLeavesWithTheUninstall moves a release to another chart the way release
// migrate does (uninstall, then install) and asks the uninstall's questions: the plan
// and release uninstall-check both name the CRD the uninstall deletes and its 12
// objects. The keep annotation on the live CRD does not help an uninstall (it reads the
// stored manifest), and both still say so.
func TestCRDLeavesWithTheUninstall(t *testing.T) {
	needCluster(t)
	const group, ns = "migrate.deletion.test", "leave-migrate"
	crd := "leaderworkersets." + group
	text, err := testenv.LWSCRDText(group)
	if err != nil {
		t.Fatal(err)
	}
	helm4 := helmBin{"helm4", cp.Helm}
	var move testenv.CRDLeaves
	for _, c := range testenv.CRDLeavingCases() {
		if c.Name == "chart to chart" {
			move = c
		}
	}
	from, err := move.From(t.TempDir(), text)
	if err != nil {
		t.Fatal(err)
	}
	to, err := move.To(t.TempDir(), text)
	if err != nil {
		t.Fatal(err)
	}
	helm4.install(t, "widgets", ns, from, group)
	count := fmt.Sprintf("all %d LeaderWorkerSet objects", lwsObjects)

	migrate := func() {
		t.Helper()
		r := ug(t, "release", "migrate", "widgets", "--to-chart", to, "--plan", "-n", ns, "-o", "json")
		var out struct {
			Plan struct {
				Safe     bool              `json:"safe"`
				Findings []finding.Finding `json:"findings"`
			} `json:"plan"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != cli.ExitFindings || out.Plan.Safe {
			t.Fatalf("release migrate --plan: exit %d (%v), want 1 with an unsafe plan\n%s%s", r.code, err, r.stdout, r.stderr)
		}
		if !slices.ContainsFunc(out.Plan.Findings, func(f finding.Finding) bool {
			return f.Check == "uninstall/"+uninstall.CheckCRDCascade && f.Subject == "CustomResourceDefinition/"+crd && f.Blocks() && strings.Contains(f.Message, count)
		}) {
			t.Errorf("the plan has no blocking crd-cascade finding on %s with %q: %+v", crd, count, out.Plan.Findings)
		}
	}
	uninstallCheck := func() {
		t.Helper()
		r := ug(t, "release", "uninstall-check", "widgets", "-n", ns, "-o", "json")
		var rep uninstall.Report
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != cli.ExitFindings {
			t.Fatalf("release uninstall-check: exit %d (%v), want 1\n%s%s", r.code, err, r.stdout, r.stderr)
		}
		if !slices.ContainsFunc(rep.Findings, func(f finding.Finding) bool {
			return f.Check == uninstall.CheckCRDCascade && strings.Contains(f.Message, count) && strings.Contains(f.Remediation, "stored manifest, not from the live CRD")
		}) {
			t.Errorf("uninstall-check has no crd-cascade finding with %q and the manifest rule: %+v", count, rep.Findings)
		}
	}
	migrate()
	uninstallCheck()
	kubectl(t, "annotate", "crd", crd, "helm.sh/resource-policy=keep")
	migrate()
	uninstallCheck()
}
