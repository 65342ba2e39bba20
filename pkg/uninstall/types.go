package uninstall

import (
	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
)

// Action is what `helm uninstall` does to one object of the stored manifest.
type Action string

// Actions, as Helm decides them (helm.sh/helm/v4 pkg/action/uninstall.go).
const (
	// Delete: Helm deletes the object.
	Delete Action = "delete"
	// Keep: the stored manifest carries helm.sh/resource-policy: keep, so Helm leaves the
	// object and lists it as kept.
	Keep Action = "keep"
	// Untouched: the stored manifest carries helm.sh/resource-policy with another value.
	// Helm neither deletes the object nor reports it as kept.
	Untouched Action = "untouched"
	// SkipNotOwned: Helm 4.3 or newer reads the live object first and skips it because its
	// ownership label and annotations no longer name the release.
	SkipNotOwned Action = "skip-not-owned"
	// SkipUnverifiable: Helm 4.3 or newer could not read the live object (for example
	// RBAC) and skips it.
	SkipUnverifiable Action = "skip-unverifiable"
	// Absent: the object is not on the cluster; there is nothing to delete.
	Absent Action = "absent"
)

// Report is the answer of Check: what a `helm uninstall` of the release does, with the
// traps found. It never holds Secret data or release values.
type Report struct {
	Release   string `json:"release"`
	Namespace string `json:"namespace"`
	// Driver is the Helm storage driver the release was read from (secret or configmap).
	Driver       helmrelease.Driver `json:"driver"`
	Chart        string             `json:"chart"`
	ChartVersion string             `json:"chartVersion"`
	// Revision is the revision whose stored manifest is the delete list: the last one,
	// whatever its status.
	Revision int    `json:"revision"`
	Status   string `json:"status"`
	// LastDeployedRevision is the newest revision with status deployed (0 if none).
	LastDeployedRevision int `json:"lastDeployedRevision"`
	// NotDeployed is true when the last revision is not deployed (a failed upgrade, or one
	// still pending): its manifest, not the deployed one, is what Helm deletes.
	NotDeployed bool `json:"notDeployed"`
	// LeftBehind are objects of the last deployed revision that the last (not deployed)
	// revision's manifest does not list: the uninstall does not delete them.
	LeftBehind []string `json:"leftBehind"`
	// HelmVersion is the Helm version the verdict assumes; VerifiesOwnership says whether
	// that version checks live ownership before deleting (4.3 and newer).
	HelmVersion       string `json:"helmVersion"`
	VerifiesOwnership bool   `json:"verifiesOwnership"`
	// Objects are the stored manifest's objects in Helm's uninstall order.
	Objects []Object `json:"objects"`
	// Hooks are the release's pre-delete and post-delete hooks, which the uninstall runs
	// unless --no-hooks is given.
	Hooks    []string  `json:"hooks"`
	Findings []Finding `json:"findings"`
	// Safe is true when there are no findings.
	Safe bool `json:"safe"`
	// PoliciesNotAsked says why the cluster's admission policies could not be evaluated
	// for the CRDs the uninstall deletes (list on validatingadmissionpolicies and their
	// bindings, and the parameters a binding names): Safe rests on the rest, and a front
	// end says so in its headline. Empty when they were evaluated, or not asked for
	// (Options.Policies nil).
	PoliciesNotAsked string `json:"policiesNotAsked,omitempty"`
}

// Object is one object of the stored manifest and what the uninstall does to it.
type Object struct {
	// Subject is Kind/namespace/name (Kind/name for cluster-scoped objects).
	Subject    string `json:"subject"`
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	Action     Action `json:"action"`
	Reason     string `json:"reason"`
	// Live is true when the object exists on the cluster.
	Live bool `json:"live"`
	// LiveKeep is true when the live object (not the stored manifest) carries
	// helm.sh/resource-policy: keep.
	LiveKeep bool `json:"liveKeep,omitempty"`
	// Owned says whether the live ownership metadata names the release (nil when the
	// object is not live).
	Owned *bool `json:"owned,omitempty"`

	PVC     *PVCInfo     `json:"pvc,omitempty"`
	Cascade *Cascade     `json:"cascade,omitempty"`
	Secret  *SecretInfo  `json:"secret,omitempty"`
	Storage *StorageInfo `json:"storageClass,omitempty"`
	// Policies are the admission policies that deny deleting this CRD (CheckCRDDeletionDenied).
	Policies []admissionpolicy.Denial `json:"policies,omitempty"`
}

// PVCInfo describes a PersistentVolumeClaim and the volume behind it.
type PVCInfo struct {
	Phase         string `json:"phase"`
	Volume        string `json:"volume,omitempty"`
	ReclaimPolicy string `json:"reclaimPolicy,omitempty"`
	StorageClass  string `json:"storageClass,omitempty"`
	// StorageClassDeleted is true when the same uninstall deletes the StorageClass.
	StorageClassDeleted bool `json:"storageClassDeleted,omitempty"`
	// UsedBy are pods and Jobs outside the release that mount the claim
	// (Pod/namespace/name, Job/namespace/name).
	UsedBy []string `json:"usedBy,omitempty"`
}

// Cascade counts what goes with a deleted Namespace or CustomResourceDefinition that the
// release does not itself list.
type Cascade struct {
	Total int `json:"total"`
	// Counts maps resource (resource.group, or resource for the core group) to a count.
	Counts map[string]int `json:"counts"`
}

// SecretInfo names what a deleted Secret holds: its type and key names, never values.
type SecretInfo struct {
	Type string   `json:"type"`
	Keys []string `json:"keys"`
}

// StorageInfo says who depends on a StorageClass the uninstall deletes.
type StorageInfo struct {
	PersistentVolumes []string `json:"persistentVolumes,omitempty"`
}

// Finding is one trap, with the action that avoids it.
type Finding = finding.Finding

// CheckInfo names a check and says why it exists.
type CheckInfo struct {
	ID  string `json:"id"`
	Why string `json:"why"`
}

// Check IDs.
const (
	CheckNotDeployed       = "last-revision-not-deployed"
	CheckLiveOnlyKeep      = "live-only-keep"
	CheckOwnershipStripped = "ownership-stripped"
	CheckUnverifiable      = "ownership-unverifiable"
	CheckUnknownKind       = "unknown-kind"
	CheckPVDelete          = "pv-reclaim-delete"
	CheckPVCDeleted        = "pvc-deleted"
	CheckPVCInUse          = "pvc-in-use"
	CheckStorageClass      = "storageclass-deleted"
	CheckNamespaceCascade  = "namespace-cascade"
	CheckCRDCascade        = "crd-cascade"
	CheckCRDDeletionDenied = "crd-deletion-denied"
	CheckSecret            = "secret-credentials"
)

// Checks is the registry of what Check looks for, and why.
var Checks = []CheckInfo{
	{CheckNotDeployed, "helm uninstall deletes what the LAST revision's manifest lists, whatever its status: after a failed upgrade that is the failed manifest, and objects only the deployed revision had are left behind"},
	{CheckLiveOnlyKeep, "helm.sh/resource-policy: keep protects an object only when it is in the stored manifest; on the live object alone it does nothing and the object is deleted"},
	{CheckOwnershipStripped, "removing the Helm ownership label and annotations from a live object protects it only with Helm 4.3 or newer; older Helm deletes it anyway"},
	{CheckUnverifiable, "Helm 4.3 or newer skips an object whose ownership it cannot read (for example RBAC): it stays on the cluster"},
	{CheckUnknownKind, "an object whose kind the API server no longer serves makes an uninstall with fresh discovery fail before it deletes anything"},
	{CheckPVDelete, "deleting a PVC whose PersistentVolume has reclaimPolicy Delete (or Recycle) destroys the data"},
	{CheckPVCDeleted, "deleting a PVC leaves a Retain volume Released: the data stays, but a new claim must be bound to it by hand"},
	{CheckPVCInUse, "pods and Jobs outside the release that mount a deleted PVC hold it in Terminating (kubernetes.io/pvc-protection) until they stop"},
	{CheckStorageClass, "deleting a StorageClass that volumes still use breaks re-creating their claims and provisioning new ones"},
	{CheckNamespaceCascade, "deleting a Namespace deletes everything in it, including objects the release never listed"},
	{CheckCRDCascade, "deleting a CustomResourceDefinition deletes every object of that type in the cluster"},
	{CheckCRDDeletionDenied, "an admission policy of the cluster denies deleting a CustomResourceDefinition the release lists: helm uninstall deletes the release's other objects and then fails on it, leaving the release half-uninstalled"},
	{CheckSecret, "a deleted Secret holding credentials cannot be recovered: a re-install mints new ones (or refuses) while the data on kept volumes still expects the old ones"},
}

// FindingReport is the pre-flight as CI reads it: one case, the release, with its findings.
func (r *Report) FindingReport() finding.Report {
	return finding.Report{Tool: "uninstall-check", Cases: []finding.Case{{
		Name: "Release/" + r.Namespace + "/" + r.Release, Findings: r.Findings,
	}}}
}
