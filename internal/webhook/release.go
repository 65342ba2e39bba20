package webhook

import (
	"context"
	"encoding/json"
	"fmt"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/manifest"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// ReleasePath is where the webhook server serves the release-record gate: a validating
// webhook on the CREATE of Helm release record Secrets (sh.helm.release.v1.NAME.vN) with
// status pending-install, pending-upgrade or pending-rollback. Every Helm client writes
// that record before it applies anything of the revision, so a denial leaves the
// cluster and the release history as they were. It also judges the UPDATE that marks
// the last record uninstalling, which helm uninstall writes after the pre-delete hooks
// and before it deletes anything (decideUninstall).
const ReleasePath = "/validate-helm-release-record"

// Labels on a StorageMigration the release-record gate creates for a release that no
// Flux HelmRelease manages (the Helm CLI, Terraform, an SDK operator).
const (
	LabelReleaseNamespace = "upgradeguard.io/release-namespace"
	LabelReleaseName      = "upgradeguard.io/release-name"
)

// Labels helm-controller puts on every object it applies (templates and crds/), naming
// the HelmRelease: the release-record and CRD gates find the HelmRelease through them.
const (
	LabelFluxName      = "helm.toolkit.fluxcd.io/name"
	LabelFluxNamespace = "helm.toolkit.fluxcd.io/namespace"
)

// releaseGate is the admission.Handler of ReleasePath.
type releaseGate struct{ g *Gate }

// envelope is the release-record door's envelope: the CREATE of a pending release record
// is decided (decide), and so is the UPDATE that marks one uninstalling
// (decideUninstall).
func (r *releaseGate) envelope() *envelope {
	return &envelope{operations: []admissionv1.Operation{admissionv1.Create, admissionv1.Update},
		skip: "only the creation of a release record and its uninstalling mark are gated", timeout: r.g.opts.RecordTimeout, logged: "release record decision",
		read: func(req admission.Request) (*call, string, error) {
			var sec corev1.Secret
			if err := json.Unmarshal(req.Object.Raw, &sec); err != nil {
				return nil, "", fmt.Errorf("decode the Secret: %w", err)
			}
			if sec.Namespace == "" {
				sec.Namespace = req.Namespace
			}
			uninstall := req.Operation == admissionv1.Update && sec.Labels[helmrelease.LabelStatus] == string(common.StatusUninstalling)
			pending := req.Operation == admissionv1.Create && helmrelease.Pending(sec.Labels[helmrelease.LabelStatus])
			if sec.Labels[helmrelease.LabelOwner] != helmrelease.OwnerHelm || sec.Type != helmrelease.SecretType || (!pending && !uninstall) {
				return nil, "not a pending Helm release record, nor one marked uninstalling", nil
			}
			decide := r.decide
			if uninstall {
				decide = r.decideUninstall
			}
			return &call{
				decide: func(ctx context.Context, dryRun bool) decision { return decide(ctx, &sec, dryRun) },
				log: []any{"release", sec.Namespace + "/" + sec.Labels[helmrelease.LabelName],
					"revision", sec.Labels[helmrelease.LabelVersion], "status", sec.Labels[helmrelease.LabelStatus]},
			}, "", nil
		}}
}

// owner is what a held release or CRD belongs to: a Flux HelmRelease, or a Helm release
// of another client.
type owner struct {
	hrNamespace, hrName string // a HelmRelease, when helm-controller manages it
	namespace, release  string // the Helm release; namespace "" for a CRD no release applies
	// appNamespace and app name the Argo CD Application whose resource tree lists a CRD
	// no release applies, when one does.
	appNamespace, app string
}

func (o owner) flux() bool { return o.hrName != "" }

func (o owner) argo() bool { return o.app != "" }

// planCommand is the plan command a bridge denial of rep names for o: its HelmRelease's
// (as the HelmRelease gate words it) or its Application's; "" leaves it to the report (a
// Helm release's). A CRD write (rep.Chart is crdGateChart) knows no chart: for a Helm
// release the command names CHART for the operator to fill in, and for a CRD nobody
// claims there is none (noPlan).
func (o owner) planCommand(rep *check.Report) (cmd string, noPlan bool) {
	switch {
	case o.flux():
		return cmdline.PlanHelmRelease{Name: o.hrName, Namespace: o.hrNamespace, Version: rep.ChartVersion}.String(), false
	case o.argo():
		return cmdline.PlanApplication{Name: o.app, Namespace: o.appNamespace}.String(), false
	case rep.Chart != crdGateChart:
		return "", false
	case o.namespace != "":
		return cmdline.Plan{Release: o.release, Namespace: o.namespace, Chart: "CHART"}.String(), false
	}
	return "", true
}

// migrations is the Migrator for what o holds: the HelmRelease's own StorageMigration
// (the same one its chart-change gate creates), else one per Helm release.
func (o owner) migrations(g *Gate, dryRun bool) *storageMigrations {
	m := &storageMigrations{g: g, dryRun: dryRun}
	if o.flux() {
		m.name = MigrationName(o.hrNamespace, o.hrName)
		m.labels = map[string]string{LabelHelmReleaseNamespace: o.hrNamespace, LabelHelmReleaseName: labelValue(o.hrName)}
		return m
	}
	if o.namespace == "" {
		// A CRD that no Helm release applies: its own migration.
		m.name = migrationName("crd-", "", o.release)
		return m
	}
	m.name = migrationName("release-", o.namespace, o.release)
	m.labels = map[string]string{LabelReleaseNamespace: o.namespace, LabelReleaseName: labelValue(o.release)}
	return m
}

// fluxOwner reads helm-controller's origin labels from the first object of a rendered
// manifest, in document order, that carries them. A document that does not parse is
// passed over: the labels are looked for, not the manifest judged.
func fluxOwner(text string) (namespace, name string) {
	objs, _ := manifest.Objects(text)
	for _, obj := range objs {
		labels := obj.GetLabels()
		if n, ns := labels[LabelFluxName], labels[LabelFluxNamespace]; n != "" && ns != "" {
			return ns, n
		}
	}
	return "", ""
}

func (r *releaseGate) decide(ctx context.Context, sec *corev1.Secret, dryRun bool) decision {
	g := r.g
	rel, err := helmrelease.DecodeSecret(sec)
	if err != nil {
		return g.recordErrored("release record "+sec.Namespace+"/"+sec.Name, err)
	}
	o := owner{namespace: sec.Namespace, release: rel.Name}
	o.hrNamespace, o.hrName = fluxOwner(rel.Manifest)
	sms := o.migrations(g, dryRun)
	sms.readBefore(ctx)

	p, err := runWithin(ctx, func(ctx context.Context) (*check.Prediction, error) {
		tgt, err := g.localTarget(ctx)
		if err != nil {
			return nil, err
		}
		reader, err := helmrelease.NewReader(tgt.Clientset, sec.Namespace, helmrelease.DriverSecret)
		if err != nil {
			return nil, err
		}
		reader.WithMemory(tgt.Metadata, tgt.Releases)
		return check.Predict(ctx, check.Sources{Cluster: tgt.Cluster, Releases: reader, Release: rel.Name, Namespace: sec.Namespace,
			Record: rel, NoObjectCounts: true})
	})
	if err != nil {
		return g.recordErrored(fmt.Sprintf("revision %d of release %s/%s", rel.Version, sec.Namespace, rel.Name), err)
	}
	what := describeRecord(rel, p)
	sms.live = p.Live
	d, err := g.judge(ctx, o.door(what, beforeApplied, p.Report, sms), p.Report)
	if err != nil {
		return g.recordErrored(what, err)
	}
	d.operation, d.chart = p.Report.Operation, chartOf(rel)
	if !dryRun && o.flux() {
		g.recordOnHelmRelease(ctx, o, d)
	}
	return d
}

// door is the door of a release record (before is beforeApplied) or of a CRD update
// (before is "": the client may have applied other objects first) whose change, named by
// what, o holds: how the deployer retries depends on who o is (helm-controller, Argo CD,
// the Helm CLI, or nobody for a CRD no release applies).
func (o owner) door(what, before string, rep *check.Report, sms *storageMigrations) upgradeDoor {
	dr := upgradeDoor{door: door{change: what, before: before, again: "then run the helm command again",
		admittedReason: ReasonReleaseAdmitted, blockedReason: ReasonReleaseBlocked},
		held: what, retry: "run the same helm command again when it has succeeded", heldReason: ReasonReleaseHeld, startedReason: ReasonReleaseHeld,
		migrations: sms}
	dr.options.PlanCommand, dr.options.NoPlan = o.planCommand(rep)
	dr.again = o.again(dr.again)
	switch {
	case o.flux():
		dr.retry = fmt.Sprintf("when it has succeeded, upgradeguard asks helm-controller to retry HelmRelease %s/%s at once (reconcile.fluxcd.io/resetAt)", o.hrNamespace, o.hrName)
	case o.argo():
		dr.again = fmt.Sprintf("then sync Application %s/%s again (or roll it back again)", o.appNamespace, o.app)
		dr.retry = "retry the update when it has succeeded"
	case o.namespace == "":
		dr.again, dr.retry = "then retry the update", "retry the update when it has succeeded"
	}
	return dr
}

// again is how o's deployer applies a change again once the next steps are done:
// helm-controller's retry for a HelmRelease, else helm (the deployer's own way).
func (o owner) again(helm string) string {
	if o.flux() {
		return fmt.Sprintf("then let helm-controller retry (%s)", cmdline.Reconcile{Name: o.hrName, Namespace: o.hrNamespace, Reset: true})
	}
	return helm
}

// describeRecord names the change a release record starts.
func describeRecord(rel *release.Release, p *check.Prediction) string {
	op := "upgrade"
	switch {
	case p.Report.Operation == predict.Rollback:
		op = "rollback"
	case p.Report.FromRevision == 0:
		op = "install"
	}
	what := fmt.Sprintf("%s of release %s/%s to revision %d (chart %s)", op, rel.Namespace, rel.Name, rel.Version, chartOf(rel))
	if p.Report.Operation == predict.Rollback && p.Report.ToRevision > 0 {
		what = fmt.Sprintf("rollback of release %s/%s to revision %d (chart %s, as revision %d)", rel.Namespace, rel.Name, p.Report.ToRevision, chartOf(rel), rel.Version)
	}
	if p.CurrentChartVersion != "" {
		what += " from chart version " + p.CurrentChartVersion
	}
	return what
}

func chartOf(rel *release.Release) string {
	if rel.Chart == nil || rel.Chart.Metadata == nil {
		return "unknown"
	}
	return rel.Chart.Metadata.Name + "@" + rel.Chart.Metadata.Version
}

// recordErrored admits a change the gate could not decide, with a warning: these
// webhooks fail open (failurePolicy Ignore), and so does their own error.
func (g *Gate) recordErrored(subject string, err error) decision {
	msg := fmt.Sprintf("upgradeguard could not check the %s and admits it unchecked: %v", subject, err)
	return decision{kind: kindErrorAdmitted, message: msg, warnings: []string{msg}, reason: ReasonGateError, noState: true}
}

// localTarget is the local cluster, kept between decisions when the gate keeps targets:
// the same target the HelmRelease gate's decisions on the local cluster use.
func (g *Gate) localTarget(ctx context.Context) (*livecluster.Target, error) {
	return g.clusters.Get(ctx, livecluster.LocalKey(g.local), g.local, true)
}

// recordOnHelmRelease puts a release-record or CRD decision where Flux users look: an
// event on the HelmRelease and the gate annotation. An admitted decision is recorded only
// when it changes what the annotation said.
func (g *Gate) recordOnHelmRelease(ctx context.Context, o owner, d decision) {
	var hr helmv2.HelmRelease
	if err := g.reader.Get(ctx, client.ObjectKey{Namespace: o.hrNamespace, Name: o.hrName}, &hr); err != nil {
		if !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Error(err, "read the HelmRelease of a held release", "helmRelease", o.hrNamespace+"/"+o.hrName)
		}
		return
	}
	if d.kind.outcome() == OutcomeAdmitted && ParseState(&hr).Decision == OutcomeAdmitted {
		return
	}
	g.record(&hr, d)
}
