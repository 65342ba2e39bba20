package controller_test

import (
	"context"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdguard"
)

// holdsObjectsBound is the bound docs/operator-guide.md states for the label to follow
// the first object created and the last one deleted, with the controller running and
// elected ("The CRD deletion guard as a policy").
const holdsObjectsBound = 5 * time.Second

// TestHoldsObjectsLabel: the controller labels upgradeguard.io/holds-objects=true a CRD
// that held objects before it started, labels another within the bound after its first
// object is created and unlabels it within the bound after its last one is deleted,
// through the label policy that lets only its ServiceAccount remove the label (the
// controller runs as that ServiceAccount's user name). While the label is on, the
// deletion policy refuses the CRD's deletion.
func TestHoldsObjectsLabel(t *testing.T) {
	e := setup(t)
	const saNamespace, saName = "ug-system", "upgradeguard"
	p := crdguard.Objects(crdguard.Options{ServiceAccountNamespace: saNamespace, ServiceAccountName: saName})
	policies, bindings := p.List()
	cp.CreateAdmissionPolicies(t, policies, bindings)
	t.Cleanup(func() {
		// The API server lets go of deleted policies a moment later: setup's clean-up
		// then deletes the CRDs that are still labelled.
		err := cp.AllowCRDDeletion(context.WithoutCancel(e.ctx), func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group == "guard.example.com" })
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})

	before := guardedCRD(t, e, "befores", "Before")
	createObject(t, before, "early")
	widgets := guardedCRD(t, e, "widgets", "Widget")

	startController(t, "system:serviceaccount:"+saNamespace+":"+saName, controller.Options{HoldsObjectsLabel: true})
	if took := waitLabel(t, e, before.Name, true); took > 30*time.Second {
		t.Errorf("CRD %s, holding an object before the controller started, labelled after %s", before.Name, took)
	}
	if holds(t, e, widgets.Name) {
		t.Errorf("CRD %s holds no objects, yet is labelled", widgets.Name)
	}

	start := time.Now()
	createObject(t, widgets, "first")
	if took := waitLabel(t, e, widgets.Name, true); took > holdsObjectsBound {
		t.Errorf("the label followed the first object after %s, more than the %s stated", took, holdsObjectsBound)
	} else {
		t.Logf("the label followed the first object after %s (%s from the create's start)", took, time.Since(start))
	}
	testenv.Eventually(t, "the deletion policy refuses the labelled CRD", func() (bool, error) {
		err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(e.ctx, widgets.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err), err
	})

	createObject(t, widgets, "second")
	deleteObject(t, widgets, "first")
	if !holds(t, e, widgets.Name) {
		t.Errorf("CRD %s still holds an object, yet was unlabelled", widgets.Name)
	}
	deleteObject(t, widgets, "second")
	if took := waitLabel(t, e, widgets.Name, false); took > holdsObjectsBound {
		t.Errorf("the label followed the last object's deletion after %s, more than the %s stated", took, holdsObjectsBound)
	} else {
		t.Logf("the label followed the last object's deletion after %s", took)
	}
}

// guardedCRD creates an established CRD <plural>.guard.example.com; setup's clean-up
// deletes it (once the policies are gone).
func guardedCRD(t *testing.T, e env, plural, kind string) *apiextv1.CustomResourceDefinition {
	t.Helper()
	crd := testenv.TwoVersionCRD("guard.example.com", plural, kind)
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitEstablished(e.ctx, e.crds, crd.Name); err != nil {
		t.Fatal(err)
	}
	return crd
}

func objectsOf(crd *apiextv1.CustomResourceDefinition) dynamic.ResourceInterface {
	return dynamic.NewForConfigOrDie(cp.Config).Resource(schema.GroupVersionResource{Group: crd.Spec.Group, Version: "v1", Resource: crd.Spec.Names.Plural}).Namespace("default")
}

func createObject(t *testing.T, crd *apiextv1.CustomResourceDefinition, name string) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": crd.Spec.Group + "/v1", "kind": crd.Spec.Names.Kind,
		"metadata": map[string]any{"name": name, "namespace": "default"}}}
	if _, err := objectsOf(crd).Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func deleteObject(t *testing.T, crd *apiextv1.CustomResourceDefinition, name string) {
	t.Helper()
	if err := objectsOf(crd).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func holds(t *testing.T, e env, name string) bool {
	t.Helper()
	crd, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return crd.Labels[crdguard.LabelHoldsObjects] == "true"
}

// waitLabel polls the CRD until its label says want, for up to a minute, and returns how
// long that took.
func waitLabel(t *testing.T, e env, name string, want bool) time.Duration {
	t.Helper()
	start := time.Now()
	err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return holds(t, e, name) == want, nil
	})
	if err != nil {
		t.Fatalf("CRD %s: label %s never became %t", name, crdguard.LabelHoldsObjects, want)
	}
	return time.Since(start)
}
