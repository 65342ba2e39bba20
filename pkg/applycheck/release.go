package applycheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
	"github.com/upgradeguard/upgradeguard/pkg/redact"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// ErrNoRevision means the release has no such revision (Helm: "release has no N version").
var ErrNoRevision = errors.New("release has no such revision")

// ErrNoDeployed means an upgrade has no deployed revision to start from.
var ErrNoDeployed = errors.New("release has no deployed revision")

// ReleaseCheck is one Helm operation on a stored release.
type ReleaseCheck struct {
	Release   string
	Namespace string
	// History is every stored revision of the release, in any order.
	History   []*release.Release
	Operation Operation
	// TargetManifest and TargetHooks are the new chart, rendered (upgrade only).
	TargetManifest string
	TargetHooks    []*release.Hook
	// ToRevision is a rollback's target; 0 means the revision before the last, as
	// `helm rollback NAME` without a revision.
	ToRevision int
	Flags      Flags
	// FieldManager defaults to "helm", the Helm CLI's.
	FieldManager string
	// Values are the values given to the operation (-f, --set). They are redacted from
	// the report together with the stored values and Secret data of every revision used.
	Values map[string]any
	// Clients, when set, run the uninstall's ownership and data model on the objects the
	// operation deletes (see uninstall.Prune).
	Clients *uninstall.Clients
}

// ReleaseReport is the prediction of one upgrade or rollback.
type ReleaseReport struct {
	Release   string `json:"release"`
	Namespace string `json:"namespace"`
	// From is the revision the operation starts from; To is the rollback target (0 for an
	// upgrade).
	From int  `json:"from"`
	To   int  `json:"to,omitempty"`
	Mode Mode `json:"mode"`
	// Apply is the prediction with the flags as given.
	Apply *Report `json:"apply"`
	// ServerSide is, for an operation that runs client-side, what the same operation with
	// --server-side=true would do: which fields move to Helm's server-side apply, and
	// which conflict with other managers.
	ServerSide *Report `json:"serverSide,omitempty"`
	// Prune is what deleting the dropped objects means: taken over by another release,
	// keep only in the old manifest, volumes, credentials, CRDs (nil without Clients).
	Prune *uninstall.Report `json:"prune,omitempty"`
	Safe  bool              `json:"safe"`
}

// CheckRelease predicts `helm upgrade` or `helm rollback` of a stored release as Helm
// 4.3.1 runs it: it resolves the apply method from the flags and the recorded
// apply_method, predicts the flag errors, sorts the hooks that run, and replays the
// operation object by object with dry runs. Release values and Secret data are redacted
// from every string of the report. It returns an error only when it cannot run.
func CheckRelease(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, rc ReleaseCheck) (*ReleaseReport, error) {
	if len(rc.History) == 0 {
		return nil, fmt.Errorf("release %s: %w", rc.Release, ErrNoRevision)
	}
	if rc.FieldManager == "" {
		rc.FieldManager = "helm"
	}
	if rc.Operation == "" {
		rc.Operation = OpUpgrade
	}
	last := rc.History[0]
	for _, r := range rc.History {
		if r.Version > last.Version {
			last = r
		}
	}
	from, up, red, err := rc.plan(last)
	if err != nil {
		return nil, err
	}
	decide := last
	if rc.Operation == OpRollback {
		decide = revision(rc.History, up.target)
	}
	rep := &ReleaseReport{Release: rc.Release, Namespace: rc.Namespace, From: from.Version}
	if rc.Operation == OpRollback {
		rep.To = decide.Version
	}
	rep.Mode = ResolveMode(rc.Operation, rc.Flags, decide.Version, decide.ApplyMethod)
	if rc.Operation == OpUpgrade {
		// An upgrade moves client-side fields when the revision it starts from (the last
		// deployed one, not the last one) was client-side (releasingUpgrade).
		rep.Mode.TakesOverClientSide = rep.Mode.ServerSide && from.ApplyMethod != MethodSSA
	}
	opts := Options{FieldManager: rc.FieldManager, Force: rc.Flags.ForceConflicts, Redact: red,
		ClientSide: !rep.Mode.ServerSide, TakeOverClientSide: rep.Mode.TakesOverClientSide, TakeOwnership: rc.Flags.TakeOwnership}
	if rep.Mode.FlagErrorStage == BeforeRecord {
		rep.Apply = &Report{HelmVersions: HelmVersions, Operation: rc.Operation, Method: rep.Mode.Method, FieldManager: rc.FieldManager, Result: Refused,
			Error: rep.Mode.FlagError, Objects: []Object{}, Failing: []string{}, Landed: []string{}, NotLanded: []string{},
			PreUpgradeHooks: []string{}, PostUpgradeHooks: []string{}, Record: Record{Previous: up.Current, PreviousStatus: up.CurrentStatus}}
		return rep, nil
	}
	opts.FlagError = rep.Mode.FlagError
	if opts.FlagError != "" {
		opts.Force = false
	}
	if rep.Apply, err = Run(ctx, dyn, mapper, up.Upgrade, opts); err != nil {
		return nil, err
	}
	if !rep.Mode.ServerSide {
		opts.ClientSide, opts.TakeOverClientSide, opts.FlagError, opts.Force = false, true, "", false
		if rep.ServerSide, err = Run(ctx, dyn, mapper, up.Upgrade, opts); err != nil {
			return nil, err
		}
	}
	if rc.Clients != nil && len(rep.Apply.dropped) > 0 {
		if rep.Prune, err = prune(ctx, rc, rep.Apply.dropped); err != nil {
			return nil, err
		}
	}
	rep.Safe = rep.Apply.Safe && rep.Mode.FlagError == "" && (rep.Prune == nil || rep.Prune.Safe) &&
		!slices.ContainsFunc(rep.Apply.Objects, func(o Object) bool { return len(o.NotReverted) > 0 })
	return rep, nil
}

func prune(ctx context.Context, rc ReleaseCheck, dropped []*unstructured.Unstructured) (*uninstall.Report, error) {
	var text strings.Builder
	for _, obj := range dropped {
		data, err := yaml.Marshal(obj.Object)
		if err != nil {
			return nil, fmt.Errorf("%s: encode: %w", manifest.Subject(obj), err)
		}
		text.WriteString("---\n")
		text.Write(data)
	}
	return uninstall.Prune(ctx, rc.Clients, uninstall.PruneOptions{Release: rc.Release, Namespace: rc.Namespace, Operation: string(rc.Operation),
		Dropped: text.String(), Deployer: predict.Helm4})
}

type planned struct {
	Upgrade
	target int
}

// plan picks the revisions the operation works from and to, as Helm does, and what to
// redact: the values given and the values and Secret data of every revision involved.
func (rc ReleaseCheck) plan(last *release.Release) (*release.Release, planned, *redact.Redactor, error) {
	red := redact.New()
	red.AddValues(rc.Values)
	if rc.Operation == OpRollback {
		want := rc.ToRevision
		if want == 0 {
			want = last.Version - 1
		}
		target := revision(rc.History, want)
		if target == nil {
			return nil, planned{}, nil, fmt.Errorf("release %s: rollback to %d: %w (Helm: \"release has no %d version\")", rc.Release, want, ErrNoRevision, want)
		}
		u := Upgrade{Operation: OpRollback, Release: rc.Release, Namespace: rc.Namespace, CurrentManifest: last.Manifest, Current: last.Version,
			CurrentStatus: statusOf(last), LastRevision: last.Version, LastStatus: statusOf(last), TargetManifest: target.Manifest}
		u.PreUpgradeHooks, u.PostUpgradeHooks = hookNames(target.Hooks, release.HookPreRollback, release.HookPostRollback)
		hide(red, last, target)
		return last, planned{Upgrade: u, target: want}, red, nil
	}
	current := last
	if statusOf(last) != common.StatusDeployed.String() {
		current = nil
		for _, r := range rc.History {
			if statusOf(r) == common.StatusDeployed.String() && (current == nil || r.Version > current.Version) {
				current = r
			}
		}
		if current == nil {
			return nil, planned{}, nil, fmt.Errorf("release %s: %w (Helm: %q has no deployed releases)", rc.Release, ErrNoDeployed, rc.Release)
		}
	}
	u := Upgrade{Operation: OpUpgrade, Release: rc.Release, Namespace: rc.Namespace, CurrentManifest: current.Manifest, Current: current.Version,
		CurrentStatus: statusOf(current), LastRevision: last.Version, LastStatus: statusOf(last), TargetManifest: rc.TargetManifest}
	u.PreUpgradeHooks, u.PostUpgradeHooks = hookNames(rc.TargetHooks, release.HookPreUpgrade, release.HookPostUpgrade)
	hide(red, current, last)
	red.AddManifest(rc.TargetManifest)
	for _, h := range rc.TargetHooks {
		red.AddManifest(h.Manifest)
	}
	return current, planned{Upgrade: u}, red, nil
}

// hide adds the values of each revision and the Secret data of its manifest and hooks.
func hide(red *redact.Redactor, revs ...*release.Release) {
	for _, r := range revs {
		red.AddValues(r.Config)
		red.AddManifest(r.Manifest)
		for _, h := range r.Hooks {
			red.AddManifest(h.Manifest)
		}
	}
}

// hookNames lists the hooks (Kind/name) that run before and after the operation, in
// Helm's hook order (weight, then name).
func hookNames(hooks []*release.Hook, pre, post release.HookEvent) (before, after []string) {
	sorted := append([]*release.Hook{}, hooks...)
	sortHooks(sorted)
	for _, h := range sorted {
		for _, e := range h.Events {
			switch e {
			case pre:
				before = append(before, h.Kind+"/"+h.Name)
			case post:
				after = append(after, h.Kind+"/"+h.Name)
			}
		}
	}
	return before, after
}

func revision(h []*release.Release, v int) *release.Release {
	for _, r := range h {
		if r.Version == v {
			return r
		}
	}
	return nil
}

func statusOf(r *release.Release) string {
	if r == nil || r.Info == nil {
		return ""
	}
	return r.Info.Status.String()
}

// sortHooks is Helm's hook order (hookByWeight in pkg/action/hooks.go): weight, then name.
func sortHooks(h []*release.Hook) {
	slices.SortStableFunc(h, func(a, b *release.Hook) int {
		if a.Weight != b.Weight {
			return cmp.Compare(a.Weight, b.Weight)
		}
		return strings.Compare(a.Name, b.Name)
	})
}
