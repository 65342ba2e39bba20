// Package audit owns the coverage audit of CRD storage-migration protection: for every Helm
// release, Flux HelmRelease and Argo CD Application in a cluster, does its chart ship CRDs, which upstream hook
// (from the chart registry) is switched on by its values, which settings switch that
// protection off, and does upgradeguard's proactive controller cover it instead. It
// returns a typed report; it never prints, and never returns release values beyond the
// values of the registry's keys.
//
// The rules, in one place:
//
//   - An upstream hook protects an upgrade when its chart version has it, its values
//     switch it on, it migrates objects and it runs pre-upgrade, and Flux does not disable
//     upgrade hooks. The same with pre-rollback and rollback hooks protects a rollback. A
//     post-upgrade hook protects nothing: the API server has already judged the new CRDs.
//     A hook that only applies CRDs protects nothing either.
//   - upgradeguard protects both when its controller is running (a Lease named
//     upgradeguard-controller, in any namespace, with a holder and a renewTime within its
//     leaseDurationSeconds of now) and every CRD the release ships is selected (Selects)
//     by at least one proactive StorageMigrationPolicy. The live CRD's labels are used,
//     or the chart's copy when the CRD is not in the cluster.
//   - A release that ships CRDs is protected when both its upgrade and its rollback are.
//     Coverage is protected releases over releases that ship CRDs.
//   - An Argo CD Application deploys CRDs when its resource tree (status.resources) lists
//     one. Argo CD applies every CRD on each sync and never runs rollback hooks, so only
//     the sync is judged. It is protected by upgradeguard's CRD gate when a
//     MutatingWebhookConfiguration holds crd.upgradeguard.io for CRD updates and the
//     controller runs; by a StorageVersionMigration in its resource tree (with a warning:
//     one runs once per name and cannot help the sync that drops the old version); or
//     by an upstream hook the registry knows, switched on by its inline values and
//     parameters, that migrates objects before the upgrade (a PreSync hook under Argo CD).
package audit

import (
	"time"

	"github.com/upgradeguard/upgradeguard/pkg/finding"
)

// Protector names who protects an operation.
const (
	ByUpgradeguard = "upgradeguard"
	byHookPrefix   = "upstream hook "
)

// Report is the result of an audit.
type Report struct {
	// Scope is the namespace audited, or "" for all namespaces.
	Scope      string     `json:"scope"`
	Controller Controller `json:"controller"`
	// Policies are the proactive StorageMigrationPolicies, by name.
	Policies []string  `json:"proactivePolicies"`
	Releases []Release `json:"releases"`
	// Applications are the Argo CD Applications that deploy CRDs; CRDGate is what the
	// audit saw of upgradeguard's CRD gate, which protects them. Both are left out when
	// the cluster has no Application that deploys CRDs.
	Applications []Application `json:"applications,omitempty"`
	CRDGate      *CRDGate      `json:"crdGate,omitempty"`
	Summary      Summary       `json:"summary"`
	// Warnings are problems that limited the audit without stopping it.
	Warnings []string `json:"warnings,omitempty"`
}

// Controller is what the audit saw of upgradeguard's controller.
type Controller struct {
	Running bool `json:"running"`
	// Lease is namespace/name of the leader-election Lease found, if any.
	Lease  string `json:"lease,omitempty"`
	Holder string `json:"holder,omitempty"`
	// Reason says why the controller counts as running or not.
	Reason string `json:"reason"`
}

// Release is one audited release.
type Release struct {
	// Subject is HelmRelease/<namespace>/<name> for a Flux HelmRelease, or
	// Release/<namespace>/<name> for a Helm release no HelmRelease manages.
	Subject string `json:"subject"`
	// HelmRelease is the Helm release (storage namespace/name) of a Flux HelmRelease,
	// when it was found.
	HelmRelease string `json:"helmRelease,omitempty"`
	// Revision is the stored revision the audit read (0: none).
	Revision int    `json:"revision,omitempty"`
	Chart    string `json:"chart"`
	Version  string `json:"version"`
	// Known says whether the chart is in the registry.
	Known bool `json:"known"`
	// ShipsCRDs is true when the stored chart or manifest holds CRDs (or, with no stored
	// release, when the registry knows the chart).
	ShipsCRDs bool     `json:"shipsCRDs"`
	CRDs      []string `json:"crds,omitempty"`
	// ValuesSource says where the values of the mechanism keys came from.
	ValuesSource string      `json:"valuesSource"`
	Mechanisms   []Mechanism `json:"mechanisms,omitempty"`
	Upgrade      Protection  `json:"upgrade"`
	Rollback     Protection  `json:"rollback"`
	// Protected is ShipsCRDs with both Upgrade and Rollback protected.
	Protected bool      `json:"protected"`
	Findings  []Finding `json:"findings,omitempty"`
	Notes     []string  `json:"notes,omitempty"`
}

// Mechanism is the state of one registry mechanism in a release.
type Mechanism struct {
	Name   string   `json:"name"`
	Hooks  []string `json:"hooks"`
	Action string   `json:"action"`
	// Exists says whether the chart version has the mechanism.
	Exists bool `json:"exists"`
	// On says whether the values switch it on (and it exists).
	On   bool    `json:"on"`
	Keys []Value `json:"keys"`
	// Rendered says whether the stored revision holds the hook (nil: not known).
	Rendered *bool `json:"rendered,omitempty"`
}

// Value is one registry key's value in a release. Only these keys are ever reported.
type Value struct {
	Key   string `json:"key"`
	Value any    `json:"value"`
	// Source: "values" (set for the release), "chart default" (the stored chart's
	// values.yaml) or "registry default".
	Source string `json:"source"`
}

// Protection says whether an operation (upgrade or rollback) is protected, and by whom.
type Protection struct {
	Protected bool `json:"protected"`
	// By lists "upstream hook <mechanism>" and/or "upgradeguard".
	By []string `json:"by,omitempty"`
}

// Severity of a finding (the shared finding.Severity).
type Severity = finding.Severity

// Severities.
const (
	Info    = finding.Info
	Warning = finding.Warning
	Danger  = finding.Danger
)

// Finding codes, stable for scripts.
const (
	CodeUpgradeHooksDisabled  = "upgrade-hooks-disabled"
	CodeRollbackHooksDisabled = "rollback-hooks-disabled"
	CodePostUpgradeHook       = "post-upgrade-hook"
	CodeCRDsSkip              = "crds-skip"
	CodeDestructive           = "destructive"
	CodeAppliesCRDsOnly       = "applies-crds-only"
	CodeMechanismOff          = "mechanism-off"
	CodeMechanismMissing      = "mechanism-missing"
	CodeNoProtection          = "no-upstream-hook"
)

// Finding is a setting or fact that weakens or endangers a release's CRDs. Its Check is
// one of the codes above and its Subject the release.
type Finding = finding.Finding

// Summary counts the releases.
type Summary struct {
	Releases          int `json:"releases"`
	ShipCRDs          int `json:"shipCRDs"`
	Protected         int `json:"protected"`
	UpgradeProtected  int `json:"upgradeProtected"`
	RollbackProtected int `json:"rollbackProtected"`
	// Coverage is "protected/shipCRDs".
	Coverage string `json:"coverage"`
	// Applications counts the Argo CD Applications that deploy CRDs, and
	// ApplicationsProtected those whose sync is protected.
	Applications          int `json:"applications,omitempty"`
	ApplicationsProtected int `json:"applicationsProtected,omitempty"`
}

// Unprotected reports whether any release that ships CRDs, or any Argo CD Application
// that deploys CRDs, is unprotected.
func (r *Report) Unprotected() bool {
	return r.Summary.Protected < r.Summary.ShipCRDs || r.Summary.ApplicationsProtected < r.Summary.Applications
}

// ControllerLeaseName is the controller's leader-election Lease (its leader election ID).
const ControllerLeaseName = "upgradeguard-controller"

// defaultLeaseDuration is client-go's and controller-runtime's default, used when a
// Lease does not say.
const defaultLeaseDuration = 15 * time.Second

// FindingReport is the audit as CI reads it: a case per audited release, with its findings.
func (r *Report) FindingReport() finding.Report {
	rep := finding.Report{Tool: "audit", Cases: []finding.Case{}}
	for _, rel := range r.Releases {
		rep.Cases = append(rep.Cases, finding.Case{Name: rel.Subject, Findings: rel.Findings})
	}
	return rep
}
