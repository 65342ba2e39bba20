package fluxgate_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

const sprocketGroup = "rollback.upgradeguard.io"

// sprocketChart is the chart "sprockets" at version: templates/ render the Sprocket CRD
// serving versions (the last the storage version) and, when broken, a ConfigMap the API
// server rejects (a Service with port 0), which fails the upgrade after the CRD is applied
// (Helm applies CRDs before Services, and stops at the first failure).
func sprocketChart(t *testing.T, version string, broken bool, versions ...string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: sprockets.%s\nspec:\n  group: %s\n  names: {kind: Sprocket, listKind: SprocketList, plural: sprockets, singular: sprocket}\n  scope: Namespaced\n  versions:\n", sprocketGroup, sprocketGroup)
	for i, v := range versions {
		fmt.Fprintf(&b, "  - name: %s\n    served: true\n    storage: %t\n    schema:\n      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}\n", v, i == len(versions)-1)
	}
	files := map[string]string{"templates/crd.yaml": b.String()}
	if broken {
		files["templates/broken.yaml"] = "apiVersion: v1\nkind: Service\nmetadata:\n  name: broken\nspec:\n  ports:\n  - port: 0\n"
	}
	dir, err := testenv.WriteChart(filepath.Join(t.TempDir(), version), "sprockets", version, files)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRemediationRollbackNeedsReverseMigration: helm-controller upgrades sprockets 1.0.0
// (v1alpha1 only) to 2.0.0 (v1alpha1 and v1, storage v1), which the gates admit: the CRD
// is applied, storage moves to v1, and then the upgrade fails on another object. Its
// remediation (strategy rollback) rolls back to 1.0.0, whose CRD drops the live storage
// version v1: the API server would reject it half-way. The release-record gate denies
// helm-controller's pending-rollback record with the reverse migration to run; the
// rollback applies nothing (the CRD keeps 2.0.0's spec, every object stays readable) and
// the reason is on the HelmRelease.
func TestRemediationRollbackNeedsReverseMigration(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	ns := "rollback-reverse"
	if err := env.Flux.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	repo, err := testenv.NewChartRepo(filepath.Join(t.TempDir(), "repo"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	for _, dir := range []string{sprocketChart(t, "1.0.0", false, "v1alpha1"), sprocketChart(t, "2.0.0", true, "v1alpha1", "v1")} {
		if err := repo.Add(dir); err != nil {
			t.Fatal(err)
		}
	}
	src := testenv.HelmRepository(ns, "charts", repo.URL)
	if err := env.Flux.Client.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	hr := testenv.HelmReleaseFromRepository(ns, "sprockets", "charts", "sprockets", "1.0.0")
	strategy := helmv2.RollbackRemediationStrategy
	hr.Spec.Upgrade = &helmv2.Upgrade{Remediation: &helmv2.UpgradeRemediation{Retries: 1, Strategy: &strategy}}
	if err := env.Flux.Client.Create(ctx, hr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_ = env.Flux.Client.Delete(ctx, hr)
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			return apierrors.IsNotFound(env.Flux.Client.Get(ctx, client.ObjectKeyFromObject(hr), &helmv2.HelmRelease{})), nil
		})
		_ = env.Flux.Client.Delete(ctx, &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "sprockets." + sprocketGroup}})
	})
	if _, err := env.Flux.WaitHelmRelease(ctx, ns, "sprockets", 3*time.Minute, testenv.ReadyAtGeneration(metav1.ConditionTrue)); err != nil {
		t.Fatalf("%v\n%s", err, env.Flux.LogTail(20))
	}
	dyn := dynamic.NewForConfigOrDie(env.CP.Config)
	gvr := schema.GroupVersionResource{Group: sprocketGroup, Resource: "sprockets"}
	for i := range 2 {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": sprocketGroup + "/v1alpha1", "kind": "Sprocket",
			"metadata": map[string]any{"name": fmt.Sprintf("s-%d", i)}, "spec": map[string]any{"teeth": int64(12)}}}
		gvr.Version = "v1alpha1"
		if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	if err := env.Flux.Update(ctx, hr, func() { hr.Spec.Chart.Spec.Version = "2.0.0" }); err != nil {
		t.Fatalf("the version bump to 2.0.0 (safe for its CRD): %v", err)
	}
	var msgs []string
	last, err := env.Flux.WaitHelmRelease(ctx, ns, "sprockets", 4*time.Minute, func(hr *helmv2.HelmRelease) bool {
		m := readyMessage(hr)
		if len(msgs) == 0 || msgs[len(msgs)-1] != m {
			msgs = append(msgs, m)
		}
		return strings.Contains(m, `admission webhook "release.upgradeguard.io" denied the request`)
	})
	if err != nil {
		t.Fatalf("the remediation rollback was not held: %v\nReady messages:\n%s\n%s", err, strings.Join(msgs, "\n"), env.Flux.LogTail(30))
	}
	msg := readyMessage(last)
	t.Logf("Ready messages: %s", strings.Join(msgs, "\n  "))
	for _, want := range []string{
		"upgradeguard denied the rollback of release rollback-reverse/sprockets to revision 1 (chart sprockets@1.0.0",
		"before anything was applied", "live storage version v1 is dropped by the incoming CRD",
		"upgradeguard migrate --rollback --release sprockets -n rollback-reverse --to-revision 1 --allow-storage-switch",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Ready message lacks %q:\n%s", want, msg)
		}
	}
	// The rollback applied nothing: 2.0.0's CRD is live, storage v1, objects readable.
	var crd apiextv1.CustomResourceDefinition
	if err := env.Flux.Client.Get(ctx, client.ObjectKey{Name: "sprockets." + sprocketGroup}, &crd); err != nil {
		t.Fatal(err)
	}
	var served []string
	for _, v := range crd.Spec.Versions {
		served = append(served, v.Name)
	}
	if !slices.Equal(served, []string{"v1alpha1", "v1"}) || !slices.Equal(crd.Status.StoredVersions, []string{"v1alpha1", "v1"}) {
		t.Errorf("the CRD after the held rollback: versions %v storedVersions %v, want 2.0.0's", served, crd.Status.StoredVersions)
	}
	gvr.Version = "v1"
	if list, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 2 {
		t.Errorf("sprockets at v1 after the held rollback: %v", err)
	}
	// No rollback revision was stored; the failed upgrade is the last revision.
	out, err := env.CP.Helm("history", "sprockets", "-n", ns, "-o", "json").CombinedOutput()
	if err != nil {
		t.Fatalf("helm history: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "Rollback to") {
		t.Errorf("a rollback revision was stored: %s", out)
	}
	st := webhook.ParseState(&last.ObjectMeta)
	if st.Decision != webhook.OutcomeBlocked || !strings.Contains(st.Message, "rollback of release rollback-reverse/sprockets") {
		t.Errorf("gate annotation on the HelmRelease = %+v, want blocked with the rollback's reason", st)
	}
}
