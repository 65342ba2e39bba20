package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/output/citest"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
)

const rbSentinel = "pw-sentinel-rollback-4b1e"

func rbChart(t *testing.T, version, extra string, added bool) string {
	t.Helper()
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  mode: a\n" + extra
	files := map[string]string{
		"values.yaml":           "password: unset\n",
		"templates/secret.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ntype: Opaque\nstringData:\n  password: {{ .Values.password | quote }}\n",
		"templates/cfg.yaml":    cm,
	}
	if added {
		files["templates/added.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: added\ndata:\n  k: v\n"
	}
	dir, err := testenv.WriteChart(t.TempDir(), "rb", version, files)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestReleaseApplyCheckHelm3Release: a release installed by the real Helm 3 is checked
// client-side, as Helm 4's --server-side=auto upgrades it, instead of exiting 2: an
// upgrade that applies exits 0, one the API server refuses exits 1, and a user who may
// not patch (so the dry run cannot tell) exits 2.
func TestReleaseApplyCheckHelm3Release(t *testing.T) {
	needCluster(t)
	cp.NeedHelm3(t)
	v1, v2 := rbChart(t, "1.0.0", "", false), rbChart(t, "2.0.0", "  extra: chart\n", true)
	if out, err := cp.Helm3("install", "h3", v1, "-n", "h3", "--create-namespace", "--set", "password="+rbSentinel).CombinedOutput(); err != nil {
		t.Fatalf("helm3 install: %v\n%s", err, out)
	}
	r := ug(t, "release", "apply-check", "h3", "--chart", v2, "-n", "h3")
	for _, want := range []string{
		"helm upgrade h3 -n h3, client-side apply (three-way merge patch) as \"helm\"",
		"recorded no apply_method (written by Helm 3 or helm-controller before v1.5: client-side)",
		"  works: helm upgrade h3 " + v2 + " -n h3 --server-side=true\n",
		"The upgrade applies: Helm records revision 2 as deployed",
		"With --server-side=true instead (moving the release to server-side apply on purpose), the upgrade succeeds.",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if r.code != cli.ExitSafe || strings.Contains(r.stdout+r.stderr, rbSentinel) {
		t.Errorf("exit %d (want 0), or the password leaked:\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = ug(t, "release", "apply-check", "h3", "--chart", v2, "-n", "h3", "-o", "json")
	var got struct {
		Mode       applycheck.Mode    `json:"mode"`
		Apply      applycheck.Report  `json:"apply"`
		ServerSide *applycheck.Report `json:"serverSide"`
		Safe       bool               `json:"safe"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r.stdout)
	}
	if got.Mode.Method != applycheck.MethodCSA || got.Apply.Method != applycheck.MethodCSA || got.ServerSide == nil || !got.Safe ||
		strings.Contains(r.stdout, rbSentinel) {
		t.Errorf("JSON: mode %+v method %s serverSide %v safe %v", got.Mode, got.Apply.Method, got.ServerSide != nil, got.Safe)
	}

	// Findings: a chart that changes the Secret's type, which the API server refuses to
	// change. The client-side dry-run patch meets the refusal: exit 1.
	v3 := h3TypeChangeChart(t)
	r = ug(t, "release", "apply-check", "h3", "--chart", v3, "-n", "h3")
	// The API server quotes the new type up to 1.37; 1.38 (v1.38.0-beta.0) quotes no value.
	refusal := `Secret "creds" is invalid: type: Invalid value: "kubernetes.io/basic-auth": field is immutable`
	if cp.Minor >= 38 {
		refusal = `Secret "creds" is invalid: type: Invalid value: null: field is immutable`
	}
	for _, want := range []string{
		"helm upgrade h3 -n h3, client-side apply (three-way merge patch) as \"helm\"",
		"The upgrade FAILS. Helm prints:",
		refusal,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the Secret's type changed: output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if r.code != cli.ExitFindings || strings.Contains(r.stdout+r.stderr, rbSentinel) {
		t.Errorf("the Secret's type changed: exit %d (want 1), or the password leaked:\n%s%s", r.code, r.stdout, r.stderr)
	}
	// CI reads the same verdict: an error annotation on the refused Secret.
	r = ug(t, "release", "apply-check", "h3", "--chart", v3, "-n", "h3", "-o", "github")
	if want := "::error title=" + applycheck.CheckRejected + "%3A Secret/h3/creds::apply fails: "; r.code != cli.ExitFindings ||
		!strings.HasPrefix(r.stdout, want) || strings.Count(r.stdout, "\n") != 1 || strings.Contains(r.stdout+r.stderr, rbSentinel) {
		t.Errorf("-o github: exit %d (want 1 and one annotation starting %q), or the password leaked:\n%s%s", r.code, want, r.stdout, r.stderr)
	}

	// Could not run: a user who may read everything but write nothing. Helm's client-side
	// patch needs patch rights, so the dry run cannot tell: exit 2, never a verdict.
	reader := readOnlyUser(t, "h3-reader")
	r = asUser(t, reader, "release", "apply-check", "h3", "--chart", v2, "-n", "h3")
	if r.code != cli.ExitCouldNot || r.stdout != "" || !strings.Contains(r.stderr, "dry-run patch") || !strings.Contains(r.stderr, "forbidden") ||
		strings.Contains(r.stderr, rbSentinel) {
		t.Errorf("a user who may not patch: exit %d (want 2 naming the forbidden dry-run patch, and no report), or the password leaked:\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// h3TypeChangeChart is rbChart at 3.0.0 with the Secret's type changed (an immutable
// field).
func h3TypeChangeChart(t *testing.T) string {
	t.Helper()
	dir, err := testenv.WriteChart(t.TempDir(), "rb", "3.0.0", map[string]string{
		"values.yaml": "password: unset\n",
		"templates/secret.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ntype: kubernetes.io/basic-auth\n" +
			"stringData:\n  password: {{ .Values.password | quote }}\n",
		"templates/cfg.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  mode: a\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// readOnlyUser is a user who may get, list and watch everything (Helm's release Secrets
// included) and write nothing, until the test ends; it returns the user's kubeconfig.
func readOnlyUser(t *testing.T, name string) string {
	t.Helper()
	cp.Grant(t, name, rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}})
	kc, err := cp.UserKubeconfig(name)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// TestReleaseRollbackCheck: revision 2 adds data.extra and a ConfigMap; kubectl-patch then
// takes data.extra. rollback-check 1 names the field the server-side rollback leaves and
// its manager, the ConfigMap it deletes, and the CRD verdict; then the real rollback.
func TestReleaseRollbackCheck(t *testing.T) {
	needCluster(t)
	v1, v2 := rbChart(t, "1.0.0", "", false), rbChart(t, "2.0.0", "  extra: chart\n", true)
	mustHelm(t, nil, "install", "rb", v1, "-n", "rb", "--create-namespace", "--set", "password="+rbSentinel)
	mustHelm(t, nil, "upgrade", "rb", v2, "-n", "rb", "--reuse-values")
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := cs.CoreV1().ConfigMaps("rb").Patch(t.Context(), "cfg", types.MergePatchType, []byte(`{"data":{"extra":"hand-set"}}`),
		metav1.PatchOptions{FieldManager: "kubectl-patch"}); err != nil {
		t.Fatal(err)
	}
	r := ug(t, "release", "rollback-check", "rb", "1", "-n", "rb")
	for _, want := range []string{
		"helm rollback rb -n rb, server-side apply as \"helm\", conflicts not forced",
		"  apply method: --server-side=auto follows the target revision (1) recorded apply_method \"ssa\"",
		"NOT REVERTED, other managers keep: .data.extra by \"kubectl-patch\"",
		"  delete  ConfigMap/rb/added",
		"The rollback applies: Helm records revision 3 as deployed",
		"It is NOT A REVERT: fields another manager took stay as they are (NOT REVERTED above).",
		"Rollback of release rb",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if r.code != cli.ExitFindings {
		t.Errorf("exit %d, want 1 (the rollback does not revert data.extra):\n%s", r.code, r.stderr)
	}
	r = ug(t, "release", "rollback-check", "rb", "1", "-n", "rb", "-o", "json")
	var got struct {
		Apply applycheck.Report `json:"apply"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r.stdout)
	}
	if got.Apply.Operation != applycheck.OpRollback || strings.Contains(r.stdout+r.stderr, rbSentinel) {
		t.Errorf("operation %s, or the password leaked", got.Apply.Operation)
	}
	// CI reads the same verdict: one result, the field not reverted; the release's case fails.
	r = ug(t, "release", "rollback-check", "rb", "1", "-n", "rb", "-o", "sarif")
	if diff := cmp.Diff([]string{applycheck.CheckNotReverted + " error ConfigMap/rb/cfg"}, citest.SARIF(t, r.stdout)); diff != "" || r.code != cli.ExitFindings {
		t.Errorf("-o sarif: exit %d (want 1), results (-want +got):\n%s", r.code, diff)
	}
	r = ug(t, "release", "rollback-check", "rb", "1", "-n", "rb", "-o", "junit")
	if diff := cmp.Diff([]string{"rollback-check: Release/rb/rb FAIL " + applycheck.CheckNotReverted}, citest.JUnit(t, r.stdout)); diff != "" || r.code != cli.ExitFindings {
		t.Errorf("-o junit: exit %d (want 1), cases (-want +got):\n%s", r.code, diff)
	}
	mustHelm(t, nil, "rollback", "rb", "1", "-n", "rb")
	cm, err := cs.CoreV1().ConfigMaps("rb").Get(t.Context(), "cfg", metav1.GetOptions{})
	if err != nil || cm.Data["extra"] != "hand-set" {
		t.Errorf("after the real rollback data.extra is %q (%v), predicted to stay hand-set", cm.Data["extra"], err)
	}
	if r := ug(t, "release", "rollback-check", "rb", "x", "-n", "rb"); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "REVISION must be a revision number") {
		t.Errorf("bad revision: exit %d\n%s", r.code, r.stderr)
	}
}
