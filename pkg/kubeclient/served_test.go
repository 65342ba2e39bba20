package kubeclient_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
	"github.com/upgradeguard/upgradeguard/pkg/svm"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

// unknownGV is a group and version no API server serves; unservedGV a type Kubernetes
// knows but does not serve by default (the built-in migrator's beta, off on every minor
// CI runs: absent on 1.32, a disabled beta on 1.37 and 1.38).
var (
	unknownGV  = schema.GroupVersion{Group: "nope.upgradeguard.io", Version: "v1"}
	unservedGV = schema.GroupVersion{Group: svm.Group, Version: "v1beta1"}
)

// TestNotServedProbes: every probe of an optional API takes the API server's 404 for a
// path it does not serve as "not served", in the form the running minor answers (text up
// to 1.37, a JSON Status from 1.38, kubernetes#138219), and a missing object of a served
// type as missing, not "not served". It runs on 1.38 in CI (KUBE_CI_PACKAGES).
func TestNotServedProbes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	assertRaw404(t)

	disco := discovery.NewDiscoveryClientForConfigOrDie(cp.Config)
	for _, gv := range []schema.GroupVersion{unknownGV, unservedGV} {
		_, err := disco.ServerResourcesForGroupVersion(gv.String())
		if !kubeclient.IsNotServed(err) {
			t.Errorf("discovery of %s: %v, want not served", gv, err)
		}
	}
	// The built-in migrator's API: v1 where served (1.37 and later), nothing on 1.32.
	gvr, err := svm.Resource(disco)
	if err != nil {
		t.Fatalf("svm.Resource: %v", err)
	}
	if want := cp.Minor >= 37; !gvr.Empty() != want || (want && gvr.Version != "v1") {
		t.Errorf("svm.Resource = %v on 1.%d", gvr, cp.Minor)
	}

	dyn := dynamic.NewForConfigOrDie(cp.Config)
	// Argo CD's Applications, not installed: a GET of one and the LIST.
	_, err = argoapp.Get(ctx, dyn, "argocd", "guestbook")
	if nf := new(argoapp.NotFoundError); !errors.As(err, &nf) || !nf.NoCRD {
		t.Errorf("argoapp.Get without Argo CD: %v, want the CRD named as missing", err)
	}
	if apps, err := argoapp.List(ctx, dyn, ""); err != nil || apps != nil {
		t.Errorf("argoapp.List without Argo CD: %v, %v", apps, err)
	}
	// Flux's HelmReleases and an unknown type, by LIST and by GET.
	for _, gvr := range []schema.GroupVersionResource{{Group: "helm.toolkit.fluxcd.io", Version: "v2", Resource: "helmreleases"},
		unknownGV.WithResource("widgets"), unservedGV.WithResource("storageversionmigrations")} {
		if _, err := kubeclient.ListAll(ctx, dyn.Resource(gvr).Namespace("default"), metav1.ListOptions{}); !kubeclient.IsNotServed(err) {
			t.Errorf("list %s: %v, want not served", gvr, err)
		}
		if _, err := dyn.Resource(gvr).Namespace("default").Get(ctx, "x", metav1.GetOptions{}); !kubeclient.IsNotServed(err) {
			t.Errorf("get %s: %v, want not served", gvr, err)
		}
	}
	// A missing object of a served type is missing, not "not served".
	_, err = dyn.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}).Namespace("default").Get(ctx, "x", metav1.GetOptions{})
	if err == nil || kubeclient.IsNotServed(err) {
		t.Errorf("get a missing Deployment: %v, want a missing object", err)
	}
}

// assertRaw404 checks what the running minor answers for an unknown /apis path, so that
// the probes above are known to have met its form: a JSON Status from 1.38, text before.
func assertRaw404(t *testing.T) {
	t.Helper()
	rt, err := rest.TransportFor(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, cp.Config.Host+"/apis/"+unknownGV.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	ct := resp.Header.Get("Content-Type")
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /apis/%s: %d %s", unknownGV, resp.StatusCode, body)
	}
	if cp.Minor < 38 {
		if !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("1.%d answered %s %s, want text", cp.Minor, ct, body)
		}
		return
	}
	var status metav1.Status
	if !strings.HasPrefix(ct, "application/json") || json.Unmarshal(body, &status) != nil ||
		status.Kind != "Status" || status.Reason != metav1.StatusReasonNotFound || status.Details != nil {
		t.Errorf("1.%d answered %s %s, want a JSON Status, reason NotFound, without details", cp.Minor, ct, body)
	}
}
