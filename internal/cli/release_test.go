package cli_test

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

func TestReleaseApplyCheck(t *testing.T) {
	needCluster(t)
	cm := func(name, data string) string {
		return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + name + "\ndata:\n  " + data + "\n"
	}
	v1, err := testenv.WriteChart(t.TempDir(), "web", "1.0.0", map[string]string{
		"values.yaml": "mode: a\n", "templates/a.yaml": cm("a-first", "x: \"1\""), "templates/b.yaml": cm("b-target", "mode: {{ .Values.mode }}"),
		"templates/c.yaml": cm("c-gone", "y: \"1\"")})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "web", "1.1.0", map[string]string{
		"values.yaml": "mode: a\n", "templates/a.yaml": cm("a-first", "x: \"2\""), "templates/b.yaml": cm("b-target", "mode: {{ .Values.mode }}")})
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "web", v1, "-n", "web", "--create-namespace", "--set", "mode=b")
	if _, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().ConfigMaps("web").Patch(t.Context(), "b-target", types.MergePatchType,
		[]byte(`{"data":{"mode":"manual"}}`), metav1.PatchOptions{FieldManager: "kubectl-patch"}); err != nil {
		t.Fatal(err)
	}
	r := ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web")
	for _, want := range []string{`field .data.mode is owned by "kubectl-patch"`, "BLOCKED at ConfigMap/web/b-target", "  ConfigMap/web/a-first", "deletes 1 object", "ConfigMap/c-gone"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s%s", want, r.stdout, r.stderr)
		}
	}
	if r.code != cli.ExitFindings {
		t.Errorf("exit %d, want 1", r.code)
	}
	r = ug(t, "release", "apply-check", "web", "--chart", v2, "-n", "web", "--field-manager", "helm-controller", "--force-conflicts")
	if r.code != cli.ExitSafe {
		t.Errorf("forced: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
