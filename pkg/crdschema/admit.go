package crdschema

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextv1client "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset/typed/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
)

// Refusal is the API server's refusal of an incoming CRD itself: a schema it does not
// accept, a CEL rule whose estimated cost exceeds its budget, a rule that uses a function
// it does not know. The rules differ between Kubernetes minors (1.38 loosened CEL cost
// estimation: a rule 1.37 refuses, 1.38 accepts), so only the target server can say: Admit
// asks it with a dry-run write. A write that drops a stored version is not a Refusal: it
// is the storedVersions verdict, which a migration fixes.
type Refusal struct {
	// Causes are the API server's own messages, one per refused field, as it words them.
	Causes []string `json:"causes"`
	// Admission says the refusal came from admission (a ValidatingAdmissionPolicy or a
	// webhook), not from the CRD's own validation: no cause names a field. The API server
	// validates the CRD first and admits it after, so a CRD that admission refuses
	// passed its own validation.
	Admission bool `json:"admission,omitempty"`
	// Gate says the refusal is upgradeguard's own admission gate's (the CRD gate, which
	// denies an update that drops a stored version or loses stored fields), recognised by
	// the cause it sets (v1alpha1.CauseGateDenied): the same decision the caller makes
	// itself. It runs as a mutating webhook, before the CRD's own validation, so nothing
	// after it was asked.
	Gate bool `json:"gate,omitempty"`
	// Local says the CRD's own validation was evaluated here (Validate), by which
	// minor's rules, because the dry run could not be asked; nil for the API server's own
	// answer.
	Local *Local `json:"local,omitempty"`
}

// Message is the causes in one line.
func (r *Refusal) Message() string {
	if r == nil {
		return ""
	}
	if r.Local != nil {
		return "the API server's own CRD validation refuses the incoming CRD (the dry run could not be asked; " + r.Local.String() + "): " + strings.Join(r.Causes, "; ")
	}
	return "the API server refuses the incoming CRD: " + strings.Join(r.Causes, "; ")
}

// Admit asks the API server whether it accepts next over live (nil: next is new), with a
// server-side dry-run update (or create) that persists nothing. It returns the refusal,
// nil when the server accepts the CRD or refuses it only for stored versions it drops,
// and an error when it could not ask (RBAC: the dry run needs update and create on
// customresourcedefinitions; a webhook that refused; the server unreachable). A CRD whose
// spec does not change (Unchanged) is not asked about: it is accepted as it is.
// Admissions keeps the answers for a process that asks again.
func Admit(ctx context.Context, crds apiextv1client.CustomResourceDefinitionInterface, live, next *apiextv1.CustomResourceDefinition) (*Refusal, error) {
	if Unchanged(live, next) {
		return nil, nil
	}
	return ask(ctx, crds, live, next)
}

// ask is Admit's dry-run write.
func ask(ctx context.Context, crds apiextv1client.CustomResourceDefinitionInterface, live, next *apiextv1.CustomResourceDefinition) (*Refusal, error) {
	dryRun := []string{metav1.DryRunAll}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := next.DeepCopy()
		c.UID, c.Generation, c.ManagedFields, c.Status = "", 0, nil, apiextv1.CustomResourceDefinitionStatus{}
		if live == nil {
			c.ResourceVersion = ""
			_, err := crds.Create(ctx, c, metav1.CreateOptions{DryRun: dryRun})
			return err
		}
		c.ResourceVersion = live.ResourceVersion
		_, err := crds.Update(ctx, c, metav1.UpdateOptions{DryRun: dryRun})
		if apierrors.IsConflict(err) {
			// The live CRD moved since it was read (or was read from a cache): ask again
			// over the API server's own copy.
			fresh, gerr := crds.Get(ctx, next.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			live = fresh
		}
		return err
	})
	if err == nil {
		return nil, nil
	}
	if gateDenied(err) {
		return &Refusal{Causes: []string{err.Error()}, Admission: true, Gate: true}, nil
	}
	if !apierrors.IsInvalid(err) {
		return nil, fmt.Errorf("ask the API server whether it accepts CRD %s (a dry-run write): %w", next.Name, err)
	}
	return refusalOf(err), nil
}

// refusalOf is the Refusal an Invalid error from the API server (or from its validation
// code, Validate) says: nil when it refuses only stored versions the CRD drops (the
// storedVersions verdict's).
func refusalOf(err error) *Refusal {
	var causes []string
	admission := true
	if status, ok := err.(apierrors.APIStatus); ok && status.Status().Details != nil {
		for _, c := range status.Status().Details.Causes {
			if c.Field != "" || c.Type != "" {
				admission = false
			}
			msg := c.Message
			if c.Field != "" {
				msg = c.Field + ": " + msg
			}
			if len(crdversions.StoredVersionRejections(msg)) == 0 {
				causes = append(causes, msg)
			}
		}
		if len(status.Status().Details.Causes) > 0 && len(causes) == 0 {
			return nil // only stored versions it drops: the storedVersions verdict's
		}
	}
	if len(causes) == 0 {
		causes, admission = []string{err.Error()}, false
	}
	return &Refusal{Causes: causes, Admission: admission}
}

// gateDenied says whether err is upgradeguard's admission gate's denial: its status
// carries the cause the gate sets on every denial.
func gateDenied(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Type == v1alpha1.CauseGateDenied {
			return true
		}
	}
	return false
}
