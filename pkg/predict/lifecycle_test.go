package predict

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// named is crd with another name and optional annotations.
func named(name string, annotations map[string]string, stored []string, versions ...string) *apiextv1.CustomResourceDefinition {
	c := crd(stored, versions...)
	c.Name, c.Annotations = name, annotations
	return c
}

// shape is what the lifecycle decides about one CRD after the chart is applied.
type shape struct {
	Storage     string
	Stored      []string
	Versions    int
	Annotations map[string]string
}

func shapes(m map[string]*apiextv1.CustomResourceDefinition) map[string]shape {
	out := map[string]shape{}
	for n, c := range m {
		s := shape{Stored: c.Status.StoredVersions, Versions: len(c.Spec.Versions), Annotations: c.Annotations}
		for _, v := range c.Spec.Versions {
			if v.Storage {
				s.Storage = v.Name
			}
		}
		out[n] = s
	}
	return out
}

func TestApply(t *testing.T) {
	const a, b = "as.example.com", "bs.example.com"
	keep := map[string]string{KeepAnnotation: KeepValue}
	cases := []struct {
		name     string
		live     map[string]*apiextv1.CustomResourceDefinition
		incoming []ChartCRD
		current  []ChartCRD
		policy   Policy
		want     map[string]shape
	}{{
		name:     "new CRD is created with only its storage version stored",
		live:     map[string]*apiextv1.CustomResourceDefinition{},
		incoming: []ChartCRD{{CRD: named(a, nil, []string{"v1alpha1"}, "v1*", "v1alpha1"), Source: CRDsDir}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1"}, Versions: 2}},
	}, {
		name:     "templates/ CRD takes the incoming spec and adds its storage version",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1beta1"}, "v1beta1*")},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*", "v1beta1"), Source: Templates}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1beta1", "v1"}, Versions: 2}},
	}, {
		name:     "storage version already stored is not added twice",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1", "v1beta1"}, "v1*", "v1beta1")},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: Templates}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1", "v1beta1"}, Versions: 1}},
	}, {
		name:     "crds/ CRD is left as it is by plain Helm",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1beta1"}, "v1beta1*")},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: CRDsDir}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1beta1", Stored: []string{"v1beta1"}, Versions: 1}},
	}, {
		name:     "crds/ CRD is applied under create-replace",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1beta1"}, "v1beta1*")},
		incoming: []ChartCRD{{CRD: named(a, nil, nil, "v1*", "v1beta1"), Source: CRDsDir}},
		policy:   PolicyCreateReplace,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1beta1", "v1"}, Versions: 2}},
	}, {
		name:     "live annotations stay unless the incoming CRD sets them",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, map[string]string{"x": "live", "y": "live"}, []string{"v1"}, "v1*")},
		incoming: []ChartCRD{{CRD: named(a, map[string]string{"y": "chart"}, nil, "v1*"), Source: Templates}},
		policy:   PolicyHelm,
		want:     map[string]shape{a: {Storage: "v1", Stored: []string{"v1"}, Versions: 1, Annotations: map[string]string{"x": "live", "y": "chart"}}},
	}, {
		name:     "templates/ CRD the chart drops is deleted",
		live:     map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1"}, "v1*"), b: named(b, nil, []string{"v1"}, "v1*")},
		current:  []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: Templates}, {CRD: named(b, nil, nil, "v1*"), Source: Templates}},
		incoming: []ChartCRD{{CRD: named(b, nil, nil, "v1*"), Source: Templates}},
		policy:   PolicyHelm,
		want:     map[string]shape{b: {Storage: "v1", Stored: []string{"v1"}, Versions: 1}},
	}, {
		name:    "dropped CRD that the live object keeps stays",
		live:    map[string]*apiextv1.CustomResourceDefinition{a: named(a, keep, []string{"v1"}, "v1*")},
		current: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: Templates}},
		policy:  PolicyHelm,
		want:    map[string]shape{a: {Storage: "v1", Stored: []string{"v1"}, Versions: 1, Annotations: keep}},
	}, {
		name:    "keep in the chart only does not save it from an upgrade",
		live:    map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1"}, "v1*")},
		current: []ChartCRD{{CRD: named(a, keep, nil, "v1*"), Source: Templates}},
		policy:  PolicyHelm,
		want:    map[string]shape{},
	}, {
		name:    "crds/ CRD the chart drops stays",
		live:    map[string]*apiextv1.CustomResourceDefinition{a: named(a, nil, []string{"v1"}, "v1*")},
		current: []ChartCRD{{CRD: named(a, nil, nil, "v1*"), Source: CRDsDir}},
		policy:  PolicyCreateReplace,
		want:    map[string]shape{a: {Storage: "v1", Stored: []string{"v1"}, Versions: 1}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := shapes(tc.live)
			got := Apply(tc.live, tc.incoming, tc.current, tc.policy)
			if diff := cmp.Diff(tc.want, shapes(got)); diff != "" {
				t.Errorf("Apply() mismatch (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, shapes(tc.live)); diff != "" {
				t.Errorf("Apply() changed the live CRDs (-before +after):\n%s", diff)
			}
		})
	}
}

func TestPolicyApplies(t *testing.T) {
	for _, tc := range []struct {
		policy Policy
		source Source
		want   bool
	}{
		{PolicyHelm, Templates, true}, {PolicyHelm, CRDsDir, false},
		{PolicyCreateReplace, Templates, true}, {PolicyCreateReplace, CRDsDir, true},
	} {
		if got := tc.policy.Applies(tc.source); got != tc.want {
			t.Errorf("%s.Applies(%s) = %v, want %v", tc.policy, tc.source, got, tc.want)
		}
	}
	for in, want := range map[string]Policy{"": PolicyHelm, "helm": PolicyHelm, "create-replace": PolicyCreateReplace} {
		if got, err := ParsePolicy(in); err != nil || got != want {
			t.Errorf("ParsePolicy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParsePolicy("CreateReplace"); err == nil {
		t.Error("ParsePolicy(CreateReplace): want an error")
	}
}

// TestUninstalls: helm uninstall deletes the templates/ CRDs of the release's manifest
// that exist live, unless the manifest marks them keep.
func TestUninstalls(t *testing.T) {
	live := map[string]*apiextv1.CustomResourceDefinition{"widgets.example.com": crd([]string{"v1"}, "v1*")}
	kept := crd(nil, "v1*")
	kept.Annotations = map[string]string{KeepAnnotation: KeepValue}
	absent := crd(nil, "v1*")
	absent.Name = "gadgets.example.com"
	for _, tc := range []struct {
		name string
		in   ChartCRD
		want int
	}{
		{"templates", ChartCRD{CRD: crd(nil, "v1*"), Source: Templates}, 1},
		{"crds/ folder", ChartCRD{CRD: crd(nil, "v1*"), Source: CRDsDir}, 0},
		{"keep", ChartCRD{CRD: kept, Source: Templates}, 0},
		{"not live", ChartCRD{CRD: absent, Source: Templates}, 0},
	} {
		if got := Uninstalls(live, []ChartCRD{tc.in}); len(got) != tc.want {
			t.Errorf("%s: Uninstalls = %v, want %d", tc.name, got, tc.want)
		}
	}
}
