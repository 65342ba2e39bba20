package testenv_test

import (
	"fmt"
	"testing"

	"golang.org/x/sync/errgroup"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// TestCreateObjectsRightAfterCRD: objects can be created the moment their CRD is, the
// way a test creates them right after `helm install` created the CRD from templates/
// (Helm waits only for CRDs in crds/). The API server serves a new CRD's resource only
// once its names are accepted, a moment after the create; until then a create is a 404.
func TestCreateObjectsRightAfterCRD(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cp := testenv.ForTest(t, testenv.Options{})
	ctx := t.Context()
	ext := apiextclient.NewForConfigOrDie(cp.Config)
	var g errgroup.Group
	for i := range 10 {
		g.Go(func() error {
			group := fmt.Sprintf("g%d.served.test", i)
			crd := testenv.TwoVersionCRD(group, "things", "Thing")
			if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
				return err
			}
			return testenv.CreateObjects(ctx, cp.Config, testenv.Objects{
				GVR: schema.GroupVersionResource{Group: group, Version: "v1", Resource: "things"}, Kind: "Thing",
				Namespaces: []string{"default"}, PerNS: 2,
			})
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}
