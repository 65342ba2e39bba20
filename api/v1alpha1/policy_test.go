package v1alpha1

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
)

func policy(name string, groups []string, sel *metav1.LabelSelector, autoMigrate bool) *StorageMigrationPolicy {
	return &StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: StorageMigrationPolicySpec{Groups: groups, Selector: sel, AutoMigrate: ptr.To(autoMigrate)}}
}

func crd(name, group string, labels map[string]string) *apiextv1.CustomResourceDefinition {
	return &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: apiextv1.CustomResourceDefinitionSpec{Group: group}}
}

// TestSelect: the first policy by name that the caller accepts and that selects a CRD is
// its policy; an invalid selector the selection reaches is an error that names the
// policy and says how to correct it.
func TestSelect(t *testing.T) {
	flux := crd("buckets.source.toolkit.fluxcd.io", "source.toolkit.fluxcd.io", map[string]string{"tier": "gitops"})
	certs := crd("certificates.cert-manager.io", "cert-manager.io", nil)
	other := crd("widgets.example.io", "example.io", nil)
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn}}}
	gitops := &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gitops"}}
	autoMigrates := (*StorageMigrationPolicy).AutoMigrates

	for _, tc := range []struct {
		name     string
		policies []*StorageMigrationPolicy
		accept   func(*StorageMigrationPolicy) bool
		want     map[string]string // CRD -> policy
		err      string
	}{
		{name: "name order", policies: []*StorageMigrationPolicy{policy("z-all", nil, nil, true), policy("a-flux", []string{"source.toolkit.fluxcd.io"}, gitops, true)},
			want: map[string]string{flux.Name: "a-flux", certs.Name: "z-all", other.Name: "z-all"}},
		{name: "accept", policies: []*StorageMigrationPolicy{policy("a-off", nil, nil, false), policy("b-certs", []string{"cert-manager.io"}, nil, true)},
			accept: autoMigrates, want: map[string]string{certs.Name: "b-certs"}},
		{name: "none", policies: []*StorageMigrationPolicy{policy("certs", []string{"cert-manager.io"}, &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}, true)},
			want: map[string]string{}},
		{name: "an invalid selector is an error", policies: []*StorageMigrationPolicy{policy("broken", nil, bad, true), policy("z-all", nil, nil, true)},
			err: "StorageMigrationPolicy broken: spec.selector is not a valid label selector"},
		{name: "an invalid selector the caller does not accept", policies: []*StorageMigrationPolicy{policy("broken", nil, bad, false), policy("z-all", nil, nil, true)},
			accept: autoMigrates, want: map[string]string{flux.Name: "z-all", certs.Name: "z-all", other.Name: "z-all"}},
		{name: "an invalid selector of other groups", policies: []*StorageMigrationPolicy{policy("broken", []string{"nothing.example.io"}, bad, true)},
			want: map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Select(tc.policies, []*apiextv1.CustomResourceDefinition{flux, certs, other}, tc.accept)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "kubectl edit storagemigrationpolicy broken") {
					t.Fatalf("error %v, want one saying %q and how to correct it", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			names := map[string]string{}
			for crd, p := range got {
				names[crd] = p.Name
			}
			if diff := cmp.Diff(tc.want, names); diff != "" {
				t.Errorf("selection (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTargetSelector: spec.targets.selector is one selector for the fleet controller and
// audit; a policy without targets selects no Secret, and an invalid selector is an error
// that names the policy and how to correct it.
func TestTargetSelector(t *testing.T) {
	fleet := func(sel metav1.LabelSelector) *StorageMigrationPolicy {
		return &StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "tenants"},
			Spec: StorageMigrationPolicySpec{Targets: &FleetTargets{Namespace: "fleet", Selector: sel}}}
	}
	sel, err := fleet(metav1.LabelSelector{MatchLabels: map[string]string{"tier": "tenant"}}).TargetSelector()
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set{"tier": "tenant"}) || sel.Matches(labels.Set{"tier": "platform"}) {
		t.Errorf("selector %s matches the wrong Secrets", sel)
	}
	none, err := (&StorageMigrationPolicy{}).TargetSelector()
	if err != nil || none.Matches(labels.Set{}) {
		t.Errorf("a policy without targets: selector %v, %v; want one that selects nothing", none, err)
	}
	_, err = fleet(metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn}}}).TargetSelector()
	if err == nil || !strings.Contains(err.Error(), "StorageMigrationPolicy tenants: spec.targets.selector is not a valid label selector") ||
		!strings.Contains(err.Error(), "kubectl edit storagemigrationpolicy tenants") {
		t.Errorf("invalid selector: %v", err)
	}
}
