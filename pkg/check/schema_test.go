package check_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestSchemaDataLoss: helm-controller 0.37.4 -> 1.0.0 moves HelmRelease storage to v2,
// whose schema drops spec.chart.spec.valuesFile (no conversion webhook). The API server
// accepts the CRD, so storedVersions alone says ok; the prediction says data loss, with
// the path, the count and the action, the gate refuses it with the path, and the live
// CRD's annotation accepts the loss.
func TestSchemaDataLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	t.Cleanup(func() {
		if err := cp.DeleteAllCRDs(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("delete the CRDs: %v", err)
		}
	})
	if err := testenv.ApplyFixtureCRDs(ctx, cs, dir(t, "flux-helm-controller/v0.37.4")...); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	ri := dyn.Resource(schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2beta2", Resource: "helmreleases"}).Namespace("default")
	for i, vf := range []string{"values-prod.yaml", "", "values-dev.yaml"} {
		chart := map[string]any{"chart": "podinfo", "sourceRef": map[string]any{"kind": "HelmRepository", "name": "podinfo"}}
		if vf != "" {
			chart["valuesFile"] = vf
		}
		hr := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "helm.toolkit.fluxcd.io/v2beta2", "kind": "HelmRelease",
			"metadata": map[string]any{"name": fmt.Sprintf("hr%d", i)}, "spec": map[string]any{"interval": "5m", "chart": map[string]any{"spec": chart}}}}
		if _, err := ri.Create(ctx, hr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	next, err := testenv.ReadCRDs(dir(t, "flux-helm-controller/v1.0.0")...)
	if err != nil {
		t.Fatal(err)
	}
	incoming := []chartcrds.CRD{{CRD: next[0], Source: predict.Templates}}
	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	run := func(noSchema bool) check.CRDReport {
		t.Helper()
		rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: incoming, NoSchemaCheck: noSchema})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.CRDs) != 1 {
			t.Fatalf("want one CRD, got %+v", rep.CRDs)
		}
		if got := rep.Safe; got != (rep.CRDs[0].Verdict == predict.OK) {
			t.Fatalf("Safe=%v with verdict %s", got, rep.CRDs[0].Verdict)
		}
		return rep.CRDs[0]
	}

	if c := run(true); c.Verdict != predict.OK || c.Schema != nil {
		t.Fatalf("without the schema check the API server's answer is ok: got %s, schema %+v", c.Verdict, c.Schema)
	}
	c := run(false)
	if c.Verdict != predict.DataLoss {
		t.Fatalf("want %s, got %s: %s", predict.DataLoss, c.Verdict, c.Reason)
	}
	i := slices.IndexFunc(c.Schema.Pruned, func(p crdschema.PathCount) bool { return p.Path == "spec.chart.spec.valuesFile" })
	if i < 0 || c.Schema.Pruned[i].Objects != 2 || !slices.Equal(c.Schema.Pruned[i].Examples, []string{"default/hr0", "default/hr2"}) {
		t.Fatalf("want valuesFile dropped from default/hr0 and default/hr2, got %+v", c.Schema.Pruned)
	}
	for _, want := range []string{"spec.chart.spec.valuesFile", "2 objects"} {
		if !strings.Contains(c.Reason, want) {
			t.Errorf("reason %q lacks %q", c.Reason, want)
		}
	}
	if !strings.Contains(c.Action, predict.AllowFieldLossAnnotation) || !strings.Contains(c.Action, "spec.chart.spec.valuesFile") {
		t.Errorf("action %q should name the paths and the annotation that accepts the loss", c.Action)
	}
	if strings.Contains(c.Reason, "values-prod.yaml") || strings.Contains(c.Action, "values-prod.yaml") {
		t.Errorf("a field's value reached the report: %q / %q", c.Reason, c.Action)
	}

	// The gate refuses it with the path: no automatic step fixes data loss.
	d, err := gate.Decide(ctx, cp.Config, incoming, gate.Options{AutoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Outcome != gate.Blocked || d.Reason != gate.ReasonDataLoss || !strings.Contains(d.Message, "spec.chart.spec.valuesFile") {
		t.Fatalf("gate: want Blocked/%s naming the path, got %s/%s: %s", gate.ReasonDataLoss, d.Outcome, d.Reason, d.Message)
	}

	// The live CRD's annotation accepts the loss: reported, no longer blocking.
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, predict.AllowFieldLossAnnotation)
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, next[0].Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	c = run(false)
	if c.Verdict != predict.OK || c.Schema == nil || !c.Schema.DataLoss() || !strings.Contains(c.Reason, "accepts the loss") {
		t.Fatalf("accepted loss: want ok with the loss still reported, got %s (%s)", c.Verdict, c.Reason)
	}
}

// TestSchemaRollback: a rollback is judged the same way, the older schema against today's
// objects. kro 0.9.3 -> 0.2.0 keeps ResourceGraphDefinition at v1alpha1 (storedVersions
// says ok), but 0.2.0's schema lacks spec.schema.additionalPrinterColumns, which a
// 0.9.3 user may have set.
func TestSchemaRollback(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	t.Cleanup(func() {
		if err := cp.DeleteAllCRDs(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("delete the CRDs: %v", err)
		}
	})
	if err := testenv.ApplyFixtureCRDs(ctx, cs, dir(t, "kro/v0.9.3")...); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	ri := dyn.Resource(schema.GroupVersionResource{Group: "kro.run", Version: "v1alpha1", Resource: "resourcegraphdefinitions"})
	for i, cols := range []bool{true, false} {
		spec := map[string]any{"apiVersion": "v1alpha1", "kind": fmt.Sprintf("Web%d", i), "spec": map[string]any{"name": "string"}}
		if cols {
			spec["additionalPrinterColumns"] = []any{map[string]any{"name": "Name", "type": "string", "jsonPath": ".spec.name"}}
		}
		rgd := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kro.run/v1alpha1", "kind": "ResourceGraphDefinition",
			"metadata": map[string]any{"name": fmt.Sprintf("web%d", i)}, "spec": map[string]any{"schema": spec}}}
		if _, err := ri.Create(ctx, rgd, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	older, err := testenv.ReadCRDs(dir(t, "kro/v0.2.0")...)
	if err != nil {
		t.Fatal(err)
	}
	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Rollback,
		Incoming: []chartcrds.CRD{{CRD: older[0], Source: predict.Templates}}})
	if err != nil {
		t.Fatal(err)
	}
	c := rep.CRDs[0]
	if rep.Safe || c.Verdict != predict.DataLoss {
		t.Fatalf("want a data-loss rollback, got safe=%v %s: %s", rep.Safe, c.Verdict, c.Reason)
	}
	if got := c.Schema.PrunedPaths(); !slices.Contains(got, "spec.schema.additionalPrinterColumns") {
		t.Fatalf("pruned %v", got)
	}
	for _, p := range c.Schema.Pruned {
		if p.Path == "spec.schema.additionalPrinterColumns" && (p.Objects != 1 || p.Examples[0] != "web0") {
			t.Errorf("want web0 only, got %+v", p)
		}
	}
}

// TestSchemaWarningsAndConversion: a new enum that one stored object breaks is a warning
// (the verdict and Safe stand); a conversion webhook removed while objects are stored at
// two differently shaped versions is a migrate verdict, fixed by migrating first.
func TestSchemaWarningsAndConversion(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	t.Cleanup(func() {
		if err := cp.DeleteAllCRDs(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("delete the CRDs: %v", err)
		}
	})
	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	run := func(in *apiextv1.CustomResourceDefinition) (*check.Report, check.CRDReport) {
		t.Helper()
		rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: []chartcrds.CRD{{CRD: in, Source: predict.Templates}}})
		if err != nil {
			t.Fatal(err)
		}
		return rep, rep.CRDs[0]
	}
	str := apiextv1.JSONSchemaProps{Type: "string"}

	t.Run("validation warning", func(t *testing.T) {
		crd := testenv.TwoVersionCRD("warn.example.com", "modes", "Mode")
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Schema = specSchema(map[string]apiextv1.JSONSchemaProps{"mode": str})
		}
		if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
			t.Fatal(err)
		}
		ri := dyn.Resource(schema.GroupVersionResource{Group: "warn.example.com", Version: "v1", Resource: "modes"}).Namespace("default")
		for name, mode := range map[string]string{"bad": "reckless", "good": "safe"} {
			o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "warn.example.com/v1", "kind": "Mode",
				"metadata": map[string]any{"name": name}, "spec": map[string]any{"mode": mode}}}
			if _, err := ri.Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		next := crd.DeepCopy()
		enum := str
		enum.Enum = []apiextv1.JSON{{Raw: []byte(`"fast"`)}, {Raw: []byte(`"safe"`)}}
		for i := range next.Spec.Versions {
			next.Spec.Versions[i].Schema = specSchema(map[string]apiextv1.JSONSchemaProps{"mode": enum})
		}
		rep, c := run(next)
		if !rep.Safe || c.Verdict != predict.OK {
			t.Fatalf("a validation warning must not block: safe=%v %s (%s)", rep.Safe, c.Verdict, c.Reason)
		}
		// One warning per version the objects are served at (each has the new enum).
		if c.Schema == nil || len(c.Schema.Invalid) != 2 {
			t.Fatalf("want a warning at v1alpha1 and v1, got %+v", c.Schema)
		}
		for _, w := range c.Schema.Invalid {
			if w.Path != "spec.mode" || !slices.Equal(w.Examples, []string{"default/bad"}) || !strings.Contains(w.Message, `"fast", "safe"`) {
				t.Errorf("want spec.mode for default/bad with the enum's values, got %+v", w)
			}
		}
		if strings.Contains(c.Schema.Summary(), "reckless") {
			t.Errorf("the object's value reached the report: %s", c.Schema.Summary())
		}
	})

	t.Run("conversion webhook removed", func(t *testing.T) {
		crd := testenv.TwoVersionCRD("conv.example.com", "renames", "Rename")
		crd.Spec.Versions[0].Schema = specSchema(map[string]apiextv1.JSONSchemaProps{"oldName": str}) // v1alpha1, storage
		crd.Spec.Versions[1].Schema = specSchema(map[string]apiextv1.JSONSchemaProps{"name": str})    // v1
		if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
			t.Fatal(err)
		}
		withWebhook := crd.DeepCopy()
		withWebhook.Spec.Versions[0].Storage, withWebhook.Spec.Versions[1].Storage = false, true
		url := "https://127.0.0.1:1/convert"
		withWebhook.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.WebhookConverter,
			Webhook: &apiextv1.WebhookConversion{ClientConfig: &apiextv1.WebhookClientConfig{URL: &url}, ConversionReviewVersions: []string{"v1"}}}
		if err := testenv.ApplyCRD(ctx, cs, withWebhook); err != nil {
			t.Fatal(err)
		}
		none := withWebhook.DeepCopy()
		none.Spec.Conversion = nil
		_, c := run(none)
		if c.Verdict != predict.Migrate || !strings.Contains(c.Reason, "conversion webhook is removed") ||
			c.Action != "upgradeguard migrate --crd "+crd.Name {
			t.Fatalf("want migrate first, got %s (%s), action %q", c.Verdict, c.Reason, c.Action)
		}
	})
}

func specSchema(props map[string]apiextv1.JSONSchemaProps) *apiextv1.CustomResourceValidation {
	return &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object",
		Properties: map[string]apiextv1.JSONSchemaProps{"spec": {Type: "object", Properties: props}}}}
}

// TestRefusedByTheServer: whether the API server accepts an incoming CRD at all is its
// minor's rule. 1.37 and older estimate a type() comparison in a CEL rule at the maximum
// cost and refuse the CRD; 1.38 accepts it (kubernetes#141984). check asks the target
// server with a dry-run write: Refused (blocking, with the server's words and no
// migration offered) where it refuses, ok where it accepts, for a CRD that is live and
// one that is new. A caller the server does not let write CRDs gets the CRD's own
// validation evaluated here, by the rules of the minor this build links, and is told what
// was not asked: the webhooks, and the server's own validation where its minor differs.
func TestRefusedByTheServer(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	t.Cleanup(func() {
		if err := cp.DeleteAllCRDs(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("delete the CRDs: %v", err)
		}
	})
	str := apiextv1.JSONSchemaProps{Type: "string"}
	live := testenv.TwoVersionCRD("cost.example.com", "costs", "Cost")
	for i := range live.Spec.Versions {
		live.Spec.Versions[i].Schema = specSchema(map[string]apiextv1.JSONSchemaProps{"a": str})
	}
	if err := testenv.ApplyCRD(ctx, cs, live); err != nil {
		t.Fatal(err)
	}
	costly := func(crd *apiextv1.CustomResourceDefinition) *apiextv1.CustomResourceDefinition {
		c := crd.DeepCopy()
		for i := range c.Spec.Versions {
			spec := c.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"]
			spec.XValidations = apiextv1.ValidationRules{{Rule: "type(self) == type(self)", Message: "same type"}}
			c.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["spec"] = spec
		}
		return c
	}
	fresh := testenv.TwoVersionCRD("costnew.example.com", "costnews", "CostNew")
	for i := range fresh.Spec.Versions {
		fresh.Spec.Versions[i].Schema = specSchema(map[string]apiextv1.JSONSchemaProps{"a": str})
	}
	incoming := []chartcrds.CRD{{CRD: costly(live), Source: predict.Templates}, {CRD: costly(fresh), Source: predict.Templates}}
	refused := cp.Minor < 38

	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: incoming})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Safe == refused {
		t.Fatalf("Kubernetes 1.%d: Safe=%v, want %v", cp.Minor, rep.Safe, !refused)
	}
	for _, c := range rep.CRDs {
		if c.AdmissionError != "" {
			t.Errorf("%s: the server was not asked: %s", c.Name, c.AdmissionError)
		}
		if !refused {
			if c.Verdict != predict.OK || c.Refusal != nil {
				t.Errorf("Kubernetes 1.%d accepts %s: want ok, got %s (%s)", cp.Minor, c.Name, c.Verdict, c.Reason)
			}
			continue
		}
		if c.Verdict != predict.Refused || c.Refusal == nil || !strings.Contains(c.Reason, "cost") ||
			predict.FixFor(c.Decision) != predict.FixChart || !strings.Contains(c.Action, "no migration helps") {
			t.Errorf("Kubernetes 1.%d refuses %s: want refused for its cost with the chart fix, got %s (%s), action %q",
				cp.Minor, c.Name, c.Verdict, c.Reason, c.Action)
		}
	}
	// The dry runs wrote nothing: the live CRD has no rule, the new one does not exist.
	got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, live.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].XValidations) != 0 {
		t.Fatal("the dry run changed the live CRD")
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, fresh.Name, metav1.GetOptions{}); err == nil {
		t.Fatal("the dry run created the new CRD")
	}
	if refused {
		d, err := gate.Decide(ctx, cp.Config, incoming, gate.Options{AutoMigrate: true})
		if err != nil {
			t.Fatal(err)
		}
		if d.Outcome != gate.Blocked || d.Reason != gate.ReasonRefused || !strings.Contains(d.Message, gate.WhyRefused) || len(d.ToMigrate) != 0 {
			t.Fatalf("gate: want Blocked/%s and no migration, got %s/%s %v: %s", gate.ReasonRefused, d.Outcome, d.Reason, d.ToMigrate, d.Message)
		}
	}

	// A reader that may not write CRDs: the dry run is not asked, and the CRD's own
	// validation is evaluated here (crdschema.Validate), by the rules of the minor this
	// build links. Where that is the server's minor, its answer is the admin's dry run's,
	// word for word, and only the webhooks are not asked; elsewhere it says whose rules
	// it used, and that the server's own validation was not asked.
	admin := map[string]*crdschema.Refusal{}
	for _, c := range rep.CRDs {
		admin[c.Name] = c.Refusal
	}
	cp.Grant(t, "crd-viewer", rbacv1.PolicyRule{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}})
	viewer, err := cp.AddUser("crd-viewer")
	if err != nil {
		t.Fatal(err)
	}
	readOnly, err := livecluster.NewKubeCluster(viewer)
	if err != nil {
		t.Fatal(err)
	}
	rep, err = check.Run(ctx, readOnly, check.Request{Operation: predict.Upgrade, Incoming: incoming})
	if err != nil {
		t.Fatal(err)
	}
	same := cp.Minor == crdschema.LinkedMinor
	refusedHere := crdschema.LinkedMinor < 38 // the fixture's rule, by the linked minor's rules
	if rep.Safe == refusedHere {
		t.Fatalf("read-only on 1.%d, evaluated by 1.%d's rules: Safe=%v, want %v: %+v", cp.Minor, crdschema.LinkedMinor, rep.Safe, !refusedHere, rep.CRDs)
	}
	for _, c := range rep.CRDs {
		if !strings.Contains(c.AdmissionError, "forbidden") {
			t.Errorf("%s: want the forbidden dry run said, got %q", c.Name, c.AdmissionError)
		}
		if !refusedHere {
			if c.Verdict != predict.OK || c.Refusal != nil {
				t.Errorf("%s: 1.%d's rules accept it: want ok, got %s (%s)", c.Name, crdschema.LinkedMinor, c.Verdict, c.Reason)
			}
			continue
		}
		if c.Verdict != predict.Refused || c.Refusal == nil || c.Refusal.Local == nil || *c.Refusal.Local != crdschema.LocalRules(cp.Minor) ||
			!strings.Contains(c.Reason, "cost") || !strings.Contains(c.Reason, fmt.Sprintf("Kubernetes 1.%d's rules", crdschema.LinkedMinor)) {
			t.Fatalf("%s: want refused, evaluated here by 1.%d's rules for a 1.%d server, got %s (%s) %+v",
				c.Name, crdschema.LinkedMinor, cp.Minor, c.Verdict, c.Reason, c.Refusal)
		}
		if a := admin[c.Name]; same && (a == nil || !slices.Equal(c.Refusal.Causes, a.Causes)) {
			t.Errorf("%s: the server's own minor's rules, evaluated here, refuse it with %q; its dry run answered %+v", c.Name, c.Refusal.Causes, a)
		}
	}
	assertUnasked(t, rep, []string{live.Name, fresh.Name}, same)

	// A CRD whose own validation passes is not refused; the webhooks are still not asked.
	valid := func(crd *apiextv1.CustomResourceDefinition) *apiextv1.CustomResourceDefinition {
		c := crd.DeepCopy()
		for i := range c.Spec.Versions {
			c.Spec.Versions[i].Schema = specSchema(map[string]apiextv1.JSONSchemaProps{"a": str, "b": {Type: "integer"}})
		}
		return c
	}
	rep, err = check.Run(ctx, readOnly, check.Request{Operation: predict.Upgrade,
		Incoming: []chartcrds.CRD{{CRD: valid(live), Source: predict.Templates}, {CRD: valid(fresh), Source: predict.Templates}}})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Safe {
		t.Fatalf("read-only, a valid CRD: want safe, got %+v", rep.CRDs)
	}
	for _, c := range rep.CRDs {
		if c.Verdict != predict.OK || c.Refusal != nil {
			t.Errorf("%s: a valid CRD evaluated here: want ok, got %s (%s)", c.Name, c.Verdict, c.Reason)
		}
	}
	assertUnasked(t, rep, []string{live.Name, fresh.Name}, same)
}

// assertUnasked: the dry run (the webhooks) is not asked for crds, with the CRD's own
// validation evaluated here in its stead by the linked minor's rules; the server's own
// validation is not asked either unless those are its rules (same).
func assertUnasked(t *testing.T, rep *check.Report, crds []string, same bool) {
	t.Helper()
	byWhat := map[string]check.Unasked{}
	for _, u := range rep.Unasked {
		byWhat[u.What] = u
	}
	dry, ok := byWhat[check.UnaskedDryRun]
	if !ok || !sameNames(dry.CRDs, crds) || !strings.Contains(dry.Why, "forbidden") || dry.Local == nil || dry.Local.Minor != crdschema.LinkedMinor {
		t.Errorf("want the dry run (webhooks) not asked for %v, with the validation evaluated here: %+v", crds, rep.Unasked)
	}
	v, ok := byWhat[check.UnaskedValidation]
	if ok == same {
		t.Errorf("the server's own validation not asked: %v, want %v (server 1.%d, rules 1.%d): %+v", ok, !same, cp.Minor, crdschema.LinkedMinor, rep.Unasked)
	}
	if ok && (!sameNames(v.CRDs, crds) || v.Local == nil || v.Local.ServerMinor != cp.Minor ||
		!strings.Contains(v.Why, fmt.Sprintf("1.%d's rules", crdschema.LinkedMinor)) || !strings.Contains(v.Why, fmt.Sprintf("runs 1.%d", cp.Minor))) {
		t.Errorf("the validation not asked must name both minors: %+v", v)
	}
}

// sameNames says whether a and b hold the same names, in any order.
func sameNames(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
