//go:build e2e

package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/controller"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

const helmrepos = "helmrepositories.source.toolkit.fluxcd.io"

var (
	hrV1beta2 = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"}
	hrV1      = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "helmrepositories"}
	// hrSpec is every HelmRepository's spec: small, so that many are created quickly.
	hrSpec = map[string]any{"url": "https://charts.example.com", "interval": "10m"}
)

// fluxIncident is the storedVersions incident of a long-lived Flux cluster (FACTS §2):
// n HelmRepositories in namespace ns written while source-controller v1.2.0's CRD stored
// them at v1beta2, then flux2 2.17.2's CRDs, which store v1: storedVersions [v1beta2 v1].
// flux2 2.18.2's HelmRepository CRD, which drops v1beta2, is what the API server then
// refuses; it is returned. The CRDs, their objects and every StorageMigration are deleted
// when the test ends, so the next test starts from a cluster without them.
func fluxIncident(t *testing.T, ns string, n int) (crds apiextclient.Interface, next *apiextv1.CustomResourceDefinition) {
	t.Helper()
	ctx := t.Context()
	crds = apiextclient.NewForConfigOrDie(cp.Config)
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		// A cluster that never had the chart (a Job-mode target) has no StorageMigrations.
		if err := ugClient(t).DeleteAllOf(ctx, &v1alpha1.StorageMigration{}); err != nil && !meta.IsNoMatchError(err) {
			t.Errorf("cleanup: delete StorageMigrations: %v", err)
		}
		// One DeleteCollection of many objects can outlast the API server's request
		// timeout, having deleted part of them: repeat it until none is left.
		dyn := dynamic.NewForConfigOrDie(cp.Config)
		err := wait.PollUntilContextTimeout(ctx, 0, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			_ = dyn.Resource(hrV1).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
			left, err := dyn.Resource(hrV1).Namespace(ns).List(ctx, metav1.ListOptions{Limit: 1})
			return err == nil && len(left.Items) == 0, nil
		})
		if err != nil {
			t.Errorf("cleanup: delete the HelmRepositories in %s: %v", ns, err)
		}
		if err := cp.DeleteCRDs(ctx, func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group == v1alpha1.GroupVersion.Group }); err != nil {
			t.Errorf("cleanup: delete the Flux CRDs: %v", err)
		}
	})
	started := time.Now()
	must(t, testenv.ApplyFixtureCRDs(ctx, crds, "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml"), "apply source-controller v1.2.0's HelmRepository CRD")
	must(t, testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: hrV1beta2, Kind: "HelmRepository", Namespaces: []string{ns}, PerNS: n, Spec: hrSpec}),
		"create %d HelmRepositories", n)
	must(t, testenv.ApplyFixtureCRDs(ctx, crds, "charts/flux2-2.17.2/rendered/crds.yaml"), "apply flux2 2.17.2's CRDs")
	if got := storedVersions(t, crds); !slices.Equal(got, []string{"v1beta2", "v1"}) {
		t.Fatalf("storedVersions %v after flux2 2.17.2, want [v1beta2 v1]", got)
	}
	t.Logf("%d HelmRepositories stored at v1beta2 under flux2 2.17.2's CRDs in %v", n, time.Since(started).Round(time.Second))

	all, err := testenv.ReadCRDs("charts/flux2-2.18.2/rendered/crds.yaml")
	must(t, err, "read flux2 2.18.2's CRDs")
	i := slices.IndexFunc(all, func(c *apiextv1.CustomResourceDefinition) bool { return c.Name == helmrepos })
	if i < 0 {
		t.Fatalf("flux2 2.18.2 has no %s", helmrepos)
	}
	next = all[i]
	err = testenv.ApplyCRD(ctx, crds, next)
	if !crdversions.IsStoredVersionRejection(err) || !strings.Contains(err.Error(), string(crdversions.WordingFor(cp.Minor))) {
		t.Fatalf("applying flux2 2.18.2's %s before a migration: %v; want the API server's storedVersions rejection", helmrepos, err)
	}
	return crds, next
}

func storedVersions(t *testing.T, crds apiextclient.Interface) []string {
	t.Helper()
	crd, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), helmrepos, metav1.GetOptions{})
	must(t, err, "read CRD %s", helmrepos)
	return crd.Status.StoredVersions
}

// ugClient reads and writes upgradeguard's objects as the cluster's administrator.
func ugClient(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(cp.Config, client.Options{Scheme: controller.NewScheme()})
	must(t, err, "client")
	return c
}

// waitMigration waits until the StorageMigration name exists and done holds for it.
func waitMigration(t *testing.T, name string, timeout time.Duration, what string, done func(*v1alpha1.StorageMigration) bool) *v1alpha1.StorageMigration {
	t.Helper()
	return waitMigrationIn(t, ugClient(t), name, timeout, what, done)
}

// waitMigrationIn is waitMigration on the cluster of c (a platform cluster in Job mode).
func waitMigrationIn(t *testing.T, c client.Client, name string, timeout time.Duration, what string, done func(*v1alpha1.StorageMigration) bool) *v1alpha1.StorageMigration {
	t.Helper()
	var sm *v1alpha1.StorageMigration
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		sm = &v1alpha1.StorageMigration{}
		err := c.Get(ctx, client.ObjectKey{Name: name}, sm)
		return err == nil && done(sm), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("waiting for StorageMigration %s %s: %v; status %+v", name, what, err, sm.Status)
	}
	return sm
}

func terminal(sm *v1alpha1.StorageMigration) bool {
	return sm.Status.Phase == v1alpha1.PhaseSucceeded || sm.Status.Phase == v1alpha1.PhaseFailed
}

// assertSucceeded checks a finished StorageMigration of helmrepositories: Succeeded with
// its conditions, n objects counted once each and storedVersions [v1beta2 v1] -> [v1].
func assertSucceeded(t *testing.T, sm *v1alpha1.StorageMigration, n int64) v1alpha1.ResourceProgress {
	t.Helper()
	if sm.Status.Phase != v1alpha1.PhaseSucceeded || len(sm.Status.Resources) != 1 {
		t.Fatalf("StorageMigration %s: phase %s, status %+v; want Succeeded for %s", sm.Name, sm.Status.Phase, sm.Status, helmrepos)
	}
	for typ, want := range map[string]metav1.ConditionStatus{
		v1alpha1.ConditionSucceeded: metav1.ConditionTrue, v1alpha1.ConditionRunning: metav1.ConditionFalse, v1alpha1.ConditionFailed: metav1.ConditionFalse,
		v1alpha1.ConditionStorageMigrationRequired: metav1.ConditionFalse, v1alpha1.ConditionStorageMigrationInProgress: metav1.ConditionFalse,
	} {
		if c := findCondition(sm.Status.Conditions, typ); c == nil || c.Status != want || c.ObservedGeneration != sm.Generation {
			t.Errorf("StorageMigration %s: condition %s = %+v, want %s at generation %d", sm.Name, typ, c, want, sm.Generation)
		}
	}
	rp := sm.Status.Resources[0]
	if rp.Name != helmrepos || rp.Phase != v1alpha1.PhaseSucceeded || rp.StorageVersion != "v1" || rp.Objects != n ||
		rp.Rewritten+rp.AlreadyCurrent != n || rp.FailedCount != 0 || rp.Deleted != 0 || rp.Continue != "" ||
		!slices.Equal(rp.StoredVersionsBefore, []string{"v1beta2", "v1"}) || !slices.Equal(rp.StoredVersionsAfter, []string{"v1"}) {
		t.Errorf("StorageMigration %s progress %+v; want %d objects each counted once, none failed, at v1, storedVersions [v1beta2 v1] -> [v1]", sm.Name, rp, n)
	}
	return rp
}

func findCondition(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}

// assertIntact reads every HelmRepository back, through the API at v1 in pages, and
// straight from etcd: n objects obj-0 .. obj-(n-1), each with the spec it was created
// with, each stored at v1.
func assertIntact(t *testing.T, ns string, n int) {
	t.Helper()
	ctx := t.Context()
	dyn, err := dynamic.NewForConfig(cp.Config)
	must(t, err, "dynamic client")
	seen := make(map[string]bool, n)
	opts := metav1.ListOptions{Limit: 2000}
	for {
		list, err := dyn.Resource(hrV1).Namespace(ns).List(ctx, opts)
		must(t, err, "list HelmRepositories at v1")
		for _, o := range list.Items {
			spec, _ := o.Object["spec"].(map[string]any)
			if spec["url"] != hrSpec["url"] || spec["interval"] != hrSpec["interval"] {
				t.Errorf("HelmRepository %s/%s reads back with spec %v, want %v", ns, o.GetName(), spec, hrSpec)
			}
			seen[o.GetName()] = true
		}
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			break
		}
	}
	var missing []string
	for i := range n {
		if name := fmt.Sprintf("obj-%d", i); !seen[name] {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 || len(seen) != n {
		t.Errorf("%d HelmRepositories read back, want %d; missing %d, the first %v", len(seen), n, len(missing), missing[:min(len(missing), 5)])
	}
	stored, err := cp.StoredVersions(ctx, hrV1.GroupResource())
	must(t, err, "read the HelmRepositories from etcd")
	notV1 := 0
	for _, v := range stored {
		if v != "source.toolkit.fluxcd.io/v1" {
			notV1++
		}
	}
	if len(stored) != n || notV1 != 0 {
		t.Errorf("etcd holds %d HelmRepositories, %d of them not at source.toolkit.fluxcd.io/v1; want all %d at v1", len(stored), notV1, n)
	}
}

// TestPolicyMigratesFluxIncident: a cluster has the Flux incident (HelmRepositories
// stored at v1beta2, flux2 2.18.2's CRD refused), and its user installs the chart with
// its defaults. The chart's StorageMigrationPolicy (proactive, every group) makes the
// controller in the Pod migrate the objects and prune storedVersions; the
// StorageMigration's conditions and counts and the Pod's /metrics, read through the
// Service, show it; etcd holds every object at v1; and flux2 2.18.2's CRD then applies.
// Nothing else migrates in this test: no manager runs in the test process.
func TestPolicyMigratesFluxIncident(t *testing.T) {
	const n = 50
	started := time.Now()
	crds, next := fluxIncident(t, "flux-incident", n)
	rel := installChart(t, "ug-policy")
	ctx := t.Context()

	sm := waitMigration(t, controller.ProactiveName(helmrepos), 3*time.Minute, "to finish", terminal)
	rp := assertSucceeded(t, sm, n)
	t.Logf("the chart's policy migrated %s %v after `helm install` started", helmrepos, sm.Status.CompletionTime.Sub(rel.installStarted).Round(time.Second))
	if sm.Labels[controller.LabelPolicy] != "default" || sm.Labels[controller.LabelProactive] != "true" {
		t.Errorf("StorageMigration %s labels %v, want the chart's policy \"default\", proactive", sm.Name, sm.Labels)
	}
	if rp.Rewritten != n || rp.Attempts != 1 {
		t.Errorf("progress %+v, want all %d rewritten in one attempt", rp, n)
	}
	if got := storedVersions(t, crds); !slices.Equal(got, []string{"v1"}) {
		t.Errorf("storedVersions %v after the migration, want [v1]", got)
	}

	// The Pod's counters, as Prometheus scrapes them through the Service. The pending
	// gauge is set after the reconcile that succeeded returns.
	var body []byte
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		body, err = rel.cs.CoreV1().Services(rel.ns).ProxyGet("http", "upgradeguard", "8080", "/metrics", nil).DoRaw(ctx)
		if err != nil {
			return false, err
		}
		pending, ok := metricSum(t, body, "upgradeguard_pending_migrations", nil)
		return ok && pending == 0, nil
	})
	if err != nil {
		t.Errorf("upgradeguard_pending_migrations never read 0 through the Service: %v", err)
	}
	if got, _ := metricSum(t, body, "upgradeguard_objects_rewritten_total", map[string]string{"cluster": "", "crd": helmrepos}); got != n {
		t.Errorf("the Pod's upgradeguard_objects_rewritten_total{crd=%q} = %v, want %d", helmrepos, got, n)
	}
	if got, _ := metricSum(t, body, "upgradeguard_migrations_total", map[string]string{"cluster": "", "result": "succeeded"}); got < 1 {
		t.Errorf("the Pod's upgradeguard_migrations_total{result=succeeded} = %v, want >= 1", got)
	}
	for _, result := range []string{"failed", "refused", "restarted"} {
		if got, _ := metricSum(t, body, "upgradeguard_migrations_total", map[string]string{"result": result}); got != 0 {
			t.Errorf("the Pod's upgradeguard_migrations_total{result=%s} = %v, want 0", result, got)
		}
	}

	assertIntact(t, "flux-incident", n)
	// The incident is over: flux2 2.18.2's CRD, without v1beta2, now applies.
	must(t, testenv.ApplyCRD(ctx, crds, next), "apply flux2 2.18.2's %s after the migration", helmrepos)
	t.Logf("TestPolicyMigratesFluxIncident took %v", time.Since(started).Round(time.Second))
}

// resumption is a migration that Pod by finished after Pod from stopped at the place
// it had saved: the progress saved and final, the objects and LIST page size of the
// migration, and the PATCH requests on HelmRepositories over all of it.
type resumption struct {
	by, from     string
	labels       map[string]string // of by's upgradeguard_objects_rewritten_total
	saved, final v1alpha1.ResourceProgress
	n, pageSize  int64
	patches      float64
}

// assertResumed checks that r.by resumed the migration where r.from stopped instead of
// starting over: its own counter (from its /metrics, which is returned) holds only what
// was left after the saved place, the status keeps what r.from had rewritten, and there
// was one PATCH per object plus at most the objects of the pages in flight when r.from
// stopped, which r.by lists and patches again (counted alreadyCurrent).
func assertResumed(t *testing.T, cs kubernetes.Interface, ns string, r resumption) []byte {
	t.Helper()
	body, err := cs.CoreV1().Pods(ns).ProxyGet("http", r.by, "8080", "/metrics", nil).DoRaw(t.Context())
	must(t, err, "GET /metrics of %s", r.by)
	second, _ := metricSum(t, body, "upgradeguard_objects_rewritten_total", r.labels)
	t.Logf("saved place at %d objects (%d rewritten); %s rewrote %v; %v PATCH requests in all; final %+v",
		r.saved.Objects, r.saved.Rewritten, r.by, second, r.patches, r.final)
	if second <= 0 || second > float64(r.n-r.saved.Objects) {
		t.Errorf("%s rewrote %v objects, want between 1 and %d (what was left after the saved place at %d)", r.by, second, r.n-r.saved.Objects, r.saved.Objects)
	}
	if first := float64(r.final.Rewritten) - second; first < float64(r.saved.Rewritten) {
		t.Errorf("the status keeps %v objects rewritten by %s, fewer than the %d it had saved", first, r.from, r.saved.Rewritten)
	}
	if lo, hi := float64(r.n), float64(r.n+2*r.pageSize); r.patches < lo || r.patches > hi {
		t.Errorf("%v PATCH requests on HelmRepositories over the migration, want %v to %v: from zero it would be %d or more",
			r.patches, lo, hi, r.n+r.saved.Objects)
	}
	return body
}

// metricSum parses a Prometheus text exposition and sums the samples of the counter or
// gauge name whose labels hold every pair of want (a label that is absent reads as "").
// ok says whether any sample matched.
func metricSum(t *testing.T, body []byte, name string, want map[string]string) (sum float64, ok bool) {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	must(t, err, "parse /metrics")
	mf := families[name]
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		ok = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, ok
}

// helmrepoPatches is kube-apiserver's count of PATCH requests on HelmRepositories it
// answered (apiserver_request_total, any code but 429, which is a refusal to serve).
func helmrepoPatches(t *testing.T, cs kubernetes.Interface) float64 {
	t.Helper()
	body, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(t.Context())
	must(t, err, "GET kube-apiserver /metrics")
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(body))
	must(t, err, "parse kube-apiserver /metrics")
	var sum float64
	for _, m := range families["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["verb"] == "PATCH" && l["group"] == hrV1.Group && l["resource"] == hrV1.Resource && l["subresource"] == "" && l["code"] != "429" {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// storedVersionsLog records every distinct status.storedVersions of the HelmRepository
// CRD, in order, from a watch started now until stop.
type storedVersionsLog struct {
	mu   sync.Mutex
	seen [][]string
	w    watch.Interface
	done chan struct{}
}

func watchStoredVersions(t *testing.T, crds apiextclient.Interface) *storedVersionsLog {
	t.Helper()
	ctx := t.Context()
	api := crds.ApiextensionsV1().CustomResourceDefinitions()
	crd, err := api.Get(ctx, helmrepos, metav1.GetOptions{})
	must(t, err, "read CRD %s", helmrepos)
	w, err := api.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + helmrepos, ResourceVersion: crd.ResourceVersion,
		TimeoutSeconds: ptr.To(int64(3600))})
	must(t, err, "watch CRD %s", helmrepos)
	l := &storedVersionsLog{seen: [][]string{crd.Status.StoredVersions}, w: w, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for ev := range w.ResultChan() {
			c, ok := ev.Object.(*apiextv1.CustomResourceDefinition)
			if !ok {
				continue
			}
			l.mu.Lock()
			if !slices.Equal(l.seen[len(l.seen)-1], c.Status.StoredVersions) {
				l.seen = append(l.seen, c.Status.StoredVersions)
			}
			l.mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return l
}

// stop ends the watch and returns what it saw; closed says whether the API server ended
// it early (then the record may be incomplete).
func (l *storedVersionsLog) stop() (seen [][]string, closed bool) {
	select {
	case <-l.done:
		closed = true
	default:
	}
	l.w.Stop()
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen, closed
}
