// Package controller holds upgradeguard's controllers: the StorageMigration reconciler,
// proactive mode over CRDs, and the manager that also serves the HelmRelease gate.
//
// RBAC: `make generate` writes config/rbac/role.yaml and the chart's ClusterRole rules
// (charts/upgradeguard/files/clusterrole.yaml) from the +kubebuilder:rbac markers in this
// package. Markers sit beside the code that needs them; this file holds the ones for
// access the migration engine and the gate need that no reconciler file owns.
package controller

// Every custom resource: a migration re-persists the objects of whichever CRD a policy or
// an upgrade selects, with a paged LIST and an empty PATCH per object; the gate and the
// CRD deletion guard count and read a resource's objects from a metadata-only informer,
// which stays current only through its watch (without it, it relists after each failed
// watch and lags by the back-off). RBAC cannot say "custom resources only", so this is a
// wildcard (it reaches built-in resources too); the chart's rbac.customResourceGroups
// narrows it to named API groups (docs/operator-guide.md).
// +kubebuilder:rbac:groups=*,resources=*,verbs=get;list;patch;watch

// The builtin migration engine: a StorageVersionMigration per CRD, followed and deleted;
// list and watch also tell check and the gate that a migration is in progress.
// +kubebuilder:rbac:groups=storagemigration.k8s.io,resources=storageversionmigrations,verbs=get;list;watch;create;delete

// The HelmRelease gate: read HelmReleases and annotate them with the gate's state.
// +kubebuilder:rbac:groups=helm.toolkit.fluxcd.io,resources=helmreleases,verbs=get;list;watch;patch

// The gate resolves the incoming chart from the HelmRelease's source.
// +kubebuilder:rbac:groups=source.toolkit.fluxcd.io,resources=helmrepositories;ocirepositories;helmcharts,verbs=get;list;watch

// Secrets: a HelmRelease's spec.kubeConfig and a StorageMigration's kubeConfig secretRef,
// repository credentials, and Helm's release storage (sh.helm.release.v1.* Secrets, listed
// by label in the release namespace).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list

// ConfigMaps and Secrets that a HelmRelease's spec.valuesFrom names: the gate composes the
// values as helm-controller does (it reads only the named objects, with get).
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get
