package webhook_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

const widgets = "widgets.valuesfrom.upgradeguard.io"

// widgetCRD is the Widget CRD with the given versions; the last one is the storage
// version.
func widgetCRD(versions ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %s
spec:
  group: valuesfrom.upgradeguard.io
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
`, widgets)
	for i, v := range versions {
		fmt.Fprintf(&b, `  - name: %s
    served: true
    storage: %t
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, v, i == len(versions)-1)
	}
	return b.String()
}

// widgetCharts packages the chart "widgets" into the suite's repository. Like the flux2
// chart's installCRDs, a value decides whether it renders its CRD: 1.0.0 renders none;
// 2.0.0 renders the Widget CRD, serving v1 only, when installCRDs is true (default false).
func widgetCharts(src, repoDir string) error {
	for v, files := range map[string]map[string]string{
		"1.0.0": {"values.yaml": "installCRDs: false\n"},
		"2.0.0": {"values.yaml": "installCRDs: false\n", "templates/crds.yaml": "{{- if .Values.installCRDs }}\n" + widgetCRD("v1") + "{{- end }}\n"},
	} {
		dir, err := testenv.WriteChart(filepath.Join(src, "widgets-"+v), "widgets", v, files)
		if err != nil {
			return err
		}
		if _, err := testenv.Package(dir, repoDir); err != nil {
			return err
		}
	}
	return nil
}

// staleWidgetCRD makes the live Widget CRD serve v1alpha1 and v1 with both in
// storedVersions: the widgets 2.0.0 chart's CRD, serving v1 only, needs a migration.
func staleWidgetCRD(t *testing.T) {
	t.Helper()
	cs, err := apiextclient.NewForConfig(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	live, err := crdversions.FromManifest("widgets", []byte(widgetCRD("v1alpha1", "v1")))
	if err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApplyCRD(t.Context(), cs, live[0]); err != nil {
		t.Fatal(err)
	}
	if err := testenv.SetStoredVersions(t.Context(), cs, widgets, "v1alpha1", "v1"); err != nil {
		t.Fatal(err)
	}
}

// TestGateValuesChanges: with GateValuesChanges, an update that changes only the values
// is decided like a chart change, so switching installCRDs on (which would bring in a
// CRD that drops a stored version) is denied, and switching something harmless is
// admitted. Without it, the values change is admitted unseen.
func TestGateValuesChanges(t *testing.T) {
	skipShort(t)
	ns := "valueschange"
	namespace(t, s.c, ns)
	staleWidgetCRD(t)
	helmRepo(t, ns, "charts", sourcev1.HelmRepositorySpec{URL: s.repoURL})
	release := func(values string) runtime.RawExtension {
		hr := &helmv2.HelmRelease{
			TypeMeta:   metav1.TypeMeta{APIVersion: helmv2.GroupVersion.String(), Kind: helmv2.HelmReleaseKind},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "widgets"},
			Spec: helmv2.HelmReleaseSpec{Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
				Chart: "widgets", Version: "2.0.0", SourceRef: helmv2.CrossNamespaceObjectReference{Kind: sourcev1.HelmRepositoryKind, Name: "charts"},
			}}, Values: &apiextv1.JSON{Raw: []byte(values)}},
		}
		return raw(t, hr)
	}
	decide := func(o webhook.Options, old, updated string) admission.Response {
		o.HelmCacheDir = t.TempDir()
		g, err := webhook.New(s.c, s.c, s.cp.Config, events.NewFakeRecorder(10), o)
		if err != nil {
			t.Fatal(err)
		}
		return g.Handle(t.Context(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Update, Object: release(updated), OldObject: release(old), DryRun: ptr.To(true),
		}})
	}
	const off, on, other = `{"installCRDs":false}`, `{"installCRDs":true}`, `{"installCRDs":false,"replicas":2}`

	resp := decide(webhook.Options{GateValuesChanges: true}, off, on)
	if resp.Allowed || !strings.Contains(resp.Result.Message, "denied the values change of release valueschange/widgets (chart widgets 2.0.0)") ||
		!strings.Contains(resp.Result.Message, "stored versions of "+widgets+" are dropped by the incoming chart") {
		t.Errorf("installCRDs switched on with GateValuesChanges: allowed=%v %q; want denied, naming the values change and the migration", resp.Allowed, resp.Result.Message)
	}
	resp = decide(webhook.Options{GateValuesChanges: true}, off, other)
	if !resp.Allowed || !strings.Contains(resp.Result.Message, "admitted the values change") {
		t.Errorf("a harmless values change with GateValuesChanges: allowed=%v %q; want admitted after a check", resp.Allowed, resp.Result.Message)
	}
	resp = decide(webhook.Options{}, off, on)
	if !resp.Allowed || resp.Result.Message != "the chart does not change" {
		t.Errorf("installCRDs switched on without GateValuesChanges: allowed=%v %q; want admitted unchecked", resp.Allowed, resp.Result.Message)
	}
}

// sentinel stands for Secret content: it must never reach a decision, an event, an
// annotation or a log line.
const sentinel = "SENTINEL-7d41b2"

// TestGateValuesFrom: the incoming chart is rendered with the values helm-controller
// composes from spec.valuesFrom, so a CRD switched on only through a Secret is seen. The
// live Widget CRD still has v1alpha1 in storedVersions; the widgets 2.0.0 chart drops
// it, but renders the CRD only when installCRDs is true.
func TestGateValuesFrom(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "valuesfrom"
	namespace(t, s.c, ns)
	staleWidgetCRD(t)
	helmRepo(t, ns, "charts", sourcev1.HelmRepositorySpec{URL: s.repoURL})
	if err := s.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "widget-values"},
		Data: map[string][]byte{
			"values.yaml": []byte("installCRDs: true\ntoken: " + sentinel + "\n"),
			"install":     []byte("true"),
			"broken":      []byte("installCRDs: [" + sentinel),
		}}); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "widget-defaults"},
		Data: map[string]string{"values.yaml": "installCRDs: false\n"}}); err != nil {
		t.Fatal(err)
	}

	secret := func(name string, mutate ...func(*helmv2.ValuesReference)) helmv2.ValuesReference {
		r := helmv2.ValuesReference{Kind: "Secret", Name: name}
		for _, m := range mutate {
			m(&r)
		}
		return r
	}
	cm := helmv2.ValuesReference{Kind: "ConfigMap", Name: "widget-defaults"}
	key := func(k string) func(*helmv2.ValuesReference) {
		return func(r *helmv2.ValuesReference) { r.ValuesKey = k }
	}
	migrate := []string{"stored versions of " + widgets + " are dropped by the incoming chart and must be migrated first"}

	var outputs []string // every denial the API server returned
	for _, tc := range []struct {
		name   string
		refs   []helmv2.ValuesReference
		inline string
		deny   []string // empty: admitted
		reason string   // event reason
	}{
		// Without valuesFrom the chart renders no CRD: nothing to migrate.
		{name: "inline-only", reason: "ChartChangeAdmitted"},
		// The Secret switches the CRD on: the prediction sees it and denies.
		{name: "from-secret", refs: []helmv2.ValuesReference{cm, secret("widget-values")}, reason: "ChartChangeBlocked",
			deny: append([]string{"(rendered with values from ConfigMap valuesfrom/widget-defaults key values.yaml, Secret valuesfrom/widget-values key values.yaml, then spec.values)"}, migrate...)},
		// Order matters: the ConfigMap after the Secret switches it off again.
		{name: "later-wins", refs: []helmv2.ValuesReference{secret("widget-values"), cm}, reason: "ChartChangeAdmitted"},
		// targetPath with Helm's --set syntax: "true" is a boolean.
		{name: "target-path", refs: []helmv2.ValuesReference{secret("widget-values", key("install"), func(r *helmv2.ValuesReference) { r.TargetPath = "installCRDs" })},
			reason: "ChartChangeBlocked", deny: migrate},
		// spec.values is merged on top of every reference.
		{name: "inline-on-top", refs: []helmv2.ValuesReference{secret("widget-values")}, inline: `{"installCRDs":false}`, reason: "ChartChangeAdmitted"},
		// An optional reference to a missing Secret is skipped, as helm-controller skips it.
		{name: "optional-missing", refs: []helmv2.ValuesReference{secret("absent", func(r *helmv2.ValuesReference) { r.Optional = true })}, reason: "ChartChangeAdmitted"},
		// A required one fails the release in helm-controller: denied, saying what to do.
		{name: "missing", refs: []helmv2.ValuesReference{secret("absent")}, reason: webhook.ReasonValuesError,
			deny: []string{"upgradeguard denied the chart change of HelmRelease valuesfrom/missing (widgets@2.0.0 from HelmRepository valuesfrom/charts)",
				"HelmRelease valuesfrom/missing: spec.valuesFrom Secret valuesfrom/absent key values.yaml does not exist",
				"helm-controller fails the release with ValuesError and installs nothing until this is fixed: create the Secret, or mark the reference optional: true"}},
		{name: "missing-key", refs: []helmv2.ValuesReference{secret("widget-values", key("nokey"))}, reason: webhook.ReasonValuesError,
			deny: []string{"spec.valuesFrom Secret valuesfrom/widget-values has no key nokey", "set valuesKey to the key that holds the values"}},
		// The YAML parser quotes what it cannot read: the message must not.
		{name: "unreadable", refs: []helmv2.ValuesReference{secret("widget-values", key("broken"))}, reason: webhook.ReasonValuesError,
			deny: []string{"spec.valuesFrom Secret valuesfrom/widget-values key broken does not hold a YAML map of values (content not shown)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			helmRelease(t, ns, tc.name, "widgets", "1.0.0", "charts", func(hr *helmv2.HelmRelease) {
				hr.Spec.ValuesFrom = tc.refs
				if tc.inline != "" {
					hr.Spec.Values = &apiextv1.JSON{Raw: []byte(tc.inline)}
				}
			})
			err := setVersion(ctx, s.c, ns, tc.name, "2.0.0")
			if len(tc.deny) == 0 {
				if err != nil {
					t.Fatalf("denied, want admitted: %v", err)
				}
				waitEvent(t, ns, tc.name, tc.reason, "every CRD of the incoming chart is accepted")
				return
			}
			mustDeny(t, err, tc.deny...)
			outputs = append(outputs, err.Error())
			waitEvent(t, ns, tc.name, tc.reason, "upgradeguard denied")
			gateState(t, ns, tc.name, func(st webhook.State) bool { return st.Decision == webhook.OutcomeBlocked })
		})
	}

	// The sentinel never left the Secret: not in a denial, an event, an annotation or a
	// log line.
	var events eventsv1.EventList
	if err := s.c.List(ctx, &events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		outputs = append(outputs, e.Note)
	}
	var list helmv2.HelmReleaseList
	if err := s.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, hr := range list.Items {
		outputs = append(outputs, hr.Annotations[webhook.AnnotationGate])
	}
	logs := s.logs.all()
	if !strings.Contains(logs, "gate decision") || !strings.Contains(logs, "chart values reference") {
		t.Fatalf("the suite's log capture holds no gate decision or values-reference line: the check below would prove nothing")
	}
	outputs = append(outputs, logs)
	if len(events.Items) < 9 || len(list.Items) != 9 {
		t.Fatalf("want an event and an annotation per HelmRelease, got %d events and %d HelmReleases", len(events.Items), len(list.Items))
	}
	for _, o := range outputs {
		if strings.Contains(o, sentinel) {
			t.Errorf("Secret content leaked into the gate's output")
		}
	}
}
