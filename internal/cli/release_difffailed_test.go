package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/output/citest"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/releasediff"
)

func TestReleaseDiffFailed(t *testing.T) {
	needCluster(t)
	const secretV1, secretV2 = "s3cr3t-first-value", "s3cr3t-second-value"
	files := func(x, cpu, secret string, old bool) map[string]string {
		f := map[string]string{
			"templates/cfg.yaml":    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  x: \"" + x + "\"\n",
			"templates/secret.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\nstringData:\n  password: " + secret + "\n",
			"templates/deploy.yaml": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: api
spec:
  selector:
    matchLabels: {app: api}
  template:
    metadata:
      labels: {app: api}
    spec:
      containers:
      - name: api
        image: busybox:1.36
        resources:
          limits: {cpu: "` + cpu + `"}
`}
		if old {
			f["templates/old.yaml"] = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: old\n"
		}
		return f
	}
	v1, err := testenv.WriteChart(t.TempDir(), "df", "1.0.0", files("1", "500m", secretV1, true))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := testenv.WriteChart(t.TempDir(), "df", "1.1.0", files("2", "1000m", secretV2, false))
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "df", v1, "-n", "df", "--create-namespace")

	// The last revision is deployed: nothing failed, and the command says how to pick one.
	r := ug(t, "release", "diff-failed", "df", "-n", "df")
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "not failed: pass --revision") {
		t.Errorf("deployed release: exit %d\n%s", r.code, r.stderr)
	}
	// A given first revision: every object is new and there, wholly at one revision.
	if r = ug(t, "release", "diff-failed", "df", "-n", "df", "--revision", "1"); r.code != cli.ExitSafe || !strings.Contains(r.stdout, "Every change of revision 1 landed") {
		t.Errorf("revision 1: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	patch := `{"spec":{"template":{"spec":{"containers":[{"name":"api","resources":{"limits":{"cpu":"750m"}}}]}}}}`
	if _, err := kubernetes.NewForConfigOrDie(cp.Config).AppsV1().Deployments("df").Patch(t.Context(), "api", types.StrategicMergePatchType,
		[]byte(patch), metav1.PatchOptions{FieldManager: "kubectl-patch"}); err != nil {
		t.Fatal(err)
	}
	if out, err := helm(t, nil, "upgrade", "df", v2, "-n", "df"); err == nil {
		t.Fatalf("helm upgrade should fail on the conflict:\n%s", out)
	}

	r = ug(t, "release", "diff-failed", "df", "-n", "df")
	for _, want := range []string{
		"revision 2 (failed) against revision 1",
		"ConfigMap/df/cfg", "Secret/df/creds",
		`Deployment/df/api  changed  neither       .spec.template.spec.containers[name="api"].resources.limits.cpu`,
		"ConfigMap/df/old   dropped  previous",
		"MIXED: 2 change(s) landed and 1 did not",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.code != cli.ExitFindings {
		t.Errorf("exit %d, want 1\n%s", r.code, r.stderr)
	}

	r = ug(t, "release", "diff-failed", "df", "-n", "df", "-o", "json")
	var rep releasediff.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r.stdout)
	}
	verdicts := map[string]releasediff.Verdict{}
	for _, o := range rep.Objects {
		verdicts[o.Object] = o.Verdict
	}
	want := map[string]releasediff.Verdict{"ConfigMap/df/cfg": releasediff.Failed, "Secret/df/creds": releasediff.Failed,
		"Deployment/df/api": releasediff.Neither, "ConfigMap/df/old": releasediff.Previous}
	for k, v := range want {
		if verdicts[k] != v {
			t.Errorf("%s: %s, want %s", k, verdicts[k], v)
		}
	}
	if !rep.Mixed || r.code != cli.ExitFindings {
		t.Errorf("json: mixed=%v exit %d", rep.Mixed, r.code)
	}
	for _, out := range []string{r.stdout, r.stderr} {
		if strings.Contains(out, secretV1) || strings.Contains(out, secretV2) {
			t.Fatal("diff-failed printed Secret data")
		}
	}

	// CI reads the same: the release half-applied, and the Deployment that drifted.
	r = ug(t, "release", "diff-failed", "df", "-n", "df", "-o", "sarif")
	wantCI := []string{releasediff.CheckHalfApplied + " error Release/df/df", releasediff.CheckDrifted + " error Deployment/df/api"}
	if diff := cmp.Diff(wantCI, citest.SARIF(t, r.stdout)); diff != "" || r.code != cli.ExitFindings ||
		strings.Contains(r.stdout, secretV1) || strings.Contains(r.stdout, secretV2) {
		t.Errorf("-o sarif: exit %d (want 1, no Secret data), results (-want +got):\n%s", r.code, diff)
	}
}

// TestReleaseDiffFailedStoredVersions: a real Helm upgrade whose chart drops a version
// still in the CRD's status.storedVersions fails on that CRD and lands the rest.
// diff-failed names the rejection, quoting the API server in the wording of the minor
// that runs: "must appear in spec.versions" up to 1.32, "missing from spec.versions; ...
// must remain in spec.versions" from 1.33 (kubernetes#128746).
func TestReleaseDiffFailedStoredVersions(t *testing.T) {
	needCluster(t)
	const crdName = "gizmos.sv.example.com"
	crd := func(versions ...string) string {
		s := "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: " + crdName + "\nspec:\n  group: sv.example.com\n" +
			"  scope: Namespaced\n  names: {plural: gizmos, singular: gizmo, kind: Gizmo}\n  versions:\n"
		for i, v := range versions {
			s += "  - name: " + v + "\n    served: true\n    storage: " + map[bool]string{true: "true", false: "false"}[i == len(versions)-1] +
				"\n    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n"
		}
		return s
	}
	files := func(x string, versions ...string) map[string]string {
		return map[string]string{
			"templates/crd.yaml": crd(versions...),
			"templates/cfg.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  x: \"" + x + "\"\n",
		}
	}
	var charts []string
	for i, f := range []map[string]string{files("1", "v1alpha1"), files("2", "v1alpha1", "v1"), files("3", "v1")} {
		dir, err := testenv.WriteChart(t.TempDir(), "sv", fmt.Sprintf("1.%d.0", i), f)
		if err != nil {
			t.Fatal(err)
		}
		charts = append(charts, dir)
	}
	mustHelm(t, nil, "install", "sv", charts[0], "-n", "sv", "--create-namespace")
	mustHelm(t, nil, "upgrade", "sv", charts[1], "-n", "sv") // storedVersions [v1alpha1 v1]
	out, err := helm(t, nil, "upgrade", "sv", charts[2], "-n", "sv")
	if err == nil {
		t.Fatalf("helm upgrade dropping a stored version succeeded:\n%s", out)
	}
	want := crdversions.WordingFor(cp.Minor)
	rejected := crdversions.StoredVersionRejections(out)
	if len(rejected) != 1 || rejected[0].CRD != crdName || rejected[0].Version != "v1alpha1" || rejected[0].Wording != want {
		t.Fatalf("Kubernetes 1.%d: helm's error %+v, want one rejection of %s v1alpha1 worded %q:\n%s", cp.Minor, rejected, crdName, want, out)
	}

	r := ug(t, "release", "diff-failed", "sv", "-n", "sv")
	if r.code != cli.ExitFindings {
		t.Fatalf("diff-failed exit %d, want 1 (mixed)\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, s := range []string{
		"CustomResourceDefinition/" + crdName, "rejected: status.storedVersions still lists v1alpha1, which revision 3 drops",
		crdName + ": v1alpha1 is still in status.storedVersions but missing from spec.versions",
		`API server: status.storedVersions[0]: Invalid value: "v1alpha1": ` + string(want),
		"upgradeguard check --release sv -n sv",
	} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("diff-failed does not say %q:\n%s", s, r.stdout)
		}
	}
	r = ug(t, "release", "diff-failed", "sv", "-n", "sv", "-o", "json")
	var rep releasediff.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if len(rep.StoredVersionsRejected) != 1 || rep.StoredVersionsRejected[0].Wording != want || rep.StoredVersionsRejected[0].CRD != crdName {
		t.Errorf("storedVersionsRejected %+v, want %s v1alpha1 worded %q", rep.StoredVersionsRejected, crdName, want)
	}
	// The CRD's change did not land (the live CRD is the previous revision's); the
	// ConfigMap's did, so the release is mixed.
	verdicts := map[string]releasediff.Verdict{}
	for _, o := range rep.Objects {
		verdicts[o.Object] = o.Verdict
	}
	if verdicts["CustomResourceDefinition/"+crdName] != releasediff.Previous || verdicts["ConfigMap/sv/cfg"] != releasediff.Failed || !rep.Mixed {
		t.Errorf("verdicts %v mixed %v, want the CRD at the previous revision and the ConfigMap at the failed one", verdicts, rep.Mixed)
	}
}
