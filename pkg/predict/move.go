package predict

import (
	"fmt"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

// Move is the verdict on a CRD that moves from one Helm release to another (a chart split
// into an operator chart and a -crds chart, a CRD moved to a sibling chart): the release
// it leaves deletes it with its next upgrade unless it is kept, and the release it joins
// refuses it until Helm's ownership metadata names that release (Helm's "invalid
// ownership metadata"). The steps (MoveSteps) keep it on the old side and move the
// ownership first; `upgradeguard crd adopt` carries them out.
const Move Verdict = "move"

// FixMove keeps the CRD on the side of the release it leaves and moves Helm's ownership
// metadata to the release it joins (MoveSteps; cmdline.CRDAdopt carries it out).
const FixMove Fix = "move"

// ReleaseRef names a Helm release: its namespace and name.
type ReleaseRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// String is NAMESPACE/NAME.
func (r ReleaseRef) String() string { return r.Namespace + "/" + r.Name }

// IsZero says that no release is named.
func (r ReleaseRef) IsZero() bool { return r.Name == "" }

// ParseReleaseRef reads NAMESPACE/NAME. flag names the flag it came from, for the error.
func ParseReleaseRef(flag, s string) (ReleaseRef, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return ReleaseRef{}, fmt.Errorf("--%s %q: want NAMESPACE/RELEASE, the Helm release's namespace and name (as `%s` lists them)", flag, s, cmdline.HelmList{Namespace: "NAMESPACE"})
	}
	return ReleaseRef{Namespace: ns, Name: name}, nil
}

// HelmOwner is the release a live object's Helm ownership metadata names
// (ReleaseNameAnnotation, ReleaseNamespaceAnnotation); ok is false when it names none.
func HelmOwner(annotations map[string]string) (ReleaseRef, bool) {
	name := annotations[ReleaseNameAnnotation]
	if name == "" {
		return ReleaseRef{}, false
	}
	return ReleaseRef{Namespace: annotations[ReleaseNamespaceAnnotation], Name: name}, true
}

// CRDMove is one CRD moving from release From to release To.
type CRDMove struct {
	CRD  string     `json:"crd"`
	From ReleaseRef `json:"from"`
	To   ReleaseRef `json:"to"`
}

// MoveStepKind names one step of a move.
type MoveStepKind string

// The steps of a move, in the order that works (MoveSteps).
const (
	// MoveKeep annotates the live CRD helm.sh/resource-policy=keep, so that the upgrade of
	// From that no longer renders it leaves it (Helm reads the live annotation).
	MoveKeep MoveStepKind = "keep"
	// MoveOwnership points Helm's ownership annotations at To.
	MoveOwnership MoveStepKind = "ownership"
	// MoveManagedBy sets Helm's managed-by label, which Helm's ownership check also reads.
	MoveManagedBy MoveStepKind = "managed-by"
	// MoveDeployTo installs or upgrades To with a chart that renders the CRD: it takes it
	// into its manifest, and its later upgrades update it.
	MoveDeployTo MoveStepKind = "deploy-to"
	// MoveUpgradeFrom upgrades From to a chart that no longer renders the CRD.
	MoveUpgradeFrom MoveStepKind = "upgrade-from"
)

// MoveStep is one step of a move: the command, why it comes at this place, and, for the
// steps on the live CRD's metadata, whether the live CRD already carries it.
type MoveStep struct {
	Kind    MoveStepKind `json:"kind"`
	Command string       `json:"command"`
	Why     string       `json:"why"`
	// Metadata says the step sets the live CRD's metadata (crd adopt carries it out);
	// the others are Helm operations the person runs.
	Metadata bool `json:"metadata"`
	// Done says the live CRD already carries what the step sets.
	Done bool `json:"done"`
}

// MoveMetadata are the annotations and labels the live CRD carries once its ownership
// has moved to m.To and it is kept on m.From's side: every value MoveSteps' metadata
// steps set. (No From: no keep.)
func MoveMetadata(m CRDMove) (annotations, labels map[string]string) {
	annotations = map[string]string{ReleaseNameAnnotation: m.To.Name, ReleaseNamespaceAnnotation: m.To.Namespace}
	if !m.From.IsZero() {
		annotations[KeepAnnotation] = KeepValue
	}
	return annotations, map[string]string{ManagedByLabel: ManagedByHelm}
}

// MoveSteps are the steps that move m's CRD, in the order that works, each marked Done
// when live already carries it:
//  1. keep it on From's side, first: from then on no upgrade of From deletes it (Helm
//     reads helm.sh/resource-policy from the live CRD), whatever order the rest runs in;
//  2. point the ownership annotations and 3. the managed-by label at To, before To's
//     install or upgrade: Helm refuses to take an object whose ownership names another
//     release;
//  4. install or upgrade To (toChart; CHART when not known): the CRD joins its manifest;
//  5. upgrade From without it: Helm leaves it, kept.
//
// The keep annotation stays afterwards: it also keeps the CRD and its objects if To
// ever stops rendering it. With no From (the CRD belongs to no release), the steps on
// From's side are left out.
func MoveSteps(m CRDMove, live *apiextv1.CustomResourceDefinition, toChart string) []MoveStep {
	var annotations, labels map[string]string
	if live != nil {
		annotations, labels = live.Annotations, live.Labels
	}
	crd := []string{m.CRD}
	var steps []MoveStep
	if !m.From.IsZero() {
		steps = append(steps, MoveStep{Kind: MoveKeep, Metadata: true, Done: annotations[KeepAnnotation] == KeepValue,
			Command: Keep(crd).String(),
			Why:     fmt.Sprintf("release %s still lists the CRD: its upgrade without it deletes the CRD and every object of its type unless the live CRD carries %s=%s", m.From, KeepAnnotation, KeepValue)})
	}
	steps = append(steps,
		MoveStep{Kind: MoveOwnership, Metadata: true,
			Done: annotations[ReleaseNameAnnotation] == m.To.Name && annotations[ReleaseNamespaceAnnotation] == m.To.Namespace,
			Command: cmdline.Annotate{Resource: "crd", Names: crd, Overwrite: true, Key: ReleaseNameAnnotation, Value: m.To.Name,
				More: []cmdline.KeyValue{{Key: ReleaseNamespaceAnnotation, Value: m.To.Namespace}}}.String(),
			Why: fmt.Sprintf("Helm refuses to take a CRD into release %s while its ownership annotations name another release (invalid ownership metadata)", m.To)},
		MoveStep{Kind: MoveManagedBy, Metadata: true, Done: labels[ManagedByLabel] == ManagedByHelm,
			Command: cmdline.Label{Resource: "crd", Names: crd, Overwrite: true, Key: ManagedByLabel, Value: ManagedByHelm}.String(),
			Why:     fmt.Sprintf("Helm's ownership check also wants the label %s=%s", ManagedByLabel, ManagedByHelm)},
		MoveStep{Kind: MoveDeployTo, Command: cmdline.HelmUpgrade{Release: m.To.Name, Namespace: m.To.Namespace, Chart: toChart, Install: true}.String(),
			Why: fmt.Sprintf("release %s takes the CRD into its manifest; from now on its upgrades update it", m.To)})
	if !m.From.IsZero() {
		steps = append(steps, MoveStep{Kind: MoveUpgradeFrom, Command: cmdline.HelmUpgrade{Release: m.From.Name, Namespace: m.From.Namespace}.String(),
			Why: fmt.Sprintf("release %s lets go of the CRD: Helm reads the keep annotation and leaves the CRD and its objects to %s", m.From, m.To)})
	}
	return steps
}

// DecideMovedAway is the verdict on a CRD that leaves release from with op while its
// live ownership metadata already names another release, to (it moved there, or is
// moving): Move while the operation deletes it (nothing keeps it on from's side), so
// that the CRD to's manifest lists is not deleted with every object; ok when it is kept.
// removed is DecideRemoved's decision, whose reason it extends.
func DecideMovedAway(op Operation, removed Decision, r Removal, from, to ReleaseRef) Decision {
	f := removed
	f.Move = &CRDMove{CRD: r.Name(), From: from, To: to}
	if r.Fate != FateDeleted {
		f.Reason = fmt.Sprintf("it moved to release %s (its live ownership names it); %s", to, f.Reason)
		return f
	}
	f.Verdict = Move
	f.Reason = fmt.Sprintf("it moved to release %s (its live ownership names it), but release %s still lists it: %s; keep it on %s's side first",
		to, from, f.Reason, from)
	return f
}

// DecideMovedIn is the verdict on a CRD that op of release to (an install or upgrade:
// Helm's rollback checks no ownership) renders from templates/ for the first time
// while the live CRD's ownership names another release, from: Helm refuses the operation
// (invalid ownership metadata) until the ownership moves to to, and from's next upgrade
// without it would delete it unless it is kept. incoming is Decide's decision on the
// write itself, kept in the reason when it is not ok (after the move, check again).
func DecideMovedIn(op Operation, incoming Decision, from, to ReleaseRef) Decision {
	f := incoming
	f.Move = &CRDMove{CRD: incoming.Name, From: from, To: to}
	f.Verdict = Move
	f.Reason = fmt.Sprintf("it moves from release %s to release %s: Helm's %s of %s refuses it while its ownership annotations name %s (invalid ownership metadata), "+
		"and the upgrade of %s that no longer renders it deletes it unless it is kept", from, to, op, to, from, from)
	if incoming.Verdict != OK {
		f.Reason += "; also: " + incoming.Reason
	}
	return f
}

// MoveAdvice words the fix of a Move verdict: the command that performs the metadata
// steps, and the steps themselves in order.
func MoveAdvice(m CRDMove, live *apiextv1.CustomResourceDefinition, toChart string) string {
	var todo []string
	for _, s := range MoveSteps(m, live, toChart) {
		if !s.Done {
			todo = append(todo, s.Command)
		}
	}
	return fmt.Sprintf("move it: %s (it keeps the CRD on %s's side and moves Helm's ownership to %s, then says what to run), or by hand, in this order: %s",
		AdoptCommand(m, toChart), m.From, m.To, strings.Join(todo, "; "))
}

// AdoptCommand is the command that performs a move's steps on the live CRD:
// `upgradeguard crd adopt CRD --from NS/A --to NS/B --chart C --apply`, with the chart
// release To is installed or upgraded with when it is known (adopt checks it renders
// the CRD; without it, adopt reads To's installed revision).
func AdoptCommand(m CRDMove, toChart string) cmdline.CRDAdopt {
	return cmdline.CRDAdopt{CRD: m.CRD, FromNamespace: m.From.Namespace, FromName: m.From.Name, ToNamespace: m.To.Namespace, ToName: m.To.Name,
		Chart: toChart, Apply: true}
}

// MovingHelm reports whether a move is judged for d: Helm's ownership metadata is Helm's
// own (Argo CD renders with helm template and keeps no release).
func MovingHelm(d Deployer) bool {
	_, ok := orDefault(d).(HelmDeployer)
	return ok
}
