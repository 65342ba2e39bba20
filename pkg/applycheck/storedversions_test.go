package applycheck_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/applycheck"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// TestStoredVersionsRejectedCRD: a chart that drops a version still in its CRD's
// status.storedVersions. The prediction marks that CRD failed with the rejection, in
// the wording of the Kubernetes minor that runs ("must appear in spec.versions" up to
// 1.32, "missing from spec.versions; ... must remain" from 1.33, kubernetes#128746),
// and the real Helm upgrade fails with exactly the predicted error.
func TestStoredVersionsRejectedCRD(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	c := newCluster(t)
	const ns, rel, crdName = "svr", "svr", "doohickeys.svr.example.com"
	chart := func(i int, x string, versions ...string) string {
		crd := "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: " + crdName + "\nspec:\n  group: svr.example.com\n" +
			"  scope: Namespaced\n  names: {plural: doohickeys, singular: doohickey, kind: Doohickey}\n  versions:\n"
		for j, v := range versions {
			crd += fmt.Sprintf("  - name: %s\n    served: true\n    storage: %v\n    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n", v, j == len(versions)-1)
		}
		dir, err := testenv.WriteChart(t.TempDir(), "svr", fmt.Sprintf("1.%d.0", i), map[string]string{
			"templates/crd.yaml": crd,
			"templates/cfg.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  x: \"" + x + "\"\n",
		})
		if err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for i, args := range [][]string{{"install", rel, chart(0, "1", "v1alpha1"), "--create-namespace"}, {"upgrade", rel, chart(1, "2", "v1alpha1", "v1")}} {
		if out, err := c.helm(t, append(args, "-n", ns)...); err != nil {
			t.Fatalf("helm %d: %v\n%s", i, err, out)
		}
	}
	v3 := chart(2, "3", "v1")

	rep := c.predict(t, v3, rel, ns, applycheck.Options{FieldManager: "helm"})
	want := crdversions.WordingFor(c.cp.Minor)
	var crd *applycheck.Object
	for i := range rep.Objects {
		if rep.Objects[i].Object == "CustomResourceDefinition/"+crdName {
			crd = &rep.Objects[i]
		}
	}
	if crd == nil || crd.Outcome != applycheck.Failed || len(crd.StoredVersionsRejected) != 1 || crd.Note == "" {
		t.Fatalf("CRD prediction %+v, want failed with one storedVersions rejection and a note", crd)
	}
	if r := crd.StoredVersionsRejected[0]; r.CRD != crdName || r.Version != "v1alpha1" || r.Wording != want {
		t.Errorf("Kubernetes 1.%d: rejection %+v, want %s v1alpha1 worded %q", c.cp.Minor, r, crdName, want)
	}
	if rep.Result != applycheck.Fails {
		t.Errorf("result %s, want fails", rep.Result)
	}
	out, err := c.helm(t, "upgrade", rel, v3, "-n", ns)
	if err == nil || !strings.Contains(out, "Error: UPGRADE FAILED: "+rep.Error+"\n") {
		t.Errorf("helm's error is not the predicted one (err %v)\nhelm:      %s\npredicted: %s", err, out, rep.Error)
	}
}
