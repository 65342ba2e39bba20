// Package controller holds upgradeguard's controllers: the StorageMigration reconciler,
// proactive mode over CRDs and the HelmRelease gate's migrations.
//
// This file holds only the RBAC markers from which `make generate` writes
// config/rbac/role.yaml and the chart's ClusterRole rules (charts/upgradeguard/files).
// Keep every permission the controller and the webhook need here, with the reason beside
// it, so that the generated role is the whole truth and nothing else.
package controller

// CRDs: proactive mode watches them; a reverse migration switches the storage version
// (update, patch); pruning storedVersions after a migration writes the status subresource.
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=apiextensions.k8s.io,resources=customresourcedefinitions/status,verbs=get;update;patch

// Every custom resource: a migration re-persists the objects of whichever CRD a policy or
// an upgrade selects, with a paged LIST and an empty PATCH per object. RBAC cannot say
// "custom resources only", so this is a wildcard; the chart's rbac.customResourceGroups
// narrows it to named API groups (see docs/operator-guide.md).
// +kubebuilder:rbac:groups=*,resources=*,verbs=get;list;patch

// upgradeguard's own API.
// +kubebuilder:rbac:groups=upgradeguard.io,resources=storagemigrations;storagemigrationpolicies,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=upgradeguard.io,resources=storagemigrations/status;storagemigrationpolicies/status,verbs=get;update;patch

// Leases: leader election (upgradeguard-controller) and the per-CRD migration Leases
// that keep two migrations of one CRD from running at once.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update

// Events on StorageMigrations and HelmReleases (core and events.k8s.io recorders).
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch

// The HelmRelease gate: read HelmReleases and annotate them with the gate's state.
// +kubebuilder:rbac:groups=helm.toolkit.fluxcd.io,resources=helmreleases,verbs=get;list;watch;patch

// The gate resolves the incoming chart from the HelmRelease's source.
// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=helmrepositories;ocirepositories;helmcharts,verbs=get;list;watch

// Secrets: a HelmRelease's spec.kubeConfig, repository credentials, and Helm's release
// storage (sh.helm.release.v1.* Secrets, listed by label in the release namespace).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list
