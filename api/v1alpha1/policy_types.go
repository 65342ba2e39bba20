package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StorageMigrationPolicySpec says which CRDs the controller looks after and how.
type StorageMigrationPolicySpec struct {
	// Selector picks CRDs by label. Empty selects every CRD (subject to Groups).
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`

	// Groups picks CRDs by API group. Empty means every group.
	// +listType=set
	// +optional
	Groups []string `json:"groups,omitempty"`

	// Proactive creates a StorageMigration as soon as an eligible CRD has stored versions
	// other than its storage version. Migrating to the live storage version is always
	// safe, so a cluster under a proactive policy never accumulates stale storedVersions.
	// +kubebuilder:default=true
	// +optional
	Proactive *bool `json:"proactive,omitempty"`

	// AutoMigrate lets the HelmRelease gate start a migration when an upgrade needs one
	// (and deny the upgrade until it completes). Off: the gate only denies, with the
	// command to run.
	// +kubebuilder:default=true
	// +optional
	AutoMigrate *bool `json:"autoMigrate,omitempty"`

	// Rate bounds the load of the migrations this policy creates.
	// +optional
	Rate RateSettings `json:"rate,omitempty"`

	// Deadline of one attempt at one CRD, for the migrations this policy creates.
	// +optional
	Deadline *metav1.Duration `json:"deadline,omitempty"`
}

// StorageMigrationPolicyStatus is what the controller last saw.
type StorageMigrationPolicyStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// EligibleCRDs is how many CRDs the policy selects.
	// +optional
	EligibleCRDs int32 `json:"eligibleCRDs,omitempty"`
	// PendingCRDs are selected CRDs with stored versions other than their storage version.
	// +listType=set
	// +optional
	PendingCRDs []string `json:"pendingCRDs,omitempty"`
	// Conditions: Ready.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// StorageMigrationPolicy puts CRDs under the controller's care: with Proactive on, every
// eligible CRD is migrated as soon as its storedVersions hold more than its storage
// version; with AutoMigrate on, the HelmRelease gate starts the migrations an upgrade needs.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=stmp,categories=upgradeguard
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Proactive",type=boolean,JSONPath=`.spec.proactive`
// +kubebuilder:printcolumn:name="Eligible",type=integer,JSONPath=`.status.eligibleCRDs`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type StorageMigrationPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   StorageMigrationPolicySpec   `json:"spec,omitempty"`
	Status StorageMigrationPolicyStatus `json:"status,omitempty"`
}

// StorageMigrationPolicyList is a list of StorageMigrationPolicies.
//
// +kubebuilder:object:root=true
type StorageMigrationPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StorageMigrationPolicy `json:"items"`
}
