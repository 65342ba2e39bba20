package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// CauseGateDenied is the status cause type upgradeguard's admission gate sets on every
// denial it answers (the response's status details), with the denial's event reason as
// the cause's message. The API server passes it on to the client, so a client that asked
// with a dry-run write (check asks whether the API server accepts each incoming CRD) knows
// the denial is the gate's own decision, which the client predicts itself, and not an
// unknown webhook's refusal. Programs read the type, never the message.
const CauseGateDenied metav1.CauseType = "upgradeguard.io/GateDenied"

// Condition reasons, declared once for every writer: the controller on StorageMigrations
// and StorageMigrationPolicies, pkg/gate (and so the admission gate) on what a gate holds.
const (
	// ReasonMigrationRequired: storedVersions hold versions other than the storage one.
	ReasonMigrationRequired = "MigrationRequired"
	// ReasonNoMigrationRequired: the incoming CRDs need no migration.
	ReasonNoMigrationRequired = "NoMigrationRequired"
	// ReasonBridgeRequired, ReasonCRDWouldBeDeleted, ReasonFieldsWouldBeLost: what no
	// automatic migration fixes.
	ReasonBridgeRequired    = "BridgeRequired"
	ReasonCRDWouldBeDeleted = "CRDWouldBeDeleted"
	ReasonFieldsWouldBeLost = "FieldsWouldBeLost"
	// ReasonCRDRefused: the API server refuses an incoming CRD itself (its schema or a
	// CEL rule), which no migration fixes.
	ReasonCRDRefused = "CRDRefused"
	// ReasonMigrating: a migration is running.
	ReasonMigrating = "Migrating"
	// ReasonMigrated: the migration succeeded.
	ReasonMigrated = "Migrated"
	// ReasonCompleted: Running is False because the migration succeeded.
	ReasonCompleted = "Completed"
	// ReasonFailed: Running and Succeeded are False because the migration failed.
	ReasonFailed = "Failed"
	// ReasonMigrationFailed: the migration failed and needs an operator.
	ReasonMigrationFailed = "MigrationFailed"
	// ReasonFieldLossRefused: the migration was refused for the fields it would drop
	// (spec.allowFieldLoss); nothing was written.
	ReasonFieldLossRefused = "FieldLossRefused"
	// ReasonAutomaticMigrationDisabled: a migration is required and nothing may start it.
	ReasonAutomaticMigrationDisabled = "AutomaticMigrationDisabled"
	// ReasonIdle: nothing is migrating, nothing failed.
	ReasonIdle = "Idle"

	// StorageMigrationPolicy Ready condition reasons.
	ReasonSelected         = "Selected"
	ReasonInvalidSelector  = "InvalidSelector"
	ReasonClustersNotReady = "ClustersNotReady"
)
