package check_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// fieldsCRD is a one-version CRD whose spec declares the named string fields.
func fieldsCRD(group string, fields ...string) *apiextv1.CustomResourceDefinition {
	props := map[string]apiextv1.JSONSchemaProps{}
	for _, f := range fields {
		props[f] = apiextv1.JSONSchemaProps{Type: "string"}
	}
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "gadgets." + group},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: group, Scope: apiextv1.NamespaceScoped,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: "gadgets", Singular: "gadget", Kind: "Gadget", ListKind: "GadgetList"},
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextv1.JSONSchemaProps{
					"spec": {Type: "object", Properties: props}}}}}},
		},
	}
}

// TestDecisionFromMemory: a repeated decision of a target of Clusters (the CRDs, the
// compiled schema judge, the schema check's LIST of the objects, the count of objects)
// makes no API request,
// and each thing it keeps is dropped when the API server's changes: an object created
// that the incoming schema prunes, then the live CRD changed so that it no longer does,
// are each seen by the decisions that follow.
func TestDecisionFromMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	t.Run("remote target", func(t *testing.T) { decisionFromMemory(t, "memory.example.io", false) })
	// The local cluster's CRDs come from the controller manager's cache.
	t.Run("local target", func(t *testing.T) { decisionFromMemory(t, "local.memory.example.io", true) })
}

func decisionFromMemory(t *testing.T, group string, local bool) {
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	if err := testenv.ApplyCRD(ctx, cs, fieldsCRD(group, "a", "b")); err != nil {
		t.Fatal(err)
	}
	// Its objects go with it: a second run starts with nothing stored.
	t.Cleanup(func() {
		_ = cp.DeleteCRDs(context.Background(), func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group != group })
	})
	o := livecluster.ClustersOptions{}
	if local {
		scheme := runtime.NewScheme()
		if err := apiextv1.AddToScheme(scheme); err != nil {
			t.Fatal(err)
		}
		c, err := cache.New(cp.Config, cache.Options{Scheme: scheme})
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = c.Start(ctx) }()
		if !c.WaitForCacheSync(ctx) {
			t.Fatal("cache not synced")
		}
		o.Local = c
	}
	target, n := testenv.CountedTarget(t, cp.Config, o, local)
	incoming := fieldsCRD(group, "b") // drops spec.a
	decide := func() (*check.CRDReport, int64, error) {
		before := n.Load()
		rep, err := check.Run(ctx, target.Cluster, check.Request{Operation: predict.Upgrade,
			Incoming: []chartcrds.CRD{{CRD: incoming, Source: predict.Templates}}})
		if err != nil {
			return nil, 0, err
		}
		if len(rep.CRDs) != 1 {
			return nil, 0, fmt.Errorf("%d CRDs in the report, want 1", len(rep.CRDs))
		}
		return &rep.CRDs[0], n.Load() - before, nil
	}
	verdictFromMemory := func(want predict.Verdict, objects int64) func() (bool, error) {
		return func() (bool, error) {
			c, reqs, err := decide()
			if err != nil || c.Verdict != want || c.Objects == nil || *c.Objects != objects {
				return false, err
			}
			return reqs == 0, nil
		}
	}
	testenv.Eventually(t, "nothing stored: ok, no object counted, decided with no API request", verdictFromMemory(predict.OK, 0))

	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "gadgets"}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": "g", "namespace": "default"}, "spec": map[string]any{"a": "kept", "b": "x"}}}
	if _, err := dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).Namespace("default").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "an object holding spec.a: counted, field loss found, then decided from memory again", verdictFromMemory(predict.DataLoss, 1))

	if err := testenv.ApplyCRD(ctx, cs, fieldsCRD(group, "b", "c")); err != nil {
		t.Fatal(err)
	}
	// The live schema no longer declares spec.a (the API server already prunes it on
	// read): the incoming CRD loses nothing more, and a judge kept for the old live CRD
	// would still say it does.
	testenv.Eventually(t, "the live CRD changed: ok again, then decided from memory", verdictFromMemory(predict.OK, 1))
}

// TestRevisionCRDsFromMemory: a target of Clusters parses the CRDs of a deployed
// revision once: the next prediction of the same stored revision reuses them (the same
// values, not a new parse), and a revision written since is parsed afresh. Wiring is not
// left to callers: every Predict on the target's Cluster goes through it.
func TestRevisionCRDsFromMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	const ns = "memory-revision-crds"
	kc := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	manifest := func(group string) string {
		return "---\n# Source: web/templates/crd.yaml\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: gadgets." + group +
			"\nspec:\n  group: " + group + "\n  scope: Namespaced\n  names: {plural: gadgets, singular: gadget, kind: Gadget, listKind: GadgetList}\n" +
			"  versions:\n  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}\n"
	}
	d := driver.NewSecrets(kc.CoreV1().Secrets(ns))
	rel := func(v int, status common.Status, group string) *release.Release {
		return &release.Release{Name: "web", Namespace: ns, Version: v, Info: &release.Info{Status: status}, Manifest: manifest(group),
			Chart: &chart.Chart{Metadata: &chart.Metadata{Name: "web", Version: fmt.Sprintf("1.%d.0", v)}}}
	}
	if err := d.Create("sh.helm.release.v1.web.v1", rel(1, common.StatusDeployed, "one.example.io")); err != nil {
		t.Fatal(err)
	}
	target, _ := testenv.CountedTarget(t, cp.Config, livecluster.ClustersOptions{}, false)
	predictCurrent := func() []chartcrds.CRD {
		t.Helper()
		reader, err := helmrelease.NewReader(target.Clientset, ns, helmrelease.DriverSecret)
		if err != nil {
			t.Fatal(err)
		}
		reader.WithMemory(target.Metadata, target.Releases)
		p, err := check.Predict(ctx, check.Sources{Cluster: target.Cluster, Releases: reader, Release: "web", Namespace: ns, NoObjectCounts: true,
			Chart: func(context.Context, bool) (*check.Chart, error) {
				return &check.Chart{Name: "web", Version: "9.0.0"}, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Current) != 1 {
			t.Fatalf("%d current CRDs, want 1", len(p.Current))
		}
		return p.Current
	}
	// Once the release's records are in memory, a prediction reuses the CRDs the one
	// before it parsed.
	testenv.Eventually(t, "the same stored revision's CRDs kept between predictions", func() (bool, error) {
		first, again := predictCurrent(), predictCurrent()
		return first[0].CRD == again[0].CRD, nil
	})

	if err := d.Update("sh.helm.release.v1.web.v1", rel(1, common.StatusSuperseded, "one.example.io")); err != nil {
		t.Fatal(err)
	}
	if err := d.Create("sh.helm.release.v1.web.v2", rel(2, common.StatusDeployed, "two.example.io")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "revision 2's CRDs read", func() (bool, error) {
		return predictCurrent()[0].CRD.Name == "gadgets.two.example.io", nil
	})
}

// TestWarmBeforeTheChart: Warm reads what a prediction for a release reads before its
// incoming chart is known (the deployed revision, its CRDs' objects), so the first
// prediction on a new target after it makes no API request, and still finds what the
// objects hold: here, a value the incoming schema prunes.
func TestWarmBeforeTheChart(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	const group, ns = "warm.memory.example.io", "memory-warm"
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	live := fieldsCRD(group, "a", "b")
	if err := testenv.ApplyCRD(ctx, cs, live); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.DeleteCRDs(context.Background(), func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group != group })
	})
	kc := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "gadgets"}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": "g", "namespace": ns}, "spec": map[string]any{"b": "kept only by the live schema"}}}
	if _, err := dynamic.NewForConfigOrDie(cp.Config).Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	typed := live.DeepCopy()
	typed.TypeMeta = metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"}
	manifest, err := yaml.Marshal(typed)
	if err != nil {
		t.Fatal(err)
	}
	if err := driver.NewSecrets(kc.CoreV1().Secrets(ns)).Create("sh.helm.release.v1.web.v1", &release.Release{Name: "web", Namespace: ns, Version: 1,
		Info: &release.Info{Status: common.StatusDeployed}, Manifest: "---\n# Source: web/templates/crd.yaml\n" + string(manifest),
		Chart: &chart.Chart{Metadata: &chart.Metadata{Name: "web", Version: "1.0.0"}}}); err != nil {
		t.Fatal(err)
	}

	// A page listed within crdSettle of the CRD's last write is not kept: each attempt
	// warms a new target, until one is past that window.
	testenv.Eventually(t, "the first prediction after Warm served from memory, with the pruned value found", func() (bool, error) {
		target, n := testenv.CountedTarget(t, cp.Config, livecluster.ClustersOptions{}, false)
		reader, err := helmrelease.NewReader(target.Clientset, ns, helmrelease.DriverSecret)
		if err != nil {
			return false, err
		}
		reader.WithMemory(target.Metadata, target.Releases)
		if err := check.Warm(ctx, target.Cluster, reader, "web"); err != nil {
			return false, err
		}
		src := check.Sources{Cluster: target.Cluster, Releases: reader, Release: "web", Namespace: ns, NoObjectCounts: true}
		before := n.Load()
		src.Chart = func(context.Context, bool) (*check.Chart, error) {
			return &check.Chart{Name: "web", Version: "2.0.0", CRDs: []chartcrds.CRD{{CRD: fieldsCRD(group, "a"), Source: predict.Templates}}}, nil
		}
		p, err := check.Predict(ctx, src)
		if err != nil {
			return false, err
		}
		if len(p.Report.CRDs) != 1 || p.Report.CRDs[0].Schema == nil || !slices.Contains(p.Report.CRDs[0].Schema.PrunedPaths(), "spec.b") {
			return false, fmt.Errorf("the prediction did not find spec.b pruned: %+v", p.Report.CRDs)
		}
		if got := n.Load() - before; got != 0 {
			return false, fmt.Errorf("%d API requests in the first prediction after Warm", got)
		}
		return true, nil
	})
}
