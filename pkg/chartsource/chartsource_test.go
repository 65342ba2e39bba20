package chartsource_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/cli"
	"helm.sh/helm/v4/pkg/cli/values"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

func settings(t *testing.T) *cli.EnvSettings {
	t.Helper()
	d := t.TempDir()
	s := cli.New()
	s.RepositoryCache = filepath.Join(d, "repository")
	s.RepositoryConfig = filepath.Join(d, "repositories.yaml")
	s.RegistryConfig = filepath.Join(d, "registry.json")
	s.ContentCache = filepath.Join(d, "content")
	return s
}

func fixture(t *testing.T, rel string) string {
	t.Helper()
	root, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// crdChart writes a chart with a conditional CRD in templates/, a CRD behind a value that
// is off by default, and a subchart that ships a CRD in its crds/ folder.
func crdChart(t *testing.T, dir, version string) string {
	t.Helper()
	path, err := testenv.WriteChart(dir, "widgets", version, map[string]string{
		"values.yaml":              "crds:\n  install: true\nextra: false\n",
		"templates/crd.yaml":       "{{- if .Values.crds.install }}\n" + fixture(t, "crds/flux-image-reflector-controller/v1.0.0/image.toolkit.fluxcd.io_imagerepositories.yaml") + "{{- end }}\n",
		"templates/extra.yaml":     "{{- if .Values.extra }}\n" + fixture(t, "crds/kro/v0.9.3/internal.kro.run_graphrevisions.yaml") + "{{- end }}\n",
		"templates/cm.yaml":        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n",
		"charts/sub/Chart.yaml":    "apiVersion: v2\nname: sub\nversion: 0.1.0\n",
		"charts/sub/crds/rgd.yaml": fixture(t, "crds/kro/v0.9.3/kro.run_resourcegraphdefinitions.yaml"),
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

type crdSummary struct{ Name, Source string }

func summary(ch *chartsource.Chart) []crdSummary {
	var out []crdSummary
	for _, c := range ch.CRDs {
		out = append(out, crdSummary{c.CRD.Name, string(c.Source)})
	}
	slices.SortFunc(out, func(a, b crdSummary) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func TestLoadLocalSources(t *testing.T) {
	dir := t.TempDir()
	chartDir := crdChart(t, dir, "1.0.0")
	tgz, err := testenv.Package(chartDir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	base := []crdSummary{
		{"imagerepositories.image.toolkit.fluxcd.io", string(predict.Templates)},
		{"resourcegraphdefinitions.kro.run", string(predict.CRDsDir)},
	}
	withExtra := append([]crdSummary{{"graphrevisions.internal.kro.run", string(predict.Templates)}}, base...)
	valuesFile := filepath.Join(dir, "values.yaml")
	if err := os.WriteFile(valuesFile, []byte("extra: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		ref    string
		values values.Options
		want   []crdSummary
	}{
		{"directory with defaults", chartDir, values.Options{}, base},
		{"tgz with defaults", tgz, values.Options{}, base},
		{"--set turns a CRD on", chartDir, values.Options{Values: []string{"extra=true"}}, withExtra},
		{"--values turns a CRD on", tgz, values.Options{ValueFiles: []string{valuesFile}}, withExtra},
		{"--set turns a CRD off", chartDir, values.Options{Values: []string{"crds.install=false"}}, base[1:]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ch, err := chartsource.Load(t.Context(), chartsource.Options{Ref: tc.ref, Values: tc.values, Settings: settings(t)})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, summary(ch)); diff != "" {
				t.Errorf("CRDs (-want +got):\n%s", diff)
			}
			if ch.Name != "widgets" || ch.Version != "1.0.0" {
				t.Errorf("chart %s %s", ch.Name, ch.Version)
			}
		})
	}
}

func TestLoadFluxFixtureChart(t *testing.T) {
	root, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := chartsource.Load(t.Context(), chartsource.Options{Ref: filepath.Join(root, "charts/flux2-2.18.2"), Namespace: "flux-system", Settings: settings(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.CRDs) != 14 {
		t.Errorf("flux2 2.18.2 renders %d CRDs, want 14 (source-watcher is off by default)", len(ch.CRDs))
	}
	ch, err = chartsource.Load(t.Context(), chartsource.Options{Ref: filepath.Join(root, "charts/flux2-2.18.2"), Values: values.Options{Values: []string{"sourceWatcher.create=true"}}, Settings: settings(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.CRDs) != 15 {
		t.Errorf("flux2 2.18.2 with sourceWatcher.create=true renders %d CRDs, want 15", len(ch.CRDs))
	}
}

func TestLoadFromHTTPRepository(t *testing.T) {
	pkgs := t.TempDir()
	for _, v := range []string{"1.0.0", "1.1.0", "2.0.0", "2.1.0-rc.1"} {
		if _, err := testenv.Package(crdChart(t, t.TempDir(), v), pkgs); err != nil {
			t.Fatal(err)
		}
	}
	url, stop, err := servers.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	s := settings(t)

	cases := map[string]string{"": "2.0.0", "^1.0": "1.1.0", "~1.0": "1.0.0", "1.0.0": "1.0.0", ">=1.0.0 <2.0.0": "1.1.0"}
	for constraint, want := range cases {
		ch, err := chartsource.Load(t.Context(), chartsource.Options{Ref: "widgets", RepoURL: url, Version: constraint, Settings: s})
		if err != nil {
			t.Fatalf("version %q: %v", constraint, err)
		}
		if ch.Version != want || len(ch.CRDs) != 2 {
			t.Errorf("version %q: got %s with %d CRDs, want %s with 2", constraint, ch.Version, len(ch.CRDs), want)
		}
	}
	vs, err := chartsource.Versions(t.Context(), chartsource.Helm{}, chartsource.Options{Ref: "widgets", RepoURL: url, Settings: s})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vs {
		got = append(got, v.Original())
	}
	if diff := cmp.Diff([]string{"2.0.0", "1.1.0", "1.0.0"}, got); diff != "" {
		t.Errorf("versions newest first, stable only (-want +got):\n%s", diff)
	}
}

func TestLoadFromOCIRegistry(t *testing.T) {
	host, stop := servers.ServeOCI()
	defer stop()
	var ref string
	for _, v := range []string{"1.0.0", "1.2.0"} {
		tgz, err := testenv.Package(crdChart(t, t.TempDir(), v), t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if ref, err = servers.PushOCI(tgz, host, "charts"); err != nil {
			t.Fatal(err)
		}
	}
	s := settings(t)
	ch, err := chartsource.Load(t.Context(), chartsource.Options{Ref: ref, Version: "1.0.0", PlainHTTP: true, Settings: s})
	if err != nil {
		t.Fatal(err)
	}
	if ch.Version != "1.0.0" || len(ch.CRDs) != 2 {
		t.Errorf("got %s with %d CRDs", ch.Version, len(ch.CRDs))
	}
	vs, err := chartsource.Versions(t.Context(), chartsource.Helm{}, chartsource.Options{Ref: ref, PlainHTTP: true, Settings: s})
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 2 || vs[0].Original() != "1.2.0" {
		t.Errorf("versions = %v, want [1.2.0 1.0.0]", vs)
	}
}

// TestPlainHTTPRegistryWithoutPlainHTTP: a registry without TLS, read over HTTPS. Both
// the fetch and the tag listing fail as the chart server's (Remote) load errors, which
// say that the registry answered plain HTTP.
func TestPlainHTTPRegistryWithoutPlainHTTP(t *testing.T) {
	host, stop := servers.ServeOCI()
	defer stop()
	tgz, err := testenv.Package(crdChart(t, t.TempDir(), "1.0.0"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ref, err := servers.PushOCI(tgz, host, "charts")
	if err != nil {
		t.Fatal(err)
	}
	o := chartsource.Options{Ref: ref, Version: "1.0.0", Settings: settings(t)}
	_, loadErr := chartsource.Load(t.Context(), o)
	_, versionsErr := chartsource.Versions(t.Context(), chartsource.Helm{}, o)
	for _, tc := range []struct {
		name, step string
		err        error
	}{{"load", chartsource.StepFetch, loadErr}, {"versions", chartsource.StepVersions, versionsErr}} {
		var le *chartsource.LoadError
		if !errors.As(tc.err, &le) || le.Step != tc.step || !le.Remote() || !chartsource.AnsweredPlainHTTP(tc.err) {
			t.Errorf("%s: %v (%T), want a remote *LoadError of step %q that says the registry answered plain HTTP", tc.name, tc.err, tc.err, tc.step)
		}
	}
	if chartsource.AnsweredPlainHTTP(errors.New("dial tcp: connection refused")) {
		t.Error("a refused connection is no plain-HTTP answer")
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	badMeta, err := testenv.WriteChart(dir, "badmeta", "1.0.0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(badMeta, "Chart.yaml"), []byte("apiVersion: v2\nname: badmeta\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	badCRD, err := testenv.WriteChart(dir, "badcrd", "1.0.0", map[string]string{
		"templates/crd.yaml": "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: things.example.com\nspec:\n  group: example.com\n  versionz: []\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, ref, repo, step, mention string
	}{
		{"malformed Chart.yaml", badMeta, "", "load", "helm lint"},
		{"invalid CRD in templates", badCRD, "", "read CRDs", "templates/crd.yaml"},
		{"missing directory", filepath.Join(dir, "nope"), "", "fetch", "not found"},
		{"unreachable repository", "widgets", "http://127.0.0.1:1", "fetch", "reachable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := chartsource.Load(t.Context(), chartsource.Options{Ref: tc.ref, RepoURL: tc.repo, Settings: settings(t)})
			var le *chartsource.LoadError
			if !errors.As(err, &le) {
				t.Fatalf("error %v (%T), want a *LoadError", err, err)
			}
			if le.Step != tc.step || !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("step %q error %q, want step %q mentioning %q", le.Step, err, tc.step, tc.mention)
			}
		})
	}
}

// TestFetchThenRender: a caller that installs the chart itself fetches it once and renders
// it with its own values; the CRDs are the ones Load finds with the same values.
func TestFetchThenRender(t *testing.T) {
	tgz, err := testenv.Package(crdChart(t, t.TempDir(), "1.0.0"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := chartsource.Fetch(chartsource.Options{Ref: tgz, Settings: settings(t)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := chartsource.Render(t.Context(), ch, chartsource.Options{BaseValues: map[string]any{"extra": true}, Settings: settings(t)})
	if err != nil {
		t.Fatal(err)
	}
	want, err := chartsource.Load(t.Context(), chartsource.Options{Ref: tgz, Values: values.Options{Values: []string{"extra=true"}}, Settings: settings(t)})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.CRDs) != 3 {
		t.Errorf("Render found %d CRDs, want 3", len(got.CRDs))
	}
	if diff := cmp.Diff(summary(want), summary(got)); diff != "" {
		t.Errorf("Render vs Load (-want +got):\n%s", diff)
	}

	var le *chartsource.LoadError
	if _, err := chartsource.Render(t.Context(), nil, chartsource.Options{}); !errors.As(err, &le) || le.Step != "render" {
		t.Errorf("Render(nil) = %v, want a render LoadError", err)
	}
	if _, err := chartsource.Fetch(chartsource.Options{Ref: filepath.Join(t.TempDir(), "missing"), Settings: settings(t)}); !errors.As(err, &le) || le.Step != "fetch" {
		t.Errorf("Fetch(missing) = %v, want a fetch LoadError", err)
	}
}
