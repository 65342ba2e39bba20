package uninstall

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/metadata"

	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// Prune check IDs: the traps of an upgrade's or rollback's deletes that an uninstall
// does not have.
const (
	CheckTakenOver        = "taken-over-by-release"
	CheckManifestOnlyKeep = "manifest-only-keep"
)

// PruneHelmVersions are the Helm versions whose upgrade and rollback delete as Prune
// models: the same in Helm v3 (to v3.22.0) and v4 (to v4.3.x), pkg/kube Client.update.
const PruneHelmVersions = "v3 and v4 (every release to v3.22.0 and v4.3.x)"

// PruneOptions name the objects an upgrade or rollback deletes.
type PruneOptions struct {
	Release   string
	Namespace string
	// Operation names the operation in messages: upgrade or rollback.
	Operation string
	// Dropped is the manifest of the objects the operation deletes: those the manifest
	// it starts from lists and the new one no longer renders.
	Dropped string
	// Deployer runs the operation (nil: the newest Helm).
	Deployer predict.Deployer
}

// Prune applies the uninstall's model (ownership, resource policy, volumes, credentials,
// cascades) to the objects an upgrade or rollback deletes because the new manifest no
// longer renders them. Helm's rules for those deletes are not the uninstall's, in every
// Helm version: only the LIVE object's helm.sh/resource-policy: keep protects it (keep in
// the old manifest alone does not), and the live ownership is never checked, so an
// object another release has taken over is deleted all the same (helm/helm#32218).
// The report's Objects are the dropped objects with what the operation does to each,
// once it gets that far (a failed apply deletes nothing).
func Prune(ctx context.Context, c *Clients, o PruneOptions) (*Report, error) {
	rep := &Report{Release: o.Release, Namespace: o.Namespace, HelmVersion: PruneHelmVersions,
		Objects: []Object{}, Hooks: []string{}, Findings: []Finding{}, LeftBehind: []string{}}
	objs, err := parseManifest(o.Dropped, o.Namespace, c.Mapper)
	if err != nil {
		return nil, fmt.Errorf("release %s: dropped objects: %w", o.Release, err)
	}
	deployer := o.Deployer
	if deployer == nil {
		deployer = predict.Helm4
	}
	return inspect(ctx, c, rep, deployer, predict.Operation(o.Operation), o.Release, o.Namespace, objs, nil, func(in *inspector, mo manifestObject) (Object, error) {
		return in.decidePrune(ctx, mo, o.Operation)
	})
}

// decidePrune applies Helm's rules for an upgrade's delete (predict.Deployer.Fate) to one
// dropped object.
func (in *inspector) decidePrune(ctx context.Context, mo manifestObject, op string) (Object, error) {
	obj := Object{Subject: mo.subject(), APIVersion: mo.apiVersion, Kind: mo.kind, Namespace: mo.namespace, Name: mo.name}
	m, err := mapping(mo, in.c.Mapper)
	if err != nil {
		obj.Action, obj.Reason = Absent, "its kind is not served by the API server: "+err.Error()
		return obj, nil
	}
	var ri metadata.ResourceInterface = in.c.Metadata.Resource(m.Resource)
	if mo.namespace != "" {
		ri = in.c.Metadata.Resource(m.Resource).Namespace(mo.namespace)
	}
	live, err := ri.Get(ctx, mo.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		obj.Action, obj.Reason = Absent, "not on the cluster: nothing to delete"
		return obj, nil
	case err != nil:
		return obj, fmt.Errorf("%s: read the live object: %w", obj.Subject, err)
	}
	obj.Live = true
	owned := ownedBy(live, in.release, in.namespace)
	obj.Owned = &owned
	obj.LiveKeep = in.deployer.Fate(in.op, predict.Leaving{Manifest: mo.annotations(), Exists: true, Live: live.Annotations, Owned: owned}) == predict.FateKeptLive
	manifestKeep := mo.hasPolicy && predict.KeepPolicy(mo.policy)
	if obj.LiveKeep {
		obj.Action, obj.Reason = Keep, "the live object carries helm.sh/resource-policy: keep: the "+op+" leaves it, and no manifest of the release lists it any more"
		return obj, nil
	}
	obj.Action, obj.Reason = Delete, "the new manifest no longer renders it and the live object does not carry helm.sh/resource-policy: keep"
	if manifestKeep {
		in.find(CheckManifestOnlyKeep, obj.Subject, "helm.sh/resource-policy: keep is in the old manifest only: an "+op+" reads the LIVE object's annotation, so it deletes the object (an uninstall would have kept it)",
			"put the annotation on the live object before the "+op+" (`"+keepCommand(obj)+"`), or keep rendering the object")
	}
	if !owned {
		other := live.Annotations[releaseNameAnno]
		if other != "" && other != in.release || live.Annotations[releaseNamespaceAnn] != "" && live.Annotations[releaseNamespaceAnn] != in.namespace {
			in.find(CheckTakenOver, obj.Subject,
				fmt.Sprintf("release %s/%s has taken it over (its live metadata names that release), but the %s of %s deletes it anyway: no Helm version checks ownership before an %s deletes a dropped object (helm/helm#32218)",
					live.Annotations[releaseNamespaceAnn], other, op, in.release, op),
				"before the "+op+", annotate the live object with helm.sh/resource-policy=keep (`"+keepCommand(obj)+"`) so the "+op+" leaves it to "+other)
		} else {
			in.find(CheckOwnershipStripped, obj.Subject,
				fmt.Sprintf("its live Helm ownership metadata no longer names the release (%s), but the %s deletes it anyway", ownershipProblem(live, in.release, in.namespace), op),
				"annotate the live object with helm.sh/resource-policy=keep before the "+op+" if it must stay")
		}
	}
	return obj, nil
}

// keepCommand is the command that puts keep on the live object.
func keepCommand(o Object) string { return predict.KeepObject(o.Kind, o.Name, o.Namespace).String() }
