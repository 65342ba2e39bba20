package audit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/audit"
)

// objects is the Reader the CLI gives the audit for spec.valuesFrom.
func objects(t *testing.T, cfg *rest.Config) client.Reader {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sentinel stands for Secret content: it must never reach the report.
const sentinel = "SENTINEL-5eca7e"

// TestAuditValuesFrom: a HelmRelease's values are composed from spec.valuesFrom as
// helm-controller composes them, and they win over the stored revision's values. The
// releases run a flux2 2.18.3 chart (the version with the flux-migrate hook, switched by
// crds.migration.enabled), each under a HelmRelease whose valuesFrom decides the switch.
func TestAuditValuesFrom(t *testing.T) {
	installScenario(t) // the HelmRelease CRD
	ctx := t.Context()
	ns := "valuesfrom"
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	chart, err := testenv.WriteChart(t.TempDir(), "flux2", "2.18.3", map[string]string{
		"values.yaml": "crds:\n  migration:\n    enabled: false\n",
		"templates/pre-upgrade-migrate-resources.yaml": `{{- if .Values.crds.migration.enabled }}
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ .Release.Name }}-migrate
  annotations:
    "helm.sh/hook": pre-upgrade
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: flux
          image: ghcr.io/fluxcd/flux-cli:v2.8.5
{{- end }}
`,
		"crds/gadgets.yaml": `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.valuesfrom.upgradeguard.io
spec:
  group: valuesfrom.upgradeguard.io
  names: {kind: Gadget, listKind: GadgetList, plural: gadgets, singular: gadget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "flux-values"},
		Data: map[string][]byte{"values.yaml": []byte("crds:\n  migration:\n    enabled: true\ntoken: " + sentinel + "\n"), "enabled": []byte("true")}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "flux-off"},
		Data: map[string]string{"values.yaml": "crds:\n  migration:\n    enabled: false\n"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dyn := dynamic.NewForConfigOrDie(cp.Config)
	type ref = map[string]any
	for _, r := range []struct {
		name       string
		storedOn   bool // the Helm release was installed with the hook on
		valuesFrom []any
	}{
		{name: "composed", valuesFrom: []any{ref{"kind": "Secret", "name": "flux-values"}}},
		{name: "target", valuesFrom: []any{ref{"kind": "Secret", "name": "flux-values", "valuesKey": "enabled", "targetPath": "crds.migration.enabled"}}},
		{name: "optional", valuesFrom: []any{ref{"kind": "Secret", "name": "absent", "optional": true}}},
		{name: "missing", storedOn: true, valuesFrom: []any{ref{"kind": "Secret", "name": "absent"}}},
		{name: "switched-off", storedOn: true, valuesFrom: []any{ref{"kind": "ConfigMap", "name": "flux-off"}}},
	} {
		args := []string{"install", r.name, chart, "-n", ns, "--no-hooks"}
		if r.storedOn {
			args = append(args, "--set", "crds.migration.enabled=true")
		}
		if out, err := cp.Helm(args...).CombinedOutput(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		// Releases that ship CRDs, unprotected: an audit of every namespace by a later
		// test (TestAuditCountsUpgradeguard's coverage) must not find them.
		t.Cleanup(func() {
			if out, err := cp.Helm("uninstall", r.name, "-n", ns, "--no-hooks").CombinedOutput(); err != nil {
				t.Errorf("helm uninstall %s: %v\n%s", r.name, err, out)
			}
		})
		hr := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
			"metadata": map[string]any{"namespace": ns, "name": r.name},
			"spec": map[string]any{"interval": "10m", "valuesFrom": r.valuesFrom,
				"chart": map[string]any{"spec": map[string]any{"chart": "flux2", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "charts"}}}},
		}}
		hrs := dyn.Resource(helmv2.GroupVersion.WithResource("helmreleases")).Namespace(ns)
		if _, err := hrs.Create(ctx, hr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := hrs.Delete(context.WithoutCancel(ctx), r.name, metav1.DeleteOptions{}); err != nil {
				t.Errorf("delete HelmRelease %s: %v", r.name, err)
			}
		})
	}

	rep := run(t, ns)
	got := bySubject(rep)
	composed := func(from string) string {
		return "HelmRelease values composed as helm-controller does from " + from + ", then spec.values"
	}
	for name, w := range map[string]struct {
		on     bool
		value  audit.Value
		source string
	}{
		// The Secret switches the hook on: protected on upgrade, from the Secret alone.
		"composed": {on: true, value: audit.Value{Key: "crds.migration.enabled", Value: true, Source: "values"},
			source: composed("Secret valuesfrom/flux-values key values.yaml")},
		"target": {on: true, value: audit.Value{Key: "crds.migration.enabled", Value: true, Source: "values"},
			source: composed("Secret valuesfrom/flux-values key enabled targetPath crds.migration.enabled")},
		"optional": {on: false, value: audit.Value{Key: "crds.migration.enabled", Value: false, Source: "chart default"},
			source: composed("Secret valuesfrom/absent key values.yaml (optional)")},
		// helm-controller would fail: the audit falls back to the stored values and says why.
		"missing": {on: true, value: audit.Value{Key: "crds.migration.enabled", Value: true, Source: "values"},
			source: "stored revision 1 (spec.valuesFrom could not be resolved: HelmRelease valuesfrom/missing: spec.valuesFrom Secret valuesfrom/absent key values.yaml does not exist; helm-controller fails the release with ValuesError and installs nothing until this is fixed: create the Secret, or mark the reference optional: true)"},
		// Installed with the hook on, switched off since through valuesFrom: the composed
		// values win over the stored ones, so the next upgrade is not protected.
		"switched-off": {on: false, value: audit.Value{Key: "crds.migration.enabled", Value: false, Source: "values"},
			source: composed("ConfigMap valuesfrom/flux-off key values.yaml")},
	} {
		subject := "HelmRelease/" + ns + "/" + name
		r, ok := got[subject]
		if !ok || len(r.Mechanisms) != 1 {
			t.Errorf("%s not reported with the flux-migrate mechanism: %+v", subject, r)
			continue
		}
		if r.ValuesSource != w.source {
			t.Errorf("%s: values source\n got %q\nwant %q", subject, r.ValuesSource, w.source)
		}
		m := r.Mechanisms[0]
		if m.On != w.on || r.Upgrade.Protected != w.on {
			t.Errorf("%s: flux-migrate on=%v, upgrade protected=%v; want %v", subject, m.On, r.Upgrade.Protected, w.on)
		}
		if diff := cmp.Diff([]audit.Value{w.value}, m.Keys); diff != "" {
			t.Errorf("%s: key (-want +got):\n%s", subject, diff)
		}
	}
	if n := got["HelmRelease/"+ns+"/missing"].Notes; len(n) == 0 || !strings.Contains(fmt.Sprint(n), "spec.valuesFrom could not be resolved") {
		t.Errorf("missing: no note about the unresolved reference: %v", n)
	}

	// Nothing from the Secret but the registry key's value reaches the report.
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), sentinel) {
		t.Error("Secret content leaked into the audit report")
	}
}
