package main

import (
	"context"
	"fmt"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// incidentState builds the production incident's starting point: n HelmRepositories stored
// at v1beta2 by source-controller 1.2.0, then the flux2 2.17.2 CRDs (storage v1,
// storedVersions [v1beta2, v1]). It returns the 2.17.2 CRDs.
func incidentState(ctx context.Context, cp *testenv.ControlPlane, n int) ([]*apiextv1.CustomResourceDefinition, error) {
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	old, err := testenv.ReadCRDs("crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml")
	if err != nil {
		return nil, err
	}
	if err := testenv.ApplyCRD(ctx, cs, old[0]); err != nil {
		return nil, err
	}
	fmt.Printf("creating %d HelmRepositories at v1beta2 ...\n", n)
	v1beta2 := benchGVR
	v1beta2.Version = "v1beta2"
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: v1beta2, Kind: "HelmRepository",
		Namespaces: []string{"bench"}, PerNS: n, Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		return nil, err
	}
	crds, err := testenv.ReadCRDs("charts/flux2-2.17.2/rendered/crds.yaml")
	if err != nil {
		return nil, err
	}
	for _, c := range crds {
		if err := testenv.ApplyCRD(ctx, cs, c); err != nil {
			return nil, err
		}
	}
	return crds, nil
}
