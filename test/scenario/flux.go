package scenario

import (
	"context"
	"fmt"
	"strings"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// FluxStoredCRDs are the CRDs whose storedVersions FluxStoredV1beta2 leaves holding
// v1beta2, by name: what flux2 2.18 fails on.
var FluxStoredCRDs = []string{"buckets.source.toolkit.fluxcd.io", "helmcharts.source.toolkit.fluxcd.io", "helmrepositories.source.toolkit.fluxcd.io"}

// FluxStoredV1beta2 installs the Helm release flux2 in flux-system as the 2.18 incident
// found it: source-controller v1.2.0's CRDs (chart "1.0.0"), two HelmRepositories stored
// at v1beta2, then an upgrade to flux2 2.17.2's CRDs. storedVersions of FluxStoredCRDs
// then hold v1beta2 and v1, and an upgrade to 2.18, which drops v1beta2, fails until the
// objects are migrated. dir receives the charts.
func FluxStoredV1beta2(ctx context.Context, cp *testenv.ControlPlane, dir string) error {
	src := func(kind string) string {
		return "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_" + kind + ".yaml"
	}
	old, err := testenv.FixtureChart(dir+"/old", "flux2", "1.0.0", src("buckets"), src("helmcharts"), src("helmrepositories"))
	if err != nil {
		return err
	}
	installed, err := testenv.FixtureChart(dir+"/installed", "flux2", "2.17.2", "charts/flux2-2.17.2/rendered/crds.yaml")
	if err != nil {
		return err
	}
	if err := helm(cp, "install", "flux2", old, "-n", "flux-system", "--create-namespace"); err != nil {
		return err
	}
	if err := HelmRepositoriesAtV1beta2(ctx, cp); err != nil {
		return err
	}
	return helm(cp, "upgrade", "flux2", installed, "-n", "flux-system")
}

// HelmRepositoriesAtV1beta2 creates two HelmRepositories in flux-system at v1beta2, once
// the HelmRepository CRD is established: stored at v1beta2 when that is its storage
// version (source-controller v1.2.0's CRD).
func HelmRepositoriesAtV1beta2(ctx context.Context, cp *testenv.ControlPlane) error {
	if err := testenv.WaitEstablished(ctx, apiextclient.NewForConfigOrDie(cp.Config), FluxStoredCRDs[2]); err != nil {
		return err
	}
	return testenv.CreateObjects(ctx, cp.Config, testenv.Objects{
		GVR:  schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{"flux-system"}, PerNS: 2,
		Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"},
	})
}

// FluxGitManifests is a HelmRepository (fluxcd, at url) and a HelmRelease (flux2, of the
// chart flux2 at version) in flux-system, as a GitOps repository holds them: the file
// review reads. The chart version is on line 20.
func FluxGitManifests(url, version string) string {
	return GitManifests("flux-system", "fluxcd", "flux2", url, version, "")
}

// GitManifests is a HelmRepository (repo, at url) and a HelmRelease (the chart's name, of
// chart at version, quoted) in ns, as a GitOps repository holds them; acknowledge, when
// set, is the HelmRelease's upgradeguard.io/acknowledge annotation.
func GitManifests(ns, repo, chart, url, version, acknowledge string) string {
	annotations := ""
	if acknowledge != "" {
		annotations = "\n  annotations:\n    upgradeguard.io/acknowledge: " + acknowledge
	}
	return `apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata:
  name: ` + repo + `
  namespace: ` + ns + `
spec:
  interval: 1h
  url: ` + url + `
---
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata:
  name: ` + chart + `
  namespace: ` + ns + annotations + `
spec:
  interval: 1h
  chart:
    spec:
      chart: ` + chart + `
      version: "` + version + `"
      sourceRef:
        kind: HelmRepository
        name: ` + repo + `
`
}

// Helm runs the real Helm CLI against cp, its output in the error.
func Helm(cp *testenv.ControlPlane, args ...string) error { return helm(cp, args...) }

func helm(cp *testenv.ControlPlane, args ...string) error {
	if out, err := cp.Helm(args...).CombinedOutput(); err != nil {
		return fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
