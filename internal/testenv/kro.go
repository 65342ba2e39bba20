package testenv

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// The kro fixtures hold a real schema change that loses data: kro 0.9.3's
// ResourceGraphDefinition no longer declares spec.defaultServiceAccounts, which 0.2.0's
// objects may hold.

// KroLostField is the field kro 0.2.0's ResourceGraphDefinitions hold and 0.9.3's schema
// prunes.
const KroLostField = "spec.defaultServiceAccounts"

// KroChart writes a chart of the kro fixture CRD at version (0.2.0 or 0.9.3) under group
// (RegroupedFixtureChart) into dir and returns its path.
func KroChart(dir, version, group string) (string, error) {
	return RegroupedFixtureChart(dir, "kro", version, "crds/kro/v"+version+"/kro.run_resourcegraphdefinitions.yaml", "kro.run", group)
}

// KroLostValue is the value CreateKroGraph puts in KroLostField: long enough that output
// which must never carry values can be searched for it.
const KroLostValue = "deployer-with-a-long-name"

// CreateKroGraph creates the cluster-scoped ResourceGraphDefinition name of group at
// v1alpha1, holding KroLostField.
func CreateKroGraph(ctx context.Context, cfg *rest.Config, group, name string) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	gvr := schema.GroupVersionResource{Group: group, Version: "v1alpha1", Resource: "resourcegraphdefinitions"}
	rgd := &unstructured.Unstructured{Object: map[string]any{"apiVersion": group + "/v1alpha1", "kind": "ResourceGraphDefinition",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"defaultServiceAccounts": map[string]any{"default": KroLostValue},
			"schema": map[string]any{"apiVersion": "v1alpha1", "kind": "Web", "spec": map[string]any{"name": "string"}}}}}
	if _, err := dyn.Resource(gvr).Create(ctx, rgd, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ResourceGraphDefinition %s: %w", name, err)
	}
	return nil
}
