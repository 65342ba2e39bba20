package servicereconciler

import (
	_ "embed"
	"fmt"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

//go:embed config/example.upgradeguard.io_demoservices.yaml
var crdYAML []byte

// CRD returns the DemoService CustomResourceDefinition, to install before the controller
// starts.
func CRD() (*apiextv1.CustomResourceDefinition, error) {
	var crd apiextv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &crd); err != nil {
		return nil, fmt.Errorf("decode the DemoService CRD: %w", err)
	}
	return &crd, nil
}
