package webhook_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

const lossyGroup = "fieldloss.upgradeguard.io"

// lossyCRD serves versions of Lossy, the last the storage version; v1alpha1 declares
// spec.legacy, which v1 does not, and neither preserves unknown fields.
func lossyCRD(versions ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: lossies.%s
spec:
  group: %s
  names: {kind: Lossy, listKind: LossyList, plural: lossies, singular: lossy}
  scope: Namespaced
  versions:
`, lossyGroup, lossyGroup)
	for i, v := range versions {
		legacy := ""
		if v == "v1alpha1" {
			legacy = ", legacy: {type: string}"
		}
		fmt.Fprintf(&b, `  - name: %s
    served: true
    storage: %t
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}%s}}
`, v, i == len(versions)-1, legacy)
	}
	return b.String()
}

// TestCRDGateFieldLoss: a CRD update drops v1alpha1 while objects stored there hold
// spec.legacy, which the v1 storage schema does not declare. The migration the gate would
// start is one the policy refuses (it would drop the field from etcd), so the gate must
// not hold the update for it: it denies at once, names the field with its count and the
// ways on, and creates no StorageMigration. Once the policy allows the loss, the same
// update is held for a migration that runs, and then goes through.
func TestCRDGateFieldLoss(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	ns := "crdgate-fieldloss"
	namespace(t, s.c, ns)
	policy := &v1alpha1.StorageMigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "lossies"},
		Spec: v1alpha1.StorageMigrationPolicySpec{Groups: []string{lossyGroup}, Proactive: ptr.To(false)}}
	if err := s.c.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.c.Delete(context.Background(), policy) })
	crdName := "lossies." + lossyGroup
	apply := func(versions ...string) error {
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(lossyCRD(versions...)), &crd); err != nil {
			t.Fatal(err)
		}
		crd.Labels = map[string]string{webhook.LabelFluxName: "lossy", webhook.LabelFluxNamespace: ns}
		return testenv.ApplyCRDServerSide(ctx, s.cp.Config, &crd, "helm-controller")
	}
	if err := apply("v1alpha1"); err != nil {
		t.Fatal(err)
	}
	if err := testenv.WaitEstablished(ctx, apiextclient.NewForConfigOrDie(s.cp.Config), crdName); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": lossyGroup + "/v1alpha1", "kind": "Lossy",
			"metadata": map[string]any{"name": fmt.Sprintf("lossy-%d", i), "namespace": ns},
			"spec":     map[string]any{"size": int64(i), "legacy": "keep-me"}}}
		if err := s.c.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	if err := apply("v1alpha1", "v1"); err != nil {
		t.Fatal(err)
	}
	sm := webhook.MigrationName(ns, "lossy")

	err := apply("v1")
	if err == nil {
		t.Fatal("the CRD update dropping v1alpha1 was accepted; want it denied")
	}
	mustContain(t, err.Error(), `admission webhook "crd.upgradeguard.io" denied the request`, crdName,
		"spec.legacy (3 objects", "would permanently drop fields the v1 schema does not declare",
		"upgradeguard.io/allow-field-loss=true", "Next steps: upgradeguard migrate --crd "+crdName)
	for _, never := range []string{"is holding", "StorageMigration " + sm, "kubectl delete storagemigration"} {
		if strings.Contains(err.Error(), never) {
			t.Errorf("the denial says %q, but no migration was or will be started:\n%v", never, err)
		}
	}
	if err := s.c.Get(ctx, client.ObjectKey{Name: sm}, &v1alpha1.StorageMigration{}); !apierrors.IsNotFound(err) {
		t.Errorf("StorageMigration %s after a refused field loss: %v, want none", sm, err)
	}
	if got := liveCRD(t, crdName).Status.StoredVersions; len(got) != 2 {
		t.Errorf("storedVersions = %v, want v1alpha1 and v1 still", got)
	}

	// The operator accepts the loss on the policy: the update is held for the migration,
	// which runs, and the retried update goes through.
	allow := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"allowFieldLoss":true}}`))
	if err := s.c.Patch(ctx, policy, allow); err != nil {
		t.Fatal(err)
	}
	err = apply("v1")
	if err == nil {
		t.Fatal("the CRD update was accepted before the migration ran; want it held")
	}
	mustContain(t, err.Error(), "upgradeguard is holding the update of CustomResourceDefinition "+crdName, "StorageMigration "+sm)
	waitMigration(t, sm)
	if err := apply("v1"); err != nil {
		t.Fatalf("the retried CRD update: %v", err)
	}
}
