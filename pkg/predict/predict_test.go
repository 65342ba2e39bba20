package predict

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// crd builds a CRD with the given versions; "v1*" marks storage, "v1-" marks served=false.
func crd(stored []string, versions ...string) *apiextv1.CustomResourceDefinition {
	c := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"}}
	for _, v := range versions {
		ver := apiextv1.CustomResourceDefinitionVersion{Name: v, Served: true}
		switch v[len(v)-1] {
		case '*':
			ver.Name, ver.Storage = v[:len(v)-1], true
		case '-':
			ver.Name, ver.Served = v[:len(v)-1], false
		}
		c.Spec.Versions = append(c.Spec.Versions, ver)
	}
	c.Status.StoredVersions = stored
	return c
}

func TestDecide(t *testing.T) {
	type want struct {
		Verdict Verdict
		Missing []string
		Switch  string
	}
	cases := []struct {
		name     string
		live     *apiextv1.CustomResourceDefinition
		incoming *apiextv1.CustomResourceDefinition
		applied  bool
		want     want
	}{
		{"new CRD", nil, crd(nil, "v1*"), true, want{OK, []string{}, ""}},
		{"same versions", crd([]string{"v1"}, "v1*"), crd(nil, "v1*"), true, want{OK, []string{}, ""}},
		{"storage promoted, old still served", crd([]string{"v1beta2"}, "v1beta2*"), crd(nil, "v1*", "v1beta2"), true, want{OK, []string{}, ""}},
		{"stored version kept but unserved", crd([]string{"v1alpha1", "v1"}, "v1alpha1", "v1*"), crd(nil, "v1alpha1-", "v1*"), true, want{OK, []string{}, ""}},
		{"old stored version dropped (flux 2.17->2.18)", crd([]string{"v1beta2", "v1"}, "v1*", "v1beta2"), crd(nil, "v1*"), true, want{Migrate, []string{"v1beta2"}, ""}},
		{"two stored versions dropped", crd([]string{"v1beta1", "v1beta2", "v1"}, "v1*", "v1beta1", "v1beta2"), crd(nil, "v1*"), true, want{Migrate, []string{"v1beta1", "v1beta2"}, ""}},
		{"storage dropped, nothing in common", crd([]string{"v1beta1", "v1beta2"}, "v1beta1", "v1beta2*"), crd(nil, "v1*"), true, want{Bridge, []string{"v1beta1", "v1beta2"}, ""}},
		{"rollback: live storage unknown to target, live serves target storage", crd([]string{"v1alpha1", "v1beta1"}, "v1alpha1", "v1beta1*"), crd(nil, "v1alpha1*"), true, want{Bridge, []string{"v1beta1"}, "v1alpha1"}},
		{"rollback: switch needs a served version", crd([]string{"v1alpha1", "v1beta1"}, "v1alpha1-", "v1beta1*"), crd(nil, "v1alpha1*"), true, want{Bridge, []string{"v1beta1"}, ""}},
		{"crds/ file not applied by helm", crd([]string{"v1beta2", "v1"}, "v1*", "v1beta2"), crd(nil, "v1*"), false, want{OK, []string{"v1beta2"}, ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := Decide(tc.live, Incoming{CRD: tc.incoming, Source: Templates, Applied: tc.applied})
			got := want{f.Verdict, f.MissingStoredVersions, f.StorageSwitchTo}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide() mismatch (-want +got):\n%s\nreason: %s", diff, f.Reason)
			}
			if f.Reason == "" {
				t.Error("Decide() gave no reason")
			}
		})
	}
}

func TestSteppingStone(t *testing.T) {
	live := crd([]string{"v1beta1", "v1beta2"}, "v1beta1", "v1beta2*")
	target := crd(nil, "v1*")
	cases := []struct {
		name      string
		candidate *apiextv1.CustomResourceDefinition
		want      bool
	}{
		{"keeps live storage, stores at a target version", crd(nil, "v1*", "v1beta2"), true},
		{"drops live storage", crd(nil, "v1*"), false},
		{"stores at a version the target drops", crd(nil, "v1beta2*", "v1"), false},
		{"missing", nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := SteppingStone(live, tc.candidate, target); got != tc.want {
				t.Errorf("SteppingStone() = %v, want %v", got, tc.want)
			}
		})
	}
}
