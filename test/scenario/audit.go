// Package scenario holds the multi-release scenarios that several test packages share:
// content of the tests, kept apart from internal/testenv, which only runs the control plane.
package scenario

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// Audit installs, with the real Helm CLI, the releases the coverage-audit tests
// judge, from the fixture charts and values:
//
//	flux-a/flux2-default       flux2 2.18.3, default values (crds.migration.enabled=false)
//	flux-b/flux2-migrate       flux2 2.18.3, crds.migration.enabled=true
//	flux-c/flux2-hooks-off     flux2 2.18.3 with migration on, managed by a Flux
//	                           HelmRelease with disableHooks on upgrade and rollback
//	kyverno/kyverno            kyverno 3.2.8 values and hook, v1.12.6 CRDs in its crds
//	                           subchart (hook on)
//	velero/velero              velero CRDs (v1.18.1) in crds/, cleanUpCRDs=true
//	kro/kro                    kro v0.9.3 CRDs in crds/, managed by a HelmRelease with
//	                           upgrade.crds: Skip
//	apps/plain                 a chart without CRDs
//
// The flux2 chart is the fixture's Chart.yaml, values.yaml and CRD templates, with its
// migration hook template replaced by the fixture's rendering of it (the copy lacks the
// chart helpers it needs) under the same `if`. The kyverno chart likewise wraps the
// fixture's rendered hook in the real chart's condition. The velero chart is made here:
// there is no velero chart in the fixtures; its values and hook annotations follow the
// upstream chart. Installs pass --no-hooks: no Job could run on this control plane, and
// Helm stores the rendered hooks all the same. The Flux HelmRelease CRD comes with the
// flux2 chart; no helm-controller runs, so the HelmReleases are paired with Helm releases
// of the names helm-controller would use.
func Audit(ctx context.Context, cp *testenv.ControlPlane, dir string) error {
	fx, err := testenv.Fixtures()
	if err != nil {
		return err
	}
	sc := &scenarioCharts{fx: fx, dir: dir}
	for _, build := range []func() error{sc.flux2, sc.kyverno, sc.velero, sc.kro, sc.plain} {
		if err := build(); err != nil {
			return err
		}
	}
	if err := installAudit(cp, sc); err != nil {
		return err
	}
	return auditHelmReleases(ctx, cp)
}

// scenarioCharts writes the scenario's charts from the fixtures.
type scenarioCharts struct {
	fx, dir                                 string
	flux, kyvernoDir, veleroDir, kroDir, pl string
}

func (sc *scenarioCharts) read(p string) (string, error) {
	b, err := os.ReadFile(filepath.Join(sc.fx, p))
	return string(b), err
}

// copy adds fixture files to files, src -> dst.
func (sc *scenarioCharts) copy(files map[string]string, pairs map[string]string) error {
	for dst, src := range pairs {
		s, err := sc.read(src)
		if err != nil {
			return err
		}
		files[dst] = s
	}
	return nil
}

// flux2 is flux2 2.18.3 with its migration hook under crds.migration.enabled.
func (sc *scenarioCharts) flux2() error {
	files, err := ChartFiles("flux2", "2.18.3")
	if err != nil {
		return err
	}
	sc.flux, err = writeFiles(filepath.Join(sc.dir, "flux2"), files)
	return err
}

// kyverno is kyverno 3.2.8: v1.12.6 CRDs in its crds subchart and its post-upgrade hook.
func (sc *scenarioCharts) kyverno() error {
	files, err := ChartFiles("kyverno", "3.2.8")
	if err != nil {
		return err
	}
	sc.kyvernoDir, err = writeFiles(filepath.Join(sc.dir, "kyverno"), files)
	return err
}

// velero is made here with the real CRDs in crds/.
func (sc *scenarioCharts) velero() error {
	files := map[string]string{
		"values.yaml": "# This job upgrades the CRDs.\nupgradeCRDs: true\n\n# Meant for CI only: destructive on production systems.\ncleanUpCRDs: false\n",
		"templates/upgrade-crds/upgrade-crds.yaml": hookJob("upgradeCRDs", "upgrade-crds", "pre-install,pre-upgrade,pre-rollback"),
		"templates/cleanup-crds.yaml":              hookJob("cleanUpCRDs", "cleanup-crds", "pre-delete"),
	}
	pairs := map[string]string{}
	for _, f := range []string{"velero.io_backuprepositories.yaml", "velero.io_datauploads.yaml"} {
		pairs["crds/"+f] = "crds/velero/v1.18.1/" + f
	}
	if err := sc.copy(files, pairs); err != nil {
		return err
	}
	var err error
	sc.veleroDir, err = testenv.WriteChart(sc.dir, "velero", "11.0.0", files)
	return err
}

// kro has its CRDs in crds/, as the upstream chart ships them.
func (sc *scenarioCharts) kro() error {
	files, pairs := map[string]string{}, map[string]string{}
	for _, f := range []string{"kro.run_resourcegraphdefinitions.yaml", "internal.kro.run_graphrevisions.yaml"} {
		pairs["crds/"+f] = "crds/kro/v0.9.3/" + f
	}
	if err := sc.copy(files, pairs); err != nil {
		return err
	}
	var err error
	sc.kroDir, err = testenv.WriteChart(sc.dir, "kro", "0.9.3", files)
	return err
}

func (sc *scenarioCharts) plain() error {
	var err error
	sc.pl, err = testenv.WriteChart(sc.dir, "plain", "1.0.0", map[string]string{
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: plain\ndata:\n  a: b\n",
	})
	return err
}

func installAudit(cp *testenv.ControlPlane, sc *scenarioCharts) error {
	installs := [][]string{
		{"flux2-default", sc.flux, "-n", "flux-a"},
		{"flux2-migrate", sc.flux, "-n", "flux-b", "--take-ownership", "--set", "crds.migration.enabled=true"},
		{"flux2-hooks-off", sc.flux, "-n", "flux-c", "--take-ownership", "--set", "crds.migration.enabled=true"},
		{"kyverno", sc.kyvernoDir, "-n", "kyverno"},
		{"velero", sc.veleroDir, "-n", "velero", "--set", "cleanUpCRDs=true"},
		{"kro", sc.kroDir, "-n", "kro"},
		{"plain", sc.pl, "-n", "apps"},
	}
	for _, in := range installs {
		args := append([]string{"install", in[0], in[1], "--create-namespace", "--no-hooks"}, in[2:]...)
		if out, err := cp.Helm(args...).CombinedOutput(); err != nil {
			return fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// scenarioHelmReleases are the Flux HelmReleases of flux2-hooks-off and kro.
func auditHelmReleases(ctx context.Context, cp *testenv.ControlPlane) error {
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	hrs := []map[string]any{
		helmRelease("flux-c", "flux2-hooks-off", "flux2", map[string]any{
			"upgrade":  map[string]any{"disableHooks": true},
			"rollback": map[string]any{"disableHooks": true},
			"values":   map[string]any{"crds": map[string]any{"migration": map[string]any{"enabled": true}}},
		}),
		helmRelease("kro", "kro", "kro", map[string]any{
			"install": map[string]any{"crds": "Create"},
			"upgrade": map[string]any{"crds": "Skip"},
		}),
	}
	gvr := schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2", Resource: "helmreleases"}
	for _, hr := range hrs {
		u := &unstructured.Unstructured{Object: hr}
		if _, err := dyn.Resource(gvr).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create HelmRelease %s/%s: %w", u.GetNamespace(), u.GetName(), err)
		}
	}
	return nil
}

func writeFiles(root string, files map[string]string) (string, error) {
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}

func hookJob(value, name, hooks string) string {
	return fmt.Sprintf(`{{- if .Values.%s }}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-%s
  annotations:
    "helm.sh/hook": %s
spec:
  template:
    spec:
      restartPolicy: OnFailure
      containers:
        - name: kubectl
          image: registry.k8s.io/kubectl:v1.36.0
{{- end }}
`, value, name, hooks)
}

func helmRelease(ns, name, chart string, spec map[string]any) map[string]any {
	spec["interval"] = "10m"
	spec["chart"] = map[string]any{"spec": map[string]any{
		"chart": chart, "sourceRef": map[string]any{"kind": "HelmRepository", "name": "charts"},
	}}
	return map[string]any{
		"apiVersion": "helm.toolkit.fluxcd.io/v2",
		"kind":       "HelmRelease",
		"metadata":   map[string]any{"namespace": ns, "name": name},
		"spec":       spec,
	}
}
