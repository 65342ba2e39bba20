package crdbackup

import (
	"context"
	"fmt"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// restoreCRD creates the CRD when it is absent, waits until it serves the objects'
// version, and restores the objects.
func (r *restorer) restoreCRD(ctx context.Context, crd CRD) (*RestoredCRD, error) {
	rc := &RestoredCRD{Name: crd.Name, Kind: crd.Kind, Version: crd.Version, Objects: crd.Objects.Count, Kept: []string{}}
	api := r.c.Dynamic.Resource(crdResource)
	live, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		def, err := backup.ReadYAML(r.dir, crd.File)
		if err != nil {
			return rc, err
		}
		_, err = api.Create(ctx, &unstructured.Unstructured{Object: cleanCRD(def)}, metav1.CreateOptions{})
		switch {
		case apierrors.IsAlreadyExists(err):
			rc.CRD = Existed
		case err != nil:
			return rc, fmt.Errorf("CustomResourceDefinition %s: create: %w", crd.Name, err)
		default:
			rc.CRD = Created
		}
	case err != nil:
		return rc, fmt.Errorf("CustomResourceDefinition %s: read: %w", crd.Name, err)
	case live.GetDeletionTimestamp() != nil:
		return rc, fmt.Errorf("CustomResourceDefinition %s is being deleted, with its objects: wait until it is gone (%s), then restore again", crd.Name, cmdline.WaitDeleted{Resource: "crd", Name: crd.Name})
	default:
		rc.CRD = Existed
	}
	status, err := r.waitServed(ctx, crd)
	if err != nil {
		return rc, err
	}
	return rc, r.restoreObjects(ctx, crd, status, rc)
}

// waitServed waits until the CRD is Established and answers at the objects' version, and
// says whether that version has a status subresource.
func (r *restorer) waitServed(ctx context.Context, crd CRD) (bool, error) {
	var status bool
	var why string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, r.o.EstablishTimeout, true, func(ctx context.Context) (bool, error) {
		u, err := r.c.Dynamic.Resource(crdResource).Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("CustomResourceDefinition %s: read: %w", crd.Name, err)
		}
		live, err := typed(u.Object)
		if err != nil {
			return false, fmt.Errorf("CustomResourceDefinition %s: %w", crd.Name, err)
		}
		if err := fits(live, crd); err != nil {
			return false, err
		}
		established := false
		for _, c := range live.Status.Conditions {
			switch {
			case c.Type == apiextv1.NamesAccepted && c.Status == apiextv1.ConditionFalse:
				return false, fmt.Errorf("CustomResourceDefinition %s: its names are not accepted (%s): %s", crd.Name, c.Reason, c.Message)
			case c.Type == apiextv1.Established && c.Status == apiextv1.ConditionTrue:
				established = true
			}
		}
		if !established {
			why = "it is not Established"
			return false, nil
		}
		status = hasStatus(live, crd.Version)
		_, err = r.c.Dynamic.Resource(crd.gvr()).List(ctx, metav1.ListOptions{Limit: 1})
		if apierrors.IsNotFound(err) {
			why = "its objects are not served yet"
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("%s: list: %w", crd.gvr().GroupResource(), err)
		}
		return true, nil
	})
	if wait.Interrupted(err) && ctx.Err() == nil {
		return false, fmt.Errorf("CustomResourceDefinition %s: %s after %s: see its conditions (%s)", crd.Name, why, r.o.EstablishTimeout, cmdline.Describe{Resource: "crd", Name: crd.Name})
	}
	return status, err
}

// fits says whether the CRD on the cluster can take the backup's objects: same kind,
// resource and scope, and the version they were saved at served.
func fits(live *apiextv1.CustomResourceDefinition, crd CRD) error {
	switch {
	case live.Spec.Group != crd.Group || live.Spec.Names.Kind != crd.Kind || live.Spec.Names.Plural != crd.Resource:
		return fmt.Errorf("CustomResourceDefinition %s on the cluster is not the one backed up (kind %s, resource %s.%s; the backup's: %s, %s.%s)",
			crd.Name, live.Spec.Names.Kind, live.Spec.Names.Plural, live.Spec.Group, crd.Kind, crd.Resource, crd.Group)
	case (live.Spec.Scope == apiextv1.NamespaceScoped) != crd.Namespaced:
		return fmt.Errorf("CustomResourceDefinition %s on the cluster is %s, but its objects in the backup are not", crd.Name, live.Spec.Scope)
	case !crdversions.Serves(live, crd.Version):
		return fmt.Errorf("CustomResourceDefinition %s on the cluster does not serve %s, the version its objects were saved at: serve it (spec.versions[].served), then restore again", crd.Name, crd.Version)
	}
	return nil
}

func hasStatus(crd *apiextv1.CustomResourceDefinition, version string) bool {
	for _, v := range crd.Spec.Versions {
		if v.Name == version {
			return v.Subresources != nil && v.Subresources.Status != nil
		}
	}
	return false
}
