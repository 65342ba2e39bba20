package cli_test

import (
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
)

type applyCheckJSON struct {
	Apply applycheck.Report `json:"apply"`
	Safe  bool              `json:"safe"`
}

func TestReleaseApplyCheck(t *testing.T) {
	needCluster(t)
	cm := func(name, data string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n  " + data + "\n"
	}
	v1, err := testenv.WriteChart(t.TempDir(), "web", "1.0.0", map[string]string{
		"values.yaml": "mode: a\n", "templates/a.yaml": cm("a-first", "x: \"1\""), "templates/b.yaml": cm("b-target", "mode: {{ .Values.mode }}"),
		"templates/c.yaml": cm("c-gone", "y: \"1\""), "templates/d.yaml": cm("d-after", "z: \"1\"")})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "web", "1.1.0", map[string]string{
		"values.yaml": "mode: a\n", "templates/a.yaml": cm("a-first", "x: \"2\""), "templates/b.yaml": cm("b-target", "mode: {{ .Values.mode }}"),
		"templates/d.yaml": cm("d-after", "z: \"2\""), "templates/e.yaml": cm("e-new", "w: \"2\"")})
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "web", v1, "-n", "web", "--create-namespace", "--set", "mode=b")
	if _, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ConfigMaps("web").Patch(t.Context(), "b-target", types.MergePatchType,
		[]byte(`{"data":{"mode":"manual"}}`), metav1.PatchOptions{FieldManager: "kubectl-patch"}); err != nil {
		t.Fatal(err)
	}
	r := ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web")
	for _, want := range []string{
		"  apply   ConfigMap/web/b-target  CONFLICT     .data.mode is owned by \"kubectl-patch\"",
		"  apply   ConfigMap/web/d-after   updated",
		"  create  ConfigMap/web/e-new     created",
		"  delete  ConfigMap/web/c-gone    not deleted  Helm deletes dropped objects only when every apply and create succeeded",
		"Error: UPGRADE FAILED: conflict occurred while applying object web/b-target /v1, Kind=ConfigMap: Apply failed with 1 conflict: conflict with \"kubectl-patch\" using v1: .data.mode\n",
		"It records revision 2 as failed; revision 1 stays deployed.",
		"  lands anyway: ConfigMap/web/a-first, ConfigMap/web/d-after, ConfigMap/web/e-new\n",
		"  does not land: ConfigMap/web/b-target, ConfigMap/web/c-gone\n",
		"modelled on Helm v4.2.1 to v4.3.2",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if r.code != cli.ExitFindings {
		t.Errorf("exit %d, want 1", r.code)
	}
	// Values that cannot be read: could not run, saying which.
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	if r := ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web", "-f", missing); r.code != cli.ExitCouldNot ||
		!strings.Contains(r.stderr, "Error: chart "+v2+": values: ") || !strings.Contains(r.stderr, missing) {
		t.Errorf("missing values file: exit %d, want 2 naming it\n%s", r.code, r.stderr)
	}
	r = ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web", "-o", "json")
	var got applyCheckJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r.stdout)
	}
	// The real upgrade prints the predicted error.
	out, err := helm(t, nil, "upgrade", "web", v2, "-n", "web")
	if err == nil || !strings.Contains(out, "Error: UPGRADE FAILED: "+got.Apply.Error+"\n") {
		t.Errorf("helm upgrade: %v\n%s\npredicted: %s", err, out, got.Apply.Error)
	}

	r = ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web", "--field-manager", "helm-controller", "--force-conflicts")
	if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "Helm records revision 3 as deployed and revision 1 as superseded") ||
		!strings.Contains(r.stdout, "  delete  ConfigMap/web/c-gone    deleted") {
		t.Errorf("forced: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// Client-side is modelled too: no more exit 2.
	if r := ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web", "--server-side", "false"); r.code == cli.ExitCouldNot ||
		!strings.Contains(r.stdout, "helm upgrade web -n web, client-side apply (three-way merge patch) as \"helm\"") ||
		!strings.Contains(r.stdout, "  apply method: --server-side=false is given (the last revision (2) recorded apply_method \"ssa\")") {
		t.Errorf("--server-side=false: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// The kubermatic#16209 flag error, predicted, with the command lines that work.
	r = ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web", "--server-side", "false", "--force-conflicts")
	for _, want := range []string{
		"  FLAG ERROR (after it records the new revision and runs the pre-upgrade hooks, before it applies anything): " +
			"invalid client update option(s): forceConflicts enabled when serverSideApply disabled\n",
		"  works: helm upgrade web " + v2 + " -n web --server-side=false\n",
		"  works: helm upgrade web " + v2 + " -n web --server-side=true --force-conflicts\n",
		"Error: UPGRADE FAILED: invalid client update option(s): forceConflicts enabled when serverSideApply disabled\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("flag error: output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if r.code != cli.ExitFindings {
		t.Errorf("flag error: exit %d, want 1", r.code)
	}
	// Both forces: cobra stops Helm before anything; the printed line is Helm's own.
	r = ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web", "--force-replace", "--force-conflicts")
	out, _ = helm(t, nil, "upgrade", "web", v2, "-n", "web", "--force-replace", "--force-conflicts")
	line, _, _ := strings.Cut(out, "\n")
	if r.code != cli.ExitFindings || !strings.Contains(r.stdout, "Helm REFUSES the upgrade before it applies anything or records a revision. It prints:\n  "+line+"\n") {
		t.Errorf("both forces: exit %d, helm printed %q:\n%s", r.code, line, r.stdout)
	}
}

// TestReleaseApplyCheckNoLeaks plants a Secret value and a values-only string that the API
// server echoes in its error (an invalid ConfigMap key), and makes the Secret itself
// conflict: neither value, nor its base64, may reach the text or JSON output.
func TestReleaseApplyCheckNoLeaks(t *testing.T) {
	needCluster(t)
	secretValue, valuesOnly := "pw-sentinel-applycheck-9d2e", "tok sentinel applycheck!"
	files := map[string]string{
		"values.yaml":           "password: unset\napiToken: unset\nbroken: false\n",
		"templates/secret.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ntype: Opaque\ndata:\n  password: {{ .Values.password | b64enc | quote }}\n",
		"templates/cm.yaml": "{{ if .Values.broken }}apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: tokens\ndata:\n" +
			"  {{ .Values.apiToken | quote }}: \"1\"\n{{ end }}",
	}
	v1, err := testenv.WriteChart(t.TempDir(), "leaky", "1.0.0", files)
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "leaky", v1, "-n", "leaky", "--create-namespace", "--set", "password="+secretValue, "--set", "apiToken="+valuesOnly)
	if _, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Secrets("leaky").Patch(t.Context(), "creds", types.MergePatchType,
		[]byte(`{"data":{"password":"cm90YXRlZA=="}}`), metav1.PatchOptions{FieldManager: "kubectl-patch"}); err != nil {
		t.Fatal(err)
	}
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, format := range []string{"text", "json"} {
		r := ug(t, "release", "apply-check", "leaky", "--chart", v1, "-n", "leaky", "--set", "password="+secretValue, "--set", "apiToken="+valuesOnly, "--set", "broken=true", "-o", format)
		if r.code != cli.ExitFindings {
			t.Fatalf("%s: exit %d, want 1\n%s", format, r.code, r.stderr)
		}
		for _, s := range []string{secretValue, valuesOnly, b64(secretValue), b64(valuesOnly)} {
			if strings.Contains(r.stdout+r.stderr, s) {
				t.Errorf("%s output holds a planted secret value", format)
			}
		}
		if format == "json" {
			var got applyCheckJSON
			if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
				t.Fatal(err)
			}
			want := map[string]applycheck.Outcome{"Secret/leaky/creds": applycheck.Conflict, "ConfigMap/leaky/tokens": applycheck.Failed}
			gotOutcomes := map[string]applycheck.Outcome{}
			for _, o := range got.Apply.Objects {
				gotOutcomes[o.Object] = o.Outcome
			}
			if diff := cmp.Diff(want, gotOutcomes); diff != "" || !strings.Contains(got.Apply.Error, "[redacted]") {
				t.Errorf("outcomes (-want +got):\n%s\nerror: %s", diff, got.Apply.Error)
			}
		}
	}
}
