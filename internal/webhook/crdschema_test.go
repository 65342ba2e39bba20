package webhook_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

const narrowGroup = "narrow.upgradeguard.io"

// narrowCRD is Gauge of narrowGroup with the one version v1 (so no update of it drops a
// stored version): spec.size, spec.mode limited to modes when any are given, and
// spec.legacy when legacy is set. No field preserves unknown fields.
func narrowCRD(legacy bool, modes ...string) string { return gaugeCRD(narrowGroup, legacy, modes...) }

// gaugeCRD is narrowCRD in group.
func gaugeCRD(group string, legacy bool, modes ...string) string {
	props := "size: {type: integer}, mode: {type: string"
	if len(modes) > 0 {
		props += ", enum: [" + strings.Join(modes, ", ") + "]"
	}
	props += "}"
	if legacy {
		props += ", legacy: {type: string}"
	}
	return fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gauges.%s
spec:
  group: %s
  names: {kind: Gauge, listKind: GaugeList, plural: gauges, singular: gauge}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {%s}}
`, group, group, props)
}

// TestCRDGateSchemaNarrowing: CRD updates that drop no stored version but change the
// schema stored objects are judged by, sent to the CRD gate by the shipped webhook
// configuration. One that stops declaring a field the objects hold would make the API
// server prune it from every object: the gate denies it as data loss, naming the field
// and its count, and the CRD and the objects stay as they were. One that only adds a rule
// the objects break is admitted, with a warning naming the rule and the objects, which
// the client sees. With the loss accepted on the live CRD, the narrowing goes through.
func TestCRDGateSchemaNarrowing(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	const ns = "crdgate-narrow"
	namespace(t, s.c, ns)
	crdName := "gauges." + narrowGroup
	seen := &warnings{}
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.WarningHandler = seen
	apply := func(legacy bool, modes ...string) error {
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(narrowCRD(legacy, modes...)), &crd); err != nil {
			t.Fatal(err)
		}
		return testenv.ApplyCRDServerSide(ctx, cfg, &crd, "narrow-test")
	}
	if err := apply(true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.cp.DeleteCRDs(context.WithoutCancel(ctx), func(c *apiextv1.CustomResourceDefinition) bool { return c.Name != crdName }); err != nil {
			t.Errorf("delete CRD %s: %v", crdName, err)
		}
	})
	if err := testenv.WaitEstablished(ctx, apiextclient.NewForConfigOrDie(s.cp.Config), crdName); err != nil {
		t.Fatal(err)
	}
	createGauges(t, narrowGroup, ns, map[string]any{"mode": "fast", "legacy": "keep-me"})

	// The schema stops declaring spec.legacy, which both objects hold.
	err := apply(false)
	if err == nil {
		t.Fatal("the CRD update that stops declaring spec.legacy was admitted; want it denied as data loss")
	}
	mustContain(t, err.Error(), `admission webhook "crd.upgradeguard.io" denied the request`,
		"upgradeguard denied the update of CustomResourceDefinition "+crdName+", which changes the schema its stored objects are judged by",
		gate.WhyDataLoss, "spec.legacy (2 objects")
	live := liveCRD(t, crdName)
	if _, ok := live.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["legacy"]; !ok {
		t.Errorf("CRD %s no longer declares spec.legacy after the denied update", crdName)
	}
	for i := range 2 {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(narrowGroup + "/v1")
		u.SetKind("Gauge")
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("gauge-%d", i)}, u); err != nil {
			t.Fatal(err)
		}
		if v, _, _ := unstructured.NestedString(u.Object, "spec", "legacy"); v != "keep-me" {
			t.Errorf("Gauge %s/%s spec.legacy = %q after the denied update, want keep-me", ns, u.GetName(), v)
		}
	}

	// A rule the objects break (spec.mode limited to slow) loses nothing: admitted, with
	// the objects that the API server would refuse their next update of spec.mode.
	if err := apply(true, "slow"); err != nil {
		t.Fatalf("the CRD update that only limits spec.mode: %v; want it admitted", err)
	}
	seen.mu.Lock()
	got := strings.Join(seen.list, "\n")
	seen.mu.Unlock()
	mustContain(t, got, crdName+": 2 objects would be refused their next update of spec.mode", "for example "+ns+"/gauge-0")

	// The loss accepted on the live CRD: the narrowing goes through.
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, predict.AllowFieldLossAnnotation)
	if _, err := apiextclient.NewForConfigOrDie(s.cp.Config).ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, crdName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := apply(false, "slow"); err != nil {
		t.Errorf("the narrowing with the loss accepted: %v", err)
	}
}

// TestHelmReleaseGateSchemaWarning: a HelmRelease moves to a chart version whose CRD
// adds a rule (spec.mode limited to slow) that objects stored under the old one break.
// Nothing is lost, so the HelmRelease gate admits the change, and warns, in the client
// that made it, which objects the API server would refuse their next update.
func TestHelmReleaseGateSchemaWarning(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	const ns, release, group = "hr-narrow", "gauges", "hrnarrow.upgradeguard.io"
	crdName := "gauges." + group
	namespace(t, s.c, ns)
	dir := t.TempDir()
	for v, crd := range map[string]string{"1.0.0": gaugeCRD(group, true), "2.0.0": gaugeCRD(group, true, "slow")} {
		src, err := testenv.WriteChart(filepath.Join(dir, "src", v), release, v, map[string]string{"templates/crd.yaml": crd})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.Package(src, filepath.Join(dir, "repo")); err != nil {
			t.Fatal(err)
		}
	}
	url, stop, err := servers.ServeRepo(filepath.Join(dir, "repo"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	mustHelm(t, "install", release, release, "--repo", url, "--version", "1.0.0", "-n", ns)
	t.Cleanup(func() {
		if err := s.cp.DeleteCRDs(context.WithoutCancel(ctx), func(c *apiextv1.CustomResourceDefinition) bool { return c.Name != crdName }); err != nil {
			t.Errorf("delete CRD %s: %v", crdName, err)
		}
	})
	if err := testenv.WaitEstablished(ctx, apiextclient.NewForConfigOrDie(s.cp.Config), crdName); err != nil {
		t.Fatal(err)
	}
	createGauges(t, group, ns, map[string]any{"mode": "fast"})
	helmRepo(t, ns, "charts", sourcev1.HelmRepositorySpec{URL: url})
	helmRelease(t, ns, release, release, "1.0.0", "charts")

	seen := &warnings{}
	cfg := rest.CopyConfig(s.cp.Config)
	cfg.WarningHandler = seen
	wc, err := client.New(cfg, client.Options{Scheme: s.scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := setVersion(ctx, wc, ns, release, "2.0.0"); err != nil {
		t.Fatalf("the chart change to 2.0.0: %v; want it admitted", err)
	}
	seen.mu.Lock()
	got := strings.Join(seen.list, "\n")
	seen.mu.Unlock()
	mustContain(t, got, crdName+": 2 objects would be refused their next update of spec.mode", "for example "+ns+"/gauge-0")
}

// createGauges creates gauge-0 and gauge-1 (spec.size 0 and 1, and spec) in ns through
// s.c. A CRD established a moment ago is not yet in the API server's discovery or
// served: the client answers "no matches for kind" or the server 404 until it is, so each
// create is retried on those two answers only.
func createGauges(t *testing.T, group, ns string, spec map[string]any) {
	t.Helper()
	for i := range 2 {
		sp := maps.Clone(spec)
		sp["size"] = int64(i)
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1", "kind": "Gauge",
			"metadata": map[string]any{"name": fmt.Sprintf("gauge-%d", i), "namespace": ns}, "spec": sp}}
		err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			err := s.c.Create(ctx, u.DeepCopy())
			if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
				return false, nil
			}
			return true, err
		})
		if err != nil {
			t.Fatalf("create Gauge %s/gauge-%d: %v", ns, i, err)
		}
	}
}
