package helmrelease

import (
	"context"
	"fmt"
	"regexp"
	"strconv"

	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Labels Helm's storage drivers put on every release record (Secret or ConfigMap).
const (
	LabelOwner   = "owner"
	LabelName    = "name"
	LabelStatus  = "status"
	LabelVersion = "version"
	// OwnerHelm is the value of LabelOwner.
	OwnerHelm = "helm"
	// SecretType is the type of a release record Secret.
	SecretType = "helm.sh/release.v1"
)

// Pending reports whether a status label names a record written before Helm applies
// the revision: pending-install, pending-upgrade or pending-rollback.
func Pending(status string) bool {
	return common.Status(status).IsPending()
}

// DecodeSecret reads the release in a release record Secret (sh.helm.release.v1.NAME.vN)
// that is not, or not yet, stored: the admission request of its creation. It decodes
// through the Helm SDK's own Secret driver, never by hand. The result holds the release's
// values: callers must not print it.
func DecodeSecret(s *corev1.Secret) (*release.Release, error) {
	if s.Type != SecretType {
		return nil, fmt.Errorf("release record %s/%s is a Secret of type %q, not a Helm release record (%s)", s.Namespace, s.Name, s.Type, SecretType)
	}
	d := driver.NewSecrets(&oneSecret{s: s})
	ri, err := d.Get(s.Name)
	if err != nil {
		return nil, fmt.Errorf("release record %s/%s: decode it with the Helm Secret driver: %w", s.Namespace, s.Name, err)
	}
	rel, ok := ri.(*release.Release)
	if !ok {
		return nil, fmt.Errorf("release record %s/%s: unsupported release format %T", s.Namespace, s.Name, ri)
	}
	if rel.Namespace == "" {
		rel.Namespace = s.Namespace
	}
	return rel, nil
}

// oneSecret serves one Secret to the Helm driver's Get; the other methods are never
// called (the embedded nil interface would panic if they were).
type oneSecret struct {
	typedcorev1.SecretInterface
	s *corev1.Secret
}

func (o *oneSecret) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.Secret, error) {
	if name != o.s.Name {
		return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
	}
	return o.s, nil
}

var rollbackTo = regexp.MustCompile(`^Rollback to (\d+)$`)

// RollbackTarget is the revision a pending-rollback record copies, read from the
// description Helm gives it ("Rollback to N"); 0 when it does not say.
func RollbackTarget(rel *release.Release) int {
	if rel.Info == nil {
		return 0
	}
	m := rollbackTo.FindStringSubmatch(rel.Info.Description)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
