// Package crdmove owns moving a live CRD from one Helm release to another (a chart split
// into an operator chart and a -crds chart, a CRD moved to a sibling chart): it checks
// that the release the CRD joins renders it, keeps it on the side of the release it
// leaves and moves Helm's ownership metadata to the release it joins, in one write that
// touches nothing but the CRD's metadata. The steps and their order are package
// predict's (MoveSteps); this package reads the releases and the live CRD and carries
// the metadata steps out. It never deletes and never writes a custom resource.
package crdmove

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// FieldManager is the field manager of the metadata write.
const FieldManager = "upgradeguard"

// Clients are what a move reads and writes: the CRDs, and Helm's release storage.
type Clients struct {
	CRDs apiextclient.CustomResourceDefinitionInterface
	Kube kubernetes.Interface
	// Driver is Helm's storage driver (empty: secret).
	Driver helmrelease.Driver
}

// Request is one move.
type Request struct {
	CRD      string
	From, To predict.ReleaseRef
	// ToChart loads the chart release To is installed or upgraded with; nil reads To's
	// current revision instead (it must be installed). Either must render the CRD from
	// templates/.
	ToChart check.ChartLoader
	// ToChartRef names that chart in the commands printed (CHART when empty).
	ToChartRef string
	// Apply writes the metadata steps; without it nothing is written (a dry run).
	Apply bool
}

// Result is what a move found and did.
type Result struct {
	Move predict.CRDMove `json:"move"`
	// Kind is the CRD's kind.
	Kind string `json:"kind"`
	// FromRenders says that release From's current revision renders the CRD from
	// templates/ (its next upgrade without it would delete it, unless kept);
	// FromRevision is that revision (0 when From is not installed).
	FromRenders  bool `json:"fromRenders"`
	FromRevision int  `json:"fromRevision,omitempty"`
	// RenderedBy says what renders the CRD on To's side: "chart NAME VERSION" or
	// "release NS/NAME revision N".
	RenderedBy string `json:"renderedBy"`
	// Steps are the move's steps in order, each Done when the live CRD carries it (after
	// this run's write, with Apply).
	Steps []predict.MoveStep `json:"steps"`
	// DryRun says nothing was written.
	DryRun bool `json:"dryRun"`
	// Changed says this run wrote the CRD's metadata (false when every step was done).
	Changed bool `json:"changed"`
}

// Pending are the metadata steps still to write.
func (r *Result) Pending() []predict.MoveStep {
	return slices.DeleteFunc(slices.Clone(r.Steps), func(s predict.MoveStep) bool { return !s.Metadata || s.Done })
}

// RefusedError says why a move was refused before anything was written, and what to do.
type RefusedError struct {
	CRD    string
	Reason string
}

func (e *RefusedError) Error() string { return "crd adopt " + e.CRD + " refused: " + e.Reason }

// Adopt moves req.CRD from release req.From to release req.To: it reads the live CRD,
// From's current revision and what renders the CRD on To's side, refuses (RefusedError)
// when To does not render it from templates/ or the CRD's ownership names a third
// release, and, with req.Apply, writes the metadata steps that are not done yet in one
// merge patch that holds the resourceVersion it read (a concurrent change is a conflict,
// never overwritten). It is idempotent: a second run finds every step done and writes
// nothing. Objects are never touched.
func Adopt(ctx context.Context, c Clients, req Request) (*Result, error) {
	if req.CRD == "" || req.From.IsZero() || req.To.IsZero() {
		return nil, errors.New("a move needs the CRD, the release it leaves and the release it joins")
	}
	if req.From == req.To {
		return nil, &RefusedError{CRD: req.CRD, Reason: fmt.Sprintf("--from and --to both name release %s: name the release the CRD leaves and the one it joins", req.From)}
	}
	live, err := c.CRDs.Get(ctx, req.CRD, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, &RefusedError{CRD: req.CRD, Reason: fmt.Sprintf("no such CRD on the cluster (`%s` lists them)", cmdline.Get{Resource: "crd"})}
	}
	if err != nil {
		return nil, fmt.Errorf("read CRD %s: %w", req.CRD, err)
	}
	m := predict.CRDMove{CRD: req.CRD, From: req.From, To: req.To}
	res := &Result{Move: m, Kind: live.Spec.Names.Kind, DryRun: !req.Apply}

	owner, owned := predict.HelmOwner(live.Annotations)
	if res.FromRenders, res.FromRevision, err = renders(ctx, c, req.From, req.CRD); err != nil {
		var nf *helmrelease.NotFoundError
		if !errors.As(err, &nf) || owner != req.To {
			return nil, err
		}
		// From is gone and the CRD is To's already: a move done before.
	}
	switch {
	case owned && owner != req.From && owner != req.To:
		return nil, &RefusedError{CRD: req.CRD, Reason: fmt.Sprintf("its Helm ownership annotations name release %s, neither --from %s nor --to %s: name the release that owns it with --from",
			owner, req.From, req.To)}
	case !owned && !res.FromRenders:
		return nil, &RefusedError{CRD: req.CRD, Reason: fmt.Sprintf("no Helm release owns it (no %s annotation) and release %s does not render it: it is not %s's to move",
			predict.ReleaseNameAnnotation, req.From, req.From)}
	}
	if res.RenderedBy, err = renderedBy(ctx, c, req); err != nil {
		return nil, err
	}

	res.Steps = predict.MoveSteps(m, live, req.ToChartRef)
	if !req.Apply || len(res.Pending()) == 0 {
		return res, nil
	}
	patched, err := patch(ctx, c.CRDs, live, m)
	if err != nil {
		return nil, err
	}
	res.Changed = true
	res.Steps = predict.MoveSteps(m, patched, req.ToChartRef)
	return res, nil
}

// renders says whether release r's current revision renders crd from templates/, and
// which revision that is.
func renders(ctx context.Context, c Clients, r predict.ReleaseRef, crd string) (bool, int, error) {
	reader, err := helmrelease.NewReader(c.Kube, r.Namespace, c.Driver)
	if err != nil {
		return false, 0, err
	}
	rel, err := reader.Current(ctx, r.Name)
	if err != nil {
		return false, 0, err
	}
	crds, err := chartcrds.FromManifest(rel.Manifest)
	if err != nil {
		return false, 0, fmt.Errorf("release %s revision %d: %w", r, rel.Version, err)
	}
	return slices.ContainsFunc(crds, func(x chartcrds.CRD) bool { return x.CRD.Name == crd && x.Source == predict.Templates }), rel.Version, nil
}

// renderedBy checks that To's side renders the CRD from templates/ (req.ToChart, else
// To's current revision) and says what does; a RefusedError when it does not.
func renderedBy(ctx context.Context, c Clients, req Request) (string, error) {
	if req.ToChart == nil {
		ok, rev, err := renders(ctx, c, req.To, req.CRD)
		var nf *helmrelease.NotFoundError
		if errors.As(err, &nf) {
			return "", &RefusedError{CRD: req.CRD, Reason: fmt.Sprintf("release %s is not installed: name the chart it will be installed with (--chart), so that adopt can check it renders the CRD", req.To)}
		}
		if err != nil {
			return "", err
		}
		if !ok {
			return "", &RefusedError{CRD: req.CRD, Reason: fmt.Sprintf("release %s (revision %d) does not render it from templates/: name the chart version that does (--chart); "+
				"moving the ownership to a release that does not list the CRD would leave it to no release", req.To, rev)}
		}
		return fmt.Sprintf("release %s revision %d", req.To, rev), nil
	}
	ch, err := req.ToChart(ctx, false)
	if err != nil {
		return "", err
	}
	what := fmt.Sprintf("chart %s %s", ch.Name, ch.Version)
	i := slices.IndexFunc(ch.CRDs, func(x chartcrds.CRD) bool { return x.CRD.Name == req.CRD })
	switch {
	case i < 0:
		return "", &RefusedError{CRD: req.CRD, Reason: fmt.Sprintf("%s does not render it (with the values given): moving the ownership to release %s would leave it to no release; "+
			"check the chart and its values (a crds.enabled or installCRDs value?)", what, req.To)}
	case ch.CRDs[i].Source != predict.Templates:
		return "", &RefusedError{CRD: req.CRD, Reason: fmt.Sprintf("%s ships it in crds/ (%s), which is never part of a Helm release: release %s could not own it. "+
			"Keep it instead (%s): it stays, outside any release", what, ch.CRDs[i].File, req.To, predict.Keep([]string{req.CRD}))}
	}
	return what, nil
}

// patch writes the move's metadata in one JSON merge patch that carries the
// resourceVersion read: the API server refuses it with a conflict if the CRD changed in
// between.
func patch(ctx context.Context, crds apiextclient.CustomResourceDefinitionInterface, live *apiextv1.CustomResourceDefinition, m predict.CRDMove) (*apiextv1.CustomResourceDefinition, error) {
	annotations, labels := predict.MoveMetadata(m)
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": live.ResourceVersion, "annotations": annotations, "labels": labels,
	}})
	if err != nil {
		return nil, err
	}
	out, err := crds.Patch(ctx, live.Name, types.MergePatchType, body, metav1.PatchOptions{FieldManager: FieldManager})
	if apierrors.IsConflict(err) {
		return nil, fmt.Errorf("CRD %s changed while it was being adopted (nothing was written): run the command again: %w", live.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("write the Helm ownership of CRD %s: %w", live.Name, err)
	}
	return out, nil
}
