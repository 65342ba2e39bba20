package predict

import (
	"fmt"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// Policy says which CRDs an upgrade or rollback writes when they already exist.
type Policy string

const (
	// PolicyHelm is plain Helm: CRDs in crds/ are created when missing and never upgraded.
	PolicyHelm Policy = "helm"
	// PolicyCreateReplace is Flux's upgrade.crds=CreateReplace: crds/ files are applied too.
	PolicyCreateReplace Policy = "create-replace"
)

// ParsePolicy validates a policy name; empty is PolicyHelm.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyHelm, PolicyCreateReplace:
		return p, nil
	case "":
		return PolicyHelm, nil
	}
	return "", fmt.Errorf("unknown CRD policy %q: use %s (plain Helm) or %s (Flux upgrade.crds=CreateReplace)", s, PolicyHelm, PolicyCreateReplace)
}

// Applies reports whether an operation under p writes an existing CRD that sits at
// source in its chart: templates/ always, crds/ only under PolicyCreateReplace. A missing
// CRD is created whatever its source.
func (p Policy) Applies(source Source) bool {
	return source == Templates || p == PolicyCreateReplace
}

// ChartCRD is one CRD a chart version or a release revision brings, with where it sits in
// the chart (package chartcrds reads them from charts and release manifests).
type ChartCRD struct {
	CRD    *apiextv1.CustomResourceDefinition
	Source Source
	// File is the chart file it came from, for messages.
	File string
}

// DeployerKind names the tool that carries an operation out.
type DeployerKind string

// KindHelm is Helm: its CLI, or a program on its SDK (HelmDeployer).
const KindHelm DeployerKind = "helm"

// (KindArgoCD, with Argo CD's rules, is in argocd.go.)

// Deployer is what carries an operation out: Helm (HelmDeployer) or Argo CD
// (ArgoCDDeployer), each with its own rules. Which CRDs leave a release with an
// operation, and which of those are deleted with every object of their types, follow the
// deployer's rules: every verdict on a deletion (check, plan, the uninstall and upgrade
// pre-flights, the gates) asks Removals, DecideRemoved or Fate with the deployer at hand,
// so that each door gives the same answer. A nil Deployer is the newest Helm modelled
// (Helm4), where a function takes one.
type Deployer interface {
	// String names the deployer: "Helm 4.3.1", "Argo CD".
	String() string
	// Spec is the deployer as a report records it.
	Spec() DeployerSpec
	// VerifiesOwnership reports whether the deployer's uninstall skips an object whose
	// live Helm ownership metadata does not name the release (Helm 4.3 and newer).
	VerifiesOwnership() bool
	// Fate is what the deployer's rules for op do with one object that leaves the
	// release. It is the one place that reads helm.sh/resource-policy and Argo CD's sync
	// options.
	Fate(op Operation, l Leaving) Fate
	// KeepAdvice words how to keep the live CRDs that op would delete, and why it works:
	// the commands come from KeepCommands.
	KeepAdvice(op Operation, live []*apiextv1.CustomResourceDefinition, release, namespace string) string
	// KeepCommands are the commands that keep live CRDs from op before it runs.
	KeepCommands(op Operation, live []*apiextv1.CustomResourceDefinition) []cmdline.Annotate
	// Kept returns a live CRD's annotations after KeepCommands for an upgrade ran on it: a
	// copy, with what the commands add.
	Kept(annotations map[string]string) map[string]string

	// removals is Removals, by the deployer's rules.
	removals(c ReleaseChange) []Removal
	// decideRemoved is DecideRemoved, by the deployer's rules.
	decideRemoved(op Operation, r Removal, objects *int64) Decision
}

// DeployerSpec is a deployer as a report records it (JSON): its kind, version and, for
// Argo CD, the Application's sync policy. Deployer gives its rules back.
type DeployerSpec struct {
	Kind DeployerKind `json:"kind"`
	// Version is the tool's version (for Helm: 3.18, 4.2.4, 4.3); empty is the newest
	// modelled.
	Version string `json:"version,omitempty"`
	// Sync is the sync policy of the Argo CD Application (KindArgoCD only).
	Sync ArgoSync `json:"sync,omitzero"`
}

// Deployer is the deployer the spec records: the zero spec is Helm4.
func (s DeployerSpec) Deployer() Deployer {
	switch s.Kind {
	case KindArgoCD:
		return ArgoCDDeployer{Version: s.Version, Sync: s.Sync}
	case "":
		return Helm4
	}
	return HelmDeployer{Version: s.Version}
}

// orDefault is d, or Helm4 when d is nil.
func orDefault(d Deployer) Deployer {
	if d == nil {
		return Helm4
	}
	return d
}

// Uninstall is a helm uninstall: every object of the release's last revision leaves.
const Uninstall Operation = "uninstall"

// Leaving is one object that an operation takes out of a release (the target no longer
// renders it, or the release is uninstalled), with what the deployer reads before it
// deletes it.
type Leaving struct {
	// Manifest are the object's annotations in the release manifest it leaves (for an
	// uninstall, the last revision's stored manifest).
	Manifest map[string]string
	// Exists says whether the object is on the cluster, and Live are its annotations.
	Exists bool
	Live   map[string]string
	// Owned says whether its live Helm ownership metadata names the release
	// (HelmOwnershipProblem is empty).
	Owned bool
	// CRD says that it is a CustomResourceDefinition (Argo CD never deletes one with its
	// Application).
	CRD bool
	// Untracked says that Argo CD does not count the live object as the Application's
	// once its sources stop rendering it (ArgoTracking.Tracks): no sync prunes it.
	Untracked bool
}

// Fate is what an operation does with one object that leaves the release.
type Fate string

const (
	// FateDeleted means the deployer deletes it (a CRD with every object of its type).
	FateDeleted Fate = "deleted"
	// FateKeptLive means an upgrade or rollback leaves it, because the live object carries
	// helm.sh/resource-policy: keep. It stays on the cluster, listed by no manifest.
	FateKeptLive Fate = "kept-live"
	// FateKeptManifest means an uninstall leaves it and reports it kept, because the stored
	// manifest gives it helm.sh/resource-policy: keep.
	FateKeptManifest Fate = "kept-manifest"
	// FateUntouched means an uninstall leaves it without a word, because the stored manifest
	// gives it helm.sh/resource-policy with a value other than keep.
	FateUntouched Fate = "untouched"
	// FateNotOwned means the uninstall of Helm 4.3 or newer skips it, because its live
	// ownership metadata does not name the release.
	FateNotOwned Fate = "not-owned"
	// FateAbsent means it is not on the cluster; there is nothing to delete.
	FateAbsent Fate = "absent"

	// Argo CD's fates (see KindArgoCD).

	// FatePruneOnSync means the sync leaves it, because it does not prune (no automated
	// prune, or a rollback): Argo CD shows it OutOfSync, requiring pruning, and the next
	// sync that prunes deletes it.
	FatePruneOnSync Fate = "prune-on-sync"
	// FateConfirm means the deletion waits until someone confirms it (Prune=confirm, or
	// Delete=confirm for an Application's deletion).
	FateConfirm Fate = "awaits-confirmation"
	// FateNoPrune means the sync leaves it, because its sync option (the object's, else the
	// Application's) is Prune=false.
	FateNoPrune Fate = "no-prune"
	// FateNoDelete means an Application's deletion leaves it: Delete=false (the object's
	// sync option, else the Application's), or helm.sh/resource-policy: keep.
	FateNoDelete Fate = "no-delete"
	// FateCRDKept means an Application's deletion leaves it, because it is a CRD: Argo CD
	// never deletes one with its Application.
	FateCRDKept Fate = "crd-kept"
	// FateUntracked means a sync leaves it for good: Argo CD does not track it as the
	// Application's (a CRD without the tracking label or annotation its repo-server never
	// sets), so once the sources stop rendering it, it leaves the resource tree unpruned.
	FateUntracked Fate = "untracked"
)

// KeepPolicy reports whether a helm.sh/resource-policy value is keep as helm uninstall
// reads its stored manifest: in any case, spaces trimmed. (An upgrade or rollback reads
// the live object's value and wants exactly "keep".)
func KeepPolicy(v string) bool { return strings.ToLower(strings.TrimSpace(v)) == KeepValue }

// Helm's ownership metadata (helm.sh/helm/v4 pkg/action/validate.go).
const (
	ManagedByLabel        = "app.kubernetes.io/managed-by"
	ManagedByHelm         = "Helm"
	ReleaseNameAnnotation = "meta.helm.sh/release-name"
	// ReleaseNamespaceAnnotation names the namespace of the release that owns an object.
	ReleaseNamespaceAnnotation = "meta.helm.sh/release-namespace"
)

// HelmOwnershipProblem is Helm's checkOwnership on an object's live labels and
// annotations: empty when both name release in namespace, else what does not.
func HelmOwnershipProblem(labels, annotations map[string]string, release, namespace string) string {
	var p []string
	check := func(m map[string]string, what, k, want string) {
		got, ok := m[k]
		switch {
		case !ok:
			p = append(p, what+" "+k+" missing")
		case got != want:
			p = append(p, fmt.Sprintf("%s %s=%q", what, k, got))
		}
	}
	check(labels, "label", ManagedByLabel, ManagedByHelm)
	check(annotations, "annotation", ReleaseNameAnnotation, release)
	check(annotations, "annotation", ReleaseNamespaceAnnotation, namespace)
	return strings.Join(p, ", ")
}

// ReleaseChange is one operation on a release, as far as its CRDs go.
type ReleaseChange struct {
	Deployer  Deployer
	Operation Operation
	// Release and Namespace name the release (an uninstall by Helm 4.3 reads the live
	// ownership against them).
	Release, Namespace string
	// Live are the cluster's CRDs, by name.
	Live map[string]*apiextv1.CustomResourceDefinition
	// Current are the CRDs of the revision the operation starts from (for an uninstall,
	// the last revision's), and Incoming those of the chart or revision it moves to (none
	// for an uninstall).
	Current, Incoming []ChartCRD
}

// Removal is a live CRD that leaves the release with an operation, and what the
// deployer does with it.
type Removal struct {
	// Live is the live CRD.
	Live *apiextv1.CustomResourceDefinition
	// From is the CRD as the release's manifest renders it today.
	From ChartCRD
	// Shipped is the copy the incoming chart still ships in crds/, which the operation
	// does not apply (nil when the incoming side does not bring it): a CRD the operation
	// deletes is then not created again.
	Shipped *ChartCRD
	Fate    Fate
}

// Name is the CRD's name.
func (r Removal) Name() string { return r.Live.Name }

// Deletes reports whether the operation deletes the CRD, and with it every object of its
// type.
func (r Removal) Deletes() bool { return r.Fate == FateDeleted }

// Removals lists, in the order of c.Current, the live CRDs that leave the release with
// the operation and the fate of each (Deployer says the rules): for an upgrade or
// rollback, those the current manifest renders (templates/) and the incoming manifest
// no longer does, whether or not the incoming chart ships them in crds/; for an
// uninstall, every one the manifest renders. crds/ files never leave: Helm never deletes
// them. A CRD not on the cluster is not listed. Under Argo CD, which renders crds/ too,
// a CRD leaves only when the target renders it nowhere (KindArgoCD).
func Removals(c ReleaseChange) []Removal { return orDefault(c.Deployer).removals(c) }

// Deletes names the live CRDs the operation deletes, each with every object of its type.
func Deletes(c ReleaseChange) []string {
	var out []string
	for _, r := range Removals(c) {
		if r.Deletes() {
			out = append(out, r.Name())
		}
	}
	return out
}

// KeepInManifest words how to keep an object through helm uninstall, which reads
// helm.sh/resource-policy from the release's stored manifest only: an upgrade that
// renders keep on it, and the command that confirms it is in the manifest.
func KeepInManifest(release, namespace string) string {
	return fmt.Sprintf("run an upgrade that renders %s: %s on it (a chart value or a post-renderer), then confirm with `%s`",
		KeepAnnotation, KeepValue, cmdline.HelmGetManifest{Release: release, Namespace: namespace, Grep: "resource-policy"})
}

func names(crds []*apiextv1.CustomResourceDefinition) []string {
	out := make([]string, 0, len(crds))
	for _, c := range crds {
		out = append(out, c.Name)
	}
	return out
}

// Apply returns the cluster's CRDs after the deployer applies a chart to them in an
// upgrade or rollback: the incoming CRDs the policy applies take the incoming spec, keep
// the live annotations the incoming ones do not set, and add the incoming storage
// version to status.storedVersions (the API server's rule); missing ones are created
// with only their storage version stored; those it does not apply stay as they are; and
// the CRDs that Removals says the operation deletes are gone. live is not changed: the
// result shares the CRDs Apply leaves alone and holds copies of the others.
func Apply(d Deployer, op Operation, live map[string]*apiextv1.CustomResourceDefinition, incoming, current []ChartCRD, p Policy) map[string]*apiextv1.CustomResourceDefinition {
	after := make(map[string]*apiextv1.CustomResourceDefinition, len(live)+len(incoming))
	for name, c := range live {
		after[name] = c
	}
	for _, in := range incoming {
		l := after[in.CRD.Name]
		switch {
		case l == nil:
			c := in.CRD.DeepCopy()
			c.Status.StoredVersions = []string{crdversions.StorageVersion(c)}
			after[c.Name] = c
		case p.Applies(in.Source):
			c := in.CRD.DeepCopy()
			c.Annotations = mergeAnnotations(l.Annotations, c.Annotations)
			c.Status.StoredVersions = slices.Clone(l.Status.StoredVersions)
			if sv := crdversions.StorageVersion(c); !slices.Contains(c.Status.StoredVersions, sv) {
				c.Status.StoredVersions = append(c.Status.StoredVersions, sv)
			}
			after[c.Name] = c
		}
	}
	for _, name := range Deletes(ReleaseChange{Deployer: d, Operation: op, Live: live, Current: current, Incoming: incoming}) {
		delete(after, name)
	}
	return after
}

func mergeAnnotations(live, incoming map[string]string) map[string]string {
	if len(live) == 0 {
		return incoming
	}
	out := make(map[string]string, len(live)+len(incoming))
	for k, v := range live {
		out[k] = v
	}
	for k, v := range incoming {
		out[k] = v
	}
	return out
}
