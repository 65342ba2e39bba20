package predict

import (
	"fmt"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// AllowDeleteAnnotation on a CRD, set to "true", says that it may be deleted with the
// objects it holds: DecideDeleted finds nothing to refuse, and the CRD deletion guard's
// webhook is not even called for it (its matchConditions skip the CRD), so the annotation
// works while upgradeguard is down.
const AllowDeleteAnnotation = "upgradeguard.io/allow-delete"

// DeleteCRD is the deletion of a CRD itself, by any client (kubectl delete crd, a Helm
// uninstall or upgrade, an Argo CD prune): the API server deletes every object of its
// type with it, at once and for good.
const DeleteCRD Operation = "delete-crd"

// DecideDeleted returns the verdict for deleting a live CRD whose type has objects
// objects, a few of them named by examples ("namespace/name"): Delete while it holds
// any, unless it carries AllowDeleteAnnotation=true; ok when it holds none. It is the
// verdict of the CRD deletion guard, whatever client deletes; what an operation deletes
// through a release (DecideRemoved) stays the release's verdict.
func DecideDeleted(live *apiextv1.CustomResourceDefinition, objects int64, examples []string) Decision {
	f := Decision{Name: live.Name, MissingStoredVersions: []string{}, IncomingVersions: []crdversions.Version{}}
	fillLive(&f, live)
	f.Conversion = crdversions.Conversion(live)
	kind := live.Spec.Names.Kind
	switch {
	case objects == 0:
		f.Verdict, f.Reason = OK, fmt.Sprintf("it holds no %s objects, so nothing is lost", kind)
	case live.Annotations[AllowDeleteAnnotation] == "true":
		f.Verdict, f.Reason = OK, fmt.Sprintf("it carries %s=true: %s are deleted with it on purpose", AllowDeleteAnnotation, countObjects(objects, kind))
	default:
		f.Verdict = Delete
		f.Reason = fmt.Sprintf("the API server deletes %s with it, for good", countObjects(objects, kind))
		if len(examples) > 0 {
			f.Reason += fmt.Sprintf(" (for example %s)", strings.Join(examples, ", "))
		}
	}
	return f
}

// countObjects is "its one Widget object" or "all 12 Widget objects".
func countObjects(n int64, kind string) string {
	if n == 1 {
		return "its one " + kind + " object"
	}
	return fmt.Sprintf("all %d %s objects", n, kind)
}

// DeletionSteps are the next steps after the deletion of CRDs refused because they hold
// objects (DecideDeleted): back up the CRDs and their objects, then delete the objects
// first, or accept their loss with AllowDeleteAnnotation. The commands come from package cmdline.
func DeletionSteps(crds ...string) []string {
	dir, what, its, it := "./crds-backup", "the CRDs and their objects", "their", "the CRDs"
	if len(crds) == 1 {
		dir, what, its, it = "./"+crds[0]+"-backup", "the CRD and its objects", "its", "it"
	}
	return []string{
		fmt.Sprintf("back up %s: %s (%s brings them back)",
			what, cmdline.CRDBackup{CRDs: crds, Dir: dir}, cmdline.CRDRestore{Dir: dir}),
		fmt.Sprintf("delete %s objects first (%s), or let them go with %s (%s)",
			its, cmdline.DeleteObjects{CRDs: crds}, it, AllowDelete(crds)),
	}
}
