package crdschema_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
)

// change is a Change without its sentence: what the tables pin.
type change struct{ check, severity, version, path string }

func (c change) String() string {
	return fmt.Sprintf("%s %s %s %s", c.check, c.severity, c.version, c.path)
}

func changesOf(t *testing.T, cs []crdschema.Change) []change {
	t.Helper()
	out := []change{}
	for _, c := range cs {
		if c.Message == "" || strings.Contains(c.Message, "\n") {
			t.Errorf("%s %s: the message must be one sentence, got %q", c.Check, c.Path, c.Message)
		}
		out = append(out, change{c.Check, string(c.Severity), c.Version, c.Path})
	}
	return out
}

const (
	breaking = string(crdschema.Breaking)
	risky    = string(crdschema.Risky)
	info     = string(crdschema.Info)
)

// TestCompareSchemaRules: each rule of one version's schema, once where it applies and
// once where the change is additive or cosmetic and nothing is reported.
func TestCompareSchemaRules(t *testing.T) {
	for _, tc := range []struct {
		name        string
		base, head  string // spec's schema, YAML
		want        []change
		wantMessage string // a part of the first Change's message
	}{{
		name: "field removed",
		base: `{type: object, properties: {keep: {type: string}, legacy: {type: object, properties: {a: {type: string}}}}}`,
		head: `{type: object, properties: {keep: {type: string}}}`,
		want: []change{{"field-removed", breaking, "v1", ".spec.legacy"}}, wantMessage: "prunes",
	}, {
		name: "field added (optional) is additive",
		base: `{type: object, properties: {keep: {type: string}}}`,
		head: `{type: object, properties: {keep: {type: string}, extra: {type: string}}}`,
	}, {
		name: "field removed inside a list",
		base: `{type: object, properties: {items: {type: array, items: {type: object, properties: {name: {type: string}, old: {type: integer}}}}}}`,
		head: `{type: object, properties: {items: {type: array, items: {type: object, properties: {name: {type: string}}}}}}`,
		want: []change{{"field-removed", breaking, "v1", ".spec.items[*].old"}},
	}, {
		name: "field removed from a map's values",
		base: `{type: object, properties: {m: {type: object, additionalProperties: {type: object, properties: {a: {type: string}, b: {type: string}}}}}}`,
		head: `{type: object, properties: {m: {type: object, additionalProperties: {type: object, properties: {a: {type: string}}}}}}`,
		want: []change{{"field-removed", breaking, "v1", ".spec.m.*.b"}},
	}, {
		name: "a map's entries no longer declared",
		base: `{type: object, properties: {m: {type: object, additionalProperties: {type: string}}}}`,
		head: `{type: object, properties: {m: {type: object}}}`,
		want: []change{{"field-removed", breaking, "v1", ".spec.m.*"}},
	}, {
		name: "preserve-unknown-fields removed",
		base: `{type: object, x-kubernetes-preserve-unknown-fields: true, properties: {known: {type: string}}}`,
		head: `{type: object, properties: {known: {type: string}}}`,
		want: []change{{"field-removed", breaking, "v1", ".spec"}}, wantMessage: "unknown fields",
	}, {
		name: "field removed where unknown fields are preserved: nothing is pruned",
		base: `{type: object, x-kubernetes-preserve-unknown-fields: true, properties: {known: {type: string}, gone: {type: string}}}`,
		head: `{type: object, x-kubernetes-preserve-unknown-fields: true, properties: {known: {type: string}}}`,
	}, {
		name: "type changed",
		base: `{type: object, properties: {port: {type: string}}}`,
		head: `{type: object, properties: {port: {type: integer}}}`,
		want: []change{{"type-changed", breaking, "v1", ".spec.port"}}, wantMessage: "from string to integer",
	}, {
		name: "type changed: nothing below is compared",
		base: `{type: object, properties: {o: {type: object, properties: {a: {type: string}}}}}`,
		head: `{type: object, properties: {o: {type: array, items: {type: string}}}}`,
		want: []change{{"type-changed", breaking, "v1", ".spec.o"}},
	}, {
		name: "int-or-string narrowed to integer",
		base: `{type: object, properties: {port: {x-kubernetes-int-or-string: true}}}`,
		head: `{type: object, properties: {port: {type: integer}}}`,
		want: []change{{"type-changed", breaking, "v1", ".spec.port"}}, wantMessage: "from int-or-string to integer",
	}, {
		name: "integer widened to number, and string to int-or-string",
		base: `{type: object, properties: {num: {type: integer}, port: {type: string}}}`,
		head: `{type: object, properties: {num: {type: number}, port: {x-kubernetes-int-or-string: true}}}`,
	}, {
		name: "required added",
		base: `{type: object, properties: {mode: {type: string}}}`,
		head: `{type: object, required: [mode], properties: {mode: {type: string}}}`,
		want: []change{{"required-added", breaking, "v1", ".spec.mode"}},
	}, {
		name: "required added with a default: the server fills it in",
		base: `{type: object, properties: {mode: {type: string}}}`,
		head: `{type: object, required: [mode], properties: {mode: {type: string, default: fast}}}`,
	}, {
		name: "required dropped",
		base: `{type: object, required: [mode], properties: {mode: {type: string}}}`,
		head: `{type: object, properties: {mode: {type: string}}}`,
	}, {
		name: "enum value removed",
		base: `{type: object, properties: {mode: {type: string, enum: [fast, safe, old]}}}`,
		head: `{type: object, properties: {mode: {type: string, enum: [fast, safe]}}}`,
		want: []change{{"enum-narrowed", breaking, "v1", ".spec.mode"}}, wantMessage: `"old"`,
	}, {
		name: "enum added to a free field",
		base: `{type: object, properties: {mode: {type: string}}}`,
		head: `{type: object, properties: {mode: {type: string, enum: [fast, safe]}}}`,
		want: []change{{"enum-narrowed", risky, "v1", ".spec.mode"}},
	}, {
		name: "enum widened",
		base: `{type: object, properties: {mode: {type: string, enum: [fast]}}}`,
		head: `{type: object, properties: {mode: {type: string, enum: [safe, fast]}}}`,
	}, {
		name: "every bound tightened",
		base: `{type: object, properties: {
			num: {type: integer, minimum: 1, maximum: 10},
			s: {type: string, minLength: 1, maxLength: 10},
			l: {type: array, minItems: 1, maxItems: 10, items: {type: string}},
			mp: {type: object, minProperties: 1, maxProperties: 10, additionalProperties: {type: string}}}}`,
		head: `{type: object, properties: {
			num: {type: integer, minimum: 2, maximum: 9},
			s: {type: string, minLength: 2, maxLength: 9},
			l: {type: array, minItems: 2, maxItems: 9, items: {type: string}},
			mp: {type: object, minProperties: 2, maxProperties: 9, additionalProperties: {type: string}}}}`,
		want: []change{
			{"bound-tightened", risky, "v1", ".spec.l"}, {"bound-tightened", risky, "v1", ".spec.l"},
			{"bound-tightened", risky, "v1", ".spec.mp"}, {"bound-tightened", risky, "v1", ".spec.mp"},
			{"bound-tightened", risky, "v1", ".spec.num"}, {"bound-tightened", risky, "v1", ".spec.num"},
			{"bound-tightened", risky, "v1", ".spec.s"}, {"bound-tightened", risky, "v1", ".spec.s"},
		},
	}, {
		name: "bounds added",
		base: `{type: object, properties: {num: {type: integer}, s: {type: string}, l: {type: array, items: {type: string}}}}`,
		head: `{type: object, properties: {num: {type: integer, maximum: 5}, s: {type: string, minLength: 3}, l: {type: array, maxItems: 4, items: {type: string}}}}`,
		want: []change{
			{"bound-tightened", risky, "v1", ".spec.l"}, {"bound-tightened", risky, "v1", ".spec.num"}, {"bound-tightened", risky, "v1", ".spec.s"},
		},
		wantMessage: "gains maxItems 4",
	}, {
		name: "maximum made exclusive",
		base: `{type: object, properties: {num: {type: integer, maximum: 5}}}`,
		head: `{type: object, properties: {num: {type: integer, maximum: 5, exclusiveMaximum: true}}}`,
		want: []change{{"bound-tightened", risky, "v1", ".spec.num"}}, wantMessage: "from 5 to 5 (exclusive)",
	}, {
		name: "minimum made exclusive",
		base: `{type: object, properties: {num: {type: integer, minimum: 5}}}`,
		head: `{type: object, properties: {num: {type: integer, minimum: 5, exclusiveMinimum: true}}}`,
		want: []change{{"bound-tightened", risky, "v1", ".spec.num"}},
	}, {
		name: "every bound loosened or dropped, and a zero minimum added",
		base: `{type: object, properties: {
			num: {type: integer, minimum: 2, maximum: 9, exclusiveMaximum: true},
			s: {type: string, minLength: 2, maxLength: 9},
			l: {type: array, minItems: 2, maxItems: 9, items: {type: string}},
			mp: {type: object, minProperties: 2, maxProperties: 9, additionalProperties: {type: string}}}}`,
		head: `{type: object, properties: {
			num: {type: integer, minimum: 1, maximum: 9},
			s: {type: string, minLength: 0},
			l: {type: array, minItems: 1, maxItems: 10, items: {type: string}},
			mp: {type: object, maxProperties: 10, additionalProperties: {type: string}}}}`,
	}, {
		name: "pattern added",
		base: `{type: object, properties: {name: {type: string}}}`,
		head: `{type: object, properties: {name: {type: string, pattern: "^[a-z]+$"}}}`,
		want: []change{{"pattern-changed", risky, "v1", ".spec.name"}},
	}, {
		name: "pattern changed",
		base: `{type: object, properties: {name: {type: string, pattern: "^[a-z]+$"}}}`,
		head: `{type: object, properties: {name: {type: string, pattern: "^[a-z0-9]+$"}}}`,
		want: []change{{"pattern-changed", risky, "v1", ".spec.name"}}, wantMessage: `from "^[a-z]+$" to "^[a-z0-9]+$"`,
	}, {
		name: "pattern dropped",
		base: `{type: object, properties: {name: {type: string, pattern: "^[a-z]+$"}}}`,
		head: `{type: object, properties: {name: {type: string}}}`,
	}, {
		name: "CEL rule added",
		base: `{type: object, properties: {minum: {type: integer}, max: {type: integer}}}`,
		head: `{type: object, x-kubernetes-validations: [{rule: "self.min <= self.max"}], properties: {minum: {type: integer}, max: {type: integer}}}`,
		want: []change{{"cel-rule-added", risky, "v1", ".spec"}}, wantMessage: "leaves it as it was",
	}, {
		name: "CEL rule removed, or only its message changed",
		base: `{type: object, x-kubernetes-validations: [{rule: "self.min <= self.max", message: a}, {rule: "has(self.min)"}], properties: {minum: {type: integer}, max: {type: integer}}}`,
		head: `{type: object, x-kubernetes-validations: [{rule: "self.min <= self.max", message: b}], properties: {minum: {type: integer}, max: {type: integer}}}`,
	}, {
		name: "descriptions and examples only",
		base: `{type: object, description: old, properties: {a: {type: string, description: "the a"}, b: {type: array, items: {type: string, description: "x"}}}}`,
		head: `{type: object, description: new, properties: {a: {type: string, description: "the A, rewritten", example: "z"}, b: {type: array, items: {type: string, description: "y"}}}}`,
	}, {
		name: "several rules at once, in path order",
		base: `{type: object, properties: {z: {type: string}, a: {type: string}, m: {type: string, enum: [fast, slow]}}}`,
		head: `{type: object, required: [a], properties: {a: {type: string, maxLength: 3}, m: {type: string, enum: [fast]}}}`,
		want: []change{
			{"bound-tightened", risky, "v1", ".spec.a"},
			{"required-added", breaking, "v1", ".spec.a"},
			{"enum-narrowed", breaking, "v1", ".spec.m"},
			{"field-removed", breaking, "v1", ".spec.z"},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			base, head := synthetic(t, "things", tc.base, ""), synthetic(t, "things", tc.head, "")
			got := crdschema.Compare(base, head)
			if diff := cmp.Diff(tc.want, changesOf(t, got), cmp.AllowUnexported(change{}), cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("Compare (-want +got):\n%s\nmessages: %v", diff, got)
			}
			if tc.wantMessage != "" && !strings.Contains(got[0].Message, tc.wantMessage) {
				t.Errorf("message %q does not say %q", got[0].Message, tc.wantMessage)
			}
			if again := crdschema.Compare(base, head); !cmp.Equal(got, again) {
				t.Errorf("Compare is not deterministic:\n%v\n%v", got, again)
			}
		})
	}
}

// TestCompareCRDRules: the rules about the CRD as a whole.
func TestCompareCRDRules(t *testing.T) {
	webhook := func(crd *apiextv1.CustomResourceDefinition) *apiextv1.CustomResourceDefinition {
		crd.Spec.Conversion = &apiextv1.CustomResourceConversion{Strategy: apiextv1.WebhookConverter,
			Webhook: &apiextv1.WebhookConversion{ConversionReviewVersions: []string{"v1"},
				ClientConfig: &apiextv1.WebhookClientConfig{Service: &apiextv1.ServiceReference{Namespace: "system", Name: "webhook"}}}}
		return crd
	}
	only := func(crd *apiextv1.CustomResourceDefinition, version string) *apiextv1.CustomResourceDefinition {
		for i := range crd.Spec.Versions {
			if crd.Spec.Versions[i].Name == version {
				crd.Spec.Versions = crd.Spec.Versions[i : i+1]
				crd.Spec.Versions[0].Storage = true
				return crd
			}
		}
		t.Fatalf("no version %s", version)
		return nil
	}
	unserve := func(crd *apiextv1.CustomResourceDefinition, version string) *apiextv1.CustomResourceDefinition {
		for i := range crd.Spec.Versions {
			if crd.Spec.Versions[i].Name == version {
				crd.Spec.Versions[i].Served = false
			}
		}
		return crd
	}
	sameSchemas := func(crd *apiextv1.CustomResourceDefinition) *apiextv1.CustomResourceDefinition {
		crd.Spec.Versions[0].Schema = crd.Spec.Versions[1].Schema.DeepCopy()
		return crd
	}
	for _, tc := range []struct {
		name       string
		base, head *apiextv1.CustomResourceDefinition
		want       []change
	}{{
		name: "scope changed",
		base: synthetic(t, "things", `{type: object}`, ""),
		head: func() *apiextv1.CustomResourceDefinition {
			c := synthetic(t, "things", `{type: object}`, "")
			c.Spec.Scope = apiextv1.ClusterScoped
			return c
		}(),
		want: []change{{"scope-changed", breaking, "", ""}},
	}, {
		name: "a served version removed",
		base: twoVersions(t, "things", "v1"),
		head: only(twoVersions(t, "things", "v1"), "v1"),
		want: []change{{"version-removed", info, "v1alpha1", ""}},
	}, {
		name: "a served version no longer served",
		base: twoVersions(t, "things", "v1"),
		head: unserve(twoVersions(t, "things", "v1"), "v1alpha1"),
		want: []change{{"version-removed", info, "v1alpha1", ""}},
	}, {
		name: "an unserved version removed",
		base: unserve(twoVersions(t, "things", "v1"), "v1alpha1"),
		head: only(twoVersions(t, "things", "v1"), "v1"),
	}, {
		name: "storage switched with no version served by both",
		base: only(twoVersions(t, "things", "v1alpha1"), "v1alpha1"),
		head: only(twoVersions(t, "things", "v1"), "v1"),
		want: []change{{"version-removed", info, "v1alpha1", ""}, {"storage-switch-unbridged", breaking, "v1", ""}},
	}, {
		name: "storage switched over a version both serve",
		base: twoVersions(t, "things", "v1alpha1"),
		head: twoVersions(t, "things", "v1"),
	}, {
		name: "conversion webhook removed while versions of different schemas are served",
		base: webhook(twoVersions(t, "things", "v1")),
		head: twoVersions(t, "things", "v1"),
		want: []change{{"conversion-removed", breaking, "", ""}},
	}, {
		name: "conversion webhook removed with one version served",
		base: webhook(twoVersions(t, "things", "v1")),
		head: unserve(twoVersions(t, "things", "v1"), "v1alpha1"),
		want: []change{{"version-removed", info, "v1alpha1", ""}},
	}, {
		name: "conversion webhook removed between versions of one schema",
		base: webhook(sameSchemas(twoVersions(t, "things", "v1"))),
		head: sameSchemas(twoVersions(t, "things", "v1")),
	}, {
		name: "conversion webhook added",
		base: twoVersions(t, "things", "v1"),
		head: webhook(twoVersions(t, "things", "v1")),
	}, {
		name: "controller-gen annotation bumped",
		base: func() *apiextv1.CustomResourceDefinition {
			c := twoVersions(t, "things", "v1")
			c.Annotations = map[string]string{"controller-gen.kubebuilder.io/version": "v0.16.5"}
			return c
		}(),
		head: func() *apiextv1.CustomResourceDefinition {
			c := twoVersions(t, "things", "v1")
			c.Annotations = map[string]string{"controller-gen.kubebuilder.io/version": "v0.17.3"}
			return c
		}(),
	}, {
		name: "apiVersion, kind and metadata dropped from the root's schema: the server keeps them",
		base: func() *apiextv1.CustomResourceDefinition {
			c := synthetic(t, "things", `{type: object}`, "")
			root := c.Spec.Versions[0].Schema.OpenAPIV3Schema
			for _, f := range []string{"apiVersion", "kind"} {
				root.Properties[f] = apiextv1.JSONSchemaProps{Type: "string"}
			}
			root.Properties["metadata"] = apiextv1.JSONSchemaProps{Type: "object"}
			return c
		}(),
		head: synthetic(t, "things", `{type: object}`, ""),
	}, {
		name: "a new CRD",
		head: twoVersions(t, "things", "v1"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, changesOf(t, crdschema.Compare(tc.base, tc.head)), cmp.AllowUnexported(change{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Compare (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCompareUpstreamReleases: real upstream CRDs, release to release, with every Change
// each pair brings (verified against the two files by hand). A CRD the head release drops
// is not compared (Helm's lifecycle and the storage history judge that).
func TestCompareUpstreamReleases(t *testing.T) {
	set := func(name string) []string {
		files, err := testenv.FixtureSet(name)
		if err != nil {
			t.Fatal(err)
		}
		return files
	}
	chart := func(name string) []string { return []string{"charts/" + name + "/rendered/crds.yaml"} }
	for _, tc := range []struct {
		name       string
		base, head []string // fixture files
		want       []string
	}{{
		// 0.16 stops serving v1alpha1, drops the template engine v1 and reshapes the fake
		// provider's data.
		name: "external-secrets 0.15.1 to 0.16.2", base: set("external-secrets/v0.15.1"), head: set("external-secrets/v0.16.2"),
		want: []string{
			"clustersecretstores.external-secrets.io: version-removed info v1alpha1 ",
			"clustersecretstores.external-secrets.io: required-added danger v1beta1 .spec.provider.fake.data[*].value",
			"clustersecretstores.external-secrets.io: field-removed danger v1beta1 .spec.provider.fake.data[*].valueMap",
			"externalsecrets.external-secrets.io: version-removed info v1alpha1 ",
			"externalsecrets.external-secrets.io: enum-narrowed danger v1beta1 .spec.target.template.engineVersion",
			"secretstores.external-secrets.io: version-removed info v1alpha1 ",
			"secretstores.external-secrets.io: required-added danger v1beta1 .spec.provider.fake.data[*].value",
			"secretstores.external-secrets.io: field-removed danger v1beta1 .spec.provider.fake.data[*].valueMap",
		},
	}, {
		name: "kyverno 1.12.6 to 1.13.4", base: set("kyverno/v1.12.6"), head: set("kyverno/v1.13.4"),
		want: []string{
			"cleanuppolicies.kyverno.io: required-added danger v2 .spec.context[*].globalReference.name",
			"cleanuppolicies.kyverno.io: required-added danger v2 .spec.context[*].name",
			"cleanuppolicies.kyverno.io: required-added danger v2 .spec.match",
			"cleanuppolicies.kyverno.io: required-added danger v2beta1 .spec.context[*].globalReference.name",
			"cleanuppolicies.kyverno.io: required-added danger v2beta1 .spec.context[*].name",
			"cleanuppolicies.kyverno.io: required-added danger v2beta1 .spec.match",
		},
	}, {
		// flux2 2.18 stops serving the beta versions; HelmChart gains a CEL rule.
		name: "flux2 2.17.2 to 2.18.2", base: chart("flux2-2.17.2"), head: chart("flux2-2.18.2"),
		want: []string{
			"buckets.source.toolkit.fluxcd.io: version-removed info v1beta2 ",
			"gitrepositories.source.toolkit.fluxcd.io: version-removed info v1beta2 ",
			"helmcharts.source.toolkit.fluxcd.io: version-removed info v1beta2 ",
			"helmcharts.source.toolkit.fluxcd.io: cel-rule-added warning v1 .spec",
			"helmreleases.helm.toolkit.fluxcd.io: version-removed info v2beta2 ",
			"helmrepositories.source.toolkit.fluxcd.io: version-removed info v1beta2 ",
			"kustomizations.kustomize.toolkit.fluxcd.io: version-removed info v1beta2 ",
			"ocirepositories.source.toolkit.fluxcd.io: version-removed info v1beta2 ",
		},
	}, {
		// A safe bump: nothing.
		name: "flux2 2.18.2 to 2.18.3", base: chart("flux2-2.18.2"), head: chart("flux2-2.18.3"),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			base, head := byName(t, tc.base), byName(t, tc.head)
			if len(base) == 0 || len(head) == 0 {
				t.Fatalf("no CRDs read: %d in base, %d in head", len(base), len(head))
			}
			var got []string
			for _, name := range slices.Sorted(maps.Keys(base)) {
				for _, c := range changesOf(t, crdschema.Compare(base[name], head[name])) {
					got = append(got, name+": "+c.String())
				}
			}
			if diff := cmp.Diff(tc.want, got, emptyIsNil()); diff != "" {
				t.Errorf("Compare (-want +got):\n%s", diff)
			}
		})
	}
}

// byName reads the CRDs of fixture files, by name.
func byName(t *testing.T, files []string) map[string]*apiextv1.CustomResourceDefinition {
	t.Helper()
	crds, err := testenv.ReadCRDs(files...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*apiextv1.CustomResourceDefinition{}
	for _, c := range crds {
		out[c.Name] = c
	}
	return out
}

// TestChangeCovers: a Change's path matches the live judgement's paths at and under it,
// list indices and map keys included, and nothing beside it.
func TestChangeCovers(t *testing.T) {
	for _, tc := range []struct {
		change, path string
		want         bool
	}{
		{".spec.legacy", "spec.legacy", true},
		{".spec.legacy", "spec.legacy.a", true},
		{".spec.legacy", "spec.legacyName", false},
		{".spec.legacy", "spec", false},
		{".spec.items[*].old", "spec.items[*].old", true},
		{".spec.items[*].old", "spec.items[2].old", true},
		{".spec.items[*].old", "spec.items[*].name", false},
		{".spec.m.*", "spec.m.anykey", true},
		{".spec.m.*.b", "spec.m.k.b", true},
		{".spec.m.*.b", "spec.m.k.a", false},
		{".spec", "spec.free", true},
		{"", "spec", false},
	} {
		if got := (crdschema.Change{Path: tc.change}).Covers(tc.path); got != tc.want {
			t.Errorf("Change at %q covers %q = %v, want %v", tc.change, tc.path, got, tc.want)
		}
	}
}
