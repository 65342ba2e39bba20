package livecluster_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// TestReleaseFromMemory: a target of Clusters (its informer on the Helm release records) finds a release's deployed revision with
// no API request once it has read it, and a revision written since is seen by the next
// reads.
func TestReleaseFromMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	const ns = "memory-releases"
	kc := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := driver.NewSecrets(kc.CoreV1().Secrets(ns))
	rel := func(v int, status common.Status) *release.Release {
		return &release.Release{Name: "web", Namespace: ns, Version: v, Info: &release.Info{Status: status},
			Chart: &chart.Chart{Metadata: &chart.Metadata{Name: "web", Version: fmt.Sprintf("1.%d.0", v)}}}
	}
	key := func(v int) string { return fmt.Sprintf("sh.helm.release.v1.web.v%d", v) }
	if err := d.Create(key(1), rel(1, common.StatusDeployed)); err != nil {
		t.Fatal(err)
	}
	target, n := testenv.CountedTarget(t, cp.Config, livecluster.ClustersOptions{}, false)
	reader, err := helmrelease.NewReader(target.Clientset, ns, helmrelease.DriverSecret)
	if err != nil {
		t.Fatal(err)
	}
	reader.WithMemory(target.Metadata, target.Releases)
	deployedFromMemory := func(want int) func() (bool, error) {
		return func() (bool, error) {
			before := n.Load()
			r, _, err := reader.Deployed(ctx, "web")
			if err != nil || r.Version != want {
				return false, err
			}
			return n.Load() == before, nil
		}
	}
	testenv.Eventually(t, "revision 1 read with no API request", deployedFromMemory(1))

	if err := d.Update(key(1), rel(1, common.StatusSuperseded)); err != nil {
		t.Fatal(err)
	}
	if err := d.Create(key(2), rel(2, common.StatusDeployed)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "revision 2 seen, then read with no API request", deployedFromMemory(2))
}

// TestInformerOfDeletedResourceStops: the metadata informer a decision starts on a
// resource's objects (here by counting them) is stopped and forgotten once the resource
// is no longer served (its CRD deleted), instead of relisting for as long as the target
// lives.
func TestInformerOfDeletedResourceStops(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	const group = "forget.memory.example.io"
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	crd := testenv.TwoVersionCRD(group, "gadgets", "Gadget")
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	target, _ := testenv.CountedTarget(t, cp.Config, livecluster.ClustersOptions{}, false)
	key := "objects/" + group + "/v1alpha1, Resource=gadgets" // counted at the storage version
	testenv.Eventually(t, "an informer on the gadgets after counting them", func() (bool, error) {
		_, err := target.Cluster.CountObjects(ctx, crd)
		return slices.Contains(livecluster.Informers(target.Cluster), key), err
	})
	if err := cp.DeleteCRDs(ctx, func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group != group }); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the informer forgotten once the CRD is deleted", func() (bool, error) {
		return !slices.Contains(livecluster.Informers(target.Cluster), key), nil
	})
}

// TestSampleObjects: SampleObjects asks the API server for the number of a resource's
// objects and names the first few, in the API server's order, with one LIST whatever
// their number; CountObjects gives the same number, from memory once the resource's
// informer has synced (no API request), and sees an object deleted since.
func TestSampleObjects(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	const group = "sample.memory.example.io"
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	crd := testenv.TwoVersionCRD(group, "widgets", "Widget")
	if err := testenv.ApplyCRD(ctx, cs, crd); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "widgets"}
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: gvr, Kind: "Widget", Namespaces: []string{"sample-a", "sample-b"}, PerNS: 4}); err != nil {
		t.Fatal(err)
	}
	target, n := testenv.CountedTarget(t, cp.Config, livecluster.ClustersOptions{}, false)
	before := n.Load()
	count, names, err := target.Cluster.SampleObjects(ctx, crd, 3)
	if err != nil {
		t.Fatal(err)
	}
	if count != 8 || n.Load()-before != 1 {
		t.Errorf("SampleObjects counted %d with %d requests, want 8 with 1", count, n.Load()-before)
	}
	if len(names) != 3 || !slices.IsSorted(names) || !strings.HasPrefix(names[0], "sample-a/") {
		t.Errorf("SampleObjects named %v, want the first 3 in the API server's order", names)
	}
	testenv.Eventually(t, "8 widgets counted from memory", func() (bool, error) {
		before := n.Load()
		c, err := target.Cluster.CountObjects(ctx, crd)
		return c == 8 && n.Load() == before, err
	})
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	if err := dyn.Resource(gvr).Namespace("sample-a").Delete(ctx, strings.TrimPrefix(names[0], "sample-a/"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if count, _, err := target.Cluster.SampleObjects(ctx, crd, 1); err != nil || count != 7 {
		t.Errorf("SampleObjects after a deletion = %d (%v), want 7", count, err)
	}
	testenv.Eventually(t, "the deletion seen in memory", func() (bool, error) {
		c, err := target.Cluster.CountObjects(ctx, crd)
		return c == 7, err
	})
}
