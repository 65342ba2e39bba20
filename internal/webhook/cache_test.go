package webhook_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	repo "helm.sh/helm/v4/pkg/repo/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
)

// countingRepo is a chart repository on loopback that counts requests by user and file
// kind ("index" or "chart"), and accepts anonymous requests and two users.
type countingRepo struct {
	dir, url string
	mu       sync.Mutex
	n        map[string]int
}

func (r *countingRepo) count(user, kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[user+" "+kind]
}

// reindex rewrites index.yaml from the archives in the directory, as a repository
// publishing a new version does.
func (r *countingRepo) reindex(t *testing.T) {
	t.Helper()
	idx, err := repo.IndexDirectory(r.dir, r.url)
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.WriteFile(filepath.Join(r.dir, "index.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func newCountingRepo(t *testing.T) *countingRepo {
	t.Helper()
	r := &countingRepo{dir: t.TempDir(), n: map[string]int{}}
	for _, v := range []string{"0.9.0", "0.9.3"} {
		data, err := os.ReadFile(s.charts["kro-"+v])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(r.dir, filepath.Base(s.charts["kro-"+v])), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	users := map[string]string{"alice": "alice-pass", "bob": "bob-pass"}
	files := http.FileServer(http.Dir(r.dir))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		user, pass, ok := req.BasicAuth()
		if ok && users[user] != pass {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		kind := "chart"
		if strings.HasSuffix(req.URL.Path, "/index.yaml") {
			kind = "index"
		}
		r.mu.Lock()
		r.n[user+" "+kind]++
		r.mu.Unlock()
		files.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	r.reindex(t)
	return r
}

// TestGateCache shows that a repeated decision is served from the gate's cache: the
// same decision without fetching the chart or the index again; an index change is seen
// only once the index TTL has passed (on a fake clock); and HelmRepositories with other
// credentials, or credentials that changed, never share cached entries.
func TestGateCache(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	rp := newCountingRepo(t)
	ns := "gatecache"
	namespace(t, s.c, ns)
	for _, u := range []string{"alice", "bob"} {
		if err := s.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: u},
			Data: map[string][]byte{"username": []byte(u), "password": []byte(u + "-pass")}}); err != nil {
			t.Fatal(err)
		}
	}
	helmRepo(t, ns, "public", sourcev1.HelmRepositorySpec{URL: rp.url})
	helmRepo(t, ns, "as-alice", sourcev1.HelmRepositorySpec{URL: rp.url, SecretRef: &meta.LocalObjectReference{Name: "alice"}})
	helmRepo(t, ns, "as-bob", sourcev1.HelmRepositorySpec{URL: rp.url, SecretRef: &meta.LocalObjectReference{Name: "bob"}})

	const ttl = time.Minute
	clk := clocktesting.NewFakePassiveClock(time.Now())
	g, err := webhook.New(s.c, s.c, s.cp.Config, events.NewFakeRecorder(10),
		webhook.Options{Timeout: 20 * time.Second, HelmCacheDir: t.TempDir(), IndexTTL: ttl, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	// decide sends a dry-run UPDATE of a kro HelmRelease from 0.9.0 to version through
	// the gate and returns its answer.
	decide := func(t *testing.T, repoName, version string) admission.Response {
		t.Helper()
		old := &helmv2.HelmRelease{
			TypeMeta:   metav1.TypeMeta{APIVersion: helmv2.GroupVersion.String(), Kind: helmv2.HelmReleaseKind},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kro-" + repoName},
			Spec: helmv2.HelmReleaseSpec{Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
				Chart: "kro", Version: "0.9.0", SourceRef: helmv2.CrossNamespaceObjectReference{Kind: sourcev1.HelmRepositoryKind, Name: repoName},
			}}},
		}
		updated := old.DeepCopy()
		updated.Spec.Chart.Spec.Version = version
		resp := g.Handle(ctx, admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Operation: admissionv1.Update, Object: raw(t, updated), OldObject: raw(t, old), DryRun: ptr.To(true),
		}})
		if !resp.Allowed {
			t.Fatalf("kro %s from HelmRepository %s was not admitted: %s", version, repoName, resp.Result.Message)
		}
		return resp
	}
	type counts struct{ index, chart int }
	seen := func(user string) counts { return counts{rp.count(user, "index"), rp.count(user, "chart")} }
	want := func(t *testing.T, user string, w counts) {
		t.Helper()
		if got := seen(user); got != w {
			t.Errorf("requests by %q: got %+v, want %+v", user, got, w)
		}
	}

	t.Run("a repeated decision fetches nothing", func(t *testing.T) {
		first := decide(t, "public", "0.9.3")
		want(t, "", counts{index: 1, chart: 1})
		second := decide(t, "public", "0.9.3")
		want(t, "", counts{index: 1, chart: 1})
		if first.Result.Message != second.Result.Message || !strings.Contains(second.Result.Message, "kro 0.9.3") {
			t.Errorf("the repeated decision differs:\nfirst:  %s\nsecond: %s", first.Result.Message, second.Result.Message)
		}
	})

	t.Run("an index change is seen only after the TTL", func(t *testing.T) {
		before := seen("")
		if resp := decide(t, "public", ">=0.9.0 <1.0.0"); !strings.Contains(resp.Result.Message, "kro 0.9.3") {
			t.Fatalf("the range resolved to another version than 0.9.3: %s", resp.Result.Message)
		}
		files, err := expand([]string{"crds/kro/v0.9.3"})
		if err != nil {
			t.Fatal(err)
		}
		src, err := testenv.FixtureChart(filepath.Join(t.TempDir(), "kro-0.9.5"), "kro", "0.9.5", files...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.Package(src, rp.dir); err != nil {
			t.Fatal(err)
		}
		rp.reindex(t)

		clk.SetTime(clk.Now().Add(ttl - time.Second))
		if resp := decide(t, "public", ">=0.9.0 <1.0.0"); !strings.Contains(resp.Result.Message, "kro 0.9.3") {
			t.Errorf("within the TTL the gate saw the new index: %s", resp.Result.Message)
		}
		want(t, "", before)

		clk.SetTime(clk.Now().Add(2 * time.Second))
		if resp := decide(t, "public", ">=0.9.0 <1.0.0"); !strings.Contains(resp.Result.Message, "kro 0.9.5") {
			t.Errorf("after the TTL the gate did not pick the new version 0.9.5: %s", resp.Result.Message)
		}
		want(t, "", counts{index: before.index + 1, chart: before.chart + 1})
		// The index is fresh again: the exact version already kept costs nothing.
		decide(t, "public", "0.9.3")
		want(t, "", counts{index: before.index + 1, chart: before.chart + 1})
	})

	t.Run("other credentials do not share entries", func(t *testing.T) {
		anonymous := seen("")
		decide(t, "as-alice", "0.9.3")
		want(t, "alice", counts{index: 1, chart: 1})
		decide(t, "as-bob", "0.9.3")
		want(t, "bob", counts{index: 1, chart: 1})
		decide(t, "as-alice", "0.9.3")
		decide(t, "as-bob", "0.9.3")
		want(t, "alice", counts{index: 1, chart: 1})
		want(t, "bob", counts{index: 1, chart: 1})
		want(t, "", anonymous)

		// Changed credentials (a new resourceVersion of the Secret) are new entries.
		var sec corev1.Secret
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "alice"}, &sec); err != nil {
			t.Fatal(err)
		}
		sec.Labels = map[string]string{"rotated": "true"}
		if err := s.c.Update(ctx, &sec); err != nil {
			t.Fatal(err)
		}
		decide(t, "as-alice", "0.9.3")
		want(t, "alice", counts{index: 2, chart: 2})
	})
}
