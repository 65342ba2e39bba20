package cli_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/audit"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

// TestAuditCommand runs `upgradeguard audit` on a control plane of its own holding only
// the audit scenario (scenario.Audit), so that -A sees exactly those releases, and
// compares the text and JSON output with the golden files in testdata/.
func TestAuditCommand(t *testing.T) {
	needCluster(t)
	own := testenv.ForTest(t)
	charts := t.TempDir()
	if err := scenario.Audit(t.Context(), own, charts); err != nil {
		t.Fatal(err)
	}
	ugOwn := func(args ...string) result {
		return run(t, append([]string{"--kubeconfig", own.Kubeconfig}, args...)...)
	}

	for _, tc := range []struct{ file, format string }{{"audit.txt", "text"}, {"audit.json", "json"}} {
		r := ugOwn("audit", "-A", "-o", tc.format)
		if r.code != cli.ExitFindings {
			t.Errorf("audit -A -o %s: exit %d, want 1 (unprotected releases)\nstderr: %s", tc.format, r.code, r.stderr)
		}
		golden(t, tc.file, r.stdout)
	}

	// Never a release value beyond the registry's keys: the chart values of flux2 hold
	// image names and resource requests, none of which may appear.
	r := ugOwn("audit", "-A", "-o", "json")
	for _, leak := range []string{"ghcr.io", "100m", "64Mi", "kustomize-controller"} {
		if strings.Contains(r.stdout, leak) {
			t.Errorf("output contains the release value %q", leak)
		}
	}
	var rep audit.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	// The CI formats: a case per audited release, the same exit code.
	junit := ugOwn("audit", "-A", "-o", "junit")
	if junit.code != cli.ExitFindings || strings.Count(junit.stdout, "<testcase ") != len(rep.Releases) || !strings.Contains(junit.stdout, `name="Release/flux-b/flux2-migrate"`) {
		t.Errorf("audit -A -o junit: exit %d, want 1 and a case for each of %d releases\n%s%s", junit.code, len(rep.Releases), junit.stdout, junit.stderr)
	}
	if rep.Summary.Coverage != "0/6" {
		t.Errorf("coverage %s", rep.Summary.Coverage)
	}

	// -n limits the audit to one namespace.
	r = ugOwn("audit", "-n", "flux-b", "-o", "json")
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Releases) != 1 || rep.Releases[0].Subject != "Release/flux-b/flux2-migrate" || !rep.Releases[0].Upgrade.Protected || rep.Releases[0].Rollback.Protected {
		t.Errorf("-n flux-b: %+v", rep.Releases)
	}

	// A registry file gives kro a hook on both operations: now it is protected (the key
	// is in neither the values nor the chart, so the registry's default decides).
	reg := filepath.Join(t.TempDir(), "charts.yaml")
	data := `charts:
  - name: kro
    confidence: upstream
    mechanisms:
      - name: in-house-migrate
        hooks: [pre-upgrade, pre-rollback]
        action: migrates-objects
        enabledBy: [{key: migration.enabled, default: true}]
`
	if err := os.WriteFile(reg, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	r = ugOwn("audit", "-n", "kro", "--registry", reg)
	if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "upgrade    protected by upstream hook in-house-migrate") || !strings.Contains(r.stdout, "Coverage: 1/1") {
		t.Errorf("kro with a registry file: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// spec.valuesFrom: the command reads the Secret and composes the values as
	// helm-controller does, so the hook that the stored values leave off is seen on.
	const sentinel = "SENTINEL-a11d17"
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(own.Config)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "vf"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets("vf").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "flux-values"},
		StringData: map[string]string{"values.yaml": "crds: {migration: {enabled: true}}\ntoken: " + sentinel + "\n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
		"metadata": map[string]any{"namespace": "vf", "name": "flux2"},
		"spec": map[string]any{"interval": "10m", "valuesFrom": []any{map[string]any{"kind": "Secret", "name": "flux-values"}},
			"chart": map[string]any{"spec": map[string]any{"chart": "flux2", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "charts"}}}},
	}}
	if _, err := dynamic.NewForConfigOrDie(own.Config).Resource(helmv2.GroupVersion.WithResource("helmreleases")).Namespace("vf").Create(ctx, hr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := own.Helm("install", "flux2", filepath.Join(charts, "flux2"), "-n", "vf", "--no-hooks", "--take-ownership").CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	r = ugOwn("audit", "-n", "vf", "-o", "json")
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.stderr)
	}
	if len(rep.Releases) != 1 || !rep.Releases[0].Upgrade.Protected ||
		rep.Releases[0].ValuesSource != "HelmRelease values composed as helm-controller does from Secret vf/flux-values key values.yaml, then spec.values" {
		t.Errorf("-n vf with valuesFrom: %+v", rep.Releases)
	}
	if strings.Contains(r.stdout+r.stderr, sentinel) {
		t.Error("Secret content in the audit output")
	}
}

func TestAuditFlagErrorsExit2(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("charts:\n- name: x\n  confidence: seed\n  mechanisms:\n  - name: m\n    versions: \">=two\"\n    hooks: [pre-upgrade]\n    action: migrates-objects\n    enabledBy: [{key: a, default: true}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args    []string
		mention string
	}{
		{[]string{"audit", "-o", "yaml"}, "-o json"},
		{[]string{"audit", "--registry", bad}, "is not a semver constraint"},
		{[]string{"audit", "--registry", filepath.Join(t.TempDir(), "none.yaml")}, "read registry"},
		{[]string{"audit", "extra"}, "unknown command"},
		{[]string{"audit", "--fleet", "fleet=prod", "-o", "sarif"}, "audit --fleet reports clusters: use -o text or -o json"},
	} {
		r := run(t, tc.args...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, tc.mention) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, r.code, r.stderr, tc.mention)
		}
	}
}

// golden compares got with testdata/name; -update (declared by the render tests) rewrites it.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if f := flag.Lookup("update"); f != nil && f.Value.String() == "true" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/cli -run TestAuditCommand -update)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", name, diff)
	}
}
