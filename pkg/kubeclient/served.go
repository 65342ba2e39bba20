package kubeclient

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
)

// IsNotServed is true when err says that the cluster does not serve the resource type a
// request named (its CRD is not installed, its group or version is unknown), not that
// one object of a served type is missing: no REST mapping, or a 404 that names no
// object. Every probe of an optional API (the built-in StorageVersionMigration, Argo CD's
// Applications, Flux's HelmReleases, upgradeguard's own types) reads its answer here.
//
// The API server answers a path under /apis that it does not serve with a 404 in one of
// two forms, and both are "not served":
//   - up to 1.37, as text ("404 page not found"), which client-go turns into a NotFound
//     StatusError whose details name no object (a cause UnexpectedServerResponse);
//   - from 1.38 (kubernetes/kubernetes#138219), as a JSON Status: reason NotFound,
//     message "404 page not found", no details.
//
// A missing object of a served type is a NotFound whose details name it.
func IsNotServed(err error) bool {
	if err == nil {
		return false
	}
	if meta.IsNoMatchError(err) {
		return true
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || !apierrors.IsNotFound(err) {
		return false
	}
	d := status.Status().Details
	return d == nil || d.Name == ""
}
