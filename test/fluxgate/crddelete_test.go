package fluxgate_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

// The CRD deletion cases under the real helm-controller: kubernetes-sigs/lws#880, where
// lws 0.7.0 renders the LeaderWorkerSet CRD from templates/ and 0.8.0 ships it in crds/.
// Helm skips crds/ for a CRD that exists and deletes what left the release manifest, so
// the upgrade deletes the CRD and every LeaderWorkerSet; so does an uninstall of 0.7.0.

// lwsObjects is how many LeaderWorkerSets each case holds.
const lwsObjects = 3

const (
	lwsTemplates = "0.7.0" // the CRD in templates/
	lwsCRDsDir   = "0.8.0" // the same CRD in crds/
	// lwsConfigMap is the ConfigMap both chart versions render, with their version.
	lwsConfigMap = "lws-chart-version"
)

// lwsRelease is a HelmRelease "lws" in its own namespace that installed lws 0.7.0 from a
// loopback chart repository, and the LeaderWorkerSets created since.
type lwsRelease struct {
	ns, crd string
	key     types.NamespacedName
	repo    *servers.ChartRepo
	source  client.Object
	charts  map[string]string
	objects dynamic.ResourceInterface
	group   string
}

// lwsCharts writes the two lws chart versions with the real CRDs of the fixture charts
// (lws-0.7.0's from templates/, lws-0.8.0's from crds/), their API group renamed to group
// so that each case has a CRD of its own, and a ConfigMap with the chart version. The
// real charts' controller Deployment, webhooks and RBAC are left out: there is no
// kubelet, and the lws webhooks would refuse every LeaderWorkerSet with nothing serving
// them.
func lwsCharts(t *testing.T, group string) map[string]string {
	t.Helper()
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	crd := func(file string) string {
		data, err := os.ReadFile(filepath.Join(fx, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.ReplaceAll(string(data), testenv.LWSGroup, group)
	}
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: " + lwsConfigMap + "\ndata:\n  version: {{ .Chart.Version | quote }}\n"
	dir := t.TempDir()
	out := map[string]string{}
	for version, files := range map[string]map[string]string{
		lwsTemplates: {"templates/crds/leaderworkersets.yaml": crd(testenv.LWSCRDFile), "templates/configmap.yaml": cm},
		lwsCRDsDir:   {"crds/leaderworkersets.yaml": crd("charts/lws-0.8.0/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml"), "templates/configmap.yaml": cm},
	} {
		path, err := testenv.WriteChart(filepath.Join(dir, version), "lws", version, files)
		if err != nil {
			t.Fatal(err)
		}
		out[version] = path
	}
	return out
}

// installLWS serves the lws charts of group (0.7.0, and the versions in also), installs
// the HelmRelease lws in ns at version (a version or a range), waits until helm-controller
// has deployed 0.7.0, and creates lwsObjects LeaderWorkerSets. Cleanup lets the CRD go
// (upgradeguard.io/allow-delete), deletes the HelmRelease (helm-controller uninstalls
// it), its source and the CRD.
func installLWS(t *testing.T, ns, group, version string, also ...string) *lwsRelease {
	t.Helper()
	ctx := t.Context()
	r := &lwsRelease{ns: ns, group: group, crd: "leaderworkersets." + group, key: types.NamespacedName{Namespace: ns, Name: "lws"}, charts: lwsCharts(t, group)}
	if err := env.Flux.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	repo, err := servers.NewChartRepo(filepath.Join(t.TempDir(), "repo"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(repo.Close)
	r.repo = repo
	for _, v := range append([]string{lwsTemplates}, also...) {
		if err := repo.Add(r.charts[v]); err != nil {
			t.Fatal(err)
		}
	}
	r.source = flux.HelmRepository(ns, "lws", repo.URL)
	if err := env.Flux.Client.Create(ctx, r.source); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.cleanup(t) })
	if err := env.Flux.Client.Create(ctx, flux.HelmReleaseFromRepository(ns, "lws", "lws", "lws", version)); err != nil {
		t.Fatal(err)
	}
	hr, err := env.Flux.WaitHelmRelease(ctx, ns, "lws", 3*time.Minute, func(hr *helmv2.HelmRelease) bool {
		l := hr.Status.History.Latest()
		return flux.ReadyAtGeneration(metav1.ConditionTrue)(hr) && l != nil && l.ChartVersion == lwsTemplates
	})
	if err != nil {
		t.Fatalf("install lws %s: %v\n%s", lwsTemplates, err, env.Flux.LogTail(20))
	}
	if l := hr.Status.History.Latest(); l.Version != 1 {
		t.Fatalf("installed at revision %d, want 1", l.Version)
	}
	if err := testenv.CreateLeaderWorkerSets(ctx, env.CP.Config, group, ns, lwsObjects); err != nil {
		t.Fatal(err)
	}
	r.objects = dynamic.NewForConfigOrDie(env.CP.Config).Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: "leaderworkersets"}).Namespace(ns)
	var crd apiextv1.CustomResourceDefinition
	if err := env.Flux.Client.Get(ctx, client.ObjectKey{Name: r.crd}, &crd); err != nil {
		t.Fatal(err)
	}
	// The premise: helm-controller applied the CRD from templates/ and labelled it with
	// its HelmRelease, which the guard reads.
	if crd.Labels[webhook.LabelFluxName] != "lws" || crd.Labels[webhook.LabelFluxNamespace] != ns || crd.Annotations["meta.helm.sh/release-name"] != "lws" {
		t.Fatalf("CRD %s labels %v annotations %v, want it applied by HelmRelease %s/lws", r.crd, crd.Labels, crd.Annotations, ns)
	}
	return r
}

func (r *lwsRelease) cleanup(t *testing.T) {
	ctx := context.WithoutCancel(t.Context())
	if err := env.CP.AllowCRDDeletion(ctx, func(c *apiextv1.CustomResourceDefinition) bool { return c.Name == r.crd }); err != nil {
		t.Errorf("allow the deletion of %s: %v", r.crd, err)
	}
	hr := &helmv2.HelmRelease{}
	if err := env.Flux.Client.Get(ctx, r.key, hr); err == nil {
		_ = env.Flux.Client.Delete(ctx, hr)
		// helm-controller retries a failed uninstall with back-off: ask it to try now.
		_, _ = env.Flux.RequestReconcile(ctx, hr)
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			err := env.Flux.Client.Get(ctx, r.key, &helmv2.HelmRelease{})
			return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
		})
		if err != nil {
			// The uninstall did not finish: drop the finalizer so the next test runs.
			_ = env.Flux.Update(ctx, hr, func() { hr.Finalizers = nil })
		}
	}
	_ = env.Flux.Client.Delete(ctx, r.source)
	if err := env.CP.DeleteCRDs(ctx, func(c *apiextv1.CustomResourceDefinition) bool { return c.Name != r.crd }); err != nil {
		t.Errorf("delete %s: %v", r.crd, err)
	}
}

// publish adds the chart version to the repository and asks source-controller to fetch
// the index, as the HelmRepository's interval would.
func (r *lwsRelease) publish(t *testing.T, version string) {
	t.Helper()
	if err := r.repo.Add(r.charts[version]); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Flux.RequestReconcile(t.Context(), r.source); err != nil {
		t.Fatal(err)
	}
}

// intact asserts that the CRD is there, established and not being deleted, and that every
// LeaderWorkerSet reads back whole.
func (r *lwsRelease) intact(t *testing.T, when string) {
	t.Helper()
	ctx := t.Context()
	var crd apiextv1.CustomResourceDefinition
	if err := env.Flux.Client.Get(ctx, client.ObjectKey{Name: r.crd}, &crd); err != nil {
		t.Errorf("%s: CRD %s: %v", when, r.crd, err)
		return
	}
	if crd.DeletionTimestamp != nil || !apihelpers.IsCRDConditionTrue(&crd, apiextv1.Established) {
		t.Errorf("%s: CRD %s deleting since %v, established %t", when, r.crd, crd.DeletionTimestamp, apihelpers.IsCRDConditionTrue(&crd, apiextv1.Established))
	}
	list, err := r.objects.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("%s: list LeaderWorkerSets: %v", when, err)
		return
	}
	if len(list.Items) != lwsObjects {
		t.Errorf("%s: %d LeaderWorkerSets, want %d", when, len(list.Items), lwsObjects)
	}
	for i := range lwsObjects {
		u, err := r.objects.Get(ctx, fmt.Sprintf("obj-%d", i), metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: LeaderWorkerSet obj-%d: %v", when, i, err)
			continue
		}
		if _, found, _ := unstructured.NestedMap(u.Object, "spec", "leaderWorkerTemplate", "workerTemplate"); !found {
			t.Errorf("%s: LeaderWorkerSet obj-%d lost its spec: %v", when, i, u.Object["spec"])
		}
	}
}

// condition is the HelmRelease's condition typ, or a zero one.
func condition(hr *helmv2.HelmRelease, typ string) metav1.Condition {
	if c := apimeta.FindStatusCondition(hr.Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// configMapVersion is the chart version that last wrote the release's ConfigMap, or ""
// when it is gone.
func (r *lwsRelease) configMapVersion(t *testing.T) string {
	t.Helper()
	cm := &corev1.ConfigMap{}
	err := env.Flux.Client.Get(t.Context(), types.NamespacedName{Namespace: r.ns, Name: lwsConfigMap}, cm)
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return cm.Data["version"]
}

// history is `helm history` of the release as "REVISION STATUS CHART".
func (r *lwsRelease) history(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, rev := range fluxtest.History(t, env, r.ns, "lws") {
		out = append(out, fmt.Sprintf("%d %s %s", rev.Revision, rev.Status, rev.Chart))
	}
	return out
}

func (r *lwsRelease) helmRelease(t *testing.T) *helmv2.HelmRelease {
	t.Helper()
	hr := &helmv2.HelmRelease{}
	if err := env.Flux.Client.Get(t.Context(), r.key, hr); err != nil {
		t.Fatal(err)
	}
	return hr
}

// describe is what helm-controller reports on a HelmRelease: its counters and the Ready,
// Released, Stalled and Reconciling conditions with reason and message.
func describe(hr *helmv2.HelmRelease) string {
	var b strings.Builder
	fmt.Fprintf(&b, "generation %d observed %d failures %d installFailures %d upgradeFailures %d", hr.Generation, hr.Status.ObservedGeneration,
		hr.Status.Failures, hr.Status.InstallFailures, hr.Status.UpgradeFailures)
	if hr.DeletionTimestamp != nil {
		fmt.Fprintf(&b, " deleting (finalizers %v)", hr.Finalizers)
	}
	for _, typ := range []string{meta.ReadyCondition, helmv2.ReleasedCondition, meta.StalledCondition, meta.ReconcilingCondition} {
		if c := apimeta.FindStatusCondition(hr.Status.Conditions, typ); c != nil {
			msg := c.Message
			if len(msg) > 600 {
				msg = msg[:600] + "..."
			}
			fmt.Fprintf(&b, "\n    %s=%s %s: %s", c.Type, c.Status, c.Reason, msg)
		}
	}
	return b.String()
}

// followTimeout bounds follow: helm-controller's retries come on its back-off.
const followTimeout = 4 * time.Minute

// follow watches the HelmRelease from resourceVersion since until done says so (or, with
// gone, until it is deleted), within followTimeout, and returns its last state and every
// distinct state (describe) it went through.
func (r *lwsRelease) follow(t *testing.T, since string, done func(hr *helmv2.HelmRelease, gone bool) bool) (*helmv2.HelmRelease, []string) {
	t.Helper()
	wc, err := client.NewWithWatch(env.CP.Config, client.Options{Scheme: flux.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), followTimeout)
	defer cancel()
	w, err := wc.Watch(ctx, &helmv2.HelmReleaseList{}, client.InNamespace(r.ns),
		client.MatchingFields{"metadata.name": r.key.Name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: since}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var states []string
	for ev := range w.ResultChan() {
		hr, ok := ev.Object.(*helmv2.HelmRelease)
		if !ok {
			t.Fatalf("watching HelmRelease %s: %v event %v", r.key, ev.Type, ev.Object)
		}
		if s := describe(hr); len(states) == 0 || states[len(states)-1] != s {
			states = append(states, s)
		}
		if done(hr, ev.Type == watch.Deleted) {
			return hr, states
		}
	}
	t.Fatalf("HelmRelease %s: not done within %s; states seen:\n  %s\n%s", r.key, followTimeout, strings.Join(states, "\n  "), env.Flux.LogTail(30))
	return nil, nil
}

// events are the events in the release's namespace about the HelmRelease, as "Type
// Reason: note".
func (r *lwsRelease) events(t *testing.T) []string {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(env.CP.Config)
	evs, err := cs.EventsV1().Events(r.ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.Regarding.Kind == helmv2.HelmReleaseKind && e.Regarding.Name == r.key.Name {
			out = append(out, eventString(e))
		}
	}
	return out
}

// crdEvents are the events about the CRD (cluster-scoped: in the default namespace).
func (r *lwsRelease) crdEvents(t *testing.T) []string {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(env.CP.Config)
	evs, err := cs.EventsV1().Events(metav1.NamespaceAll).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.Regarding.Kind == "CustomResourceDefinition" && e.Regarding.Name == r.crd {
			out = append(out, eventString(e))
		}
	}
	return out
}

func eventString(e eventsv1.Event) string {
	n := int32(1)
	if e.Series != nil {
		n = e.Series.Count
	} else if e.DeprecatedCount > 0 {
		n = e.DeprecatedCount
	}
	return fmt.Sprintf("%s %s (x%d, %s): %s", e.Type, e.Reason, n, e.ReportingController, e.Note)
}

func hasEvent(events []string, prefix string, contains ...string) bool {
	return slices.ContainsFunc(events, func(e string) bool {
		if !strings.HasPrefix(e, prefix) {
			return false
		}
		for _, c := range contains {
			if !strings.Contains(e, c) {
				return false
			}
		}
		return true
	})
}

func mustContain(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

// objectCount is how the gates count the LeaderWorkerSets a deletion would take.
var objectCount = fmt.Sprintf("all %d LeaderWorkerSet objects", lwsObjects)

// movedReason is the deletion model's reason for the CRD of the upgrade to 0.8.0.
func (r *lwsRelease) movedReason() string {
	return r.crd + ": the upgrade target moves it from templates/ to crds/, which is not part of the release manifest, so Helm deletes the CRD and " + objectCount
}

// annotateHR sets annotations on the HelmRelease: reconcile.fluxcd.io/requestedAt (what
// `flux reconcile helmrelease` sets), with reconcile.fluxcd.io/resetAt too for --reset.
func (r *lwsRelease) annotateHR(t *testing.T, kv ...string) {
	t.Helper()
	hr := &helmv2.HelmRelease{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: r.key.Name}}
	if err := env.Flux.Update(t.Context(), hr, func() {
		if hr.Annotations == nil {
			hr.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			hr.Annotations[kv[i]] = kv[i+1]
		}
	}); err != nil {
		t.Fatal(err)
	}
}

// retryWithReset does what `flux reconcile helmrelease --reset` does.
func (r *lwsRelease) retryWithReset(t *testing.T) {
	t.Helper()
	token := time.Now().UTC().Format(time.RFC3339Nano)
	r.annotateHR(t, meta.ReconcileRequestAnnotation, token, "reconcile.fluxcd.io/resetAt", token)
}

// keepCRD does what a denied upgrade's message names: annotate the CRD
// helm.sh/resource-policy=keep, so that Helm leaves it and its objects.
func (r *lwsRelease) keepCRD(t *testing.T) {
	t.Helper()
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"helm.sh/resource-policy":"keep"}}}`))
	if err := env.Flux.Client.Patch(t.Context(), &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: r.crd}}, patch); err != nil {
		t.Fatal(err)
	}
}

// waitUpgraded waits until helm-controller reports Ready=True with 0.8.0 deployed, and
// checks the end state: history ends at 0.8.0 deployed, 0.8.0's ConfigMap, and the CRD
// and every LeaderWorkerSet in place (kept outside the release).
func (r *lwsRelease) waitUpgraded(t *testing.T, lastRevision int) {
	t.Helper()
	hr, err := env.Flux.WaitHelmRelease(t.Context(), r.ns, "lws", 3*time.Minute, func(hr *helmv2.HelmRelease) bool {
		l := hr.Status.History.Latest()
		return flux.ReadyAtGeneration(metav1.ConditionTrue)(hr) && l != nil && l.ChartVersion == lwsCRDsDir
	})
	if err != nil {
		t.Fatalf("the upgrade with the CRD kept: %v\n%s", err, env.Flux.LogTail(20))
	}
	t.Logf("after the upgrade with the CRD kept:\n  %s", describe(hr))
	h := r.history(t)
	if want := fmt.Sprintf("%d deployed lws-%s", lastRevision, lwsCRDsDir); len(h) != lastRevision || h[len(h)-1] != want {
		t.Errorf("helm history after the kept upgrade = %v, want %d revisions ending with %q", h, lastRevision, want)
	}
	if v := r.configMapVersion(t); v != lwsCRDsDir {
		t.Errorf("ConfigMap version %q after the kept upgrade, want %s", v, lwsCRDsDir)
	}
	r.intact(t, "after the kept upgrade")
}

// waitGateState waits until the gate annotation on the HelmRelease says blocked for
// operation with a message that contains want, and the HelmRelease has a Warning event
// with reason that contains want too.
func (r *lwsRelease) waitGateState(t *testing.T, operation, reason, want string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		st := webhook.ParseState(r.helmRelease(t))
		return st.Decision == webhook.OutcomeBlocked && st.Operation == operation && strings.Contains(st.Message, want) &&
			hasEvent(r.events(t), "Warning "+reason+" ", want), nil
	})
	if err != nil {
		t.Errorf("the gate's record on the HelmRelease: want blocked %s and a %s event with %q; annotation %+v, events:\n  %s",
			operation, reason, want, webhook.ParseState(r.helmRelease(t)), strings.Join(r.events(t), "\n  "))
	}
}

// TestCRDDeletionVersionBumpDeniedUnderFlux: the HelmRelease pinned to lws 0.7.0 is
// bumped to 0.8.0 (what a Git commit does). The HelmRelease gate renders 0.8.0, finds
// that Helm would delete the LeaderWorkerSet CRD with its objects, and denies the update:
// helm-controller never sees the change, the release stays at revision 1, and the CRD and
// every LeaderWorkerSet stay. The way on the denial names (keep the CRD) lets the same
// bump through, and the upgrade leaves the CRD and its objects in place.
func TestCRDDeletionVersionBumpDeniedUnderFlux(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	r := installLWS(t, "crd-delete-bump", "bump.lws.fluxgate.test", lwsTemplates, lwsCRDsDir)
	before := r.helmRelease(t)

	bump := func() error {
		hr := &helmv2.HelmRelease{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "lws"}}
		return env.Flux.Update(ctx, hr, func() { hr.Spec.Chart.Spec.Version = lwsCRDsDir })
	}
	err := bump()
	if err == nil {
		t.Fatalf("the bump to %s was admitted; want the HelmRelease gate to deny it", lwsCRDsDir)
	}
	t.Logf("the bump to %s: %v", lwsCRDsDir, err)
	mustContain(t, "the HelmRelease gate's denial", err.Error(),
		`admission webhook "helmrelease.upgradeguard.io" denied the request: upgradeguard denied`,
		r.movedReason(), "kubectl annotate crd "+r.crd+" helm.sh/resource-policy=keep")

	hr := r.helmRelease(t)
	if hr.Spec.Chart.Spec.Version != lwsTemplates || hr.Generation != before.Generation {
		t.Errorf("HelmRelease after the denied bump: version %s generation %d, want %s at %d", hr.Spec.Chart.Spec.Version, hr.Generation, lwsTemplates, before.Generation)
	}
	if l := hr.Status.History.Latest(); l == nil || l.Version != 1 || l.ChartVersion != lwsTemplates || !flux.ReadyAtGeneration(metav1.ConditionTrue)(hr) {
		t.Errorf("HelmRelease status after the denied bump, want Ready at revision 1:\n  %s", describe(hr))
	}
	if h := r.history(t); !slices.Equal(h, []string{"1 deployed lws-" + lwsTemplates}) {
		t.Errorf("helm history after the denied bump = %v, want revision 1 only", h)
	}
	if v := r.configMapVersion(t); v != lwsTemplates {
		t.Errorf("ConfigMap version %q after the denied bump, want %s", v, lwsTemplates)
	}
	r.intact(t, "after the denied bump")
	r.waitGateState(t, "upgrade", webhook.ReasonChartChangeBlocked, r.movedReason())

	// The way on: keep the CRD outside the release, and apply the bump again, as GitOps
	// does. The gate reads the live CRDs from memory, which may not hold the annotation
	// for a few milliseconds: an apply in that window is denied the same way again (the
	// conservative side of the gate's memory), and the next one is admitted.
	r.keepCRD(t)
	denied := 0
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		err := bump()
		if err != nil && strings.Contains(err.Error(), r.movedReason()) {
			denied++
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("the bump to %s with the CRD kept: %v (denied %d times for the deletion)", lwsCRDsDir, err, denied)
	}
	t.Logf("the bump with the CRD kept was admitted after %d denial(s) on memory that had not seen the annotation yet", denied)
	r.waitUpgraded(t, 2)
}

// TestCRDDeletionSourceMoveDeniedUnderFlux: the HelmRelease (version "0.x") never
// changes; the repository publishes lws 0.8.0 and helm-controller upgrades by itself. The
// release-record gate denies its pending-upgrade record, so the Helm upgrade applies and
// deletes nothing: the CRD and every LeaderWorkerSet stay, helm history keeps revision 1
// only, and the Ready message carries the denial and its next steps. helm-controller
// counts no upgrade failure (no release was stored), so it never stalls: it retries on
// its back-off, each attempt denied the same way. Keeping the CRD lets the upgrade
// through.
func TestCRDDeletionSourceMoveDeniedUnderFlux(t *testing.T) {
	needCluster(t)
	r := installLWS(t, "crd-delete-semver", "semver.lws.fluxgate.test", "0.x")
	since := r.helmRelease(t).ResourceVersion
	r.publish(t, lwsCRDsDir)
	hr, states := r.follow(t, since, func(hr *helmv2.HelmRelease, _ bool) bool {
		return hr.Status.Failures >= 3 || apimeta.IsStatusConditionTrue(hr.Status.Conditions, meta.StalledCondition) || hr.Status.UpgradeFailures > 0
	})
	t.Logf("helm-controller after 0.8.0 was published:\n  %s", strings.Join(states, "\n  "))
	prefix := fmt.Sprintf("Helm upgrade failed for release %s/lws with chart lws@%s: create: failed to create: "+
		`admission webhook "release.upgradeguard.io" denied the request: upgradeguard denied the upgrade of release %s/lws to revision 2 (chart lws@%s) from chart version %s before anything was applied`,
		r.ns, lwsCRDsDir, r.ns, lwsCRDsDir, lwsTemplates)
	for _, typ := range []string{meta.ReadyCondition, helmv2.ReleasedCondition} {
		c := condition(hr, typ)
		if c.Status != metav1.ConditionFalse || c.Reason != helmv2.UpgradeFailedReason {
			t.Errorf("%s=%s %s, want False %s", typ, c.Status, c.Reason, helmv2.UpgradeFailedReason)
		}
		mustContain(t, typ+" message", c.Message, prefix, r.movedReason(),
			"kubectl annotate crd "+r.crd+" helm.sh/resource-policy=keep; then let helm-controller retry")
	}
	// It keeps retrying: three failed attempts, none counted as an upgrade failure, and
	// no stall.
	if hr.Status.Failures < 3 || hr.Status.UpgradeFailures != 0 || apimeta.FindStatusCondition(hr.Status.Conditions, meta.StalledCondition) != nil {
		t.Errorf("want helm-controller retrying (3 failures, no upgrade failure, not stalled):\n  %s", describe(hr))
	}
	if h := r.history(t); !slices.Equal(h, []string{"1 deployed lws-" + lwsTemplates}) {
		t.Errorf("helm history after the denied upgrades = %v, want revision 1 only", h)
	}
	if v := r.configMapVersion(t); v != lwsTemplates {
		t.Errorf("ConfigMap version %q after the denied upgrades, want %s", v, lwsTemplates)
	}
	r.intact(t, "after the denied upgrades")
	// helm-controller applies a chart's crds/ before the Helm upgrade writes its record,
	// also with spec.upgrade.crds unset (its code defaults to Create, server-side and
	// forced): 0.8.0's CRD, which adds the app.kubernetes.io labels, was applied each time
	// (the CRD gate admits it: it drops no stored version).
	var crd apiextv1.CustomResourceDefinition
	if err := env.Flux.Client.Get(t.Context(), client.ObjectKey{Name: r.crd}, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Labels["app.kubernetes.io/name"] != "lws" {
		t.Errorf("CRD labels %v: want 0.8.0's crds/ file applied by helm-controller before its upgrade", crd.Labels)
	}
	r.waitGateState(t, "upgrade", webhook.ReasonReleaseBlocked, r.movedReason())
	if !hasEvent(r.events(t), "Warning "+helmv2.UpgradeFailedReason+" ", `admission webhook "release.upgradeguard.io" denied the request`) {
		t.Errorf("no %s event from helm-controller with the denial:\n  %s", helmv2.UpgradeFailedReason, strings.Join(r.events(t), "\n  "))
	}

	// The way on, as the message says: keep the CRD, then let helm-controller retry.
	r.keepCRD(t)
	r.retryWithReset(t)
	r.waitUpgraded(t, 2)
}

// TestCRDDeletionSourceMoveGuardedWithoutRecordGate is the same source move with the
// release-record gate off for the namespace (upgradeguard.io/gate=off): helm-controller's
// Helm upgrade stores revision 2, applies 0.8.0's ConfigMap and reaches the DELETE of the
// CRD, which the CRD deletion guard denies. Helm fails the upgrade (revision 2 failed),
// and with no remediation configured helm-controller stalls after that one attempt and
// does not retry until reset. The CRD and every LeaderWorkerSet stay; keeping the CRD
// and resetting lets the next upgrade through.
func TestCRDDeletionSourceMoveGuardedWithoutRecordGate(t *testing.T) {
	needCluster(t)
	const ns = "crd-delete-guard"
	if err := env.Flux.EnsureNamespace(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if err := env.Flux.Update(t.Context(), nsObj, func() {
		if nsObj.Labels == nil {
			nsObj.Labels = map[string]string{}
		}
		nsObj.Labels["upgradeguard.io/gate"] = "off"
	}); err != nil {
		t.Fatal(err)
	}
	r := installLWS(t, ns, "guard.lws.fluxgate.test", "0.x")
	since := r.helmRelease(t).ResourceVersion
	r.publish(t, lwsCRDsDir)
	hr, states := r.follow(t, since, func(hr *helmv2.HelmRelease, _ bool) bool {
		return apimeta.IsStatusConditionTrue(hr.Status.Conditions, meta.StalledCondition) || hr.Status.Failures >= 3 ||
			flux.ReadyAtGeneration(metav1.ConditionTrue)(hr) && hr.Status.History.Latest().ChartVersion == lwsCRDsDir
	})
	t.Logf("helm-controller after 0.8.0 was published:\n  %s", strings.Join(states, "\n  "))
	prefix := fmt.Sprintf("Helm upgrade failed for release %s/lws with chart lws@%s: failed to delete resource namespace=, name=%s, kind=CustomResourceDefinition: "+
		`admission webhook "crd-delete.upgradeguard.io" denied the request: upgradeguard denied the deletion of CustomResourceDefinition %s by user `,
		r.ns, lwsCRDsDir, r.crd, r.crd)
	guardReason := r.crd + ": the API server deletes " + objectCount + " with it, for good"
	for _, typ := range []string{meta.ReadyCondition, helmv2.ReleasedCondition} {
		c := condition(hr, typ)
		if c.Status != metav1.ConditionFalse || c.Reason != helmv2.UpgradeFailedReason {
			t.Errorf("%s=%s %s, want False %s", typ, c.Status, c.Reason, helmv2.UpgradeFailedReason)
		}
		mustContain(t, typ+" message", c.Message, prefix, fmt.Sprintf("(a CRD that HelmRelease %s/lws applies)", r.ns), guardReason)
	}
	if c := condition(hr, meta.StalledCondition); c.Status != metav1.ConditionTrue || c.Reason != "RetriesExceeded" || c.Message != "Failed to upgrade after 1 attempt(s)" ||
		hr.Status.Failures != 1 || hr.Status.UpgradeFailures != 1 {
		t.Errorf("want helm-controller stalled after one failed upgrade:\n  %s", describe(hr))
	}
	if h := r.history(t); !slices.Equal(h, []string{"1 deployed lws-" + lwsTemplates, "2 failed lws-" + lwsCRDsDir}) {
		t.Errorf("helm history after the denied deletion = %v, want revision 2 failed", h)
	}
	// The upgrade applied 0.8.0's other objects before the DELETE.
	if v := r.configMapVersion(t); v != lwsCRDsDir {
		t.Errorf("ConfigMap version %q after the denied deletion, want %s", v, lwsCRDsDir)
	}
	r.intact(t, "after the denied deletion")
	r.waitGateState(t, string(predict.DeleteCRD), webhook.ReasonCRDDeletionBlocked, guardReason)
	if !hasEvent(r.crdEvents(t), "Warning "+webhook.ReasonCRDDeletionBlocked+" ", guardReason) {
		t.Errorf("no %s event on the CRD:\n  %s", webhook.ReasonCRDDeletionBlocked, strings.Join(r.crdEvents(t), "\n  "))
	}

	// Stalled: a reconcile request without --reset is handled and changes nothing.
	token := time.Now().UTC().Format(time.RFC3339Nano)
	r.annotateHR(t, meta.ReconcileRequestAnnotation, token)
	hr, err := env.Flux.WaitHelmRelease(t.Context(), r.ns, "lws", time.Minute, func(hr *helmv2.HelmRelease) bool {
		return hr.Status.LastHandledReconcileAt == token
	})
	if err != nil {
		t.Fatalf("helm-controller did not handle the reconcile request: %v", err)
	}
	if hr.Status.Failures != 1 || !apimeta.IsStatusConditionTrue(hr.Status.Conditions, meta.StalledCondition) || len(r.history(t)) != 2 {
		t.Errorf("after a reconcile request without reset, want it still stalled with nothing tried:\n  %s\n  history %v", describe(hr), r.history(t))
	}

	// The way on: keep the CRD, then reset.
	r.keepCRD(t)
	r.retryWithReset(t)
	r.waitUpgraded(t, 3)
}

// TestCRDDeletionUninstallGuardedUnderFlux: deleting the HelmRelease makes helm-controller
// uninstall lws 0.7.0, whose CRD renders from templates/ without
// helm.sh/resource-policy: keep: Helm would delete it with every LeaderWorkerSet. The
// release-record gate denies the uninstalling mark (Helm only logs that and goes on,
// deleting the ConfigMap), and the CRD deletion guard denies the CRD's DELETE: the
// uninstall fails, the CRD and its objects stay, and the HelmRelease stays, finalizer and
// all, while helm-controller retries on its back-off. Annotating the CRD
// upgradeguard.io/allow-delete=true lets helm-controller's next retry finish the
// uninstall, and the CRD goes with its objects.
func TestCRDDeletionUninstallGuardedUnderFlux(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	r := installLWS(t, "crd-delete-uninstall", "uninstall.lws.fluxgate.test", lwsTemplates)
	since := r.helmRelease(t).ResourceVersion
	if err := env.Flux.Client.Delete(ctx, r.helmRelease(t)); err != nil {
		t.Fatal(err)
	}
	hr, states := r.follow(t, since, func(hr *helmv2.HelmRelease, gone bool) bool {
		return gone || hr.Status.Failures >= 3
	})
	t.Logf("helm-controller after the HelmRelease was deleted:\n  %s", strings.Join(states, "\n  "))
	if hr.DeletionTimestamp == nil || !slices.Contains(hr.Finalizers, helmv2.HelmReleaseFinalizer) || hr.Status.Failures < 3 {
		t.Errorf("want the HelmRelease deleting, held by its finalizer, and the uninstall retried:\n  %s", describe(hr))
	}
	want := fmt.Sprintf("Helm uninstall failed for release %s/lws.v1 with chart lws@%s: failed to delete release: lws", r.ns, lwsTemplates)
	for _, typ := range []string{meta.ReadyCondition, helmv2.ReleasedCondition} {
		if c := condition(hr, typ); c.Status != metav1.ConditionFalse || c.Reason != helmv2.UninstallFailedReason || c.Message != want {
			t.Errorf("%s=%s %s: %q, want False %s: %q", typ, c.Status, c.Reason, c.Message, helmv2.UninstallFailedReason, want)
		}
	}
	// The uninstalling mark was refused: the record still says deployed.
	if h := r.history(t); !slices.Equal(h, []string{"1 deployed lws-" + lwsTemplates}) {
		t.Errorf("helm history after the denied uninstall = %v, want revision 1 deployed", h)
	}
	// Helm deleted the release's other objects.
	if v := r.configMapVersion(t); v != "" {
		t.Errorf("ConfigMap version %q after the denied uninstall, want it deleted", v)
	}
	r.intact(t, "after the denied uninstall")
	guardReason := r.crd + ": the API server deletes " + objectCount + " with it, for good"
	// The why: helm-controller's UninstallFailed event carries Helm's log with the guard's
	// answer; upgradeguard's events and annotation say it too.
	events := r.events(t)
	for _, e := range []struct{ prefix, want string }{
		{"Warning " + helmv2.UninstallFailedReason + " ", `admission webhook \"crd-delete.upgradeguard.io\" denied the request`},
		{"Warning " + webhook.ReasonUninstallBlocked + " ", guardReason},
		{"Warning " + webhook.ReasonCRDDeletionBlocked + " ", guardReason},
	} {
		if !hasEvent(events, e.prefix, e.want) {
			t.Errorf("no event %q with %q on the HelmRelease:\n  %s", e.prefix, e.want, strings.Join(events, "\n  "))
		}
	}
	if !hasEvent(r.crdEvents(t), "Warning "+webhook.ReasonCRDDeletionBlocked+" ", guardReason) {
		t.Errorf("no %s event on the CRD:\n  %s", webhook.ReasonCRDDeletionBlocked, strings.Join(r.crdEvents(t), "\n  "))
	}
	if st := webhook.ParseState(hr); st.Decision != webhook.OutcomeBlocked || !strings.Contains(st.Message, guardReason) {
		t.Errorf("gate annotation %+v, want blocked with the guard's reason", st)
	}

	// The way on: let the CRD go with its objects; helm-controller's own retry finishes.
	if err := env.CP.AllowCRDDeletion(ctx, func(c *apiextv1.CustomResourceDefinition) bool { return c.Name == r.crd }); err != nil {
		t.Fatal(err)
	}
	_, states = r.follow(t, r.helmRelease(t).ResourceVersion, func(_ *helmv2.HelmRelease, gone bool) bool { return gone })
	t.Logf("helm-controller after the CRD was annotated:\n  %s", strings.Join(states, "\n  "))
	if !slices.ContainsFunc(states, func(s string) bool {
		return strings.Contains(s, "Ready=False "+helmv2.UninstallSucceededReason+": Helm uninstall succeeded for release "+r.ns+"/lws.v1")
	}) {
		t.Errorf("helm-controller never reported the uninstall succeeded")
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Flux.Client.Get(ctx, client.ObjectKey{Name: r.crd}, &apiextv1.CustomResourceDefinition{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Errorf("CRD %s after the uninstall: %v", r.crd, err)
	}
	if _, err := r.objects.List(ctx, metav1.ListOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("LeaderWorkerSets after the uninstall: %v, want the kind gone", err)
	}
	var records corev1.SecretList
	if err := env.Flux.Client.List(ctx, &records, client.InNamespace(r.ns), client.MatchingLabels{"owner": "helm", "name": "lws"}); err != nil || len(records.Items) != 0 {
		t.Errorf("release records after the uninstall: %d (%v), want none", len(records.Items), err)
	}
}
