package migrate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// The gadgets of these tests: v1alpha1 holds spec.size, v1 the same value as
// spec.replicas, and the conversion webhook renames the field.
var (
	gadgetsAlpha = schema.GroupVersionResource{Group: "example.com", Version: "v1alpha1", Resource: "gadgets"}
	gadgetsV1    = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "gadgets"}
)

// renamer is a conversion webhook that renames spec.size (v1alpha1) to spec.replicas
// (v1) and back; it counts the objects it converted.
type renamer struct{ converted atomic.Int64 }

func (c *renamer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var review apiextv1.ConversionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "not a ConversionReview", http.StatusBadRequest)
		return
	}
	resp := &apiextv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
	for _, raw := range review.Request.Objects {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw.Raw); err != nil {
			resp.Result = metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}
			break
		}
		from, to := "size", "replicas"
		if review.Request.DesiredAPIVersion == gadgetsAlpha.GroupVersion().String() {
			from, to = "replicas", "size"
		}
		if v, ok, _ := unstructured.NestedFieldCopy(u.Object, "spec", from); ok {
			unstructured.RemoveNestedField(u.Object, "spec", from)
			_ = unstructured.SetNestedField(u.Object, v, "spec", to)
		}
		u.SetAPIVersion(review.Request.DesiredAPIVersion)
		out, _ := u.MarshalJSON()
		resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Raw: out})
		c.converted.Add(1)
	}
	review.Request, review.Response = nil, resp
	_ = json.NewEncoder(w).Encode(review)
}

// gadgetCRD is the two-version CRD, storing at storage, converting through wh.
func gadgetCRD(storage string, wh *testenv.TLSWebhook) *apiextv1.CustomResourceDefinition {
	crd := testenv.TwoVersionCRD("example.com", "gadgets", "Gadget")
	crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = storage == "v1alpha1", storage == "v1"
	crd.Spec.Conversion = webhookAt(wh)
	return crd
}

func webhookAt(wh *testenv.TLSWebhook) *apiextv1.CustomResourceConversion {
	return &apiextv1.CustomResourceConversion{Strategy: apiextv1.WebhookConverter, Webhook: &apiextv1.WebhookConversion{
		ConversionReviewVersions: []string{"v1"},
		ClientConfig:             &apiextv1.WebhookClientConfig{URL: ptr.To(wh.URL + "/convert"), CABundle: wh.CABundle},
	}}
}

func newTLSWebhook(t *testing.T, h http.Handler) *testenv.TLSWebhook {
	t.Helper()
	wh, err := testenv.NewTLSWebhook(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wh.Close)
	return wh
}

// createGadgets creates n gadgets at v1alpha1 in each namespace, every namespace at once.
func createGadgets(t *testing.T, e env, namespaces []string, n int) {
	t.Helper()
	var g errgroup.Group
	for _, ns := range namespaces {
		g.Go(func() error {
			return testenv.CreateObjects(e.ctx, cp.Config, testenv.Objects{GVR: gadgetsAlpha, Kind: "Gadget", Namespaces: []string{ns}, PerNS: n,
				Spec: map[string]any{"size": int64(3)}})
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// verifyMigrated reads etcd and then every object through the API at v1, where each is
// stored now (so nothing converts it): want objects, each at v1 with the renamed field.
func verifyMigrated(t *testing.T, e env, want int) {
	t.Helper()
	stored, err := cp.StoredVersions(e.ctx, gadgetsV1.GroupResource())
	if err != nil {
		t.Fatal(err)
	}
	notV1 := 0
	for _, v := range stored {
		if v != "example.com/v1" {
			notV1++
		}
	}
	if len(stored) != want || notV1 != 0 {
		t.Fatalf("etcd holds %d gadgets, %d of them not at example.com/v1; want %d, all at v1", len(stored), notV1, want)
	}
	items, err := kubeclient.ListAll(e.ctx, e.dyn.Resource(gadgetsV1), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for _, o := range items {
		replicas, _, _ := unstructured.NestedInt64(o.Object, "spec", "replicas")
		_, hasSize, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "size")
		if replicas != 3 || hasSize {
			if bad++; bad <= 3 {
				t.Errorf("%s/%s spec %v, want replicas 3 and no size", o.GetNamespace(), o.GetName(), o.Object["spec"])
			}
		}
	}
	if len(items) != want || bad > 0 {
		t.Fatalf("%d gadgets read at v1, %d not converted; want %d, all converted", len(items), bad, want)
	}
}

// TestConversionFailureRecognised: the API server's answers when a conversion webhook is
// not serving, for a LIST, a GET and a write, are each recognised, and a read at another
// version falls back to the storage version, where objects stored there need no
// conversion and are read.
func TestConversionFailureRecognised(t *testing.T) {
	e := emptyCluster(t)
	wh := newTLSWebhook(t, &renamer{})
	crd := gadgetCRD("v1alpha1", wh)
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}
	createGadgets(t, e, []string{"g"}, 3)
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(kubeclient.FailFastOnConversion)
	c, err := kubeclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, listErr := c.Metadata.Resource(gadgetsV1).List(e.ctx, metav1.ListOptions{})
	_, getErr := c.Metadata.Resource(gadgetsV1).Namespace("g").Get(e.ctx, "obj-0", metav1.GetOptions{})
	_, patchErr := c.Metadata.Resource(gadgetsV1).Namespace("g").Patch(e.ctx, "obj-0", "application/merge-patch+json", []byte(`{}`), metav1.PatchOptions{})
	for what, err := range map[string]error{"LIST": listErr, "GET": getErr, "PATCH": patchErr} {
		if !kubeclient.IsConversionFailure(err) {
			t.Errorf("%s at v1 with the webhook down: %v, want a conversion failure", what, err)
		}
		if v, ok := kubeclient.StorageFallback(crd, "v1", err); !ok || v != "v1alpha1" {
			t.Errorf("%s: fallback %q %v, want v1alpha1", what, v, ok)
		}
		if _, ok := kubeclient.StorageFallback(crd, "v1alpha1", err); ok {
			t.Errorf("%s: a read at the storage version has nothing to fall back to", what)
		}
	}
	if _, err := c.Metadata.Resource(gadgetsAlpha).List(e.ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("LIST at the storage version: %v, want the objects stored there", err)
	}
	if _, err := c.Metadata.Resource(gadgetsV1).Namespace("g").Get(e.ctx, "missing", metav1.GetOptions{}); kubeclient.IsConversionFailure(err) || !apierrors.IsNotFound(err) {
		t.Errorf("GET of a missing object: %v, want NotFound, not a conversion failure", err)
	}
}

// TestConversionWebhookStartsAfterCRD: the CRD names a conversion webhook that is not
// serving yet (michelangelo-ai/michelangelo#785). check's schema read at the other
// version falls back to the storage version and says so; the object count reads at the
// storage version; a migration that must convert every object waits for the webhook and,
// once it serves, migrates all of them; then the read at the other version succeeds.
func TestConversionWebhookStartsAfterCRD(t *testing.T) {
	e := emptyCluster(t)
	conv := &renamer{}
	wh := newTLSWebhook(t, conv)
	live := gadgetCRD("v1alpha1", wh)
	if err := testenv.ApplyCRD(e.ctx, e.crds, live); err != nil {
		t.Fatal(err)
	}
	const n = 40
	createGadgets(t, e, []string{"a", "b"}, n/2)
	live, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, live.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// check, with the webhook down: an upgrade that changes v1's schema reads at v1.
	next := live.DeepCopy()
	next.Spec.Versions[1].Schema.OpenAPIV3Schema.Description = "v1 changes"
	kc, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	judge, err := crdschema.New(live, next)
	if err != nil {
		t.Fatal(err)
	}
	lister := listerFunc(kc.ListObjects)
	rep, err := judge.Scan(e.ctx, lister, crdschema.ScanOptions{})
	if err != nil {
		t.Fatalf("scan with the webhook down: %v, want the read to fall back to the storage version", err)
	}
	if len(rep.ConversionFallbacks) != 1 || rep.ConversionFallbacks[0].Version != "v1" || rep.ConversionFallbacks[0].ReadAt != "v1alpha1" ||
		!strings.Contains(rep.ConversionFallbacks[0].Error, "conversion webhook for") || rep.Objects != n {
		t.Fatalf("report %+v, want %d objects read at v1alpha1 instead of v1, with the API server's answer", rep, n)
	}
	if count, names, err := kc.SampleObjects(e.ctx, live, 2); err != nil || count != n || len(names) != 2 {
		t.Fatalf("count with the webhook down: %d %v %v, want %d read at the storage version", count, names, err, n)
	}

	// A migration that switches the storage version to v1: every object converts.
	o := opts()
	o.AllowStorageSwitch, o.PageSize = true, 10
	type outcome struct {
		res *migrate.Result
		err error
	}
	done := make(chan outcome, 1)
	var failedWrites, failedReads atomic.Int64
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return failureCounter{next: rt, writes: &failedWrites, reads: &failedReads}
	})
	go func() {
		res, err := newMigrator(t, cfg).Migrate(e.ctx, migrate.Target{Name: live.Name, StorageVersion: "v1"}, o)
		done <- outcome{res, err}
	}()
	// The run switches the storage version to v1, and its reads meet the webhook that
	// does not serve: it waits, and writes nothing.
	testenv.Eventually(t, "the migration's reads meet the webhook that does not serve", func() (bool, error) {
		return failedReads.Load() > 0, nil
	})
	if conv.converted.Load() != 0 || failedWrites.Load() != 0 {
		t.Fatalf("before the webhook served: %d converted, %d failed writes; want none", conv.converted.Load(), failedWrites.Load())
	}
	if err := wh.Start(); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if out.err != nil {
		t.Fatal(out.err)
	}
	if out.res.Status != migrate.Migrated || out.res.FailedCount != 0 || out.res.Rewritten != n || failedWrites.Load() != 0 {
		t.Fatalf("result %+v (%d failed writes), want migrated, %d rewritten, no write failed", out.res, failedWrites.Load(), n)
	}
	if got := storedVersions(t, e, live.Name); strings.Join(got, ",") != "v1" {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
	verifyMigrated(t, e, n)

	// With the webhook serving, the read at the other version (v1alpha1 now) converts.
	live, err = e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, live.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next = live.DeepCopy()
	next.Spec.Versions[0].Schema.OpenAPIV3Schema.Description = "v1alpha1 changes"
	if judge, err = crdschema.New(live, next); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the read at v1alpha1 converts", func() (bool, error) {
		rep, err = judge.Scan(e.ctx, lister, crdschema.ScanOptions{})
		return err == nil && len(rep.ConversionFallbacks) == 0 && rep.Objects == n, err
	})
}

type listerFunc func(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error)

func (f listerFunc) List(ctx context.Context, gvr schema.GroupVersionResource, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	return f(ctx, gvr, opts)
}

// failureCounter counts the API server's answers to a client's writes and reads of
// custom resources: the writes it accepted, and the 5xx and 429 answers to writes and
// reads; after accepted writes reach atWrites, it closes reached once.
type failureCounter struct {
	next          http.RoundTripper
	writes, reads *atomic.Int64
	accepted      *atomic.Int64
	atWrites      int64
	reached       chan struct{}
}

func (c failureCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(r)
	if err != nil || !strings.Contains(r.URL.Path, "/gadgets") {
		return resp, err
	}
	failed := resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests
	switch {
	case r.Method == http.MethodPatch && failed:
		c.writes.Add(1)
	case r.Method == http.MethodPatch && c.accepted != nil:
		if c.accepted.Add(1) == c.atWrites {
			close(c.reached)
		}
	case r.Method == http.MethodGet && failed && c.reads != nil:
		c.reads.Add(1)
	}
	return resp, err
}

// TestConversionWebhookRepointedMidMigration: 20,000 objects stored at v1alpha1 are
// migrated to v1 through webhook A. In the middle of a page the CRD is repointed to
// webhook B, with a certificate authority of its own, whose server is not serving yet (a
// new Deployment starting), and A stops. The API server takes the new address up
// asynchronously, and from then on the writes that read an object from etcd meet B not
// serving (TeraSky measured one failed write in 9,456 while a webhook was repointed):
// they are retried, and the run sees the change before its next page and waits until B
// converts. No write is lost and no object is skipped: etcd holds every object at v1
// with the renamed field, storedVersions is [v1], and the result counts the retries and
// the change of spec.conversion.
func TestConversionWebhookRepointedMidMigration(t *testing.T) {
	e := emptyCluster(t)
	convA, convB := &renamer{}, &renamer{}
	whA, whB := newTLSWebhook(t, convA), newTLSWebhook(t, convB)
	if err := whA.Start(); err != nil {
		t.Fatal(err)
	}
	crd := gadgetCRD("v1alpha1", whA)
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}
	const n = 20000
	namespaces := []string{"n0", "n1", "n2", "n3"}
	start := time.Now()
	createGadgets(t, e, namespaces, n/len(namespaces))
	t.Logf("created %d objects in %s", n, time.Since(start).Round(time.Second))
	crd.Spec.Versions[0].Storage, crd.Spec.Versions[1].Storage = false, true
	if err := testenv.ApplyCRD(e.ctx, e.crds, crd); err != nil {
		t.Fatal(err)
	}

	o := opts()
	o.PageSize, o.Concurrency, o.Deadline = 500, 16, 10*time.Minute
	// The repoint comes in the middle of the eleventh page.
	var failedWrites, failedReads, accepted atomic.Int64
	reached := make(chan struct{})
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return failureCounter{next: rt, writes: &failedWrites, reads: &failedReads, accepted: &accepted, atWrites: 10*500 + 100, reached: reached}
	})
	type outcome struct {
		res *migrate.Result
		err error
	}
	done := make(chan outcome, 1)
	start = time.Now()
	go func() {
		res, err := newMigrator(t, cfg).Migrate(e.ctx, migrate.Target{Name: crd.Name}, o)
		done <- outcome{res, err}
	}()
	select {
	case <-reached:
	case out := <-done:
		t.Fatalf("the run ended before the repoint: %+v %v", out.res, out.err)
	}
	cur, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Get(e.ctx, crd.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Conversion = webhookAt(whB)
	if _, err := e.crds.ApiextensionsV1().CustomResourceDefinitions().Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	whA.Close()
	// B serves once the run has met it not serving: a write failed, or the run waits.
	testenv.Eventually(t, "the run meets webhook B not serving", func() (bool, error) {
		return failedWrites.Load() > 0 || failedReads.Load() > 0, nil
	})
	if err := whB.Start(); err != nil {
		t.Fatal(err)
	}
	out := <-done
	if out.err != nil {
		t.Fatal(out.err)
	}
	res := out.res
	t.Logf("migrated in %s: %d failed writes and %d failed reads answered; the result counts %d conversion retries and %d conversion changes; A converted %d objects, B %d",
		time.Since(start).Round(time.Second), failedWrites.Load(), failedReads.Load(), res.ConversionRetries, res.ConversionChanges, convA.converted.Load(), convB.converted.Load())
	if res.Status != migrate.Migrated || res.FailedCount != 0 || res.Rewritten+res.AlreadyCurrent != n {
		t.Fatalf("result %s failed %d rewritten %d current %d (%s), want migrated with all %d objects", res.Status, res.FailedCount, res.Rewritten, res.AlreadyCurrent, res.Message, n)
	}
	if res.ConversionRetries < failedWrites.Load() || res.ConversionChanges != 1 {
		t.Errorf("result says %d conversion retries and %d changes; want at least the %d failed writes, and one change", res.ConversionRetries, res.ConversionChanges, failedWrites.Load())
	}
	if convB.converted.Load() == 0 {
		t.Error("webhook B converted nothing: the run did not go on through it")
	}
	js, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`"conversionRetries":%d`, res.ConversionRetries); res.ConversionRetries > 0 && !strings.Contains(string(js), want) {
		t.Errorf("JSON %s, want %s", js, want)
	}
	if got := storedVersions(t, e, crd.Name); strings.Join(got, ",") != "v1" {
		t.Errorf("storedVersions %v, want [v1]", got)
	}
	verifyMigrated(t, e, n)
}
