package predict

import (
	"fmt"
	"slices"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

// KindArgoCD is Argo CD's application controller: it syncs an Application (Upgrade, and
// Rollback for `argocd app rollback`) and deletes it (Uninstall).
//
// Argo CD's rules, read in argo-cd v3.6 (controller/appcontroller.go, controller/sync.go,
// gitops-engine pkg/sync):
//   - A Helm source is rendered with `helm template --include-crds` (crds/ left out with
//     helm.skipCrds): crds/ files and templates/ alike are part of the Application, so a
//     CRD that moves from templates/ to crds/ stays. A CRD leaves when the chart stops
//     rendering it at all (a values toggle, a subchart removed, a move to another chart).
//     What an Application manages today is its resource tree, status.resources.
//   - What an Application manages is what its sources render, plus every live object that
//     Argo CD tracks as its: by the tracking-id annotation (v3's default tracking method),
//     or by the instance label under application.resourceTrackingMethod: label (argocd-cm;
//     GetAppName in util/argo/resource_tracking.go). The repo-server never puts either on a
//     CRD (GenerateManifests skips CRDs), so a CRD the sources stop rendering stays the
//     Application's only when its chart (or someone) set the tracking label or annotation
//     itself, e.g. Helm's app.kubernetes.io/instance: {{ .Release.Name }} under label
//     tracking (Argo CD renders with the Application's name as the release name). An
//     untracked CRD leaves the resource tree and is never pruned.
//   - A sync prunes (deletes) what left the Application only when it prunes: an automated
//     sync with spec.syncPolicy.automated.prune: true, or a manual sync with prune
//     (`argocd app sync --prune`). Otherwise the object stays, and the Application is
//     OutOfSync with the object requiring pruning. A rollback never runs while automated
//     sync is on, so it prunes only when asked to.
//   - The live object's argocd.argoproj.io/sync-options annotation (a comma-separated list
//     of options) decides first, then the Application's spec.syncPolicy.syncOptions:
//     Prune=false stops the prune (the object stays, requiring pruning); Prune=confirm
//     holds the sync until someone confirms the prune. helm.sh/resource-policy: keep does
//     NOT stop a prune.
//   - PrunePropagationPolicy (foreground, the default; background; orphan) is the
//     propagation policy of the prune's DELETE call. It saves no custom resource: deleting
//     a CRD deletes every object of its type whatever the policy, since they are not its
//     dependents by ownerReferences.
//   - Deleting the Application with cascade (the resources-finalizer.argocd.argoproj.io
//     finalizer, which `argocd app delete` sets) deletes what it manages, but never a CRD,
//     and not an object whose own sync-options annotation says Delete=false or that
//     carries helm.sh/resource-policy: keep (the Application's syncOptions are not read
//     there); Delete=confirm waits for a confirmation.
const KindArgoCD DeployerKind = "argocd"

// ArgoSyncOptionsAnnotation is Argo CD's per-object sync options annotation: a
// comma-separated list such as "Prune=false,ServerSideApply=true".
const ArgoSyncOptionsAnnotation = "argocd.argoproj.io/sync-options"

// The sync options that keep an object, and the propagation policy that users believe
// keeps a CRD's objects.
const (
	ArgoPruneFalse = "Prune=false"
	// ArgoPruneConfirm holds a sync that would prune the object until someone confirms
	// the prune: Argo CD's own confirmation, offered beside Prune=false.
	ArgoPruneConfirm = "Prune=confirm"
	ArgoDeleteFalse  = "Delete=false"
	ArgoOrphan       = "orphan"
)

// ArgoSync is what an Argo CD Application's spec says about deleting the objects that
// leave it (ArgoCD reads it from the Application's fields).
type ArgoSync struct {
	// AutoPrune says that automated sync is on and prunes: spec.syncPolicy.automated with
	// prune: true (and enabled not false).
	AutoPrune bool `json:"autoPrune,omitempty"`
	// Prune is the value of the Application's own Prune= sync option ("false",
	// "confirm"; empty when unset). An object's sync-options annotation overrides it.
	// Delete= is read from the object alone: the cascading deletion consults no
	// Application option.
	Prune string `json:"prune,omitempty"`
	// PropagationPolicy is the PrunePropagationPolicy sync option: foreground (Argo CD's
	// default, also when empty), background or orphan.
	PropagationPolicy string `json:"prunePropagationPolicy,omitempty"`
	// SkipCRDs is the Helm source's helm.skipCrds: crds/ files are not rendered, so they
	// are not part of the Application.
	SkipCRDs bool `json:"skipCrds,omitempty"`
	// Tracking is how the Argo CD installation tells the Application's objects: it
	// decides whether a CRD the sources stop rendering is still the Application's, to
	// prune.
	Tracking ArgoTracking `json:"tracking,omitzero"`
}

// Argo CD's resource tracking: the annotation (and the installation's id beside it) and
// the default instance label.
const (
	ArgoTrackingAnnotation       = "argocd.argoproj.io/tracking-id"
	ArgoInstallationIDAnnotation = "argocd.argoproj.io/installation-id"
	ArgoDefaultInstanceLabel     = "app.kubernetes.io/instance"
	// ArgoTrackingLabel is the tracking method that reads the instance label; any other
	// value (annotation, annotation+label, unset) reads the tracking-id annotation.
	ArgoTrackingLabel = "label"
)

// ArgoTracking is how an Argo CD installation tells the objects of an Application, from
// its argocd-cm ConfigMap (application.resourceTrackingMethod,
// application.instanceLabelKey, installationID), and the Application's instance name.
type ArgoTracking struct {
	// Method is application.resourceTrackingMethod ("annotation" when argocd-cm sets
	// none). Empty means the settings could not be read: every CRD then counts as tracked,
	// the cautious answer.
	Method string `json:"method,omitempty"`
	// LabelKey is application.instanceLabelKey (ArgoDefaultInstanceLabel when empty).
	LabelKey string `json:"labelKey,omitempty"`
	// InstallationID is argocd-cm's installationID: the tracking-id annotation counts only
	// beside an installation-id annotation of that value.
	InstallationID string `json:"installationID,omitempty"`
	// Instance is the Application's instance name: its name, or namespace_name for an
	// Application outside Argo CD's own namespace (InstanceName in argo-cd).
	Instance string `json:"instance,omitempty"`
}

// Known says whether the tracking settings were read.
func (t ArgoTracking) Known() bool { return t.Method != "" && t.Instance != "" }

// Tracks says whether Argo CD counts a live object with these labels and annotations as
// the Application's when its sources no longer render it, and so prunes it (GetAppName in
// argo-cd util/argo/resource_tracking.go). Unknown settings track everything.
func (t ArgoTracking) Tracks(labels, annotations map[string]string) bool {
	if !t.Known() {
		return true
	}
	if t.Method == ArgoTrackingLabel {
		return labels[t.labelKey()] == t.Instance
	}
	if t.InstallationID != "" && annotations[ArgoInstallationIDAnnotation] != t.InstallationID {
		return false
	}
	// <application>:<group>/<kind>:<namespace>/<name>
	parts := strings.SplitN(annotations[ArgoTrackingAnnotation], ":", 3)
	return len(parts) == 3 && strings.Count(parts[1], "/") == 1 && strings.Count(parts[2], "/") == 1 && parts[0] == t.Instance
}

func (t ArgoTracking) labelKey() string {
	if t.LabelKey == "" {
		return ArgoDefaultInstanceLabel
	}
	return t.LabelKey
}

// marker names what would make Argo CD track an object: the instance label or the
// tracking-id annotation.
func (t ArgoTracking) marker() string {
	if t.Method == ArgoTrackingLabel {
		return fmt.Sprintf("%s label (application.resourceTrackingMethod: %s)", t.labelKey(), ArgoTrackingLabel)
	}
	return fmt.Sprintf("%s annotation (application.resourceTrackingMethod: %s)", ArgoTrackingAnnotation, t.Method)
}

// ArgoCDDeployer is Argo CD's application controller syncing (and deleting) one
// Application, by the rules of KindArgoCD.
type ArgoCDDeployer struct {
	// Version is Argo CD's version, when known.
	Version string
	// Sync is what the Application's spec says about deleting the objects that leave it.
	Sync ArgoSync
}

// ArgoCD is the deployer Argo CD syncing an Application whose automated sync prunes or
// not (autoPrune), with its spec.syncPolicy.syncOptions and helm.skipCrds.
func ArgoCD(autoPrune bool, syncOptions []string, skipCRDs bool) ArgoCDDeployer {
	s := ArgoSync{AutoPrune: autoPrune, SkipCRDs: skipCRDs}
	s.Prune, _ = optionValue(syncOptions, "Prune", false)
	// controller/sync.go tests the exact options, in this order.
	for _, p := range []string{"background", "foreground", ArgoOrphan} {
		for _, o := range syncOptions {
			if o == "PrunePropagationPolicy="+p && s.PropagationPolicy == "" {
				s.PropagationPolicy = p
			}
		}
	}
	return ArgoCDDeployer{Sync: s}
}

// String names the deployer: "Argo CD", with its version when known.
func (a ArgoCDDeployer) String() string { return strings.TrimSpace("Argo CD " + a.Version) }

// Spec is the deployer as a report records it.
func (a ArgoCDDeployer) Spec() DeployerSpec {
	return DeployerSpec{Kind: KindArgoCD, Version: a.Version, Sync: a.Sync}
}

// VerifiesOwnership is false: Argo CD reads no Helm ownership metadata.
func (a ArgoCDDeployer) VerifiesOwnership() bool { return false }

// optionValue is the value of the first option key=value of a list (trimmed when trim,
// as an annotation's comma-separated items are).
func optionValue(options []string, key string, trim bool) (string, bool) {
	for _, o := range options {
		if trim {
			o = strings.TrimSpace(o)
		}
		if v, ok := strings.CutPrefix(o, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// annotationOptions splits a comma-separated annotation value as Argo CD does: items
// trimmed, empty ones and repeats dropped.
func annotationOptions(v string) []string {
	var out []string
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item != "" && !slices.Contains(out, item) {
			out = append(out, item)
		}
	}
	return out
}

// syncOption is the value of option key for an object with live annotations: its own
// sync-options annotation first, else the Application's (app).
func syncOption(live map[string]string, key, app string) string {
	if v, ok := optionValue(annotationOptions(live[ArgoSyncOptionsAnnotation]), key, true); ok {
		return v
	}
	return app
}

// Fate applies Argo CD's rules for op to one object that leaves the Application (see
// KindArgoCD).
func (a ArgoCDDeployer) Fate(op Operation, l Leaving) Fate {
	if !l.Exists {
		return FateAbsent
	}
	if op == Uninstall {
		del, _ := optionValue(annotationOptions(l.Live[ArgoSyncOptionsAnnotation]), "Delete", true)
		switch {
		case l.CRD:
			return FateCRDKept
		case del == "false", slices.Contains(annotationOptions(l.Live[KeepAnnotation]), KeepValue):
			return FateNoDelete
		case del == "confirm":
			return FateConfirm
		}
		return FateDeleted
	}
	if l.Untracked {
		return FateUntracked
	}
	switch prune := syncOption(l.Live, "Prune", a.Sync.Prune); {
	case prune == "false":
		return FateNoPrune
	case op != Upgrade || !a.Sync.AutoPrune:
		return FatePruneOnSync
	case prune == "confirm":
		return FateConfirm
	}
	return FateDeleted
}

// removals is Removals for Argo CD: the CRDs the Application manages today (c.Current,
// whatever their source) that the target no longer renders, from templates/ or, unless
// helm.skipCrds, crds/. An Application's deletion takes them all.
func (a ArgoCDDeployer) removals(c ReleaseChange) []Removal {
	rendered := map[string]bool{}
	shipped := map[string]ChartCRD{}
	if c.Operation != Uninstall {
		for _, in := range c.Incoming {
			if in.Source == CRDsDir && a.Sync.SkipCRDs {
				shipped[in.CRD.Name] = in
				continue
			}
			rendered[in.CRD.Name] = true
		}
	}
	var out []Removal
	for _, cur := range c.Current {
		live := c.Live[cur.CRD.Name]
		if rendered[cur.CRD.Name] || live == nil {
			continue
		}
		r := Removal{Live: live, From: cur, Fate: a.Fate(c.Operation, Leaving{Exists: true, Live: live.Annotations, CRD: true,
			Untracked: !a.Sync.Tracking.Tracks(live.Labels, live.Annotations)})}
		if s, ok := shipped[cur.CRD.Name]; ok {
			r.Shipped = &s
		}
		out = append(out, r)
	}
	return out
}

// decideRemoved is DecideRemoved for Argo CD: a CRD its sync prunes is a Delete while it
// holds objects, when their number is unknown, and when the chart still ships it in crds/
// (under helm.skipCrds); a CRD that stays OutOfSync until a sync with prune, or a
// confirmation, is a Prune verdict while it holds objects (the same cases); a CRD Argo CD
// leaves is ok.
func (a ArgoCDDeployer) decideRemoved(op Operation, r Removal, objects *int64) Decision {
	f := removedDecision(r)
	f.Verdict, f.Reason = a.judge(op, r, a.stakes(op, r, objects))
	f.Reason += files(r)
	return f
}

// argoStakes is what the reasons about one CRD that leaves an Application say.
type argoStakes struct {
	// leaves says why it leaves, what is what a deletion takes with it, and atStake
	// whether that loses anything.
	leaves, what string
	atStake      bool
	// again and orphan are the notes on a CRD not created again, and on the orphan
	// propagation policy that does not save its objects.
	again, orphan string
}

func (a ArgoCDDeployer) stakes(op Operation, r Removal, objects *int64) argoStakes {
	kind := r.Live.Spec.Names.Kind
	s := argoStakes{leaves: "the Application's target no longer renders it", what: fmt.Sprintf("every %s object (how many could not be read)", kind),
		atStake: objects == nil || *objects > 0 || r.Shipped != nil}
	if r.Shipped != nil {
		s.leaves = "the target ships it in crds/ only, which helm.skipCrds leaves out of what Argo CD renders"
		s.again = "; Argo CD does not create it again"
	}
	if op == Uninstall {
		s.leaves = "deleting the Application deletes the resources it manages"
	}
	if objects != nil {
		s.what = fmt.Sprintf("%s objects", kind)
		if *objects > 0 {
			s.what = objectsOf(*objects, kind)
		}
	}
	if a.Sync.PropagationPolicy == ArgoOrphan {
		s.orphan = fmt.Sprintf("; PrunePropagationPolicy=%s does not save them: deleting a CRD deletes every object of its type whatever the propagation policy, "+
			"since they are not its dependents by ownerReferences", ArgoOrphan)
	}
	return s
}

// judge is the verdict and reason for a removal's fate.
func (a ArgoCDDeployer) judge(op Operation, r Removal, s argoStakes) (Verdict, string) {
	switch r.Fate {
	case FateDeleted:
		by := "its automated sync prunes it"
		if op == Uninstall {
			by = "the cascading deletion takes it"
		}
		if s.atStake {
			return Delete, fmt.Sprintf("%s, and %s: Argo CD deletes the CRD and %s%s%s", s.leaves, by, s.what, s.again, s.orphan)
		}
		return OK, fmt.Sprintf("%s, and %s: Argo CD deletes the CRD; it holds no %s, so nothing is lost", s.leaves, by, s.what)
	case FatePruneOnSync, FateConfirm:
		if s.atStake {
			return Prune, fmt.Sprintf("%s, but %s; a sync that prunes (%s, or automated prune) would delete the CRD and %s%s%s",
				s.leaves, waits(op, r.Fate), cmdline.Sync{Prune: true}, s.what, s.again, s.orphan)
		}
		return OK, fmt.Sprintf("%s, but %s; a sync that prunes would delete the CRD, which holds no %s, so nothing would be lost", s.leaves, waits(op, r.Fate), s.what)
	case FateNoPrune:
		where := "its " + ArgoSyncOptionsAnnotation + " annotation"
		if _, ok := optionValue(annotationOptions(r.Live.Annotations[ArgoSyncOptionsAnnotation]), "Prune", true); !ok {
			where = "the Application's spec.syncPolicy.syncOptions"
		}
		return OK, fmt.Sprintf("%s, but %s in %s stops Argo CD pruning it: the CRD and its objects stay, and Argo CD shows the Application OutOfSync, the CRD requiring pruning",
			s.leaves, ArgoPruneFalse, where)
	case FateUntracked:
		return OK, fmt.Sprintf("%s, but Argo CD does not track the CRD as the Application's: its repo-server puts no tracking label or annotation on CRDs, "+
			"and the live CRD carries no %s naming %s. The CRD leaves the Application's resource tree and no sync prunes it: the CRD and its objects stay",
			s.leaves, a.Sync.Tracking.marker(), a.Sync.Tracking.Instance)
	case FateCRDKept:
		return OK, s.leaves + ", but never a CRD: Argo CD leaves the CRD and its objects in place"
	case FateNoDelete:
		return OK, fmt.Sprintf("%s, but %s (or helm.sh/resource-policy: keep) keeps it: Argo CD leaves it in place", s.leaves, ArgoDeleteFalse)
	case FateAbsent:
		return OK, s.leaves + ", and it is not on the cluster"
	}
	return OK, ""
}

// waits words why a CRD that leaves stays until a sync that prunes (FatePruneOnSync), or
// a confirmation (FateConfirm).
func waits(op Operation, fate Fate) string {
	switch {
	case fate == FateConfirm:
		return "its Prune=confirm sync option holds the sync until someone confirms the prune (the UI's Confirm Pruning, " +
			"or the argocd.argoproj.io/deletion-approved annotation on the Application)"
	case op == Rollback:
		return "a rollback prunes only with --prune: it leaves the CRD and its objects in place, and Argo CD shows the Application OutOfSync, the CRD requiring pruning"
	}
	return "its sync policy does not prune (spec.syncPolicy.automated.prune is not true): the sync leaves the CRD and its objects in place, " +
		"and Argo CD shows the Application OutOfSync, the CRD requiring pruning"
}

// KeepAdvice words how to keep the live CRDs that op would delete: a sync option on the
// live CRD, which Argo CD reads when it prunes (or deletes), merged into the annotation's
// list.
func (a ArgoCDDeployer) KeepAdvice(op Operation, live []*apiextv1.CustomResourceDefinition, _, _ string) string {
	var cmds []string
	for _, c := range a.KeepCommands(op, live) {
		cmds = append(cmds, c.String())
	}
	if op == Uninstall {
		return fmt.Sprintf("keep it: %s before deleting the Application (Argo CD reads %s from the live object and leaves it in place)",
			strings.Join(cmds, "; "), ArgoDeleteFalse)
	}
	var confirm []string
	for _, c := range syncOptionCommands(live, ArgoPruneConfirm) {
		confirm = append(confirm, c.String())
	}
	return fmt.Sprintf("keep it: %s before the sync (Argo CD reads %s from the live CRD's %s when it prunes, and leaves the CRD and its objects in place, "+
		"OutOfSync; the command adds the option to those the annotation already lists); to keep it in git instead, first sync a chart that renders the CRD with that annotation. "+
		"Or let a person decide at the prune, with Argo CD's own confirmation, %s: %s (the sync that would prune it waits until someone confirms). "+
		"helm.sh/resource-policy: keep does not stop an Argo CD prune",
		strings.Join(cmds, "; "), ArgoPruneFalse, ArgoSyncOptionsAnnotation, ArgoSyncOptionsAnnotation+": "+ArgoPruneConfirm, strings.Join(confirm, "; "))
}

// KeepCommands adds Prune=false (Delete=false for an Application's deletion) to the
// CRDs' sync-options annotation (ArgoSyncOption): one command for those without it and
// one for each whose list it extends.
func (a ArgoCDDeployer) KeepCommands(op Operation, live []*apiextv1.CustomResourceDefinition) []cmdline.Annotate {
	option := ArgoPruneFalse
	if op == Uninstall {
		option = ArgoDeleteFalse
	}
	return syncOptionCommands(live, option)
}

// syncOptionCommands add option to the CRDs' sync-options annotation (ArgoSyncOption):
// one command for those without it and one for each whose list it extends.
func syncOptionCommands(live []*apiextv1.CustomResourceDefinition, option string) []cmdline.Annotate {
	var bare []string
	var out []cmdline.Annotate
	for _, c := range live {
		if existing := c.Annotations[ArgoSyncOptionsAnnotation]; strings.TrimSpace(existing) != "" {
			out = append(out, ArgoSyncOption([]string{c.Name}, option, existing))
		} else {
			bare = append(bare, c.Name)
		}
	}
	if len(bare) > 0 {
		out = append([]cmdline.Annotate{ArgoSyncOption(bare, option, "")}, out...)
	}
	return out
}

// Kept merges Prune=false into a copy of the annotations' sync options.
func (a ArgoCDDeployer) Kept(annotations map[string]string) map[string]string {
	out := copyAnnotations(annotations)
	out[ArgoSyncOptionsAnnotation] = MergeSyncOptions(annotations[ArgoSyncOptionsAnnotation], ArgoPruneFalse)
	return out
}

// MergeSyncOptions adds option (key=value) to a sync-options annotation value, keeping
// every other option and replacing one of the same key: "ServerSideApply=true" and
// "Prune=false" give "ServerSideApply=true,Prune=false".
func MergeSyncOptions(existing, option string) string {
	key, _, _ := strings.Cut(option, "=")
	var out []string
	for _, o := range annotationOptions(existing) {
		if k, _, _ := strings.Cut(o, "="); k != key {
			out = append(out, o)
		}
	}
	return strings.Join(append(out, option), ",")
}
