package crdschema

import (
	"context"
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	kubeversion "k8s.io/component-base/version"
)

// LinkedMinor is the Kubernetes minor of the API server code this build links
// (k8s.io/apiextensions-apiserver): the rules Validate evaluates a CRD by.
var LinkedMinor = int(utilversion.MustParseGeneric(kubeversion.DefaultKubeBinaryVersion).Minor())

// Local says that a CRD's own validation was evaluated here, not by the target API server
// (its dry run could not be asked), and by which minor's rules.
type Local struct {
	// Minor is the Kubernetes minor whose validation code ran here (LinkedMinor).
	Minor int `json:"minor"`
	// ServerMinor is the target API server's minor; 0 when it could not be told.
	ServerMinor int `json:"serverMinor,omitempty"`
}

// LocalRules is the Local of an evaluation here for a target server of serverMinor (0:
// unknown).
func LocalRules(serverMinor int) Local {
	return Local{Minor: LinkedMinor, ServerMinor: serverMinor}
}

// Stands reports whether the local answer is the target server's: the same minor's rules.
// Otherwise a refusal may differ (1.38 estimates CEL costs lower than 1.37 does, and
// accepts rules 1.37 refuses).
func (l Local) Stands() bool { return l.ServerMinor != 0 && l.ServerMinor == l.Minor }

// String says whose rules were evaluated, and whether they are the server's.
func (l Local) String() string {
	switch {
	case l.Stands():
		return fmt.Sprintf("evaluated here by Kubernetes 1.%d's rules, the API server's own", l.Minor)
	case l.ServerMinor == 0:
		return fmt.Sprintf("evaluated here by Kubernetes 1.%d's rules; the API server's minor could not be read, and its answer may differ", l.Minor)
	default:
		return fmt.Sprintf("evaluated here by Kubernetes 1.%d's rules; the API server runs 1.%d, whose answer may differ: CEL cost estimation, for one, changes between minors", l.Minor, l.ServerMinor)
	}
}

// Validate evaluates here what Admit asks the API server: whether it accepts next over
// live (nil: next is new), by the CRD's own validation, with the API server's own code
// (the linked apiextensions-apiserver's ValidateCustomResourceDefinition and
// ValidateCustomResourceDefinitionUpdate, after the defaults, the conversion and the
// preparation its registry makes for a create or an update). It is for an identity that
// may not make the dry run: it reaches no admission policy or webhook, and its rules are
// LinkedMinor's, which may not be the target server's (serverMinor, 0: unknown). A
// refusal says so (Refusal.Local). Like Admit, it returns nil for a CRD that is accepted,
// Unchanged, or refused only for stored versions it drops, and an error only when next
// cannot be read as a CRD.
func Validate(ctx context.Context, live, next *apiextv1.CustomResourceDefinition, serverMinor int) (*Refusal, error) {
	if Unchanged(live, next) {
		return nil, nil
	}
	incoming, err := internalCRD(next)
	if err != nil {
		return nil, err
	}
	incoming.UID, incoming.Generation, incoming.ManagedFields = "", 0, nil
	var errs field.ErrorList
	if live == nil {
		incoming.ResourceVersion = ""
		prepareForCreate(incoming)
		errs = validation.ValidateCustomResourceDefinition(ctx, incoming)
	} else {
		old, err := internalCRD(live)
		if err != nil {
			return nil, err
		}
		if old.ResourceVersion == "" {
			// A live CRD recorded without its metadata (a snapshot's): the write would
			// carry the server's own resourceVersion, which is no question of validation.
			old.ResourceVersion = "1"
		}
		incoming.ResourceVersion = old.ResourceVersion
		prepareForUpdate(incoming, old)
		errs = validation.ValidateCustomResourceDefinitionUpdate(ctx, incoming, old)
	}
	if len(errs) == 0 {
		return nil, nil
	}
	r := refusalOf(apierrors.NewInvalid(apiextensions.Kind("CustomResourceDefinition"), next.Name, errs))
	if r != nil {
		l := LocalRules(serverMinor)
		r.Local, r.Admission = &l, false
	}
	return r, nil
}

// internalCRD is crd as the API server validates it: with the defaults of a v1 CRD it
// decodes, converted to the internal version.
func internalCRD(crd *apiextv1.CustomResourceDefinition) (*apiextensions.CustomResourceDefinition, error) {
	c := crd.DeepCopy()
	apiextv1.SetObjectDefaults_CustomResourceDefinition(c)
	out := &apiextensions.CustomResourceDefinition{}
	if err := apiextv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(c, out, nil); err != nil {
		return nil, fmt.Errorf("read CRD %s for its validation: %w", crd.Name, err)
	}
	return out, nil
}

// prepareForCreate is what the API server's registry does to a CRD it creates before it
// validates it (the customresourcedefinition strategy's PrepareForCreate): no status but
// the storage version stored, generation 1. The strategy also drops fields of disabled
// feature gates; the gates it checks are on in every minor this build validates by.
func prepareForCreate(crd *apiextensions.CustomResourceDefinition) {
	crd.Status = apiextensions.CustomResourceDefinitionStatus{}
	crd.Generation = 1
	storeStorageVersion(crd)
}

// prepareForUpdate is what the API server's registry does to a CRD update before it
// validates it (rest.BeforeUpdate and the strategy's PrepareForUpdate): the live status,
// the storage version added to storedVersions, the generation, UID and creation time
// of the live CRD (the generation one more when the spec changes).
func prepareForUpdate(crd, old *apiextensions.CustomResourceDefinition) {
	crd.Status = *old.Status.DeepCopy()
	crd.Generation = old.Generation
	if !apiequality.Semantic.DeepEqual(old.Spec, crd.Spec) {
		crd.Generation++
	}
	if crd.UID == "" {
		crd.UID = old.UID
	}
	if !old.CreationTimestamp.IsZero() {
		crd.CreationTimestamp = old.CreationTimestamp
	}
	if old.DeletionTimestamp != nil {
		crd.DeletionTimestamp = old.DeletionTimestamp
	}
	if old.DeletionGracePeriodSeconds != nil && crd.DeletionGracePeriodSeconds == nil {
		crd.DeletionGracePeriodSeconds = old.DeletionGracePeriodSeconds
	}
	storeStorageVersion(crd)
}

// storeStorageVersion adds the storage version to status.storedVersions, as the API
// server does on every write.
func storeStorageVersion(crd *apiextensions.CustomResourceDefinition) {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			if !apiextensions.IsStoredVersion(crd, v.Name) {
				crd.Status.StoredVersions = append(crd.Status.StoredVersions, v.Name)
			}
			return
		}
	}
}
