package argoapp_test

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
)

func TestDeploying(t *testing.T) {
	app := func(ns, name string, resources ...argoapp.ResourceStatus) *argoapp.Application {
		a := &argoapp.Application{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		a.Status.Resources = resources
		return a
	}
	crd := argoapp.ResourceStatus{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition", Name: "widgets.example.io"}
	other := argoapp.ResourceStatus{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition", Name: "gadgets.example.io"}
	namespaced := argoapp.ResourceStatus{Kind: "ConfigMap", Namespace: "web", Name: "widgets.example.io"}
	apps := []*argoapp.Application{
		app("team-b", "widgets", namespaced, crd),
		app("argocd", "gadgets", other),
		app("argocd", "widgets", crd),
		app("argocd", "web", namespaced),
	}
	var got []string
	for _, a := range argoapp.Deploying(apps, "apiextensions.k8s.io", "CustomResourceDefinition", "", "widgets.example.io") {
		got = append(got, a.Namespace+"/"+a.Name)
	}
	if want := []string{"argocd/widgets", "team-b/widgets"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Deploying = %v, want %v", got, want)
	}
	if got := argoapp.Deploying(apps, "apiextensions.k8s.io", "CustomResourceDefinition", "", "missing.example.io"); len(got) != 0 {
		t.Errorf("Deploying of a CRD no Application lists = %d Applications, want none", len(got))
	}
}
