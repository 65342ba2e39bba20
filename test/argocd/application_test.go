//go:build argocd

package argocd_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// TestApplicationCRDIsArgoCDs: the stand-in Application CRD (argocd.ApplicationCRD, for
// tests where no Argo CD runs) has the name, group, names, scope, versions and
// subresources of the real one that argocd.Start installs (bin/argocd/manifests, built
// by ./hack/testbin.sh --argocd); only the schema and printer columns differ.
func TestApplicationCRDIsArgoCDs(t *testing.T) {
	bin, err := testenv.BinDir()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(bin, "argocd", "manifests", "crds", "application-crd.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run ./hack/testbin.sh --argocd (make test-argocd) first", err)
	}
	crds, err := crdversions.FromManifest(path, data)
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) != 1 {
		t.Fatalf("%s holds %d CRDs, want 1", path, len(crds))
	}
	shape := func(crd *apiextv1.CustomResourceDefinition) apiextv1.CustomResourceDefinitionSpec {
		spec := *crd.Spec.DeepCopy()
		spec.Names.Categories = nil
		for i := range spec.Versions {
			v := &spec.Versions[i]
			v.Schema, v.AdditionalPrinterColumns = nil, nil
			// `subresources: {}` is no subresource, as nil is.
			if r := v.Subresources; r != nil && r.Status == nil && r.Scale == nil {
				v.Subresources = nil
			}
		}
		return spec
	}
	real, stand := crds[0], argocd.ApplicationCRD()
	if real.Name != stand.Name {
		t.Errorf("name %s, Argo CD's is %s", stand.Name, real.Name)
	}
	if diff := cmp.Diff(shape(real), shape(stand)); diff != "" {
		t.Errorf("ApplicationCRD differs from Argo CD's (-real +stand-in):\n%s", diff)
	}
}
