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

	// Mode of the migrations this policy creates (see StorageMigrationSpec.Mode).
	// +kubebuilder:validation:Enum=Remote;Job
	// +optional
	Mode MigrationMode `json:"mode,omitempty"`

	// Engine of the migrations this policy creates (see StorageMigrationSpec.Engine).
	// +kubebuilder:validation:Enum=auto;client;builtin
	// +optional
	Engine MigrationEngine `json:"engine,omitempty"`

	// AllowFieldLoss of the migrations this policy creates (see
	// StorageMigrationSpec.AllowFieldLoss). Off (the default), a migration that would
	// drop fields objects hold is refused and waits for an operator. Changing it replaces
	// the policy's refused migrations.
	// +optional
	AllowFieldLoss bool `json:"allowFieldLoss,omitempty"`

	// Targets puts remote clusters under the policy: every kubeconfig Secret the selector
	// matches is a target cluster, whose CRDs are watched and migrated as a local
	// cluster's are (proactive mode per cluster). Set, the policy looks after its targets
	// only, and the local cluster needs a policy of its own without targets. Unset: the
	// local cluster only.
	// +optional
	Targets *FleetTargets `json:"targets,omitempty"`
}

// FleetTargets selects target clusters by their kubeconfig Secrets. The layouts in use
// are read as they are: Flux's kubeConfig Secrets (key value or value.yaml), Cluster
// API's <cluster>-kubeconfig Secrets (key value) and a plain kubeconfig key.
type FleetTargets struct {
	// Namespace holding the kubeconfig Secrets.
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// Selector picks the Secrets by label.
	Selector metav1.LabelSelector `json:"selector"`
	// Key holding the kubeconfig. When empty, value, value.yaml and kubeconfig are tried
	// in that order.
	// +optional
	Key string `json:"key,omitempty"`
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
	// Clusters is the state of each target cluster (spec.targets).
	// +listType=map
	// +listMapKey=name
	// +optional
	Clusters []ClusterStatus `json:"clusters,omitempty"`
}

// Target cluster states (ClusterStatus.State).
const (
	// ClusterReady: the cluster answers and its CRDs are watched.
	ClusterReady = "Ready"
	// ClusterUnreachable: the API server does not answer (down, slow, a bad address).
	ClusterUnreachable = "Unreachable"
	// ClusterForbidden: the API server refuses the kubeconfig's credentials, or they may
	// not read CRDs.
	ClusterForbidden = "Forbidden"
	// ClusterInvalid: the Secret holds no usable kubeconfig.
	ClusterInvalid = "Invalid"
)

// ClusterStatus is one target cluster as the controller last saw it.
type ClusterStatus struct {
	// Name of the cluster: the Cluster API cluster name for a <cluster>-kubeconfig
	// Secret, else the Secret's name.
	Name string `json:"name"`
	// Secret holding its kubeconfig, in spec.targets.namespace.
	Secret string `json:"secret"`
	// KubeconfigHash identifies the kubeconfig in use (the first 12 hex digits of its
	// SHA-256), so a rotation shows.
	// +optional
	KubeconfigHash string `json:"kubeconfigHash,omitempty"`
	// State is Ready, Unreachable, Forbidden or Invalid.
	// +kubebuilder:validation:Enum=Ready;Unreachable;Forbidden;Invalid
	State string `json:"state"`
	// Reason says why, for a state other than Ready.
	// +optional
	Reason string `json:"reason,omitempty"`
	// EligibleCRDs is how many of its CRDs the policy selects.
	// +optional
	EligibleCRDs int32 `json:"eligibleCRDs,omitempty"`
	// PendingCRDs are selected CRDs with stored versions other than their storage version.
	// +listType=set
	// +optional
	PendingCRDs []string `json:"pendingCRDs,omitempty"`
	// LastTransitionTime is when State last changed.
	// +optional
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// Replica is the controller replica that owns the target (holds its Lease
	// upgradeguard-target-<hash>) and wrote this entry.
	// +optional
	Replica string `json:"replica,omitempty"`
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
