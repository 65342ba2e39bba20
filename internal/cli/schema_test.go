package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestCheckDataLoss: a chart upgrade whose CRD the API server accepts but whose schema
// drops fields objects hold (kro 0.2.0 -> 0.9.3). check exits 1 with the paths and no
// values; the real helm upgrade then succeeds, and the fields are gone, as predicted.
func TestCheckDataLoss(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	const crd = "resourcegraphdefinitions.kro.run"
	t.Cleanup(func() { _ = cp.DeleteAllCRDs(ctx) })
	rev1 := fixtureChart(t, "kro", "0.2.0", "crds/kro/v0.2.0/kro.run_resourcegraphdefinitions.yaml")
	rev2 := fixtureChart(t, "kro", "0.9.3", "crds/kro/v0.9.3/kro.run_resourcegraphdefinitions.yaml")
	mustHelm(t, nil, "install", "kro", rev1, "-n", "kro", "--create-namespace")
	if err := testenv.WaitEstablished(ctx, apiextclient.NewForConfigOrDie(cp.Config), crd); err != nil {
		t.Fatal(err)
	}
	ri := dynamic.NewForConfigOrDie(cp.Config).Resource(schema.GroupVersionResource{Group: "kro.run", Version: "v1alpha1", Resource: "resourcegraphdefinitions"})
	const secretish = "deployer-with-a-long-name"
	rgd := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kro.run/v1alpha1", "kind": "ResourceGraphDefinition",
		"metadata": map[string]any{"name": "web"},
		"spec": map[string]any{"defaultServiceAccounts": map[string]any{"default": secretish},
			"schema": map[string]any{"apiVersion": "v1alpha1", "kind": "Web", "spec": map[string]any{"name": "string"}}}}}
	if _, err := ri.Create(ctx, rgd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	r := ug(t, "check", "--chart", rev2, "--release", "kro", "-n", "kro", "-o", "json")
	if r.code != cli.ExitFindings {
		t.Fatalf("check exit %d, want 1\n%s%s", r.code, r.stdout, r.stderr)
	}
	rep := report(t, r)
	if got := verdicts(rep)[predict.DataLoss]; len(got) != 1 || got[0] != crd {
		t.Fatalf("verdicts %v, want %s data-loss", verdicts(rep), crd)
	}
	text := ug(t, "check", "--chart", rev2, "--release", "kro", "-n", "kro")
	for _, want := range []string{"data loss: spec.defaultServiceAccounts is dropped at v1alpha1 from 1 objects (web)",
		"upgradeguard.io/allow-field-loss=true", "data-loss"} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}
	if strings.Contains(text.stdout+r.stdout, secretish) {
		t.Errorf("a field's value reached the output")
	}

	// The API server accepts the upgrade: nothing fails, and the field is gone.
	mustHelm(t, nil, "upgrade", "kro", rev2, "-n", "kro")
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := ri.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, found, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", "defaultServiceAccounts")
		return !found, nil
	})
	if err != nil {
		t.Fatalf("after the real upgrade spec.defaultServiceAccounts is still served: %v", err)
	}
}
