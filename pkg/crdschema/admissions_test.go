package crdschema_test

import (
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
)

// requestCounter counts the requests of the clients built from its config.
type requestCounter struct{ n atomic.Int64 }

func (c *requestCounter) config(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) { c.n.Add(1); return rt.RoundTrip(r) })
	})
	return cfg
}

// take returns the requests counted since the last call.
func (c *requestCounter) take() int64 { return c.n.Swap(0) }

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// regrouped is the flux2 chart's CRDs of a release moved to a group of this test's own, so
// that they meet no other test's CRDs on the shared API server.
func regrouped(t *testing.T, file string) []*apiextv1.CustomResourceDefinition {
	t.Helper()
	crds, err := testenv.ReadCRDs(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		c.Spec.Group = strings.TrimSuffix(c.Spec.Group, ".toolkit.fluxcd.io") + ".admissions.example.com"
		c.Name = c.Spec.Names.Plural + "." + c.Spec.Group
	}
	return crds
}

// The API server is asked only what it has not answered: upgrading flux2 2.17.2's CRDs,
// as the API server stored them, to 2.18.2's asks nothing about the four 2.18.2 leaves as
// they are, one dry run for each of the others, and nothing at all the second time.
func TestAdmissionsAskOnlyWhatChanged(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	var counter requestCounter
	counted := apiextclient.NewForConfigOrDie(counter.config(cp.Config)).ApiextensionsV1().CustomResourceDefinitions()
	for _, c := range regrouped(t, "charts/flux2-2.17.2/rendered/crds.yaml") {
		if err := testenv.ApplyCRD(ctx, cs, c); err != nil {
			t.Fatal(err)
		}
	}
	incoming := regrouped(t, "charts/flux2-2.18.2/rendered/crds.yaml")
	live := map[string]*apiextv1.CustomResourceDefinition{}
	var unchanged []string
	for _, next := range incoming {
		live[next.Name] = liveCRD(t, cs, next.Name)
		if crdschema.Unchanged(live[next.Name], next) {
			unchanged = append(unchanged, next.Spec.Names.Plural)
		}
	}
	slices.Sort(unchanged)
	want := []string{"externalartifacts", "imagepolicies", "imagerepositories", "imageupdateautomations"}
	if diff := cmp.Diff(want, unchanged); diff != "" {
		t.Fatalf("CRDs whose spec 2.18.2 leaves as the API server stored it (-want +got):\n%s", diff)
	}

	admissions := crdschema.NewAdmissions(0)
	for round, wantRequests := range []int64{int64(len(incoming) - len(want)), 0} {
		for _, next := range incoming {
			if r, err := admissions.Admit(ctx, counted, live[next.Name], next); err != nil || r != nil {
				t.Fatalf("round %d: %s: refusal %v, error %v; the API server accepts flux2 2.18.2", round, next.Name, r.Message(), err)
			}
		}
		if got := counter.take(); got != wantRequests {
			t.Errorf("round %d: %d requests, want %d (one dry run per changed CRD, none for an answer kept)", round, got, wantRequests)
		}
	}

	// Admit without Admissions asks nothing about an unchanged CRD either.
	for _, next := range incoming {
		if slices.Contains(want, next.Spec.Names.Plural) {
			if _, err := crdschema.Admit(ctx, counted, live[next.Name], next); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := counter.take(); got != 0 {
		t.Errorf("Admit of the unchanged CRDs made %d requests, want none", got)
	}
}

// A refusal is kept like an acceptance, and a live CRD that changed is asked about again.
func TestAdmissionsKeepRefusalsUntilTheLiveCRDChanges(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	var counter requestCounter
	counted := apiextclient.NewForConfigOrDie(counter.config(cp.Config)).ApiextensionsV1().CustomResourceDefinitions()
	before := synthetic(t, "admitted", `{type: object, properties: {a: {type: string}}}`, "")
	if err := testenv.ApplyCRD(ctx, cs, before); err != nil {
		t.Fatal(err)
	}
	// A rule that does not compile: every minor refuses it.
	after := synthetic(t, "admitted", `{type: object, x-kubernetes-validations: [{rule: "self.a ==", message: "broken"}],
		properties: {a: {type: string}}}`, "")
	admissions := crdschema.NewAdmissions(0)
	live := liveCRD(t, cs, before.Name)
	first, err := admissions.Admit(ctx, counted, live, after)
	if err != nil || first == nil {
		t.Fatalf("refusal %v, error %v; want a refusal of the rule", first, err)
	}
	again, err := admissions.Admit(ctx, counted, live, after)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("the kept answer differs (-first +again):\n%s", diff)
	}
	if got := counter.take(); got != 1 {
		t.Errorf("%d requests for the same question twice, want 1", got)
	}

	live.Labels = map[string]string{"moved": "yes"}
	moved, err := cs.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, live, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admissions.Admit(ctx, counted, moved, after); err != nil {
		t.Fatal(err)
	}
	if got := counter.take(); got != 1 {
		t.Errorf("%d requests after the live CRD changed, want 1 (asked again)", got)
	}
}
