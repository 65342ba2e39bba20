package predict

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMoveSteps(t *testing.T) {
	a, b := ReleaseRef{Namespace: "apps", Name: "widgets"}, ReleaseRef{Namespace: "crds", Name: "widgets-crds"}
	m := CRDMove{CRD: "widgets.example.com", From: a, To: b}
	crd := func(labels, annotations map[string]string) *apiextv1.CustomResourceDefinition {
		return &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: m.CRD, Labels: labels, Annotations: annotations}}
	}
	ownedByA := crd(map[string]string{ManagedByLabel: ManagedByHelm}, map[string]string{ReleaseNameAnnotation: "widgets", ReleaseNamespaceAnnotation: "apps"})
	movedAnnotations, movedLabels := MoveMetadata(m)
	moved := crd(movedLabels, movedAnnotations)
	type step struct {
		Kind    MoveStepKind
		Command string
		Done    bool
	}
	steps := func(s []MoveStep) []step {
		var out []step
		for _, x := range s {
			out = append(out, step{x.Kind, x.Command, x.Done})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		m     CRDMove
		live  *apiextv1.CustomResourceDefinition
		chart string
		want  []step
	}{
		{"owned by A", m, ownedByA, "repo/widgets-crds", []step{
			{MoveKeep, "kubectl annotate crd widgets.example.com helm.sh/resource-policy=keep", false},
			{MoveOwnership, "kubectl annotate --overwrite crd widgets.example.com meta.helm.sh/release-name=widgets-crds meta.helm.sh/release-namespace=crds", false},
			{MoveManagedBy, "kubectl label --overwrite crd widgets.example.com app.kubernetes.io/managed-by=Helm", true},
			{MoveDeployTo, "helm upgrade --install widgets-crds repo/widgets-crds -n crds", false},
			{MoveUpgradeFrom, "helm upgrade widgets CHART -n apps", false},
		}},
		{"moved: every metadata step done", m, moved, "", []step{
			{MoveKeep, "kubectl annotate crd widgets.example.com helm.sh/resource-policy=keep", true},
			{MoveOwnership, "kubectl annotate --overwrite crd widgets.example.com meta.helm.sh/release-name=widgets-crds meta.helm.sh/release-namespace=crds", true},
			{MoveManagedBy, "kubectl label --overwrite crd widgets.example.com app.kubernetes.io/managed-by=Helm", true},
			{MoveDeployTo, "helm upgrade --install widgets-crds CHART -n crds", false},
			{MoveUpgradeFrom, "helm upgrade widgets CHART -n apps", false},
		}},
		// Same name in another namespace is another release.
		{"same name, other namespace", CRDMove{CRD: m.CRD, From: a, To: ReleaseRef{Namespace: "other", Name: "widgets"}}, ownedByA, "", []step{
			{MoveKeep, "kubectl annotate crd widgets.example.com helm.sh/resource-policy=keep", false},
			{MoveOwnership, "kubectl annotate --overwrite crd widgets.example.com meta.helm.sh/release-name=widgets meta.helm.sh/release-namespace=other", false},
			{MoveManagedBy, "kubectl label --overwrite crd widgets.example.com app.kubernetes.io/managed-by=Helm", true},
			{MoveDeployTo, "helm upgrade --install widgets CHART -n other", false},
			{MoveUpgradeFrom, "helm upgrade widgets CHART -n apps", false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, steps(MoveSteps(tc.m, tc.live, tc.chart))); diff != "" {
				t.Errorf("MoveSteps (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecideMoved(t *testing.T) {
	a, b := ReleaseRef{Namespace: "apps", Name: "widgets"}, ReleaseRef{Namespace: "apps", Name: "widgets-crds"}
	live := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com",
		Annotations: map[string]string{ReleaseNameAnnotation: "widgets-crds", ReleaseNamespaceAnnotation: "apps"}},
		Spec: apiextv1.CustomResourceDefinitionSpec{Names: apiextv1.CustomResourceDefinitionNames{Kind: "Widget"},
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true}}}}
	twelve := int64(12)
	for _, tc := range []struct {
		name    string
		fate    Fate
		verdict Verdict
		says    string
	}{
		{"deleted", FateDeleted, Move, "still lists it"},
		{"kept", FateKeptLive, OK, "it moved to release apps/widgets-crds"},
	} {
		t.Run("away/"+tc.name, func(t *testing.T) {
			r := Removal{Live: live, Fate: tc.fate}
			f := DecideMovedAway(Upgrade, DecideRemoved(Upgrade, Helm4, r, &twelve), r, a, b)
			if f.Verdict != tc.verdict || !strings.Contains(f.Reason, tc.says) || f.Move == nil || f.Move.To != b || f.Move.From != a {
				t.Errorf("DecideMovedAway: %+v, want %s saying %q", f, tc.verdict, tc.says)
			}
			if (FixFor(f) == FixMove) != (tc.verdict == Move) {
				t.Errorf("FixFor: %s", FixFor(f))
			}
		})
	}
	t.Run("in", func(t *testing.T) {
		f := DecideMovedIn(Upgrade, Decision{Name: live.Name, Verdict: Migrate, Reason: "stored v1beta1 dropped"}, a, b)
		if f.Verdict != Move || !f.Verdict.Blocks() || !strings.Contains(f.Reason, "invalid ownership metadata") || !strings.Contains(f.Reason, "also: stored v1beta1 dropped") {
			t.Errorf("DecideMovedIn: %+v", f)
		}
		if got, want := AdoptCommand(*f.Move, "./b").String(), "upgradeguard crd adopt widgets.example.com --from apps/widgets --to apps/widgets-crds --chart ./b --apply"; got != want {
			t.Errorf("AdoptCommand %q, want %q", got, want)
		}
	})
}

func TestParseReleaseRef(t *testing.T) {
	if r, err := ParseReleaseRef("from", "apps/widgets"); err != nil || r != (ReleaseRef{Namespace: "apps", Name: "widgets"}) {
		t.Errorf("apps/widgets: %v, %v", r, err)
	}
	for _, bad := range []string{"widgets", "/widgets", "apps/", "a/b/c", ""} {
		if _, err := ParseReleaseRef("from", bad); err == nil || !strings.Contains(err.Error(), "NAMESPACE/RELEASE") {
			t.Errorf("%q: %v, want an error naming NAMESPACE/RELEASE", bad, err)
		}
	}
}
