package audit_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/pkg/audit"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

const argoNS = "argo-audit"

// createApplication writes an Application with its spec and status in one write, as
// Argo CD does: its CRD has no status subresource.
func createApplication(t *testing.T, name string, source map[string]any, status map[string]any) {
	t.Helper()
	ri := dynamic.NewForConfigOrDie(cp.Config).Resource(argocd.ApplicationGVR).Namespace(argoNS)
	app := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
		"metadata": map[string]any{"name": name, "namespace": argoNS},
		"spec": map[string]any{"project": "default", "source": source,
			"destination": map[string]any{"server": argocd.InClusterServer, "namespace": "apps"}},
		"status": status,
	}}
	if _, err := ri.Create(t.Context(), app, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := ri.Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := got.Object["status"]; !ok {
		t.Fatalf("Application %s: the API server dropped its status", name)
	}
	t.Cleanup(func() {
		if err := ri.Delete(context.WithoutCancel(t.Context()), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Application %s: %v", name, err)
		}
	})
}

func resources(kinds ...[3]string) map[string]any {
	var out []any
	for _, k := range kinds {
		out = append(out, map[string]any{"group": k[0], "version": "v1", "kind": k[1], "name": k[2], "status": "Synced"})
	}
	return map[string]any{"resources": out, "sync": map[string]any{"status": "Synced"}}
}

var (
	widgetsCRD = [3]string{"apiextensions.k8s.io", "CustomResourceDefinition", "widgets.example.com"}
	configMap  = [3]string{"", "ConfigMap", "settings"}
	widgetsSVM = [3]string{"storagemigration.k8s.io", "StorageVersionMigration", "widgets-v1"}
)

// installCRDGate creates the CRD gate's MutatingWebhookConfiguration exactly as
// config/webhook/manifests.yaml ships it (its service does not exist here; it fails
// open), and removes it when the test ends.
func installCRDGate(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile("../../config/webhook/manifests.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.All(string(data))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range objs {
		if u.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		var c admissionv1.MutatingWebhookConfiguration
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &c); err != nil {
			t.Fatal(err)
		}
		api := kubernetes.NewForConfigOrDie(cp.Config).AdmissionregistrationV1().MutatingWebhookConfigurations()
		if _, err := api.Create(t.Context(), &c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := api.Delete(context.WithoutCancel(t.Context()), c.Name, metav1.DeleteOptions{}); err != nil {
				t.Errorf("delete MutatingWebhookConfiguration %s: %v", c.Name, err)
			}
		})
		return
	}
	t.Fatal("config/webhook/manifests.yaml has no MutatingWebhookConfiguration")
}

func byApplication(rep *audit.Report) map[string]audit.Application {
	return indexed(rep.Applications, func(a audit.Application) string { return a.Subject })
}

func findingCodes(a audit.Application) []string { return findingChecks(a.Findings) }

// TestAuditArgoCDApplications: Applications whose resource tree holds CRDs are listed
// with who protects their sync: an upstream PreSync hook switched on by their
// parameters, a bundled StorageVersionMigration, and, once its webhook is installed and
// the controller runs, upgradeguard's CRD gate. An Application without CRDs is not
// listed.
func TestAuditArgoCDApplications(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	if err := argocd.InstallApplicationCRD(ctx, apiextclient.NewForConfigOrDie(cp.Config)); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: argoNS}}
	if _, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	flux := func(version string, helm map[string]any) map[string]any {
		return map[string]any{"repoURL": "https://fluxcd-community.github.io/helm-charts", "chart": "flux2", "targetRevision": version, "helm": helm}
	}
	hookOn := resources(widgetsCRD)
	hookOn["sync"] = map[string]any{"status": "Synced", "revision": "2.18.3"}
	createApplication(t, "flux-hook", flux("~2.18", map[string]any{"parameters": []any{map[string]any{"name": "crds.migration.enabled", "value": "true"}}}), hookOn)
	createApplication(t, "flux-old", flux("2.18.2", map[string]any{"valuesObject": map[string]any{"crds": map[string]any{"migration": map[string]any{"enabled": true}}}}),
		resources(widgetsCRD))
	git := map[string]any{"repoURL": "https://git.example.com/widgets", "path": "deploy/chart", "targetRevision": "main"}
	createApplication(t, "plain", git, resources(widgetsCRD, configMap))
	createApplication(t, "bundled", git, resources(widgetsCRD, widgetsSVM))
	createApplication(t, "no-crds", git, resources(configMap))

	want := map[string][]string{
		"Application/argo-audit/flux-hook": {"upstream hook flux-migrate"},
		"Application/argo-audit/flux-old":  nil,
		"Application/argo-audit/plain":     nil,
		"Application/argo-audit/bundled":   {"bundled StorageVersionMigration widgets-v1"},
	}
	assertSync := func(rep *audit.Report, want map[string][]string) {
		t.Helper()
		got := map[string][]string{}
		for s, a := range byApplication(rep) {
			got[s] = a.Sync.By
			if a.Protected != (len(a.Sync.By) > 0) || (!a.Protected && !slices.Contains(findingCodes(a), audit.CodeNoProtection)) {
				t.Errorf("%s: protected %v by %v, findings %v", s, a.Protected, a.Sync.By, findingCodes(a))
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("who protects each sync (-want +got):\n%s", diff)
		}
	}

	rep := run(t, argoNS)
	assertSync(rep, want)
	apps := byApplication(rep)
	if a := apps["Application/argo-audit/bundled"]; !slices.Contains(findingCodes(a), audit.CodeBundledMigrationOnly) || !slices.Equal(a.CRDs, []string{widgetsCRD[2]}) {
		t.Errorf("bundled: findings %v, CRDs %v", findingCodes(a), a.CRDs)
	}
	// Each finding names the check of that very Application.
	for _, name := range []string{"bundled", "plain"} {
		check := cmdline.CheckApplication{Namespace: argoNS, Name: name}.String()
		for _, f := range apps["Application/"+argoNS+"/"+name].Findings {
			if !strings.Contains(f.Message, "`"+check+"`") {
				t.Errorf("%s: finding %s does not name `%s`: %s", name, f.Check, check, f.Message)
			}
		}
	}
	if a := apps["Application/argo-audit/flux-hook"]; a.Version != "2.18.3" || len(a.Mechanisms) != 1 || !a.Mechanisms[0].On {
		t.Errorf("flux-hook: version %q (want the synced 2.18.3), mechanisms %+v", a.Version, a.Mechanisms)
	}
	if a := apps["Application/argo-audit/flux-old"]; len(a.Mechanisms) != 1 || a.Mechanisms[0].Exists {
		t.Errorf("flux-old: mechanisms %+v, want flux-migrate not in 2.18.2", a.Mechanisms)
	}
	if s := rep.Summary; s.Applications != 4 || s.ApplicationsProtected != 2 || !rep.Unprotected() || rep.CRDGate == nil || rep.CRDGate.Installed {
		t.Errorf("summary %+v, gate %+v: want 2/4 Applications protected and no gate", s, rep.CRDGate)
	}

	// The gate's webhook alone protects nothing: it fails open without the controller.
	installCRDGate(t)
	rep = run(t, argoNS)
	assertSync(rep, want)
	if g := rep.CRDGate; g == nil || !g.Installed || g.Running || g.Configuration != "upgradeguard" {
		t.Errorf("gate %+v, want installed (upgradeguard), not running", g)
	}

	// With the controller running, the gate protects every sync.
	startController(t, argoNS)
	rep = run(t, argoNS)
	gated := map[string][]string{}
	for s, by := range want {
		gated[s] = append(slices.Clone(by), audit.ByCRDGate)
	}
	assertSync(rep, gated)
	if rep.Unprotected() || rep.Summary.ApplicationsProtected != 4 {
		t.Errorf("with the gate running: summary %+v", rep.Summary)
	}
}
