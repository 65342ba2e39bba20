package predict

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDecideDeleted(t *testing.T) {
	widgets := func(annotations map[string]string) *apiextv1.CustomResourceDefinition {
		return &apiextv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", Annotations: annotations},
			Spec: apiextv1.CustomResourceDefinitionSpec{Group: "example.com", Names: apiextv1.CustomResourceDefinitionNames{Plural: "widgets", Kind: "Widget"},
				Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true}}},
			Status: apiextv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1"}},
		}
	}
	for _, tc := range []struct {
		name     string
		live     *apiextv1.CustomResourceDefinition
		objects  int64
		examples []string
		verdict  Verdict
		reason   string
	}{
		{"empty", widgets(nil), 0, nil, OK, "it holds no Widget objects, so nothing is lost"},
		{"objects", widgets(nil), 12, []string{"a/w0", "a/w1", "b/w0"}, Delete,
			"the API server deletes all 12 Widget objects with it, for good (for example a/w0, a/w1, b/w0)"},
		{"one object", widgets(nil), 1, []string{"a/w0"}, Delete, "the API server deletes its one Widget object with it, for good (for example a/w0)"},
		{"allowed", widgets(map[string]string{AllowDeleteAnnotation: "true"}), 12, nil, OK,
			"it carries upgradeguard.io/allow-delete=true: all 12 Widget objects are deleted with it on purpose"},
		{"allowed with another value", widgets(map[string]string{AllowDeleteAnnotation: "yes"}), 2, nil, Delete,
			"the API server deletes all 2 Widget objects with it, for good"},
		// Helm's keep policy protects a CRD from Helm only: a DELETE of the CRD still takes
		// its objects.
		{"kept by Helm", widgets(map[string]string{KeepAnnotation: KeepValue}), 2, nil, Delete,
			"the API server deletes all 2 Widget objects with it, for good"},
	} {
		f := DecideDeleted(tc.live, tc.objects, tc.examples)
		if f.Verdict != tc.verdict || f.Reason != tc.reason || f.Name != "widgets.example.com" || f.LiveStorageVersion != "v1" {
			t.Errorf("%s: DecideDeleted() = %s %q (name %s, storage %s), want %s %q", tc.name, f.Verdict, f.Reason, f.Name, f.LiveStorageVersion, tc.verdict, tc.reason)
		}
	}
}

func TestDeletionSteps(t *testing.T) {
	got := DeletionSteps("widgets.example.com")
	want := []string{
		"back up the CRD and its objects: upgradeguard crd backup widgets.example.com --dir ./widgets.example.com-backup " +
			"(upgradeguard crd restore --dir ./widgets.example.com-backup brings them back)",
		"delete its objects first (kubectl delete widgets.example.com --all --all-namespaces), " +
			"or let them go with it (kubectl annotate crd widgets.example.com upgradeguard.io/allow-delete=true)",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DeletionSteps(one) (-want +got):\n%s", diff)
	}
	got = DeletionSteps("a.example.com", "b.example.com")
	want = []string{
		"back up the CRDs and their objects: upgradeguard crd backup a.example.com b.example.com --dir ./crds-backup " +
			"(upgradeguard crd restore --dir ./crds-backup brings them back)",
		"delete their objects first (kubectl delete a.example.com,b.example.com --all --all-namespaces), " +
			"or let them go with the CRDs (kubectl annotate crd a.example.com b.example.com upgradeguard.io/allow-delete=true)",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DeletionSteps(two) (-want +got):\n%s", diff)
	}
}
