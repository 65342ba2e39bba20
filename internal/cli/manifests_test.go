package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// ugIn runs upgradeguard against the test control plane with stdin as standard input.
func ugIn(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Execute(t.Context(), append([]string{"--kubeconfig", cp.Kubeconfig}, args...),
		cli.Streams{Out: &out, ErrOut: &errOut, In: strings.NewReader(stdin)})
	return result{code, out.String(), errOut.String()}
}

// helmTemplate renders a chart with the real Helm CLI as Argo CD and CI pipelines do.
func helmTemplate(t *testing.T, release, chart, ns string) string {
	t.Helper()
	out, err := cp.Helm("template", release, chart, "--include-crds", "-n", ns).Output()
	if err != nil {
		t.Fatalf("helm template %s: %v", chart, err)
	}
	return string(out)
}

// applyFixtures applies fixture CRD files in order, so that the live CRDs carry the
// storedVersions an upgrade path leaves.
func applyFixtures(t *testing.T, files ...string) {
	t.Helper()
	if err := testenv.ApplyFixtureCRDs(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), files...); err != nil {
		t.Fatal(err)
	}
}

func fixtureSet(t *testing.T, set string) []string {
	t.Helper()
	files, err := testenv.FixtureSet(set)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// sameVerdicts asserts that check --manifests - on a chart's rendered output reports
// what check --chart reports for the chart with every CRD applied: the same exit code,
// and per CRD the same finding, objects at stake and next action.
func sameVerdicts(t *testing.T, chart, rendered string, chartArgs ...string) *check.Report {
	t.Helper()
	byChart := ug(t, append([]string{"check", "--chart", chart, "--crd-policy", "create-replace", "-o", "json"}, chartArgs...)...)
	byManifests := ugIn(t, rendered, "check", "--manifests", "-", "-o", "json")
	if byChart.code != byManifests.code {
		t.Fatalf("exit %d from --manifests, %d from --chart\n%s%s", byManifests.code, byChart.code, byManifests.stdout, byManifests.stderr)
	}
	want, got := report(t, byChart), report(t, byManifests)
	if diff := cmp.Diff(want.CRDs, got.CRDs, cmpopts.IgnoreFields(check.CRDReport{}, "ManifestObjects")); diff != "" {
		t.Errorf("CRDs: --chart (-) and --manifests (+):\n%s", diff)
	}
	if diff := cmp.Diff(want.NextSteps, got.NextSteps); diff != "" {
		t.Errorf("next steps: --chart (-) and --manifests (+):\n%s", diff)
	}
	if got.Safe != want.Safe || got.Operation != predict.Upgrade || got.Manifests == nil {
		t.Errorf("safe %v (chart %v), operation %s, manifests %+v", got.Safe, want.Safe, got.Operation, got.Manifests)
	}
	return got
}

// TestCheckManifestsFlux: the real flux2 2.18.2 chart rendered by helm template
// --include-crds, over live CRDs that still store v1beta2 (flux2 2.12 then 2.17.2), gets
// the verdicts check --chart gives, and the objects it carries are counted per CRD.
func TestCheckManifestsFlux(t *testing.T) {
	needCluster(t)
	fluxLiveStoresV1beta2(t)

	chart := filepath.Join(fixturesDir(t), "charts/flux2-2.18.2")
	rendered := helmTemplate(t, "flux", chart, "flux-system") +
		"---\napiVersion: source.toolkit.fluxcd.io/v1\nkind: HelmRepository\nmetadata: {name: a, namespace: flux-system}\nspec: {url: https://a.example.com}\n" +
		"---\napiVersion: v1\nkind: List\nitems:\n" +
		"- {apiVersion: source.toolkit.fluxcd.io/v1, kind: HelmRepository, metadata: {name: b, namespace: flux-system}, spec: {url: https://b.example.com}}\n" +
		"- {apiVersion: helm.toolkit.fluxcd.io/v2, kind: HelmRelease, metadata: {name: c, namespace: flux-system}}\n" +
		"- {apiVersion: v1, kind: ConfigMap, metadata: {name: d, namespace: flux-system}}\n"
	rep := sameVerdicts(t, chart, rendered, "-n", "flux-system")

	migrate := []string{buckets, charts, helmrepos}
	if got := verdicts(rep)[predict.Migrate]; !slices.Equal(got, migrate) || len(verdicts(rep)[predict.OK]) != 11 {
		t.Errorf("verdicts %v, want migrate %v and 11 ok", verdicts(rep), migrate)
	}
	carried := map[string]int{}
	for _, c := range rep.CRDs {
		if c.ManifestObjects == nil {
			t.Errorf("%s: no count of the objects the manifests carry", c.Name)
			continue
		}
		if *c.ManifestObjects > 0 {
			carried[c.Name] = *c.ManifestObjects
		}
		if c.Name == helmrepos && (c.Objects == nil || *c.Objects != 2) {
			t.Errorf("%s: %v objects live, want 2", c.Name, c.Objects)
		}
	}
	if diff := cmp.Diff(map[string]int{helmrepos: 2, "helmreleases.helm.toolkit.fluxcd.io": 1}, carried); diff != "" {
		t.Errorf("objects carried per CRD (-want +got):\n%s", diff)
	}
	if m := rep.Manifests; m.CRDs != 14 || m.Objects != 4 || len(m.Files) != 1 || m.Files[0] != "-" || len(m.LiveCRDObjects) != 0 {
		t.Errorf("summary %+v, want 14 CRDs and 4 other objects from -", m)
	}

	text := ugIn(t, rendered, "check", "--manifests", "-")
	for _, want := range []string{
		"Upgrade to the rendered manifests in standard input (every CRD applied)",
		"BLOCKED: 3 of 14 CRDs need action before the upgrade.",
		"IN MANIFESTS",
		"Manifests: ", "14 CRD(s), 4 other object(s) (not judged for storage).",
		"upgradeguard migrate --crd " + buckets,
	} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}
	if text.code != cli.ExitFindings {
		t.Errorf("text: exit %d, want 1", text.code)
	}

	// rbac --manifests grants exactly what migrating those CRDs needs.
	role := ugIn(t, rendered, "rbac", "--manifests", "-")
	for _, name := range migrate {
		if role.code != cli.ExitSafe || !strings.Contains(role.stdout, strings.SplitN(name, ".", 2)[0]) {
			t.Errorf("rbac --manifests (exit %d) does not grant %s:\n%s%s", role.code, name, role.stdout, role.stderr)
		}
	}
	if strings.Contains(role.stdout, "kustomizations") {
		t.Errorf("rbac --manifests grants on kustomizations, which need no migration:\n%s", role.stdout)
	}

	// migrate --manifests selects what check finds, and changes nothing with --dry-run.
	dry := ugIn(t, rendered, "migrate", "--manifests", "-", "--dry-run", "-o", "json")
	for _, name := range migrate {
		if !strings.Contains(dry.stdout, `"name": "`+name+`"`) {
			t.Errorf("migrate --manifests --dry-run does not select %s (exit %d):\n%s%s", name, dry.code, dry.stdout, dry.stderr)
		}
	}
}

// TestCheckManifestsKyverno: kyverno's CRDs in a chart's crds/ folder (kyverno#12633:
// 1.13 drops v2alpha1, which 1.10 stored). helm upgrade leaves crds/ alone, so check
// --chart says the upgrade is safe; the rendered output applied whole writes them, so
// check --manifests - reports what check --chart --crd-policy create-replace does.
func TestCheckManifestsKyverno(t *testing.T) {
	needCluster(t)
	cleanCRDs(t, "kyverno.io")
	applyFixtures(t, fixtureSet(t, "kyverno/v1.10.7")...)
	applyFixtures(t, fixtureSet(t, "kyverno/v1.12.6")...)

	files := map[string]string{}
	for _, f := range fixtureSet(t, "kyverno/v1.13.4") {
		data, err := os.ReadFile(filepath.Join(fixturesDir(t), f))
		if err != nil {
			t.Fatal(err)
		}
		files["crds/"+filepath.Base(f)] = string(data)
	}
	chart, err := testenv.WriteChart(t.TempDir(), "kyverno", "3.3.7", files)
	if err != nil {
		t.Fatal(err)
	}
	rendered := helmTemplate(t, "kyverno", chart, "kyverno")
	rep := sameVerdicts(t, chart, rendered, "-n", "kyverno")
	migrate := []string{"cleanuppolicies.kyverno.io", "policyexceptions.kyverno.io"}
	if got := verdicts(rep)[predict.Migrate]; !slices.Equal(got, migrate) || len(verdicts(rep)[predict.OK]) != 1 {
		t.Errorf("verdicts %v, want migrate %v and 1 ok", verdicts(rep), migrate)
	}
	for _, c := range rep.CRDs {
		if c.Source != predict.CRDsDir {
			t.Errorf("%s: source %q, want crds (read from helm template's Source line)", c.Name, c.Source)
		}
	}
	if plain := ug(t, "check", "--chart", chart, "-n", "kyverno"); plain.code != cli.ExitSafe {
		t.Errorf("check --chart (helm leaves crds/ alone): exit %d, want 0\n%s%s", plain.code, plain.stdout, plain.stderr)
	}
}

// TestCheckManifestsSources: a directory, a JSON List, a bad document and manifests
// without CRDs.
func TestCheckManifestsSources(t *testing.T) {
	needCluster(t)
	group := "manifests.upgradeguard.test"
	cleanCRDs(t, group)
	old := testenv.TwoVersionCRD(group, "gizmos", "Gizmo") // v1alpha1 storage, v1 served
	if err := testenv.ApplyCRD(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), old); err != nil {
		t.Fatal(err)
	}
	// The next release: v1 storage, v1alpha1 gone; the live CRD stores v1alpha1.
	next := "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: gizmos." + group + "}\n" +
		"spec:\n  group: " + group + "\n  scope: Namespaced\n  names: {plural: gizmos, singular: gizmo, kind: Gizmo, listKind: GizmoList}\n" +
		"  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}\n"
	gizmo := func(name string) string {
		return "apiVersion: " + group + "/v1\nkind: Gizmo\nmetadata: {name: " + name + ", namespace: default}\n"
	}
	dir := t.TempDir()
	for name, data := range map[string]string{
		"10-crd.yaml":   next,
		"20-gizmos.yml": gizmo("a") + "---\n" + gizmo("b"),
		"30-list.json": `{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"` + group + `/v1","kind":"Gizmo","metadata":{"name":"c"}},` +
			`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"d"}}]}`,
		"README.md": "not read",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("directory", func(t *testing.T) {
		r := ug(t, "check", "--manifests", dir, "-o", "json")
		if r.code != cli.ExitFindings {
			t.Fatalf("exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
		}
		rep := report(t, r)
		if len(rep.CRDs) != 1 || rep.CRDs[0].Verdict != predict.Bridge || rep.CRDs[0].ManifestObjects == nil || *rep.CRDs[0].ManifestObjects != 3 {
			t.Fatalf("CRDs %+v, want gizmos bridge with 3 objects in the manifests", rep.CRDs)
		}
		want := []string{filepath.Join(dir, "10-crd.yaml"), filepath.Join(dir, "20-gizmos.yml"), filepath.Join(dir, "30-list.json")}
		if m := rep.Manifests; !slices.Equal(m.Files, want) || m.Documents != 4 || m.Objects != 4 {
			t.Errorf("summary %+v, want files %v, 4 documents and 4 other objects", m, want)
		}
	})

	t.Run("JSON List on stdin", func(t *testing.T) {
		crdJSON := `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"gizmos.` + group + `"},` +
			`"spec":{"group":"` + group + `","scope":"Namespaced","names":{"plural":"gizmos","singular":"gizmo","kind":"Gizmo"},` +
			`"versions":[{"name":"v1alpha1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}},` +
			`{"name":"v1","served":true,"storage":false,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`
		r := ugIn(t, `{"apiVersion":"v1","kind":"List","items":[`+crdJSON+`]}`, "check", "--manifests", "-", "-o", "json")
		rep := report(t, r)
		if r.code != cli.ExitSafe || len(rep.CRDs) != 1 || rep.CRDs[0].Verdict != predict.OK {
			t.Errorf("exit %d, CRDs %+v; want the unchanged CRD ok, exit 0", r.code, rep.CRDs)
		}
	})

	t.Run("bad document", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(bad, []byte(gizmo("a")+"---\n"+next+"---\nkind: [\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			r    result
			want string
		}{
			{ug(t, "check", "--manifests", bad), bad + " (document 3): not valid YAML"},
			{ugIn(t, gizmo("a")+"---\n"+strings.Replace(next, "scope:", "scopez:", 1), "check", "--manifests", "-"),
				`standard input (document 2): invalid CustomResourceDefinition: json: unknown field "scopez"`},
		} {
			if tc.r.code != cli.ExitCouldNot || tc.r.stdout != "" {
				t.Errorf("exit %d, stdout %q; want 2 and nothing", tc.r.code, tc.r.stdout)
			}
			if !strings.Contains(tc.r.stderr, tc.want) {
				t.Errorf("stderr %q, want it to name the input, the document and the fault: %q", tc.r.stderr, tc.want)
			}
		}
	})

	t.Run("nothing rendered", func(t *testing.T) {
		// helm template failed before the pipe: nothing to judge is not "safe".
		r := ugIn(t, "", "check", "--manifests", "-")
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "standard input holds no Kubernetes object") {
			t.Errorf("exit %d, stderr %q; want 2 saying nothing was read", r.code, r.stderr)
		}
	})

	t.Run("no CRDs", func(t *testing.T) {
		r := ugIn(t, gizmo("a")+"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: d}\n", "check", "--manifests", "-")
		if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "The manifests bring no CRDs: nothing to check.") ||
			!strings.Contains(r.stdout, "1 Gizmo object(s) of live CRD gizmos."+group+", which the manifests do not bring") {
			t.Errorf("exit %d, want 0 saying there are no CRDs and counting the Gizmo:\n%s%s", r.code, r.stdout, r.stderr)
		}
		j := ugIn(t, gizmo("a"), "check", "--manifests", "-", "-o", "json")
		rep := report(t, j)
		want := []check.CustomResourceCount{{CRD: "gizmos." + group, Kind: "Gizmo", Objects: 1}}
		if diff := cmp.Diff(want, rep.Manifests.LiveCRDObjects); diff != "" || len(rep.CRDs) != 0 || !rep.Safe {
			t.Errorf("JSON: CRDs %+v, safe %v, live CRD objects (-want +got):\n%s", rep.CRDs, rep.Safe, diff)
		}
	})
}

// TestCheckManifestsFlagErrors: --manifests refuses other sources, and plan says to use
// check, before anything is read or the cluster is asked.
func TestCheckManifestsFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		mention string
	}{
		{[]string{"check", "--manifests", "-", "--chart", "x"}, "--manifests and --chart do not go together"},
		{[]string{"check", "--manifests", "-", "--release", "x"}, "drop --release, or drop --manifests"},
		{[]string{"check", "flux", "--manifests", "-"}, `--manifests and release "flux" do not go together`},
		{[]string{"check", "--manifests", "-", "--rollback"}, "--rollback"},
		{[]string{"check", "--manifests", "-", "--crd-policy", "helm"}, "--crd-policy does not apply to --manifests"},
		{[]string{"check", "--manifests", "-", "-f", "values.yaml"}, "drop --values"},
		{[]string{"migrate", "--manifests", "-", "--all"}, "exactly one of --crd, --chart, --manifests"},
		{[]string{"plan", "--release", "x", "--manifests", "out.yaml"}, "run `upgradeguard check --manifests out.yaml`"},
	} {
		r := run(t, tc.args...)
		if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, tc.mention) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, r.code, r.stderr, tc.mention)
		}
	}
}
