package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
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
}
