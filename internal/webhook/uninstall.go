package webhook

import (
	"context"
	"fmt"
	"strings"

	release "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// decideUninstall judges the UPDATE that marks a release's last record uninstalling:
// helm uninstall (the CLI, helm-controller, the SDK) writes it after the pre-delete hooks
// and before it deletes anything (pkg/action/uninstall.go in Helm 3 and 4). It is denied
// when the uninstall would delete a CRD that holds objects: the CRDs the stored manifest
// renders from templates/ without helm.sh/resource-policy: keep (predict.Uninstalls),
// each judged as a deletion of the CRD (predict.DecideDeleted), as the CRD deletion guard
// judges it. Helm 3 and 4 only log a refused write of that mark and go on deleting; the
// answer says so, and the CRD deletion guard is what keeps the CRD and its objects.
func (r *releaseGate) decideUninstall(ctx context.Context, sec *corev1.Secret, dryRun bool) decision {
	g := r.g
	rel, err := helmrelease.DecodeSecret(sec)
	if err != nil {
		return g.recordErrored("release record "+sec.Namespace+"/"+sec.Name, err)
	}
	what := fmt.Sprintf("uninstalling mark of release %s/%s (revision %d, chart %s), which helm uninstall writes before it deletes anything",
		sec.Namespace, rel.Name, rel.Version, chartOf(rel))
	rep, err := runWithin(ctx, func(ctx context.Context) (*check.Report, error) { return g.uninstallReport(ctx, rel) })
	if err != nil {
		return g.recordErrored(what, err)
	}
	o := owner{namespace: sec.Namespace, release: rel.Name}
	o.hrNamespace, o.hrName = fluxOwner(rel.Manifest)
	var deleted []string
	for _, c := range rep.Findings() {
		deleted = append(deleted, c.Name)
	}
	d := o.uninstallDoor(what, deleted).answer(gate.JudgeDeletion(rep))
	d.operation, d.chart = predict.DeleteCRD, chartOf(rel)
	if !d.kind.allowed() && !dryRun && o.flux() {
		g.recordOnHelmRelease(ctx, o, d)
	}
	return d
}

// uninstallReport is the report of the CRDs an uninstall of rel deletes
// (predict.Uninstalls), each judged as the deletion of that CRD with its objects counted
// (predict.DecideDeleted), with the next steps of those that hold objects.
func (g *Gate) uninstallReport(ctx context.Context, rel *release.Release) (*check.Report, error) {
	rendered, err := chartcrds.FromManifest(rel.Manifest)
	if err != nil {
		return nil, fmt.Errorf("revision %d of release %s: %w", rel.Version, rel.Name, err)
	}
	rep := &check.Report{Operation: predict.DeleteCRD, Release: rel.Name, Namespace: rel.Namespace, Safe: true, CRDs: []check.CRDReport{}}
	if len(rendered) == 0 {
		return rep, nil
	}
	tgt, err := g.localTarget(ctx)
	if err != nil {
		return nil, err
	}
	live, err := tgt.Cluster.CRDs(ctx)
	if err != nil {
		return nil, err
	}
	var held []string
	// The writer's Helm version is unknown: Helm 3's rules delete a superset of what
	// Helm 4.3's (which skips CRDs whose live ownership names another release).
	change := predict.ReleaseChange{Deployer: predict.Helm3, Operation: predict.Uninstall, Release: rel.Name, Namespace: rel.Namespace,
		Live: live, Current: rendered}
	for _, name := range predict.Deletes(change) {
		n, examples, err := objectsOf(ctx, tgt, live[name])
		if err != nil {
			return nil, err
		}
		f := predict.DecideDeleted(live[name], n, examples)
		rep.CRDs = append(rep.CRDs, check.CRDReport{Decision: f, Objects: &n})
		if f.Verdict != predict.OK {
			rep.Safe, held = false, append(held, name)
		}
	}
	if !rep.Safe {
		rep.NextSteps = predict.DeletionSteps(held...)
		for i := range rep.CRDs {
			if rep.CRDs[i].Verdict != predict.OK {
				rep.CRDs[i].Action = strings.Join(predict.DeletionSteps(rep.CRDs[i].Name), "; then ")
			}
		}
	}
	return rep, nil
}

// uninstallDoor is the door of an uninstall named by what, which would delete the CRDs
// deleted with their objects. Helm 3 and 4 only log a refused write of the uninstalling
// mark and go on deleting the release's other objects; the CRD deletion guard then
// refuses the CRDs' DELETE, so the uninstall fails with the CRDs and their objects in
// place. again says so, after how to run the uninstall again; Helm prints the warnings
// of the refused write (client-go logs them), so the warning is the whole answer.
func (o owner) uninstallDoor(what string, deleted []string) deletionDoor {
	dr := deletionDoor{door: door{change: what, again: o.again("then run " + cmdline.HelmUninstall{}.String() + " again"),
		admittedReason: ReasonReleaseAdmitted, blockedReason: ReasonUninstallBlocked}}
	dr.again += fmt.Sprintf(". Helm only logs this refusal and goes on deleting the release's other objects; upgradeguard's CRD deletion guard, where it is on, "+
		"refuses the DELETE of %s, so the uninstall fails and leaves the CRDs and their objects in place", strings.Join(deleted, ", "))
	return dr
}
