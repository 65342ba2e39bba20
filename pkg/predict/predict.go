// Package predict owns the decision of what an upgrade or rollback will do to each CRD,
// given the live CRD and the one the operation brings; what Helm (and Flux's
// upgrade.crds policies) applies and what the cluster's CRDs look like after it (Apply);
// the one model of what an operation deletes, for the deployer that runs it (Deployer,
// Fate, Removals: which objects and CRDs leave a release and which are deleted, with
// Helm 3's and Helm 4's rules); what fixes each verdict (FixFor); and the wording of
// the commands that set the annotations it reads (Keep, AllowFieldLoss...). It is pure: no I/O, no
// clocks, so every rule is covered by table tests and the same answer is given by the
// CLI, the controller and the admission gate.
//
// The rule comes from the API server: every write to a CRD is validated so that each entry
// of status.storedVersions is still in spec.versions. An incoming CRD that drops a stored
// version is rejected until a storage migration removes that version from storedVersions.
package predict

import (
	"fmt"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// Verdict is what will happen to one CRD.
type Verdict string

const (
	// OK means the API server accepts the incoming CRD (or it is new, or not applied).
	OK Verdict = "ok"
	// Migrate means some stored versions are missing from the incoming CRD, but the live
	// storage version stays: migrating every object to the live storage version and
	// pruning storedVersions makes the operation succeed.
	Migrate Verdict = "migrate"
	// Bridge means the live storage version itself is missing from the incoming CRD. A
	// migration alone cannot help: the storage version must move first (a stepping-stone
	// chart version, or a storage switch on the live CRD), then the objects are migrated.
	Bridge Verdict = "bridge"
	// Delete means the operation deletes a live CRD, and with it every object of its type.
	Delete Verdict = "delete"
	// DataLoss means the API server accepts the incoming CRD, but its schema no longer
	// declares fields that stored objects hold: they are hidden at once and gone from etcd
	// at each object's next write. No migration fixes it; the schema or the decision must
	// change (the live CRD's AllowFieldLossAnnotation accepts the loss).
	DataLoss Verdict = "data-loss"
	// Prune means the operation leaves a live CRD the deployment no longer renders, with
	// its objects, but does not delete it now: Argo CD's sync without prune leaves it
	// OutOfSync, requiring pruning, and the next sync that prunes deletes it with every
	// object of its type. The operation itself loses nothing (Blocks is false); keeping
	// the CRD (FixKeep) stops the later prune.
	Prune Verdict = "prune"
	// Refused means the API server refuses the incoming CRD itself, for a reason no
	// migration fixes: a schema or a CEL rule its minor does not accept (crdschema.Admit
	// asks it). The operation fails at that CRD, after what was applied before it; the
	// chart (or the control plane's version) must change first.
	Refused Verdict = "refused"
	// PolicyDenied means an admission policy of the cluster (a ValidatingAdmissionPolicy and
	// its binding) denies writing the incoming CRD (package admissionpolicy evaluates
	// them). Neither a migration nor another Kubernetes minor helps: the policy's own way
	// past it (an exception its authors document, its parameter) or the chart must change.
	PolicyDenied Verdict = "policy"
)

// Blocks reports whether a verdict stops the operation as it stands: every one but OK and
// Prune, which loses nothing now. A report is safe when no verdict blocks.
func (v Verdict) Blocks() bool { return v != OK && v != Prune }

// AllowFieldLossAnnotation on a live CRD, set to "true", accepts that an upgrade or
// rollback drops fields its objects hold: the loss is still reported, but no longer blocks.
const AllowFieldLossAnnotation = "upgradeguard.io/allow-field-loss"

// AcceptsFieldLoss reports whether the live CRD accepts losing fields its objects hold
// (AllowFieldLossAnnotation is "true"). It is the one reading of the annotation: an
// upgrade's verdict (WithSchema) and a migration's refusal (package migrate) both ask it.
func AcceptsFieldLoss(live *apiextv1.CustomResourceDefinition) bool {
	return live != nil && live.Annotations[AllowFieldLossAnnotation] == "true"
}

// Operation is the Helm operation being predicted.
type Operation string

const (
	// Upgrade is a helm upgrade (or a Flux HelmRelease upgrade) to a new chart.
	Upgrade Operation = "upgrade"
	// Rollback is a helm rollback (or a Flux rollback) to an earlier revision.
	Rollback Operation = "rollback"
)

// Source says where an incoming CRD comes from in its chart.
type Source string

const (
	// Templates means the CRD is rendered from templates/: Helm applies it on every
	// upgrade and rollback, and deletes it when a later revision drops it.
	Templates Source = "templates"
	// CRDsDir means the CRD sits in the chart's crds/ folder: Helm creates it on install
	// and never upgrades or deletes it. Flux's upgrade.crds=CreateReplace applies it too.
	CRDsDir Source = "crds"
)

// Incoming is one CRD the operation brings.
type Incoming struct {
	CRD    *apiextv1.CustomResourceDefinition
	Source Source
	// Applied says whether the operation writes this CRD when it already exists live.
	// It is false for crds/ files under plain Helm.
	Applied bool
}

// Decision is the verdict on one CRD, with the facts it rests on and the reason a person
// reads. It is not a finding (package finding): it is what Decide and DecideRemoved return,
// and what check reports per CRD.
type Decision struct {
	Name                   string                `json:"name"`
	Verdict                Verdict               `json:"verdict"`
	Reason                 string                `json:"reason"`
	Source                 Source                `json:"source,omitempty"`
	LiveStoredVersions     []string              `json:"liveStoredVersions"`
	LiveStorageVersion     string                `json:"liveStorageVersion"`
	LiveVersions           []crdversions.Version `json:"liveVersions,omitempty"`
	IncomingVersions       []crdversions.Version `json:"incomingVersions"`
	IncomingStorageVersion string                `json:"incomingStorageVersion"`
	MissingStoredVersions  []string              `json:"missingStoredVersions"`
	Conversion             string                `json:"conversion"`
	// StorageSwitchTo is, for a bridge, a version that both the live and the incoming CRD
	// serve. Switching the live storage version to it, migrating and pruning unblocks the
	// operation without a stepping stone. Empty when no such version exists.
	StorageSwitchTo string `json:"storageSwitchTo,omitempty"`
	// Move is, for a move, the releases the CRD moves between (MoveSteps says how).
	Move *CRDMove `json:"move,omitempty"`
}

// Decide returns the verdict for one incoming CRD against the live one (nil when the CRD
// does not exist on the cluster).
func Decide(live *apiextv1.CustomResourceDefinition, in Incoming) Decision {
	f := Decision{
		Name:                   in.CRD.Name,
		Source:                 in.Source,
		IncomingVersions:       crdversions.Versions(in.CRD),
		IncomingStorageVersion: crdversions.StorageVersion(in.CRD),
		Conversion:             crdversions.Conversion(in.CRD),
		LiveStoredVersions:     []string{},
		MissingStoredVersions:  []string{},
	}
	if live == nil {
		f.Verdict = OK
		f.Reason = "new CRD: it is created"
		return f
	}
	fillLive(&f, live)

	f.MissingStoredVersions = append(f.MissingStoredVersions, crdversions.DroppedStoredVersions(live, in.CRD)...)
	if !in.Applied {
		f.Verdict = OK
		f.Reason = "Helm does not upgrade CRDs in crds/: the live CRD stays as it is"
		if len(f.MissingStoredVersions) > 0 {
			f.Reason += fmt.Sprintf(" (applying it, as Flux upgrade.crds=CreateReplace does, would fail on stored %s)",
				strings.Join(f.MissingStoredVersions, ","))
		}
		return f
	}
	if len(f.MissingStoredVersions) == 0 {
		f.Verdict = OK
		f.Reason = "every stored version stays in spec.versions"
		return f
	}
	missing := strings.Join(f.MissingStoredVersions, ",")
	if crdversions.Has(in.CRD, f.LiveStorageVersion) {
		f.Verdict = Migrate
		f.Reason = fmt.Sprintf("stored %s dropped by the incoming CRD: migrate objects to %s and prune storedVersions first",
			missing, f.LiveStorageVersion)
		return f
	}
	f.Verdict = Bridge
	f.StorageSwitchTo = switchTarget(live, in.CRD)
	f.Reason = fmt.Sprintf("live storage version %s is dropped by the incoming CRD (%s): a migration alone cannot help",
		f.LiveStorageVersion, versionNames(in.CRD))
	if f.StorageSwitchTo != "" {
		f.Reason += fmt.Sprintf("; switch live storage to %s (served by both), migrate, prune", f.StorageSwitchTo)
	} else {
		f.Reason += fmt.Sprintf("; go through a chart version whose CRD serves %s and stores at one of %s",
			f.LiveStorageVersion, versionNames(in.CRD))
	}
	return f
}

// DecideRemoved returns the verdict for a live CRD that leaves the release with an
// operation (a Removal of Removals), given how many objects of its type exist (nil when
// that is not known). A CRD the operation deletes is a Delete verdict while it holds
// objects, when their number is not known, and when the incoming chart still ships it in
// crds/: the operation deletes it and never creates it again, so the release is left
// without the CRD it ships, whatever it holds. A CRD the operation deletes that holds no
// objects and that the incoming side no longer brings is removed on purpose and nothing
// is lost: ok, with the deletion in the reason. A CRD the deployer leaves is ok. Argo CD
// has its own rules (KindArgoCD): a CRD its sync leaves until a sync that prunes is a
// Prune verdict.
func DecideRemoved(op Operation, d Deployer, r Removal, objects *int64) Decision {
	return orDefault(d).decideRemoved(op, r, objects)
}

// objectsOf words n objects of kind (n > 0) as what a deletion takes with it.
func objectsOf(n int64, kind string) string {
	if n == 1 {
		return "its one " + kind + " object"
	}
	return fmt.Sprintf("all %d %s objects", n, kind)
}

// files names the chart files a removal comes from, as far as they are known: " (chart
// file F)", with ", now G" for the crds/ file of a CRD moved there.
func files(r Removal) string {
	var parts []string
	if r.From.File != "" {
		parts = append(parts, r.From.File)
	}
	if r.Shipped != nil && r.Shipped.File != "" {
		parts = append(parts, "now "+r.Shipped.File)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (chart file " + strings.Join(parts, ", ") + ")"
}

// Schema is what the incoming schema does to the objects stored today (see package
// crdschema), as far as the decision needs it.
type Schema struct {
	// Pruned are the field paths the incoming schema drops from stored objects.
	Pruned []string
	// ConversionRemoved says a conversion webhook is removed while objects are stored at
	// differently shaped versions (Message says which).
	ConversionRemoved bool
	// Summary words the finding with paths and counts, for the reason.
	Summary string
}

// WithSchema joins the schema finding to a storedVersions finding. Pruned fields make an
// accepted or migratable CRD a DataLoss verdict unless the live CRD accepts the loss. A
// removed conversion webhook is fixed by migrating every object to the storage version
// while the webhook still converts, so it makes an ok CRD a Migrate verdict. A bridge or a
// deletion stays what it is, with the schema finding added to its reason.
func WithSchema(f Decision, live *apiextv1.CustomResourceDefinition, s Schema) Decision {
	if len(s.Pruned) == 0 && !s.ConversionRemoved {
		return f
	}
	accepted := AcceptsFieldLoss(live)
	switch {
	case f.Verdict == Bridge || f.Verdict == Delete:
		f.Reason += "; also: " + s.Summary
	case len(s.Pruned) > 0 && accepted:
		f.Reason += fmt.Sprintf("; the live CRD accepts the loss (%s=true): %s", AllowFieldLossAnnotation, s.Summary)
	case len(s.Pruned) > 0:
		prior := ""
		if f.Verdict == Migrate {
			prior = "; " + f.Reason
		}
		f.Verdict = DataLoss
		f.Reason = "the incoming schema drops data that stored objects hold: " + s.Summary + prior
	case f.Verdict == OK:
		f.Verdict = Migrate
		f.Reason = s.Summary + ": migrate every object to " + f.LiveStorageVersion + " while the webhook still converts, and prune storedVersions first"
	default:
		f.Reason += "; " + s.Summary
	}
	return f
}

// WithRefusal makes a finding the Refused verdict: the API server refuses the incoming
// CRD itself (message is crdschema.Refusal.Message), so nothing else the verdict said
// can happen first. What it said stays in the reason.
func WithRefusal(f Decision, message string) Decision {
	if f.Verdict != OK {
		message += "; also: " + f.Reason
	}
	f.Verdict, f.Reason = Refused, message
	return f
}

// WithPolicy makes a finding the PolicyDenied verdict: an admission policy denies writing the
// incoming CRD (message names the policy, its binding and its message), so nothing else
// the verdict said can happen first. What it said stays in the reason.
func WithPolicy(f Decision, message string) Decision {
	if f.Verdict != OK {
		message += "; also: " + f.Reason
	}
	f.Verdict, f.Reason = PolicyDenied, message
	return f
}

// WithDeletionDenied joins an admission policy's denial of deleting a CRD (message names
// the policy, its binding and its message) to the verdict on the CRD that op removes
// (DecideRemoved): the API server refuses the DELETE, so the CRD and its objects stay
// whatever the verdict said. Helm 3's upgrade and rollback log a refused deletion and go
// on (helm.sh/helm/v3 pkg/kube Client.Update): the operation succeeds with the CRD left
// in place, outside the release, and that loses nothing (ok, the denial in the reason).
// Every other deletion fails there (Helm 4 returns the refusal after applying the rest,
// and marks the release failed; an uninstall fails; Argo CD's sync fails at the prune): the PolicyDenied verdict, what it said before in the reason.
// It is the one owner of a denied deletion: no Delete verdict stands beside it.
func WithDeletionDenied(op Operation, d Deployer, f Decision, message string) Decision {
	if h, ok := orDefault(d).(HelmDeployer); ok && h.major() == 3 && op != Uninstall {
		f.Verdict = OK
		f.Reason = message + ": Helm 3 logs the refused deletion and goes on, so the CRD and its objects stay, outside the release; without the policy: " + f.Reason
		return f
	}
	f.Reason = fmt.Sprintf("%s: the %s fails at the deletion; also: %s", message, op, f.Reason)
	f.Verdict = PolicyDenied
	return f
}

// KeepAnnotation and KeepValue are Helm's resource policy that stops it deleting an object.
const (
	KeepAnnotation = "helm.sh/resource-policy"
	KeepValue      = "keep"
)

// SteppingStone reports whether a candidate CRD works as the middle step between live
// and target: the candidate is accepted after migrating to the live storage version
// (it keeps that version), and the target is accepted after migrating again to the
// candidate's storage version (the target keeps that one).
func SteppingStone(live, candidate, target *apiextv1.CustomResourceDefinition) bool {
	if live == nil || candidate == nil {
		return false
	}
	return crdversions.Has(candidate, crdversions.StorageVersion(live)) &&
		crdversions.Has(target, crdversions.StorageVersion(candidate))
}

func fillLive(f *Decision, live *apiextv1.CustomResourceDefinition) {
	f.LiveStoredVersions = append([]string{}, live.Status.StoredVersions...)
	f.LiveStorageVersion = crdversions.StorageVersion(live)
	f.LiveVersions = crdversions.Versions(live)
}

// switchTarget picks a version the live CRD serves and the incoming CRD keeps, preferring
// the incoming storage version, then the incoming served versions in manifest order.
func switchTarget(live, in *apiextv1.CustomResourceDefinition) string {
	candidates := []string{crdversions.StorageVersion(in)}
	for _, v := range in.Spec.Versions {
		if v.Served {
			candidates = append(candidates, v.Name)
		}
	}
	for _, v := range in.Spec.Versions {
		candidates = append(candidates, v.Name)
	}
	for _, c := range candidates {
		if crdversions.Serves(live, c) {
			return c
		}
	}
	return ""
}

func versionNames(crd *apiextv1.CustomResourceDefinition) string {
	names := make([]string, 0, len(crd.Spec.Versions))
	for _, v := range crd.Spec.Versions {
		names = append(names, v.Name)
	}
	slices.Sort(names)
	return "[" + strings.Join(names, " ") + "]"
}
