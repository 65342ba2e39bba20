package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types of a StorageMigration. The gate also sets StorageMigrationRequired and
// StorageMigrationInProgress on the resources it guards (see pkg/gate).
const (
	// ConditionRunning is True while the controller is migrating objects.
	ConditionRunning = "Running"
	// ConditionSucceeded is True once every CRD is migrated and its storedVersions pruned.
	ConditionSucceeded = "Succeeded"
	// ConditionFailed is True when the migration stopped and needs an operator.
	ConditionFailed = "Failed"

	ConditionStorageMigrationRequired   = "StorageMigrationRequired"
	ConditionStorageMigrationInProgress = "StorageMigrationInProgress"
	ConditionStorageMigrationFailed     = "StorageMigrationFailed"
)

// Phase is where a StorageMigration is in its life.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type Phase string

// Phases.
const (
	PhasePending   Phase = "Pending"
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

// KubeConfigReference names a Secret that holds a kubeconfig for a remote cluster, the way
// Flux's spec.kubeConfig.secretRef does. The StorageMigration is cluster-scoped, so the
// reference carries the Secret's namespace.
type KubeConfigReference struct {
	// SecretRef is the Secret holding the kubeconfig.
	SecretRef SecretKeyReference `json:"secretRef"`
}

// SecretKeyReference is one key of one Secret.
type SecretKeyReference struct {
	// Namespace of the Secret.
	// +kubebuilder:validation:MinLength=1
	Namespace string `json:"namespace"`
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key holding the kubeconfig. When empty, Flux's keys "value" and then "value.yaml",
	// then a plain "kubeconfig", are tried.
	// +optional
	Key string `json:"key,omitempty"`
}

// RateSettings bound the load a migration puts on the API server.
type RateSettings struct {
	// QPS is an opt-in client-side limit on the sustained request rate. 0 means none:
	// Concurrency bounds the load, and the API server's Priority and Fairness paces it
	// (429 and Retry-After, which the migration honours).
	// +kubebuilder:validation:Minimum=0
	// +optional
	QPS int32 `json:"qps,omitempty"`
	// Burst is the client's burst. 0 means twice QPS.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Burst int32 `json:"burst,omitempty"`
	// Concurrency is how many objects are patched at once. 0 means the default (8).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	// +optional
	Concurrency int32 `json:"concurrency,omitempty"`
	// PageSize is the LIST page size. 0 means the default (500).
	// +kubebuilder:validation:Minimum=0
	// +optional
	PageSize int64 `json:"pageSize,omitempty"`
}

// StorageMigrationSpec says which CRDs to migrate, where, and how fast.
type StorageMigrationSpec struct {
	// Resources are the CRDs to migrate, by name (plural.group). Each is migrated to its
	// live storage version, and its status.storedVersions is pruned to that version once
	// every object has been re-persisted.
	// +kubebuilder:validation:MinItems=1
	// +listType=set
	Resources []string `json:"resources"`

	// KubeConfig targets a remote cluster. The cluster the controller runs in when unset.
	// +optional
	KubeConfig *KubeConfigReference `json:"kubeConfig,omitempty"`

	// Rate bounds the load on the API server.
	// +optional
	Rate RateSettings `json:"rate,omitempty"`

	// Deadline bounds one attempt at one CRD; the controller saves its place and carries on
	// in the next attempt. Defaults to 10m.
	// +optional
	Deadline *metav1.Duration `json:"deadline,omitempty"`

	// Mode is where the migration runs. Remote (the default): the controller migrates
	// through the target's API server. Job: the controller creates on the target a
	// ServiceAccount with the least privileges for exactly these CRDs and a Job running
	// `upgradeguard migrate`, follows it through the result it writes, and cleans up.
	// +kubebuilder:validation:Enum=Remote;Job
	// +optional
	Mode MigrationMode `json:"mode,omitempty"`

	// Engine is who re-persists the objects. Client: the controller (or its Job) patches
	// every object; fastest, and it needs patch on the custom resources. Builtin: the
	// controller creates a StorageVersionMigration and Kubernetes' own migrator in
	// kube-controller-manager patches them (storagemigration.k8s.io v1 from 1.37, v1beta1
	// where enabled on 1.35 and 1.36); least privilege, at the controller manager's pace.
	// Auto (the default): client when the controller may patch the objects, else builtin.
	// Either way the controller holds the migration Lease, prunes storedVersions under the
	// same guards, and reports the same status.
	// +kubebuilder:validation:Enum=auto;client;builtin
	// +optional
	Engine MigrationEngine `json:"engine,omitempty"`

	// AllowFieldLoss lets the migration drop fields. Before it writes anything, the
	// migration reads the objects stored at other versions and judges them against the
	// storage version's schema: a field that schema does not declare is already hidden
	// by the API server, and the migration's rewrite deletes it from etcd for good. By
	// default such a migration is refused: it fails with reason FieldLossRefused, the
	// paths and object counts in its message and status.resources[].fieldLoss, and
	// nothing written. Set this to true only once the loss is intended (see
	// docs/runbooks/migration-refused-field-loss.md); the status still lists what was
	// dropped. Changing it starts the migration over.
	// +optional
	AllowFieldLoss bool `json:"allowFieldLoss,omitempty"`
}

// MigrationEngine is who re-persists the objects of a migration.
type MigrationEngine string

// Migration engines (the values of `upgradeguard migrate --engine`).
const (
	EngineAuto    MigrationEngine = "auto"
	EngineClient  MigrationEngine = "client"
	EngineBuiltin MigrationEngine = "builtin"
)

// MigrationMode is where a migration runs.
type MigrationMode string

// Migration modes.
const (
	ModeRemote MigrationMode = "Remote"
	ModeJob    MigrationMode = "Job"
)

// ResourceProgress is the state of one CRD's migration. Its counts are those of
// `upgradeguard migrate -o json`.
type ResourceProgress struct {
	// Name of the CRD.
	Name string `json:"name"`
	// Phase of this CRD's migration.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// StorageVersion the objects are re-persisted at.
	// +optional
	StorageVersion string `json:"storageVersion,omitempty"`
	// StoredVersionsBefore is status.storedVersions when the migration started.
	// +optional
	StoredVersionsBefore []string `json:"storedVersionsBefore,omitempty"`
	// StoredVersionsAfter is status.storedVersions when it ended.
	// +optional
	StoredVersionsAfter []string `json:"storedVersionsAfter,omitempty"`
	// Objects seen so far.
	Objects int64 `json:"objects"`
	// Rewritten objects (their stored encoding changed).
	Rewritten int64 `json:"rewritten"`
	// AlreadyCurrent objects (already stored at the storage version).
	AlreadyCurrent int64 `json:"alreadyCurrent"`
	// Deleted while the migration ran.
	Deleted int64 `json:"deleted"`
	// FailedCount objects the API server refused to re-persist.
	FailedCount int64 `json:"failedCount"`
	// Continue is the LIST continue token after the last page done, so a restarted
	// controller resumes there. Empty before the first page and after the last.
	// +optional
	Continue string `json:"continue,omitempty"`
	// Attempts made at this CRD.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`
	// Engine is the engine that migrated this CRD, and EngineReason why it was chosen.
	// +optional
	Engine MigrationEngine `json:"engine,omitempty"`
	// +optional
	EngineReason string `json:"engineReason,omitempty"`
	// FieldLoss are the fields the migration drops (refused, or dropped under
	// spec.allowFieldLoss): paths, object counts and a few object names, never values.
	// +optional
	FieldLoss []DroppedField `json:"fieldLoss,omitempty"`
	// Message says what happened, and what to do when it failed.
	// +optional
	Message string `json:"message,omitempty"`
	// CompletionTime is when this CRD finished.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// DroppedField is one field path that re-writing objects stored at an older version
// drops, because the storage version's schema does not declare it.
type DroppedField struct {
	// Path of the field, list indices written as [*].
	Path string `json:"path"`
	// Version whose schema does not declare it (the storage version).
	Version string `json:"version"`
	// Objects holding the field.
	Objects int64 `json:"objects"`
	// Examples are up to three of those objects (namespace/name).
	// +optional
	Examples []string `json:"examples,omitempty"`
}

// StorageMigrationStatus is what the controller observed.
type StorageMigrationStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Phase summarises the conditions.
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// Conditions: Running, Succeeded, Failed, and StorageMigrationRequired,
	// StorageMigrationInProgress, StorageMigrationFailed for readers that follow the gate's
	// types.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Resources is the progress per CRD, in spec order.
	// +optional
	Resources []ResourceProgress `json:"resources,omitempty"`
	// StartTime is when the controller started the migration.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when it succeeded or failed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// Job is the target cluster's Job (namespace/name) running the migration in Job mode.
	// +optional
	Job string `json:"job,omitempty"`
	// Replica is the controller replica (its --replica-id, the Pod's name in the chart)
	// that ran the migration last. A migration of a fleet target moves with the target
	// when the replica that owned it goes, and resumes where it stopped.
	// +optional
	Replica string `json:"replica,omitempty"`
}

// StorageMigration re-persists every object of some CRDs at their storage version and
// prunes status.storedVersions, so that a chart that drops an old version installs.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=stm,categories=upgradeguard
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Resources",type=string,JSONPath=`.spec.resources`,priority=1
// +kubebuilder:printcolumn:name="Replica",type=string,JSONPath=`.status.replica`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type StorageMigration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   StorageMigrationSpec   `json:"spec,omitempty"`
	Status StorageMigrationStatus `json:"status,omitempty"`
}

// StorageMigrationList is a list of StorageMigrations.
//
// +kubebuilder:object:root=true
type StorageMigrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StorageMigration `json:"items"`
}
