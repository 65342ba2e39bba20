package predict

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// ChartMigration is a StorageVersionMigration (storagemigration.k8s.io, run by
// kube-controller-manager's built-in migrator) that a chart renders next to its CRDs, as
// Kubernetes 1.37's release blog tells chart authors to do. Package chartcrds reads them
// from rendered manifests.
type ChartMigration struct {
	// Name is metadata.name (empty when the object only has a generateName).
	Name       string `json:"name"`
	APIVersion string `json:"apiVersion"`
	// Group and Resource are spec.resource: the CRD it covers is Resource.Group.
	Group    string `json:"group"`
	Resource string `json:"resource"`
	// File is the chart file it came from, for messages.
	File string `json:"file,omitempty"`
}

// CRD is the name of the CRD the migration covers (spec.resource as resource.group).
func (m ChartMigration) CRD() string {
	if m.Group == "" {
		return m.Resource
	}
	return m.Resource + "." + m.Group
}

// LiveMigration is a StorageVersionMigration already on the cluster under the name a
// chart's migration uses.
type LiveMigration struct {
	// CRD is what it covers (spec.resource as resource.group).
	CRD string `json:"crd"`
	// State is "succeeded", "failed", "running" or "pending".
	State string `json:"state"`
}

// BundledVerdict is whether a StorageVersionMigration a chart bundles helps.
type BundledVerdict string

const (
	// BundledWillRun means the migration is new and the release that brings it is
	// accepted: the built-in migrator runs it once the release applies it. Nothing waits
	// for it to finish.
	BundledWillRun BundledVerdict = "will-run"
	// BundledWillNotRun means a StorageVersionMigration of that name already exists:
	// spec.resource is immutable and the migrator acts on each object once, so applying
	// it again migrates nothing.
	BundledWillNotRun BundledVerdict = "will-not-run"
	// BundledTooLate means the migration arrives with the CRD that drops a stored
	// version: the API server rejects that CRD write, so the operation fails whatever the
	// migration does. (Helm, 3 and 4, still creates a new StorageVersionMigration beside the
	// failed CRD; where the migrator runs, a retry after it finished may pass.)
	BundledTooLate BundledVerdict = "too-late"
	// BundledNoCRD means spec.resource names no CRD, neither in the chart nor on the
	// cluster: there is nothing for it to migrate that upgradeguard judges.
	BundledNoCRD BundledVerdict = "no-crd"
)

// BundledMigration is the verdict on one StorageVersionMigration a chart renders. It is
// advice beside the CRD's own verdict: it never makes an operation safe or unsafe.
type BundledMigration struct {
	Name       string `json:"name"`
	APIVersion string `json:"apiVersion"`
	File       string `json:"file,omitempty"`
	// CRD is the CRD it covers (spec.resource as resource.group).
	CRD     string         `json:"crd"`
	Verdict BundledVerdict `json:"verdict"`
	Reason  string         `json:"reason"`
	// Action is what to do instead, or as well; empty when nothing is needed.
	Action string `json:"action,omitempty"`
}

// BundledFacts are what the verdict on a bundled migration rests on.
type BundledFacts struct {
	// Operation is the upgrade or rollback that applies the chart.
	Operation Operation
	// Live is the live CRD it covers (nil when none), Incoming the chart's (nil when the
	// chart brings none of that name), and Applied whether the operation writes Incoming
	// over Live (Policy.Applies).
	Live, Incoming *apiextv1.CustomResourceDefinition
	Applied        bool
	// Decision is the CRD's own verdict, when the chart brings it.
	Decision *Decision
	// Existing is the StorageVersionMigration already on the cluster under the same name
	// (nil when there is none, or the caller may not read them).
	Existing *LiveMigration
}

// DecideBundled judges one StorageVersionMigration a chart renders: which CRD it covers,
// whether the built-in migrator will run it, and what to do instead where it will not
// help. The order follows what happens first: a CRD write the API server rejects stops
// the whole release before any name matters.
func DecideBundled(m ChartMigration, f BundledFacts) BundledMigration {
	b := BundledMigration{Name: m.Name, APIVersion: m.APIVersion, File: m.File, CRD: m.CRD()}
	migrate := cmdline.Migrate{CRDs: []string{b.CRD}}
	switch {
	case f.Live == nil && f.Incoming == nil:
		b.Verdict = BundledNoCRD
		b.Reason = fmt.Sprintf("spec.resource %s names no CRD in the chart or on the cluster: it migrates no custom resource", b.CRD)
		b.Action = "check spec.resource: its group and resource are the CRD's spec.group and spec.names.plural (the CRD's name is resource.group)"
		return b
	case f.Decision != nil && f.Applied && f.Live != nil && len(f.Decision.MissingStoredVersions) > 0:
		b.Verdict = BundledTooLate
		b.Reason = fmt.Sprintf("it arrives with the CRD that drops stored %s: the API server rejects that CRD write (status.storedVersions), so the %s fails whatever the migration does; "+
			"Helm (3 and 4) still creates a new StorageVersionMigration beside the failed CRD, and the built-in migrator may then migrate and prune in time for a retry, but the release is failed meanwhile and nothing waits for it",
			strings.Join(f.Decision.MissingStoredVersions, ","), cmp.Or(f.Operation, Upgrade))
		if FixFor(*f.Decision) == FixMigrate {
			b.Action = fmt.Sprintf("migrate before the %s instead: %s", cmp.Or(f.Operation, Upgrade), migrate)
		} else {
			b.Action = "follow the CRD's own next step: a bundled migration cannot move the storage version the incoming CRD drops"
		}
		return b
	}
	stored, storage := storedAfter(f)
	pending := slices.DeleteFunc(slices.Clone(stored), func(v string) bool { return v == storage })
	if f.Existing != nil && m.Name != "" {
		b.Verdict = BundledWillNotRun
		b.Reason = fmt.Sprintf("StorageVersionMigration %s already exists (%s", m.Name, f.Existing.State)
		if f.Existing.CRD != b.CRD {
			b.Reason += fmt.Sprintf(", for %s; the API server refuses to change spec.resource, which fails the apply", f.Existing.CRD)
		}
		b.Reason += "): spec.resource is immutable and the built-in migrator acts on a StorageVersionMigration once, so applying it again migrates nothing"
		if len(pending) > 0 {
			b.Action = fmt.Sprintf("after the release, stored %s remain: %s (or give the StorageVersionMigration a new name for each chart version)",
				strings.Join(pending, ","), migrate)
		} else {
			b.Action = "nothing to migrate after this release; give the StorageVersionMigration a new name for each chart version so that a later storage change runs it"
		}
		return b
	}
	b.Verdict = BundledWillRun
	b.Reason = "a new StorageVersionMigration, and the CRD keeps every stored version: the built-in migrator runs it once the release applies it"
	if len(pending) > 0 {
		b.Reason += fmt.Sprintf(" (it re-writes the objects stored at %s to %s and prunes storedVersions)", strings.Join(pending, ","), storage)
	} else {
		b.Reason += fmt.Sprintf(" (nothing to migrate: storedVersions will be [%s])", strings.Join(stored, " "))
	}
	b.Reason += "; nothing waits for it (kstatus calls it Current at once, Argo CD gives it no health), so a later release may come before it finished"
	b.Action = fmt.Sprintf("before the release that drops a version: %s (waits for it, and prunes storedVersions where the server did not)",
		cmdline.Migrate{CRDs: []string{b.CRD}, Wait: true})
	return b
}

// storedAfter are the CRD's storedVersions and storage version once the release applied
// (Apply's rule): the incoming storage version is added when the CRD is written.
func storedAfter(f BundledFacts) (stored []string, storage string) {
	switch {
	case f.Live == nil:
		storage = crdversions.StorageVersion(f.Incoming)
		return []string{storage}, storage
	case f.Incoming == nil || !f.Applied:
		return slices.Clone(f.Live.Status.StoredVersions), crdversions.StorageVersion(f.Live)
	}
	storage = crdversions.StorageVersion(f.Incoming)
	stored = slices.Clone(f.Live.Status.StoredVersions)
	if !slices.Contains(stored, storage) {
		stored = append(stored, storage)
	}
	return stored, storage
}
