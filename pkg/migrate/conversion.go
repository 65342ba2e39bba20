package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// ConversionRunbook is the runbook a run stopped for its conversion webhook points to.
const ConversionRunbook = "docs/runbooks/conversion-webhook-not-answering.md"

// Conversion waits bound waitConversion: the API server takes up a changed
// spec.conversion within moments (its CRD informer), and a webhook that does not answer
// for conversionWait is down, not switching.
const (
	conversionWait = 30 * time.Second
	// conversionProbes is how many probes in a row must convert: with several API
	// servers behind one address, each takes up a change on its own.
	conversionProbes = 3
)

// webhookConversion says whether the API server converts crd's objects through a webhook
// at all: a webhook strategy and more than one served version.
func webhookConversion(crd *apiextv1.CustomResourceDefinition) bool {
	if crdversions.Conversion(crd) != string(apiextv1.WebhookConverter) {
		return false
	}
	served := 0
	for _, v := range crd.Spec.Versions {
		if v.Served {
			served++
		}
	}
	return served > 1
}

// waitConversion waits until the API server converts crd's objects through the
// conversion webhook the CRD names now, before the run writes. The API server takes up a
// change of spec.conversion asynchronously and says nowhere when it has (no status field
// or generation follows it), so it is observed: one object is read from etcd at the
// storage version and at another served version (a GET without resourceVersion is not
// served from the watch cache), so at least one of the two reads converts it, whatever
// version it is stored at. conversionProbes probes in a row must convert. The objects
// left (a write that still meets the old configuration) are retried, bounded and
// counted (retryCounting). A CRD without webhook conversion, or without objects, needs
// no wait.
func (m *Migrator) waitConversion(ctx context.Context, crd *apiextv1.CustomResourceDefinition) error {
	if !webhookConversion(crd) {
		return nil
	}
	storage := crdversions.StorageVersion(crd)
	other := ""
	for _, v := range crd.Spec.Versions {
		if v.Served && v.Name != storage {
			other = v.Name
			break
		}
	}
	gvr := func(version string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural}
	}
	var last error
	converted := 0
	probe := func(ctx context.Context) (bool, error) {
		list, err := m.metadata.Resource(gvr(storage)).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil && len(list.Items) == 0 {
			return true, nil // no objects: nothing to convert, nothing to write
		}
		if err == nil {
			item := list.Items[0]
			for _, v := range []string{storage, other} {
				if _, err = m.metadata.Resource(gvr(v)).Namespace(item.Namespace).Get(ctx, item.Name, metav1.GetOptions{}); err != nil {
					break
				}
			}
		}
		switch {
		case err == nil:
			converted++
			return converted == conversionProbes, nil
		case kubeclient.IsConversionFailure(err), apierrors.IsNotFound(err), retriable(err):
			last, converted = err, 0
			return false, nil
		case apierrors.IsForbidden(err):
			// An identity that may only list (the builtin engine's least privilege, which
			// writes nothing itself) cannot observe it: the retries still bound the rest.
			return true, nil
		default:
			return false, err
		}
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, conversionWait, true, probe)
	switch {
	case err == nil:
		return nil
	case last != nil && errors.Is(err, context.DeadlineExceeded):
		after := fmt.Sprintf("for %s", conversionWait)
		if ctx.Err() != nil {
			after = "until the run's deadline"
		}
		return &ConversionError{CRD: crd.Name, After: after, Err: last}
	}
	return fmt.Errorf("wait until the API server converts %s through its conversion webhook: %w", crd.Name, err)
}

// ConversionError says the API server could not convert a CRD's objects through its
// conversion webhook for as long as a run waits before writing, or for as many retries
// as one write is given (MaxConversionRetries): the webhook is down, unreachable or
// answering badly. The run stopped writing.
type ConversionError struct {
	CRD string
	// After says how long the run waited or how often it retried.
	After string
	Err   error
}

func (e *ConversionError) Error() string {
	return fmt.Sprintf("the API server could not convert objects of %s through its conversion webhook %s: %v; "+
		"make the webhook answer (its Service, endpoints and certificate: spec.conversion.webhook.clientConfig) and run again; see %s",
		e.CRD, e.After, e.Err, ConversionRunbook)
}

func (e *ConversionError) Unwrap() error { return e.Err }

// conversionChanged reads crd again and says whether its spec.conversion differs from
// seen, returning the conversion it has now.
func (m *Migrator) conversionChanged(ctx context.Context, name string, seen *apiextv1.CustomResourceConversion) (*apiextv1.CustomResourceDefinition, bool, error) {
	var cur *apiextv1.CustomResourceDefinition
	err := retry(ctx, func() error {
		var err error
		cur, err = m.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("read CRD %s: %w", name, err)
	}
	return cur, !equality.Semantic.DeepEqual(cur.Spec.Conversion, seen), nil
}

// onlyWebhookMoved says whether b differs from a in nothing but the address of its
// conversion webhook (spec.conversion.webhook: clientConfig, review versions), both
// converting through a webhook: a repointed webhook changes the CRD's generation, but
// not what a migration wrote (the storage version and its encoding), so a run that saw
// it may still prune storedVersions.
func onlyWebhookMoved(a, b *apiextv1.CustomResourceDefinition) bool {
	if !webhookConversion(a) || !webhookConversion(b) {
		return false
	}
	as, bs := a.Spec.DeepCopy(), b.Spec.DeepCopy()
	as.Conversion, bs.Conversion = nil, nil
	return equality.Semantic.DeepEqual(as, bs)
}
