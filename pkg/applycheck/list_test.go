package applycheck_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
)

// TestListItemsAreObjects: a template that renders a kind: List is applied item by item
// (Helm's resource builder flattens it), so the prediction judges each item. An item
// that already exists without the release's ownership makes the real Helm 4.3.1 refuse
// the upgrade with the error predicted for that item, not for the List.
func TestListItemsAreObjects(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	const ns, rel = "listed", "app"
	item := func(name string) string {
		return "- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: " + name + "\n  data:\n    v: \"2\"\n"
	}
	v1, err := testenv.WriteChart(t.TempDir(), "app", "1.0.0", map[string]string{
		"templates/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  v: \"1\"\n"})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "app", "1.1.0", map[string]string{
		"templates/a.yaml":    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  v: \"1\"\n",
		"templates/list.yaml": "apiVersion: v1\nkind: List\nitems:\n" + item("b") + item("c")})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.helm(t, "install", rel, v1, "-n", ns, "--create-namespace"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	if _, err := c.cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c"}},
		metav1.CreateOptions{FieldManager: "kubectl-create"}); err != nil {
		t.Fatal(err)
	}
	rep := c.predict(t, v2, rel, ns, applycheck.Options{FieldManager: "helm"})
	if rep.Result != applycheck.Refused || !cmp.Equal(rep.Failing, []string{"ConfigMap/listed/c"}) {
		t.Fatalf("report %s, failing %v: want refused on ConfigMap/listed/c (%+v)", rep.Result, rep.Failing, rep.Objects)
	}
	out, err := c.helm(t, "upgrade", rel, v2, "-n", ns)
	if err == nil || !strings.Contains(out, "Error: UPGRADE FAILED: "+rep.Error+"\n") {
		t.Errorf("helm's error is not the predicted one\nhelm:      %s\npredicted: %s", out, rep.Error)
	}
}
