// Package v1alpha1 holds the upgradeguard.io/v1alpha1 API: StorageMigration, one run of
// storage-version migration over some CRDs, and StorageMigrationPolicy, which CRDs the
// controller keeps migrated on its own.
//
// +kubebuilder:object:generate=true
// +groupName=upgradeguard.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "upgradeguard.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
