package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
)

// TestBridgeDenialNamesPlan: a HelmRelease on a chart whose CRD stores at v1alpha1 only
// moves to a version that keeps only v1 (Crossplane's CompositionRevision, 1.10 -> 2.0,
// under a group of its own). The gate denies it and names the plan command; that
// command, run through the CLI, gives the spec.chart.spec.version values to commit
// (the stepping stone, then the target) with the migration between them, and the gate
// admits the first value, as the plan predicts.
func TestBridgeDenialNamesPlan(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	const ns, release = "planhr", "planhr"
	steppingStoneRelease(t, ns, release)

	const planCmd = "upgradeguard plan --helmrelease planhr/planhr --version 2.0.0"
	mustDeny(t, setVersion(ctx, s.c, ns, release, "2.0.0"), "The whole safe path: "+planCmd)

	var out, errOut bytes.Buffer
	args := append([]string{"--kubeconfig", s.cp.Kubeconfig}, strings.Fields(planCmd)[1:]...)
	code := cli.Execute(ctx, append(args, "-o", "json"), cli.Streams{Out: &out, ErrOut: &errOut})
	if code != cli.ExitFindings {
		t.Fatalf("plan exit %d, want 1\n%s%s", code, out.String(), errOut.String())
	}
	var p plan.Plan
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatalf("plan -o json: %v\n%s", err, out.String())
	}
	var versions []string
	for _, st := range p.Steps {
		versions = append(versions, string(st.Kind)+" "+st.ChartVersion)
		if st.Kind == plan.Upgrade && !strings.Contains(st.Commands[0], `spec.chart.spec.version: "`+st.ChartVersion+`"`) {
			t.Errorf("step %q does not name the spec.chart.spec.version value to commit", st.Commands[0])
		}
	}
	if !slices.Equal(versions, []string{"upgrade 1.12.2", "migrate ", "upgrade 2.0.0"}) || p.From != "1.10.2" {
		t.Fatalf("plan from %s: %v, want 1.12.2, migrate, 2.0.0", p.From, versions)
	}
	if err := setVersion(ctx, s.c, ns, release, p.Steps[0].ChartVersion); err != nil {
		t.Errorf("the gate denied the plan's first step (%s): %v", p.Steps[0].ChartVersion, err)
	}
}

// TestCRDGateBridgeNamesApplication: a CRD that an Argo CD Application syncs (its
// resource tree lists it; Argo CD leaves CRDs untracked) stores at v1alpha1 only; an
// update that keeps only v1 is a bridge. The CRD gate denies it naming the Application,
// its plan command and how to go on: Argo CD stores no Helm release, so nothing else
// could name them.
func TestCRDGateBridgeNamesApplication(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	const ns = "crdbridge"
	namespace(t, s.c, ns)
	crdName := "bridgeboxes." + gadgetGroup
	if err := argocd.InstallApplicationCRD(ctx, apiextclient.NewForConfigOrDie(s.cp.Config)); err != nil {
		t.Fatal(err)
	}
	app := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
		"metadata": map[string]any{"namespace": ns, "name": "boxes"},
		"spec":     map[string]any{"project": "default"},
		"status": map[string]any{"resources": []any{
			map[string]any{"group": "apiextensions.k8s.io", "version": "v1", "kind": "CustomResourceDefinition", "name": crdName, "status": "Synced"},
		}},
	}}
	apps := dynamic.NewForConfigOrDie(s.cp.Config).Resource(argoapp.GVR).Namespace(ns)
	if _, err := apps.Create(ctx, app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := apps.Delete(context.WithoutCancel(ctx), "boxes", metav1.DeleteOptions{}); err != nil {
			t.Errorf("clean-up: delete Application %s/boxes: %v", ns, err)
		}
	})
	err := bridgeDenied(t, ns, "bridgeboxes", nil)
	mustContain(t, err.Error(), `admission webhook "crd.upgradeguard.io" denied the request`,
		"upgradeguard denied the update of CustomResourceDefinition "+crdName+", which drops v1alpha1 from spec.versions while status.storedVersions still lists it (the API server rejects it), applied for Argo CD Application crdbridge/boxes",
		crdName+": live storage version v1alpha1 is dropped by the incoming CRD ([v1]): a migration alone cannot help",
		"then sync Application crdbridge/boxes again (or roll it back again)",
		"The whole safe path: upgradeguard plan --argocd-app crdbridge/boxes")
}

// TestCRDGateBridgePlanByOwner: the CRD gate judges one CRD write and knows no chart. A
// bridge denial of a CRD a Helm release applies (its meta.helm.sh annotations) names that
// release's plan command with CHART to fill in; one of a CRD nobody claims names no plan
// command, rather than one that cannot run.
func TestCRDGateBridgePlanByOwner(t *testing.T) {
	skipShort(t)
	const ns = "crdbridgeowner"
	namespace(t, s.c, ns)
	err := bridgeDenied(t, ns, "releaseboxes", map[string]string{"meta.helm.sh/release-name": "boxes", "meta.helm.sh/release-namespace": ns})
	mustContain(t, err.Error(), "releaseboxes."+gadgetGroup+": live storage version v1alpha1 is dropped",
		"The whole safe path: upgradeguard plan --release boxes -n crdbridgeowner --chart CHART")

	err = bridgeDenied(t, ns, "lonelyboxes", nil)
	mustContain(t, err.Error(), "lonelyboxes."+gadgetGroup+": live storage version v1alpha1 is dropped", "then retry the update")
	if strings.Contains(err.Error(), "upgradeguard plan") {
		t.Errorf("the denial of a CRD nobody claims names a plan command: %v", err)
	}
}

// bridgeDenied applies the CRD of plural (with annotations) storing v1alpha1, creates two
// objects, then applies it keeping only v1 (a bridge) and returns the CRD gate's denial.
// Nothing may have changed: storedVersions and the objects stay at v1alpha1. The CRD is
// deleted when the test ends.
func bridgeDenied(t *testing.T, ns, plural string, annotations map[string]string) error {
	t.Helper()
	ctx := t.Context()
	apply := func(versions ...string) error {
		var crd apiextv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(gadgetCRD(plural, versions...)), &crd); err != nil {
			t.Fatal(err)
		}
		crd.Annotations = annotations
		return testenv.ApplyCRDServerSide(ctx, s.cp.Config, &crd, "argocd-controller")
	}
	name := plural + "." + gadgetGroup
	t.Cleanup(func() {
		if err := s.cp.DeleteCRDs(context.WithoutCancel(ctx), func(c *apiextv1.CustomResourceDefinition) bool { return c.Name != name }); err != nil {
			t.Errorf("clean-up: delete CRD %s: %v", name, err)
		}
	})
	if err := apply("v1alpha1"); err != nil {
		t.Fatal(err)
	}
	readable := createObjects(t, ns, plural, "v1alpha1", 2)
	err := apply("v1")
	if err == nil {
		t.Fatalf("the CRD update of %s dropping the storage version v1alpha1 was accepted; want it denied", plural)
	}
	mustContain(t, err.Error(), `admission webhook "crd.upgradeguard.io" denied the request`)
	if got := liveCRD(t, name).Status.StoredVersions; !slices.Equal(got, []string{"v1alpha1"}) {
		t.Errorf("%s storedVersions = %v, want [v1alpha1]", name, got)
	}
	if n := readable("v1alpha1"); n != 2 {
		t.Errorf("%d objects of %s readable at v1alpha1, want 2", n, name)
	}
	return err
}
