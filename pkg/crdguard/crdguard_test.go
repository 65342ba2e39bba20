package crdguard_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdguard"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

// The ServiceAccount the policies let remove the label, as the chart names it for a
// release "upgradeguard" in namespace ug-system.
const saNamespace, saName = "ug-system", "upgradeguard"

// TestPolicyGuardsDeletion is the guard in policy mode with no controller running (none
// is started, and no webhook is registered): the label is set by hand, as the controller
// would set it. `kubectl delete crd` of a CRD that holds objects is refused with the
// runbook and the annotation named, and the CRD and its objects stay; a CRD with no
// objects (no label) is deleted; one annotated upgradeguard.io/allow-delete=true is
// deleted with its objects. Only upgradeguard's ServiceAccount may remove the label.
func TestPolicyGuardsDeletion(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	crds := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	p := crdguard.Objects(crdguard.Options{ServiceAccountNamespace: saNamespace, ServiceAccountName: saName})
	policies, bindings := p.List()
	cp.CreateAdmissionPolicies(t, policies, bindings)

	held := newCRD(t, "helds", "Held")
	createObject(t, held)
	label(t, cp.Config, held.Name, `"true"`)
	empty := newCRD(t, "empties", "Empty")
	allowed := newCRD(t, "alloweds", "Allowed")
	createObject(t, allowed)
	label(t, cp.Config, allowed.Name, `"true"`)
	waitInEffect(t, held.Name)

	out, err := kubectl("delete", "crd", held.Name)
	if err == nil {
		t.Fatalf("kubectl delete crd %s of a CRD holding objects succeeded:\n%s", held.Name, out)
	}
	for _, want := range []string{"ValidatingAdmissionPolicy 'upgradeguard-crd-deletion'", "CustomResourceDefinition " + held.Name + " holds objects",
		crdguard.Runbook, predict.AllowDelete([]string{held.Name}).String()} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	t.Logf("kubectl delete crd %s:\n%s", held.Name, out)
	if _, err := crds.Get(ctx, held.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("CRD %s after the refused deletion: %v", held.Name, err)
	}

	if out, err := kubectl("delete", "crd", empty.Name); err != nil {
		t.Errorf("kubectl delete crd %s of a CRD without objects: %v\n%s", empty.Name, err, out)
	}
	if _, err := kubectl("annotate", "crd", allowed.Name, predict.AllowDeleteAnnotation+"=true"); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("delete", "crd", allowed.Name); err != nil {
		t.Errorf("kubectl delete crd %s annotated %s=true: %v\n%s", allowed.Name, predict.AllowDeleteAnnotation, err, out)
	}

	// The label: another user may not remove it (a cluster admin included), the
	// ServiceAccount may.
	alice, err := cp.AddUser("alice", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	err = patchLabel(ctx, alice, held.Name, "null")
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only upgradeguard (system:serviceaccount:ug-system:upgradeguard) removes label "+crdguard.LabelHoldsObjects) {
		t.Errorf("alice removing the label: %v, want the label policy's refusal", err)
	}
	if err := patchLabel(ctx, alice, held.Name, `"false"`); !apierrors.IsForbidden(err) {
		t.Errorf("alice setting the label false: %v, want the label policy's refusal", err)
	}
	sa, err := cp.AddUser("system:serviceaccount:"+saNamespace+":"+saName, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	if err := patchLabel(ctx, sa, held.Name, "null"); err != nil {
		t.Errorf("upgradeguard's ServiceAccount removing the label: %v", err)
	}
	// Without the label the CRD is no longer the policy's to refuse.
	if out, err := kubectl("delete", "crd", held.Name); err != nil {
		t.Errorf("kubectl delete crd %s once unlabelled: %v\n%s", held.Name, err, out)
	}
}

// waitInEffect waits until the API server refuses a dry-run deletion of the labelled CRD
// name and a dry-run removal of its label: it takes both policies in through informers.
func waitInEffect(t *testing.T, name string) {
	t.Helper()
	crds := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	testenv.Eventually(t, "the policies refuse a dry-run deletion and label removal", func() (bool, error) {
		err := crds.Delete(t.Context(), name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsForbidden(err) {
			return false, err
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, crdguard.LabelHoldsObjects)
		_, err = crds.Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err), err
	})
}

// newCRD creates an established CRD <plural>.guard.example.com, deleted with its objects
// when the test ends if it is still there (annotated allow-delete first).
func newCRD(t *testing.T, plural, kind string) *apiextv1.CustomResourceDefinition {
	t.Helper()
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	crd := testenv.TwoVersionCRD("guard.example.com", plural, kind)
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitEstablished(ctx, cs, crd.Name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		this := func(c *apiextv1.CustomResourceDefinition) bool { return c.Name == crd.Name }
		if err := cp.AllowCRDDeletion(ctx, this); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if err := cp.DeleteCRDs(ctx, func(c *apiextv1.CustomResourceDefinition) bool { return !this(c) }); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return crd
}

func gvr(crd *apiextv1.CustomResourceDefinition) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: crd.Spec.Group, Version: "v1", Resource: crd.Spec.Names.Plural}
}

// createObject creates one object of the CRD's type in namespace default.
func createObject(t *testing.T, crd *apiextv1.CustomResourceDefinition) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": crd.Spec.Group + "/v1", "kind": crd.Spec.Names.Kind,
		"metadata": map[string]any{"name": "one", "namespace": "default"}}}
	if _, err := dynamic.NewForConfigOrDie(cp.Config).Resource(gvr(crd)).Namespace("default").Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// label sets the guard's label of CRD name to value (JSON: "true", null) as the admin.
func label(t *testing.T, cfg *rest.Config, name, value string) {
	t.Helper()
	if err := patchLabel(t.Context(), cfg, name, value); err != nil {
		t.Fatal(err)
	}
}

func patchLabel(ctx context.Context, cfg *rest.Config, name, value string) error {
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%s}}}`, crdguard.LabelHoldsObjects, value)
	_, err := apiextclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// kubectl runs the control plane's own kubectl as the admin.
func kubectl(args ...string) (string, error) {
	out, err := exec.Command(filepath.Join(cp.KubeBin, "kubectl"), append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...).CombinedOutput()
	return string(out), err
}
