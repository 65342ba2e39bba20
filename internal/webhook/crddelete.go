package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/internal/metrics"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// CRDDeletePath is where the webhook server serves the CRD deletion guard: a validating
// webhook on the DELETE of CustomResourceDefinitions, from any client (kubectl, a Helm
// uninstall or upgrade, helm-controller, an Argo CD prune). Deleting a CRD deletes every
// object of its type, at once and for good: the guard denies the deletion of a CRD that
// still holds objects, naming how many with a few examples, who deletes it, and how to go
// on (back up, delete the objects first, or annotate the CRD
// predict.AllowDeleteAnnotation=true, which its webhook's matchConditions skip). A CRD
// with no objects deletes at once.
const CRDDeletePath = "/validate-apiextensions-crd-delete"

// maxExamples bounds the objects a denial names.
const maxExamples = 3

// crdDeleteGuard is the admission.Handler of CRDDeletePath.
type crdDeleteGuard struct{ g *Gate }

// envelope is the CRD deletion guard's envelope: a DELETE of a CRD that is not being
// deleted already is decided. The request's old object is the CRD as the API server
// holds it. A denial that is not a dry run is counted per CRD.
func (c *crdDeleteGuard) envelope() *envelope {
	return &envelope{operations: []admissionv1.Operation{admissionv1.Delete}, skip: "only the deletion of a CustomResourceDefinition is guarded",
		timeout: c.g.opts.RecordTimeout, logged: "CRD deletion decision",
		read: func(req admission.Request) (*call, string, error) {
			var crd apiextv1.CustomResourceDefinition
			if err := json.Unmarshal(req.OldObject.Raw, &crd); err != nil {
				return nil, "", fmt.Errorf("decode the CustomResourceDefinition being deleted: %w", err)
			}
			if crd.DeletionTimestamp != nil {
				// The API server is deleting it (and its objects) already: another DELETE
				// changes nothing.
				return nil, "the CustomResourceDefinition is being deleted already", nil
			}
			user := req.UserInfo.Username
			return &call{
				decide: func(ctx context.Context, dryRun bool) decision { return c.decide(ctx, &crd, user, dryRun) },
				log:    []any{"crd", crd.Name, "user", user},
				recorded: func(d decision) {
					if !d.kind.allowed() {
						metrics.CRDDeletionsDenied.WithLabelValues(crd.Name).Inc()
					}
				},
			}, "", nil
		}}
}

func (c *crdDeleteGuard) decide(ctx context.Context, crd *apiextv1.CustomResourceDefinition, user string, dryRun bool) decision {
	g := c.g
	type objects struct {
		n        int64
		examples []string
	}
	objs, err := runWithin(ctx, func(ctx context.Context) (objects, error) {
		tgt, err := g.localTarget(ctx)
		if err != nil {
			return objects{}, err
		}
		n, examples, err := objectsOf(ctx, tgt, crd)
		return objects{n, examples}, err
	})
	if err != nil {
		return deletionErrored(crd.Name, err)
	}
	f := predict.DecideDeleted(crd, objs.n, objs.examples)
	o := crdOwner(crd)
	if f.Verdict != predict.OK && !o.flux() && o.namespace == "" {
		// Argo CD leaves the CRDs it syncs untracked: its Application's resource tree
		// names it. Read only for a deletion that is not admitted outright, as the name
		// only words the denial.
		o.appNamespace, o.app = g.argoApplication(ctx, crd.Name)
	}
	rep := &check.Report{Operation: predict.DeleteCRD, Safe: f.Verdict == predict.OK, CRDs: []check.CRDReport{{Decision: f, Objects: &objs.n}}}
	if !rep.Safe {
		rep.NextSteps = predict.DeletionSteps(crd.Name)
		rep.CRDs[0].Action = strings.Join(rep.NextSteps, "; then ")
	}
	d := o.deletionDoor(describeDeletion(crd.Name, user, o), crd).answer(gate.JudgeDeletion(rep))
	d.operation, d.chart = predict.DeleteCRD, crd.Name
	if d.kind.allowed() || dryRun {
		return d
	}
	g.recorder.Eventf(crd, nil, corev1.EventTypeWarning, d.reason, "Delete", "%s", truncate(d.message, 1000))
	if o.flux() {
		g.recordOnHelmRelease(ctx, o, d)
	}
	return d
}

// objectsOf asks the API server, never memory, how many objects of the CRD's type exist
// and names a few: memory lags behind a create by a moment, and a zero read from an
// informer that has not yet seen a new object would let a CRD go with it. A CRD deletion
// is rare, so the one LIST it costs is cheap.
func objectsOf(ctx context.Context, tgt *livecluster.Target, crd *apiextv1.CustomResourceDefinition) (int64, []string, error) {
	return tgt.Cluster.SampleObjects(ctx, crd, maxExamples)
}

// describeDeletion names a CRD deletion: the CRD, who deletes it, and what applies it.
func describeDeletion(crd, user string, o owner) string {
	what := fmt.Sprintf("deletion of CustomResourceDefinition %s by %s", crd, orUnknownUser(user))
	switch {
	case o.flux():
		what += fmt.Sprintf(" (a CRD that HelmRelease %s/%s applies)", o.hrNamespace, o.hrName)
	case o.namespace != "":
		what += fmt.Sprintf(" (a CRD of Helm release %s/%s)", o.namespace, o.release)
	case o.argo():
		what += fmt.Sprintf(" (a CRD that Argo CD Application %s/%s syncs)", o.appNamespace, o.app)
	}
	return what
}

func orUnknownUser(user string) string {
	if user == "" {
		return "an unnamed user"
	}
	return "user " + user
}

// deletionDoor is the door of a CRD deletion, named by what: only the DELETE is refused
// (the client may have deleted other objects before it), and the deleter deletes the CRD
// again once the next steps are done. For a CRD of a Helm release it also says how to keep
// the CRD and its objects outside the release; for a CRD that an Argo CD Application syncs
// (an Argo CD prune), how to make Argo CD leave it: Prune=false merged into the live CRD's
// sync options. Helm shows the warning, which says where the next steps are.
func (o owner) deletionDoor(what string, live *apiextv1.CustomResourceDefinition) deletionDoor {
	crd := live.Name
	dr := deletionDoor{door: door{change: what, again: "then delete the CRD again",
		admittedReason: ReasonCRDDeletionAdmitted, blockedReason: ReasonCRDDeletionBlocked},
		seeAlso: fmt.Sprintf("%s shows the next steps", cmdline.Delete{Resource: "crd", Name: crd, DryRunServer: true})}
	switch {
	case o.flux():
		// helm-controller goes on as after any other denial.
		dr.again = o.again(dr.again)
	case o.argo():
		// A prune is a sync's: a rollback never prunes unless asked.
		dr.again = fmt.Sprintf("then sync Application %s/%s again with prune", o.appNamespace, o.app)
	case o.namespace != "":
		dr.again = "then delete the CRD again (or run the helm command that deletes it again)"
	}
	if o.namespace != "" {
		dr.again += fmt.Sprintf(". To keep the CRD and its objects outside the release instead: %s makes Helm's next upgrade leave them "+
			"(an uninstall reads that policy from the release's stored manifest only)", predict.Keep([]string{crd}))
	}
	if o.argo() {
		var keep []string
		for _, c := range predict.ArgoCD(true, nil, false).KeepCommands(predict.Upgrade, []*apiextv1.CustomResourceDefinition{live}) {
			keep = append(keep, c.String())
		}
		dr.again += fmt.Sprintf(". To keep the CRD and its objects instead: %s, then sync Application %s/%s again: Argo CD skips the CRD's prune, "+
			"and the Application stays OutOfSync with the CRD requiring pruning", strings.Join(keep, "; "), o.appNamespace, o.app)
	}
	return dr
}

// deletionErrored is the answer when the guard could not count a CRD's objects: denied
// until it can (a deletion cannot be undone), with the annotation that deletes the CRD
// anyway, which the webhook's matchConditions skip.
func deletionErrored(crd string, err error) decision {
	allow := predict.AllowDelete([]string{crd})
	msg := fmt.Sprintf("upgradeguard could not count the objects of CustomResourceDefinition %s: %v. Its deletion is denied until they can be counted; "+
		"to delete it with whatever it holds: %s, then delete it again", crd, err, allow)
	return decision{kind: kindErrorDenied, message: msg, reason: ReasonGateError, noState: true}
}
