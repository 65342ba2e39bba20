package gate_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/loader"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

func loadChart(t *testing.T, dir string) *chart.Chart {
	t.Helper()
	c, err := loader.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ch, ok := c.(*chart.Chart)
	if !ok {
		t.Fatalf("chart %s: unexpected type %T", dir, c)
	}
	return ch
}

func fixtureChart(t *testing.T, name string) *chart.Chart {
	t.Helper()
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	return loadChart(t, filepath.Join(fx, "charts", name))
}

// fluxHistory leaves the cluster as a long-lived one that ran source-controller 1.2.0 and
// then the flux2 2.17.2 chart: HelmRepositories stored at v1beta2, storedVersions
// [v1beta2 v1].
func fluxHistory(t *testing.T) apiextclient.Interface {
	t.Helper()
	cs := emptyCluster(t)
	if err := applyAll(t, cs, read(t, "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(t.Context(), cp.Config, testenv.Objects{GVR: schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{"chart"}, PerNS: 20, Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		t.Fatal(err)
	}
	if err := applyAll(t, cs, read(t, "charts/flux2-2.17.2/rendered/crds.yaml")); err != nil {
		t.Fatal(err)
	}
	return cs
}

func names(crds []chartcrds.CRD) []string {
	var out []string
	for _, c := range crds {
		out = append(out, c.CRD.Name+" "+string(c.Source)+" "+c.File)
	}
	slices.Sort(out)
	return out
}

// TestDecideChartRendersValues: the real flux2 chart brings its CRDs from templates behind
// installCRDs, so the decision depends on the values the release is installed with.
func TestDecideChartRendersValues(t *testing.T) {
	fluxHistory(t)
	incoming := gate.Chart{Chart: fixtureChart(t, "flux2-2.18.2"), ReleaseName: "flux", Namespace: "flux-system"}
	o := gate.Options{ObservedGeneration: 7}

	d, err := gate.DecideChart(t.Context(), cp.Config, incoming, o)
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != gate.Blocked || len(d.Report.CRDs) != 14 {
		t.Fatalf("default values: outcome %s with %d CRDs, want Blocked with the chart's 14: %s", d.Outcome, len(d.Report.CRDs), d.Message)
	}
	c := condition(t, d, gate.ConditionRequired)
	if c.Status != metav1.ConditionTrue || c.Reason != gate.ReasonMigrationRequired || c.ObservedGeneration != 7 ||
		!strings.Contains(c.Message, "helmrepositories.source.toolkit.fluxcd.io") {
		t.Errorf("required condition %+v", c)
	}
	var found bool
	for _, f := range d.Report.Findings() {
		if f.Name == "helmrepositories.source.toolkit.fluxcd.io" {
			found = f.Verdict == predict.Migrate && f.Source == predict.Templates
		}
	}
	if !found {
		t.Errorf("no migrate finding for helmrepositories from templates/ in %+v", d.Report.Findings())
	}
	crds, err := gate.ChartCRDs(t.Context(), cp.Config, incoming)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(crds), "helmrepositories.source.toolkit.fluxcd.io templates flux2/templates/source-controller.crds.yaml"; !slices.Contains(got, want) {
		t.Errorf("ChartCRDs = %q, want it to hold %q", got, want)
	}

	incoming.Values = map[string]any{"installCRDs": false}
	d, err = gate.DecideChart(t.Context(), cp.Config, incoming, o)
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != gate.Proceed || len(d.Report.CRDs) != 0 {
		t.Errorf("installCRDs=false: outcome %s with %d CRDs, want Proceed with none", d.Outcome, len(d.Report.CRDs))
	}
	if c := condition(t, d, gate.ConditionRequired); c.Status != metav1.ConditionFalse || c.Reason != gate.ReasonNotRequired {
		t.Errorf("required condition %+v", c)
	}
}

// TestDecideChartCRDsFolder: crds/ files count only when the deployment applies them
// (Flux's CreateReplace); then DecideChart migrates, telling the caller first.
func TestDecideChartCRDsFolder(t *testing.T) {
	cs := fluxHistory(t)
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile(filepath.Join(fx, "crds/flux-source-controller/v1.8.0/source.toolkit.fluxcd.io_helmrepositories.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := testenv.WriteChart(t.TempDir(), "sources", "1.8.0", map[string]string{"crds/helmrepositories.yaml": string(crd)})
	if err != nil {
		t.Fatal(err)
	}
	incoming := gate.Chart{Chart: loadChart(t, dir)}
	crds, err := gate.ChartCRDs(t.Context(), cp.Config, incoming)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(crds), []string{"helmrepositories.source.toolkit.fluxcd.io crds sources/crds/helmrepositories.yaml"}; !slices.Equal(got, want) {
		t.Fatalf("ChartCRDs = %q, want %q", got, want)
	}

	var published [][]metav1.Condition
	o := gate.Options{AutoMigrate: true, Migrate: migrate.Options{LeaseNamespace: "default", Holder: "gate-test"},
		BeforeMigrate: func(_ context.Context, c []metav1.Condition) error {
			published = append(published, c)
			return nil
		}}
	d, err := gate.DecideChart(t.Context(), cp.Config, incoming, o)
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != gate.Proceed || len(d.Migrations) != 0 || len(published) != 0 {
		t.Fatalf("plain Helm never upgrades crds/: %s, %d migrations, %d publications", d.Outcome, len(d.Migrations), len(published))
	}

	o.Policy = check.PolicyCreateReplace
	d, err = gate.DecideChart(t.Context(), cp.Config, incoming, o)
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != gate.Proceed || len(d.Migrations) != 1 || d.Migrations[0].Status != migrate.Migrated {
		t.Fatalf("create-replace: %s %+v: %s", d.Outcome, d.Migrations, d.Message)
	}
	if len(published) != 1 {
		t.Fatalf("BeforeMigrate called %d times, want once", len(published))
	}
	for typ, reason := range map[string]string{gate.ConditionRequired: gate.ReasonMigrationRequired, gate.ConditionInProgress: gate.ReasonMigrating} {
		c := meta.FindStatusCondition(published[0], typ)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason {
			t.Errorf("published %s = %+v, want True %s", typ, c, reason)
		}
	}
	if c := condition(t, d, gate.ConditionInProgress); c.Status != metav1.ConditionFalse || c.Reason != gate.ReasonMigrated {
		t.Errorf("in-progress condition after the migration %+v", c)
	}
	live, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), "helmrepositories.source.toolkit.fluxcd.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(live.Status.StoredVersions, []string{"v1"}) {
		t.Errorf("storedVersions after Proceed = %v, want [v1]", live.Status.StoredVersions)
	}
	if err := testenv.ApplyCRD(t.Context(), cs, crds[0].CRD); err != nil {
		t.Errorf("the incoming CRD is rejected after Proceed: %v", err)
	}
}

func TestChartCRDsNeedsAChart(t *testing.T) {
	if _, err := gate.DecideChart(t.Context(), nil, gate.Chart{}, gate.Options{}); err == nil || !strings.Contains(err.Error(), "no chart given") {
		t.Errorf("error = %v, want one that says no chart was given", err)
	}
}
