// Package v1alpha1 holds the upgradeguard.io/v1alpha1 API: StorageMigration, one run of
// storage-version migration over some CRDs, and StorageMigrationPolicy, which CRDs the
// controller keeps migrated on its own.
//
// +kubebuilder:object:generate=true
// +groupName=upgradeguard.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "upgradeguard.io", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this API with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this API to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&StorageMigration{}, &StorageMigrationList{},
		&StorageMigrationPolicy{}, &StorageMigrationPolicyList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
