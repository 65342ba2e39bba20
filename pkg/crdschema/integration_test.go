package crdschema_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

const group = "schema.example.com"

// ruleCase is one schema change, proven against the API server of every minor the matrix
// runs: objects are created under the before schema, the prediction is made for that
// server (its minor's words, and whether it accepts the after CRD at all), the after
// schema is applied, and what the server then serves and refuses is compared with the
// prediction.
type ruleCase struct {
	name          string
	before, after string // the spec schema, YAML
	// refusedBy says which minors refuse the after CRD itself (nil: none do).
	refusedBy  func(minor int) bool
	objects    map[string]string
	wantPruned []string
	// wantInvalid are the paths of predicted validation failures; touch is, per object
	// with one, a merge patch that changes the offending field and must be refused.
	wantInvalid []string
	touch       map[string]string
	// wantChecks are the Checks Compare reports for the change, statically; every
	// pruned field and refused value the server shows lies under one of them.
	wantChecks []string
}

func ruleCases() []ruleCase {
	return []ruleCase{{
		name:       "field removed",
		before:     `{type: object, properties: {keep: {type: string}, legacy: {type: object, properties: {a: {type: string}}}}}`,
		after:      `{type: object, properties: {keep: {type: string}}}`,
		objects:    map[string]string{"with": `{keep: x, legacy: {a: alpha}}`, "without": `{keep: x}`},
		wantPruned: []string{"spec.legacy"},
		wantChecks: []string{crdschema.CheckFieldRemoved},
	}, {
		name:       "field removed inside a list",
		before:     `{type: object, properties: {items: {type: array, items: {type: object, properties: {name: {type: string}, old: {type: integer}}}}}}`,
		after:      `{type: object, properties: {items: {type: array, items: {type: object, properties: {name: {type: string}}}}}}`,
		objects:    map[string]string{"list": `{items: [{name: a, old: 1}, {name: b, old: 2}]}`},
		wantPruned: []string{"spec.items[*].old"},
		wantChecks: []string{crdschema.CheckFieldRemoved},
	}, {
		name:       "preserve-unknown-fields removed",
		before:     `{type: object, x-kubernetes-preserve-unknown-fields: true, properties: {known: {type: string}}}`,
		after:      `{type: object, properties: {known: {type: string}}}`,
		objects:    map[string]string{"extra": `{known: k, free: {deep: 1}}`, "plain": `{known: k}`},
		wantPruned: []string{"spec.free"},
		wantChecks: []string{crdschema.CheckFieldRemoved},
	}, {
		name:   "embedded resource declared",
		before: `{type: object, properties: {template: {type: object, x-kubernetes-preserve-unknown-fields: true}}}`,
		after: `{type: object, properties: {template: {type: object, x-kubernetes-embedded-resource: true,
			properties: {spec: {type: object, properties: {replicas: {type: integer}}}}}}}`,
		objects: map[string]string{"tpl": `{template: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, labels: {a: b}},
			spec: {replicas: 2, extra: true}, data: {k: v}}}`},
		wantPruned: []string{"spec.template.data", "spec.template.spec.extra"},
		wantChecks: []string{crdschema.CheckFieldRemoved},
	}, {
		name:        "new required field",
		before:      `{type: object, properties: {mode: {type: string}, other: {type: string}}}`,
		after:       `{type: object, required: [mode], properties: {mode: {type: string}, other: {type: string}}}`,
		objects:     map[string]string{"nomode": `{other: a}`, "mode": `{mode: m, other: a}`},
		wantInvalid: []string{"spec.mode"},
		touch:       map[string]string{"nomode": `{"spec":{"other":"b"}}`},
		wantChecks:  []string{crdschema.CheckRequiredAdded},
	}, {
		name:        "enum",
		before:      `{type: object, properties: {mode: {type: string}}}`,
		after:       `{type: object, properties: {mode: {type: string, enum: [fast, safe]}}}`,
		objects:     map[string]string{"bad": `{mode: reckless}`, "good": `{mode: safe}`},
		wantInvalid: []string{"spec.mode"},
		touch:       map[string]string{"bad": `{"spec":{"mode":"careless"}}`},
		wantChecks:  []string{crdschema.CheckEnumNarrowed},
	}, {
		name:        "pattern and maxLength",
		before:      `{type: object, properties: {name: {type: string}}}`,
		after:       `{type: object, properties: {name: {type: string, pattern: "^[a-z]+$", maxLength: 5}}}`,
		objects:     map[string]string{"upper": `{name: Abc}`, "long": `{name: abcdefgh}`, "fine": `{name: abc}`},
		wantInvalid: []string{"spec.name"},
		touch:       map[string]string{"upper": `{"spec":{"name":"Abd"}}`, "long": `{"spec":{"name":"abcdefghi"}}`},
		wantChecks:  []string{crdschema.CheckBoundTightened, crdschema.CheckPatternChanged},
	}, {
		name:   "CEL rule",
		before: `{type: object, properties: {min: {type: integer}, max: {type: integer}}}`,
		after: `{type: object, x-kubernetes-validations: [{rule: "self.min <= self.max", message: "min must not exceed max"}],
			properties: {min: {type: integer}, max: {type: integer}}}`,
		objects:     map[string]string{"inverted": `{min: 5, max: 1}`, "ordered": `{min: 1, max: 5}`},
		wantInvalid: []string{"spec"},
		touch:       map[string]string{"inverted": `{"spec":{"max":2}}`},
		wantChecks:  []string{crdschema.CheckCELRuleAdded},
	}, {
		// 1.38 words these "Too few" (kubernetes#141641), 1.37 and older "Invalid value".
		name:        "minItems",
		before:      `{type: object, properties: {hosts: {type: array, items: {type: string}}}}`,
		after:       `{type: object, properties: {hosts: {type: array, minItems: 2, items: {type: string}}}}`,
		objects:     map[string]string{"one": `{hosts: [a]}`, "two": `{hosts: [a, b]}`},
		wantInvalid: []string{"spec.hosts"},
		touch:       map[string]string{"one": `{"spec":{"hosts":["c"]}}`},
		wantChecks:  []string{crdschema.CheckBoundTightened},
	}, {
		name:        "minProperties",
		before:      `{type: object, properties: {labels: {type: object, additionalProperties: {type: string}}}}`,
		after:       `{type: object, properties: {labels: {type: object, minProperties: 2, additionalProperties: {type: string}}}}`,
		objects:     map[string]string{"one": `{labels: {a: b}}`, "two": `{labels: {a: b, c: d}}`},
		wantInvalid: []string{"spec.labels"},
		touch:       map[string]string{"one": `{"spec":{"labels":{"a":"c"}}}`},
		wantChecks:  []string{crdschema.CheckBoundTightened},
	}, {
		// 1.38 loosened CEL cost estimation (kubernetes#141984): 1.37 and older estimate
		// type() comparisons at the maximum cost and refuse the CRD itself.
		name:   "CEL rule whose estimated cost only 1.38 accepts",
		before: `{type: object, properties: {a: {type: string}}}`,
		after: `{type: object, x-kubernetes-validations: [{rule: "type(self) == type(self)", message: "same type"}],
			properties: {a: {type: string}}}`,
		refusedBy:  func(minor int) bool { return minor < 38 },
		objects:    map[string]string{"plain": `{a: x}`},
		wantChecks: []string{crdschema.CheckCELRuleAdded},
	}, {
		name:        "int-or-string narrowed to integer",
		before:      `{type: object, properties: {port: {x-kubernetes-int-or-string: true}}}`,
		after:       `{type: object, properties: {port: {type: integer}}}`,
		objects:     map[string]string{"named": `{port: http}`, "number": `{port: 80}`},
		wantInvalid: []string{"spec.port"},
		touch:       map[string]string{"named": `{"spec":{"port":"https"}}`},
		wantChecks:  []string{crdschema.CheckTypeChanged},
	}, {
		name:    "unchanged schema",
		before:  `{type: object, properties: {a: {type: string}}}`,
		after:   `{type: object, properties: {a: {type: string}}}`,
		objects: map[string]string{"same": `{a: x}`},
	}}
}

func TestRulesAgainstTheAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	for i, tc := range ruleCases() {
		t.Run(tc.name, func(t *testing.T) {
			plural := fmt.Sprintf("rules%d", i)
			runRuleCase(t, plural, tc)
		})
	}
}

func runRuleCase(t *testing.T, plural string, tc ruleCase) {
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	before := synthetic(t, plural, tc.before, "")
	if err := testenv.ApplyCRD(ctx, cs, before); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: plural}
	ri := dyn.Resource(gvr).Namespace("default")
	for name, spec := range tc.objects {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1", "kind": kindOf(plural),
			"metadata": map[string]any{"name": name}, "spec": fromYAML(t, spec)}}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	served := readAll(t, ri)

	live, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, before.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sentinel := "after"
	if tc.before == tc.after {
		sentinel = "" // nothing changes: nothing is applied or waited for
	}
	after := synthetic(t, plural, tc.after, sentinel)
	j, err := crdschema.New(live, after)
	if err != nil {
		t.Fatal(err)
	}
	// Pages of two: paging is exercised.
	rep, err := j.Scan(ctx, crdschema.DynamicLister{Client: dyn}, crdschema.ScanOptions{PageSize: 2, ServerMinor: cp.Minor})
	if err != nil {
		t.Fatal(err)
	}
	compareWithScan(t, before, after, rep, tc.wantChecks)
	if tc.before == tc.after {
		if len(rep.Reads) != 0 || rep.Objects != 0 {
			t.Fatalf("an unchanged schema must not be read: %+v", rep)
		}
		return
	}
	if diff := cmp.Diff(tc.wantPruned, rep.PrunedPaths(), emptyIsNil()); diff != "" {
		t.Errorf("predicted pruned paths (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(tc.wantInvalid, invalidPaths(rep), emptyIsNil()); diff != "" {
		t.Errorf("predicted invalid paths (-want +got):\n%s", diff)
	}
	if !strings.Contains(rep.Summary(), "objects") && (rep.DataLoss() || rep.Warns()) {
		t.Errorf("summary names no counts: %q", rep.Summary())
	}

	// Whether the server accepts the after CRD at all is its minor's rule: Admit asks it,
	// and the write must then do what Admit said.
	refusal, err := crdschema.Admit(ctx, cs.ApiextensionsV1().CustomResourceDefinitions(), live, after)
	if err != nil {
		t.Fatal(err)
	}
	if want := tc.refusedBy != nil && tc.refusedBy(cp.Minor); (refusal != nil) != want {
		t.Errorf("Kubernetes 1.%d: refusal %v, want refused=%v", cp.Minor, refusal, want)
	}
	// The same question evaluated here (Validate: what an identity that may not make the
	// dry run is told), by the rules of the minor this build links: the server's answer,
	// word for word, where that is the server's minor, and that minor's answer elsewhere.
	local, err := crdschema.Validate(ctx, live, after, cp.Minor)
	if err != nil {
		t.Fatal(err)
	}
	if want := tc.refusedBy != nil && tc.refusedBy(crdschema.LinkedMinor); (local != nil) != want {
		t.Errorf("evaluated here by 1.%d's rules: refusal %v, want refused=%v", crdschema.LinkedMinor, local, want)
	}
	if local != nil && (local.Local == nil || *local.Local != crdschema.LocalRules(cp.Minor) ||
		local.Local.Stands() != (cp.Minor == crdschema.LinkedMinor) || local.Admission) {
		t.Errorf("a refusal evaluated here must say by which minor's rules, for 1.%d: %+v", cp.Minor, local)
	}
	if cp.Minor == crdschema.LinkedMinor && refusal != nil && local != nil {
		if diff := cmp.Diff(refusal.Causes, local.Causes); diff != "" {
			t.Errorf("evaluated here, the server's own minor's causes differ from its dry run's (-server +here):\n%s", diff)
		}
	}
	err = testenv.ApplyCRD(ctx, cs, after)
	if refusal != nil {
		if err == nil {
			t.Fatalf("Admit predicted a refusal (%s), but the API server accepted the CRD", refusal.Message())
		}
		for _, c := range refusal.Causes {
			if !strings.Contains(err.Error(), c) {
				t.Errorf("the API server's refusal %q does not contain the predicted %q", err, c)
			}
		}
		return
	}
	// Apply the new schema and wait until the API server serves it (the sentinel default).
	if err != nil {
		t.Fatalf("the API server refused the new schema, which Admit said it accepts: %v", err)
	}
	waitSentinel(t, ri, "after", "")

	// Pruning: what the server stopped serving is exactly what was predicted, per object.
	gotPruned := map[string][]string{}
	for name, now := range readAll(t, ri) {
		if p := missing("", served[name].Object, now.Object); len(p) > 0 {
			gotPruned[name] = p
		}
	}
	wantPruned := map[string][]string{}
	for _, p := range rep.Pruned {
		for _, ex := range p.Examples {
			wantPruned[strings.TrimPrefix(ex, "default/")] = append(wantPruned[strings.TrimPrefix(ex, "default/")], p.Path)
		}
	}
	if diff := cmp.Diff(wantPruned, gotPruned, emptyIsNil()); diff != "" {
		t.Errorf("pruned by the API server, per object (-predicted +served):\n%s", diff)
	}

	// Validation: every predicted failure is ratcheted for an unchanged object, and refused
	// with the predicted message once the update touches the field.
	for _, rc := range rep.Invalid {
		for _, ex := range rc.Examples {
			name := strings.TrimPrefix(ex, "default/")
			if _, err := ri.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"no"}}}`), metav1.PatchOptions{}); err != nil {
				t.Errorf("%s: an update that leaves the invalid field alone must be ratcheted, got %v", name, err)
			}
			patch, ok := tc.touch[name]
			if !ok {
				t.Fatalf("case has no touching patch for %s", name)
			}
			_, err := ri.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			if err == nil {
				t.Errorf("%s: an update touching %s was admitted; the prediction said it would be refused", name, rc.Path)
				continue
			}
			for _, part := range []string{rc.Path, rc.Type, detailOf(rc)} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("%s: the API server's refusal %q does not contain the predicted %q", name, err, part)
				}
			}
		}
	}
	// What the update ratchets, a create does not: a client sending an object that base
	// accepted is refused (as Compare's messages say).
	for name := range tc.touch {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1", "kind": kindOf(plural),
			"metadata": map[string]any{"name": name + "-again"}, "spec": fromYAML(t, tc.objects[name])}}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err == nil {
			t.Errorf("%s: a create of the spec the old schema accepted was admitted under the new one", name)
		}
	}
	for name := range tc.objects {
		if slices.ContainsFunc(rep.Invalid, func(rc crdschema.RuleCount) bool { return slices.Contains(rc.Examples, "default/"+name) }) {
			continue
		}
		if patch, ok := tc.touch[name]; ok {
			t.Fatalf("case touches %s, which the prediction says is valid (patch %s)", name, patch)
		}
	}
}

// TestPrunedFieldLeavesEtcdAtTheNextWrite proves the data-loss claim: after the new schema
// is applied, a pruned field is only hidden (restoring the old schema shows it again)
// until the object is written, and then it is gone for good.
func TestPrunedFieldLeavesEtcdAtTheNextWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	const plural = "etcdproofs"
	old := `{type: object, properties: {keep: {type: string}, legacy: {type: string}}}`
	if err := testenv.ApplyCRD(ctx, cs, synthetic(t, plural, old, "")); err != nil {
		t.Fatal(err)
	}
	ri := dyn.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: plural}).Namespace("default")
	for _, name := range []string{"written", "untouched"} {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1", "kind": kindOf(plural),
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"keep": "k", "legacy": "l"}}}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	live, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, plural+"."+group, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	narrow := synthetic(t, plural, `{type: object, properties: {keep: {type: string}}}`, "narrow")
	rep, err := crdschema.Check(ctx, crdschema.DynamicLister{Client: dyn}, live, narrow)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.DataLoss() || len(rep.Pruned) != 1 || rep.Pruned[0].Path != "spec.legacy" || rep.Pruned[0].Objects != 2 {
		t.Fatalf("want spec.legacy pruned from 2 objects, got %+v", rep.Pruned)
	}
	if err := testenv.ApplyCRD(ctx, cs, narrow); err != nil {
		t.Fatal(err)
	}
	waitSentinel(t, ri, "narrow", "")
	// The next write: an empty merge patch, as a storage migration or a status update.
	if _, err := ri.Patch(ctx, "written", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApplyCRD(ctx, cs, synthetic(t, plural, old, "restored")); err != nil {
		t.Fatal(err)
	}
	waitSentinel(t, ri, "restored", "untouched") // "written" stored the narrow default
	got := readAll(t, ri)
	if _, ok, _ := unstructured.NestedString(got["untouched"].Object, "spec", "legacy"); !ok {
		t.Error("untouched: spec.legacy should be back with the old schema (it was only hidden)")
	}
	if _, ok, _ := unstructured.NestedString(got["written"].Object, "spec", "legacy"); ok {
		t.Error("written: spec.legacy survived a write under the narrow schema")
	}
}

// TestRealUpgrades judges real upstream transitions: kro 0.2.0 -> 0.9.3 drops two fields
// of ResourceGraphDefinition in place (v1alpha1 both times), and helm-controller 0.37.4 ->
// 1.0.0 moves storage from v2beta2 to v2, whose schema no longer has
// spec.chart.spec.valuesFile, with no conversion webhook.
func TestRealUpgrades(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	dyn := dynamic.NewForConfigOrDie(cp.Config)

	t.Run("kro", func(t *testing.T) {
		from, to := fixtureCRD(t, "kro/v0.2.0", "resourcegraphdefinitions.kro.run"), fixtureCRD(t, "kro/v0.9.3", "resourcegraphdefinitions.kro.run")
		if err := testenv.ApplyCRD(ctx, cs, from); err != nil {
			t.Fatal(err)
		}
		ri := dyn.Resource(schema.GroupVersionResource{Group: "kro.run", Version: "v1alpha1", Resource: "resourcegraphdefinitions"})
		rgd := fromYAML(t, `{apiVersion: kro.run/v1alpha1, kind: ResourceGraphDefinition, metadata: {name: web},
			spec: {defaultServiceAccounts: {default: deployer}, schema: {apiVersion: v1alpha1, kind: Web, spec: {name: string},
			validation: ["self.spec.name != ''"]}, resources: []}}`)
		if _, err := ri.Create(ctx, &unstructured.Unstructured{Object: rgd}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		live := liveCRD(t, cs, from.Name)
		rep, err := crdschema.Check(ctx, crdschema.DynamicLister{Client: dyn}, live, to)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"spec.defaultServiceAccounts", "spec.schema.validation"}
		if diff := cmp.Diff(want, rep.PrunedPaths()); diff != "" {
			t.Fatalf("pruned (-want +got):\n%s", diff)
		}
		if err := testenv.ApplyCRD(ctx, cs, to); err != nil {
			t.Fatal(err)
		}
		err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := ri.Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			_, ok, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "defaultServiceAccounts")
			_, ok2, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "schema", "validation")
			return !ok && !ok2, nil
		})
		if err != nil {
			t.Fatalf("the API server still serves the fields predicted pruned: %v", err)
		}
	})

	t.Run("helm-controller", func(t *testing.T) {
		const name = "helmreleases.helm.toolkit.fluxcd.io"
		from, to := fixtureCRD(t, "flux-helm-controller/v0.37.4", name), fixtureCRD(t, "flux-helm-controller/v1.0.0", name)
		if err := testenv.ApplyCRD(ctx, cs, from); err != nil {
			t.Fatal(err)
		}
		at := func(v string) dynamic.ResourceInterface {
			return dyn.Resource(schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: v, Resource: "helmreleases"}).Namespace("default")
		}
		for i, vf := range []string{"values-prod.yaml", "", "values-dev.yaml"} {
			spec := map[string]any{"interval": "5m", "chart": map[string]any{"spec": map[string]any{"chart": "podinfo",
				"sourceRef": map[string]any{"kind": "HelmRepository", "name": "podinfo"}}}}
			if vf != "" {
				spec["chart"].(map[string]any)["spec"].(map[string]any)["valuesFile"] = vf
			}
			hr := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "helm.toolkit.fluxcd.io/v2beta2", "kind": "HelmRelease",
				"metadata": map[string]any{"name": fmt.Sprintf("hr%d", i)}, "spec": spec}}
			if _, err := at("v2beta2").Create(ctx, hr, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		rep, err := crdschema.Check(ctx, crdschema.DynamicLister{Client: dyn}, liveCRD(t, cs, name), to)
		if err != nil {
			t.Fatal(err)
		}
		var vf *crdschema.PathCount
		for i := range rep.Pruned {
			if rep.Pruned[i].Path == "spec.chart.spec.valuesFile" {
				vf = &rep.Pruned[i]
			}
		}
		if vf == nil || vf.Objects != 2 || vf.Version != "v2" {
			t.Fatalf("want spec.chart.spec.valuesFile pruned at v2 from 2 objects, got %+v", rep.Pruned)
		}
		// The values can be saved first: one file per object that loses something.
		j, err := crdschema.New(liveCRD(t, cs, name), to)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), "backup")
		b, err := j.Backup(ctx, crdschema.DynamicLister{Client: dyn}, dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Objects) != 2 || b.Objects[0].Object != "default/hr0" || b.Objects[1].Object != "default/hr2" {
			t.Fatalf("backup entries %+v, want default/hr0 and default/hr2", b.Objects)
		}
		saved, err := os.ReadFile(filepath.Join(dir, b.Objects[0].File))
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(saved, &doc); err != nil {
			t.Fatal(err)
		}
		if v, _, _ := unstructured.NestedString(doc, "spec", "chart", "spec", "valuesFile"); v != "values-prod.yaml" {
			t.Errorf("backup of hr0 holds valuesFile %q:\n%s", v, saved)
		}
		var index crdschema.BackupResult
		if err := backup.Read(dir, backup.KindFieldLoss, &index); err != nil || len(index.Objects) != 2 || index.CRD != b.CRD {
			t.Errorf("the index reads back as %+v, %v", index, err)
		}
		for _, f := range []string{dir, filepath.Join(dir, b.Objects[0].File), filepath.Join(dir, backup.IndexFile)} {
			if st, err := os.Stat(f); err != nil || st.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s is readable by others (%v, %v): field values must stay private", f, st.Mode(), err)
			}
		}
		if _, found, _ := unstructured.NestedFieldNoCopy(doc, "spec", "interval"); found {
			t.Errorf("backup holds fields that are not lost:\n%s", saved)
		}
		if _, err := j.Backup(ctx, crdschema.DynamicLister{Client: dyn}, dir); !errors.As(err, new(*backup.ExistsError)) {
			t.Errorf("a second backup into the same directory must be refused, got %v", err)
		}
		if err := testenv.ApplyCRD(ctx, cs, to); err != nil {
			t.Fatal(err)
		}
		// v2beta2 is still served with its own schema: the field is still in etcd...
		got, err := at("v2beta2").Get(ctx, "hr0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, _, _ := unstructured.NestedString(got.Object, "spec", "chart", "spec", "valuesFile"); v != "values-prod.yaml" {
			t.Fatalf("before any write the field should still be stored, got %q", v)
		}
		// ...until the object is written at the new storage version, as a migration does.
		err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			if _, err := at("v2beta2").Patch(ctx, "hr0", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}); err != nil {
				return false, err
			}
			got, err := at("v2beta2").Get(ctx, "hr0", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			_, ok, _ := unstructured.NestedString(got.Object, "spec", "chart", "spec", "valuesFile")
			return !ok, nil
		})
		if err != nil {
			t.Fatalf("spec.chart.spec.valuesFile survived a write at storage v2: %v", err)
		}
	})
}

// TestConversionWebhookRemoved: objects stored at v1alpha1 (field oldName) and v1 (field
// name) under a conversion webhook; a CRD update to conversion None is predicted as data
// loss, and the API server then serves the v1alpha1 object as v1 without its name.
func TestConversionWebhookRemoved(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	const plural = "renames"
	crd := twoVersions(t, plural, "v1alpha1")
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	old := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1alpha1", "kind": kindOf(plural),
		"metadata": map[string]any{"name": "old"}, "spec": map[string]any{"oldName": "kept"}}}
	alpha := dyn.Resource(schema.GroupVersionResource{Group: group, Version: "v1alpha1", Resource: plural}).Namespace("default")
	if _, err := alpha.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Storage moves to v1 behind a conversion webhook (never called here: nothing reads
	// across versions until the webhook is gone).
	withWebhook := twoVersions(t, plural, "v1")
	url := "https://127.0.0.1:1/convert"
	withWebhook.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.WebhookConverter,
		Webhook: &apiextv1.WebhookConversion{ClientConfig: &apiextv1.WebhookClientConfig{URL: &url}, ConversionReviewVersions: []string{"v1"}}}
	if err := testenv.ApplyCRD(ctx, cs, withWebhook); err != nil {
		t.Fatal(err)
	}
	live := liveCRD(t, cs, crd.Name)
	if !slices.Equal(live.Status.StoredVersions, []string{"v1alpha1", "v1"}) {
		t.Fatalf("storedVersions %v", live.Status.StoredVersions)
	}
	none := twoVersions(t, plural, "v1")
	j, err := crdschema.New(live, none)
	if err != nil {
		t.Fatal(err)
	}
	cr := j.ConversionRemoved()
	if cr == nil || !slices.Equal(cr.DifferentSchemas, []string{"v1alpha1"}) {
		t.Fatalf("want the conversion removal over v1alpha1, got %+v", cr)
	}
	// Compare says the same from the two CRDs alone (the served versions standing in for
	// storedVersions), and the server then serves the object unconverted.
	if got := crdschema.Compare(withWebhook, none); len(got) != 1 || got[0].Check != crdschema.CheckConversionRemoved {
		t.Fatalf("Compare: want one %s, got %v", crdschema.CheckConversionRemoved, got)
	}
	if err := testenv.ApplyCRD(ctx, cs, none); err != nil {
		t.Fatal(err)
	}
	v1 := dyn.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: plural}).Namespace("default")
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := v1.Get(ctx, "old", metav1.GetOptions{})
		if err != nil {
			return false, nil // the webhook may still be called until the API server switches
		}
		spec, _, _ := unstructured.NestedMap(got.Object, "spec")
		return len(spec) == 0, nil
	})
	if err != nil {
		t.Fatalf("the v1alpha1 object was not served as v1 without its data: %v", err)
	}
}

// synthetic is a one-version (v1) namespaced CRD with spec's schema; a non-empty sentinel
// adds spec.sentinel defaulting to it, which shows when the API server serves the schema.
func synthetic(t *testing.T, plural, spec, sentinel string) *apiextv1.CustomResourceDefinition {
	t.Helper()
	var s apiextv1.JSONSchemaProps
	if err := yaml.Unmarshal([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	if sentinel != "" {
		if s.Properties == nil {
			s.Properties = map[string]apiextv1.JSONSchemaProps{}
		}
		s.Properties["sentinel"] = apiextv1.JSONSchemaProps{Type: "string", Default: &apiextv1.JSON{Raw: []byte(`"` + sentinel + `"`)}}
	}
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: group, Scope: apiextv1.NamespaceScoped,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: plural, Kind: kindOf(plural), ListKind: kindOf(plural) + "List"},
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object",
					Properties: map[string]apiextv1.JSONSchemaProps{"spec": s}}}}},
		},
	}
}

// twoVersions: v1alpha1 has spec.oldName, v1 has spec.name; storage as given.
func twoVersions(t *testing.T, plural, storage string) *apiextv1.CustomResourceDefinition {
	crd := synthetic(t, plural, `{type: object, properties: {name: {type: string}}}`, "")
	alpha := synthetic(t, plural, `{type: object, properties: {oldName: {type: string}}}`, "").Spec.Versions[0]
	alpha.Name = "v1alpha1"
	crd.Spec.Versions = append([]apiextv1.CustomResourceDefinitionVersion{alpha}, crd.Spec.Versions...)
	for i := range crd.Spec.Versions {
		crd.Spec.Versions[i].Storage = crd.Spec.Versions[i].Name == storage
	}
	return crd
}

func kindOf(plural string) string { return strings.ToUpper(plural[:1]) + plural[1:] }

func fromYAML(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func readAll(t *testing.T, ri dynamic.ResourceInterface) map[string]*unstructured.Unstructured {
	t.Helper()
	list, err := ri.List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*unstructured.Unstructured{}
	for i := range list.Items {
		out[list.Items[i].GetName()] = &list.Items[i]
	}
	return out
}

// waitSentinel waits until every object (or only the one named) is served with
// spec.sentinel = want: the API server then serves the CRD's new schema.
func waitSentinel(t *testing.T, ri dynamic.ResourceInterface, want, only string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := ri.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, it := range list.Items {
			if only != "" && it.GetName() != only {
				continue
			}
			if s, _, _ := unstructured.NestedString(it.Object, "spec", "sentinel"); s != want {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the API server did not start serving the %s schema: %v", want, err)
	}
}

var listIndex = regexp.MustCompile(`\[\d+\]`)

// missing lists the top-most paths of before that after lacks, list indices folded, the
// sentinel and metadata ignored.
func missing(prefix string, before, after any) []string {
	var out []string
	switch b := before.(type) {
	case map[string]any:
		a, _ := after.(map[string]any)
		for k, v := range b {
			if prefix == "" && (k == "metadata" || k == "apiVersion" || k == "kind") || k == "sentinel" {
				continue
			}
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			av, ok := a[k]
			if !ok {
				out = append(out, p)
				continue
			}
			out = append(out, missing(p, v, av)...)
		}
	case []any:
		a, _ := after.([]any)
		for i, v := range b {
			if i < len(a) {
				out = append(out, missing(fmt.Sprintf("%s[%d]", prefix, i), v, a[i])...)
			}
		}
	}
	for i := range out {
		out[i] = listIndex.ReplaceAllString(out[i], "[*]")
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func invalidPaths(rep *crdschema.Report) []string {
	var out []string
	for _, r := range rep.Invalid {
		out = append(out, r.Path)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func detailOf(rc crdschema.RuleCount) string {
	return strings.TrimPrefix(strings.TrimPrefix(rc.Message, rc.Type), ": ")
}

func emptyIsNil() cmp.Option {
	return cmp.FilterValues(func(a, b any) bool {
		return isEmpty(a) && isEmpty(b)
	}, cmp.Comparer(func(a, b any) bool { return true }))
}

func isEmpty(v any) bool {
	switch x := v.(type) {
	case []string:
		return len(x) == 0
	case map[string][]string:
		return len(x) == 0
	}
	return false
}

func fixtureCRD(t *testing.T, set, name string) *apiextv1.CustomResourceDefinition {
	t.Helper()
	files, err := testenv.FixtureSet(set)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := testenv.ReadCRDs(files...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("%s has no CRD %s", set, name)
	return nil
}

func liveCRD(t *testing.T, cs apiextclient.Interface, name string) *apiextv1.CustomResourceDefinition {
	t.Helper()
	c, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// compareWithScan: Compare's static verdict on the change is wantChecks, and what the live
// judgement found on the real objects (every pruned field, every failure the server
// confirms below) lies under one of its Changes (Report.Holders).
func compareWithScan(t *testing.T, before, after *apiextv1.CustomResourceDefinition, rep *crdschema.Report, wantChecks []string) {
	t.Helper()
	changes := crdschema.Compare(before, after)
	var checks []string
	heldPruned, heldInvalid := map[string]bool{}, map[string]bool{}
	for _, c := range changes {
		checks = append(checks, c.Check)
		pruned, invalid := rep.Holders(c)
		for _, p := range pruned {
			heldPruned[p.Path] = true
		}
		for _, i := range invalid {
			heldInvalid[i.Path] = true
		}
	}
	if diff := cmp.Diff(wantChecks, checks, emptyIsNil()); diff != "" {
		t.Errorf("Compare's checks (-want +got):\n%s\n%v", diff, changes)
	}
	for _, p := range rep.Pruned {
		if !heldPruned[p.Path] {
			t.Errorf("the live judgement prunes %s, which no Change of Compare reaches: %v", p.Path, changes)
		}
	}
	for _, i := range rep.Invalid {
		if !heldInvalid[i.Path] {
			t.Errorf("the live judgement refuses %s (%s), which no Change of Compare reaches: %v", i.Path, i.Message, changes)
		}
	}
}
