package migrate

import (
	"testing"

	"k8s.io/apiserver/pkg/endpoints/discovery"
)

func TestStorageVersionHashMatchesTheAPIServer(t *testing.T) {
	for _, gvk := range [][3]string{{"source.toolkit.fluxcd.io", "v1", "HelmRepository"}, {"", "v1", "ConfigMap"}, {"example.com", "v1alpha1", "Widget"}} {
		if got, want := storageVersionHash(gvk[0], gvk[1], gvk[2]), discovery.StorageVersionHash(gvk[0], gvk[1], gvk[2]); got != want {
			t.Errorf("%v: %q, the API server says %q", gvk, got, want)
		}
	}
}
