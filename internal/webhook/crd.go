package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// CRDPath is where the webhook server serves the CRD gate: a MUTATING webhook on
// CustomResourceDefinition UPDATEs that never patches. Its matchConditions send it only
// an update that drops from spec.versions a version still listed in the live
// status.storedVersions, which the API server's own validation rejects after mutating
// admission (and so before any validating webhook could see it). The gate denies it
// with the reason and starts the migration that lets the client's retry succeed: it only
// ever denies what the API server would reject anyway.
//
// This is how Flux helm-controller's upgrade.crds Create and CreateReplace are gated:
// they apply the chart's crds/ before the release record is written.
const CRDPath = "/mutate-apiextensions-crd-storedversions"

// crdGate is the admission.Handler of CRDPath.
type crdGate struct{ g *Gate }

// envelope is the CRD gate's envelope: an UPDATE that drops a stored version, or changes
// the schema its stored objects are judged by, is decided; it never patches. An admitted
// update is left to the API server's own validation.
func (c *crdGate) envelope() *envelope {
	return &envelope{operations: []admissionv1.Operation{admissionv1.Update}, timeout: c.g.opts.RecordTimeout, logged: "CRD update decision",
		read: func(req admission.Request) (*call, string, error) {
			var old, crd apiextv1.CustomResourceDefinition
			if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
				return nil, "", fmt.Errorf("decode the old CustomResourceDefinition: %w", err)
			}
			if err := json.Unmarshal(req.Object.Raw, &crd); err != nil {
				return nil, "", fmt.Errorf("decode the CustomResourceDefinition: %w", err)
			}
			dropped := crdversions.DroppedStoredVersions(&old, &crd)
			if len(dropped) == 0 && !crdschema.Changed(&old, &crd) {
				return nil, "", nil
			}
			return &call{
				decide: func(ctx context.Context, dryRun bool) decision { return c.decide(ctx, &old, &crd, dropped, dryRun) },
				log:    []any{"crd", crd.Name, "dropped", dropped},
			}, "", nil
		}}
}

// crdOwner is the HelmRelease (helm-controller's origin labels) or the Helm release
// (Helm's meta.helm.sh annotations) that applies the CRD; else the CRD itself.
func crdOwner(crd *apiextv1.CustomResourceDefinition) owner {
	o := owner{hrNamespace: crd.Labels[LabelFluxNamespace], hrName: crd.Labels[LabelFluxName]}
	if o.hrName == "" || o.hrNamespace == "" {
		o.hrNamespace, o.hrName = "", ""
	}
	o.namespace, o.release = crd.Annotations["meta.helm.sh/release-namespace"], crd.Annotations["meta.helm.sh/release-name"]
	if o.release == "" {
		o.namespace, o.release = "", crd.Name
	}
	return o
}

// argoApplication is the Argo CD Application whose resource tree lists the CRD, when
// exactly one does; "" when none does, several do, or they cannot be read (the name only
// words the denial).
func (g *Gate) argoApplication(ctx context.Context, crd string) (namespace, name string) {
	dyn, err := dynamic.NewForConfig(g.local)
	if err != nil {
		return "", ""
	}
	apps, err := argoapp.List(ctx, dyn, "")
	if err != nil {
		log.FromContext(ctx).Info("could not read Argo CD Applications to name the one that syncs the CRD", "crd", crd, "error", err.Error())
		return "", ""
	}
	found := argoapp.Deploying(apps, apiextv1.GroupName, "CustomResourceDefinition", "", crd)
	if len(found) != 1 {
		return "", ""
	}
	return found[0].Namespace, found[0].Name
}

// crdGateChart names the one-CRD "chart" the CRD gate judges a CRD write as.
const crdGateChart = "CustomResourceDefinition"

func (c *crdGate) decide(ctx context.Context, old, crd *apiextv1.CustomResourceDefinition, dropped []string, dryRun bool) decision {
	g := c.g
	ctx = readFresh(ctx) // policies and StorageMigrations too, not only the CRDs
	o := crdOwner(crd)
	sms := o.migrations(g, dryRun)
	sms.readBefore(ctx)
	p, err := runWithin(ctx, func(ctx context.Context) (*check.Prediction, error) {
		// The CRD door reads the API server itself, not the gate's memory: it is the
		// last line for a chart change the other doors admitted on state an informer had
		// not delivered yet, and CRD updates are rare. The request's old object is the
		// live CRD as the API server has it now.
		tgt, err := livecluster.Connect(ctx, g.local)
		if err != nil {
			return nil, err
		}
		// The incoming CRD as the update applies it; the one prediction engine decides. The
		// API server judges the CRD itself in this very request: it is not asked again.
		return check.Predict(ctx, check.Sources{Cluster: tgt.Cluster, Live: []*apiextv1.CustomResourceDefinition{old}, NoObjectCounts: true, NoAdmission: true,
			Chart: func(context.Context, bool) (*check.Chart, error) {
				return &check.Chart{Name: crdGateChart, CRDs: []chartcrds.CRD{{CRD: crd, Source: predict.Templates}}}, nil
			}})
	})
	if err != nil {
		return g.recordErrored("update of CustomResourceDefinition "+crd.Name, err)
	}
	if !p.Report.Safe && !o.flux() && o.namespace == "" {
		// Argo CD renders charts with helm template (no release is stored) and leaves the
		// CRDs it syncs untracked: its Application's resource tree names it. Read only for
		// a change that is not admitted outright, as the name only words the answer.
		o.appNamespace, o.app = g.argoApplication(ctx, crd.Name)
	}
	what := fmt.Sprintf("update of CustomResourceDefinition %s, which drops %s from spec.versions while status.storedVersions still lists it (the API server rejects it)",
		crd.Name, strings.Join(dropped, ", "))
	if len(dropped) == 0 {
		what = fmt.Sprintf("update of CustomResourceDefinition %s, which changes the schema its stored objects are judged by", crd.Name)
	}
	switch {
	case o.flux():
		what += fmt.Sprintf(", applied for HelmRelease %s/%s", o.hrNamespace, o.hrName)
	case o.argo():
		what += fmt.Sprintf(", applied for Argo CD Application %s/%s", o.appNamespace, o.app)
	}
	sms.live = p.Live
	// Only this CRD write is refused: the client may have applied other objects before it
	// (Argo CD applies a sync wave's objects together).
	dr := o.door(what, "", p.Report, sms)
	dr.crd = crd.Name
	d, err := g.judge(ctx, dr, p.Report)
	if err != nil {
		return g.recordErrored(what, err)
	}
	d.operation, d.chart = predict.Upgrade, crd.Name
	d.warnings = append(d.warnings, schemaWarnings(p.Report)...)
	if d.kind.allowed() {
		// The live CRD no longer lists the dropped versions (a migration just pruned
		// them): the API server decides.
		return d
	}
	if !dryRun && o.flux() {
		g.recordOnHelmRelease(ctx, o, d)
	}
	return d
}

// schemaWarnings are the objects whose next update the incoming schemas would refuse (the
// API server ratchets them until an update touches the field): admitted, with a warning.
func schemaWarnings(rep *check.Report) []string {
	var out []string
	for _, c := range rep.CRDs {
		if c.Schema == nil {
			continue
		}
		for _, r := range c.Schema.Invalid {
			out = append(out, fmt.Sprintf("%s: %d objects would be refused their next update of %s (%s), for example %s",
				c.Name, r.Objects, r.Path, r.Message, strings.Join(r.Examples, ", ")))
		}
	}
	return out
}
