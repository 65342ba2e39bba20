package flux_test

import (
	"path/filepath"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
)

// TestFluxInstallsChart proves the real source-controller and helm-controller run against
// the test API server: a HelmRelease over a loopback chart repository reaches Ready=True
// and its ConfigMap exists, from a HelmRepository and from an OCIRepository.
func TestFluxInstallsChart(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane and Flux")
	}
	cp := testenv.ForTest(t)
	fx := flux.Start(t, cp)
	ctx := t.Context()
	const ns = "apps"
	if err := fx.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	chart, err := testenv.WriteChart(dir, "hello", "1.0.0", map[string]string{
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hello-{{ .Release.Name }}\ndata:\n  version: {{ .Chart.Version | quote }}\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := servers.NewChartRepo(filepath.Join(dir, "repo"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	if err := repo.Add(chart); err != nil {
		t.Fatal(err)
	}
	host, stop := servers.ServeOCI()
	t.Cleanup(stop)
	tgz, err := testenv.Package(chart, filepath.Join(dir, "oci"))
	if err != nil {
		t.Fatal(err)
	}
	ociURL, err := servers.PushOCI(tgz, host, "charts")
	if err != nil {
		t.Fatal(err)
	}

	if err := fx.Client.Create(ctx, flux.HelmRepository(ns, "repo", repo.URL)); err != nil {
		t.Fatal(err)
	}
	if err := fx.Client.Create(ctx, flux.HelmReleaseFromRepository(ns, "from-repo", "repo", "hello", "1.x")); err != nil {
		t.Fatal(err)
	}
	if err := fx.Client.Create(ctx, flux.OCIRepository(ns, "oci", ociURL, sourcev1.OCIRepositoryRef{SemVer: "1.x"})); err != nil {
		t.Fatal(err)
	}
	if err := fx.Client.Create(ctx, flux.HelmReleaseFromOCIRepository(ns, "from-oci", "oci")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"from-repo", "from-oci"} {
		hr, err := fx.WaitHelmRelease(ctx, ns, name, 2*time.Minute, flux.ReadyAtGeneration(metav1.ConditionTrue))
		if err != nil {
			t.Fatal(err)
		}
		// From an OCIRepository, helm-controller appends the artifact's digest to the
		// chart version as build metadata (1.0.0+7b81b0d6f1ec).
		if got := hr.Status.History.Latest(); got == nil || flux.ChartSemver(got.ChartVersion) != "1.0.0" || got.Version != 1 {
			t.Errorf("%s: latest snapshot = %+v, want chart 1.0.0 at revision 1", name, got)
		}
		cm := &corev1.ConfigMap{}
		if err := fx.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "hello-" + name}, cm); err != nil {
			t.Fatalf("%s: the chart's ConfigMap: %v", name, err)
		}
		if flux.ChartSemver(cm.Data["version"]) != "1.0.0" {
			t.Errorf("%s: ConfigMap version = %q, want 1.0.0", name, cm.Data["version"])
		}
	}
}
