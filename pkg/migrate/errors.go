package migrate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/upgradeguard/upgradeguard/pkg/kubeclient"
)

// crdChangedError stops a prune because the CRD changed during the run; a run from the
// start is expected to finish (Result.Restart).
type crdChangedError struct{ msg string }

func (e *crdChangedError) Error() string { return e.msg }

// retriable says whether an error is worth retrying: throttling (429), server errors and
// timeouts (5xx, including a conversion webhook that is unavailable), and transport
// errors such as a refused connection while the API server restarts.
func retriable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true // transport level: connection refused or reset, EOF
	}
	return apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || status.Status().Code >= 500
}

// MaxConversionRetries bounds how often one request is repeated after the API server
// could not convert an object through the CRD's conversion webhook
// (kubeclient.IsConversionFailure). With the backoff of retry that is about 40 seconds:
// long enough for the API server to take up a changed spec.conversion (TeraSky measured
// one failed write in 9,456 while a webhook was repointed), short enough that a webhook
// that is down fails the object, named with the API server's answer, instead of holding
// the run until its deadline.
const MaxConversionRetries = 10

// retry calls f until it succeeds, fails permanently, or ctx ends. client-go has
// already retried a 429 or 5xx that carried Retry-After (up to 10 times, each after the
// delay the server asked for), except a conversion failure, which kubeclient hands over
// at once; what reaches here backs off exponentially with jitter, from 100ms to 10s, and
// never sooner than the server's Retry-After, so that many workers throttled at once
// spread out rather than return together. A conversion failure is retried at most
// MaxConversionRetries times.
func retry(ctx context.Context, f func() error) error { return retryCounting(ctx, nil, f) }

// retryCounting is retry that adds each retry of a conversion failure to conversions
// (when not nil), for the run's report.
func retryCounting(ctx context.Context, conversions *atomic.Int64, f func() error) error {
	b := retryBackoff()
	conversionRetries := 0
	for {
		err := f()
		if !retriable(err) {
			return err
		}
		if kubeclient.IsConversionFailure(err) {
			if conversionRetries == MaxConversionRetries {
				return fmt.Errorf("%w (gave up after %d retries: the conversion webhook did not answer)", err, conversionRetries)
			}
			conversionRetries++
			if conversions != nil {
				conversions.Add(1)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(retryDelay(&b, err)):
		}
	}
}

// retryBackoff is the backoff of one object's or one page's retries.
func retryBackoff() wait.Backoff {
	return wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: 10 * time.Second}
}

// retryDelay is the next wait: the backoff's next step, or the server's Retry-After when
// that is longer.
func retryDelay(b *wait.Backoff, err error) time.Duration {
	d := b.Step()
	if s, ok := apierrors.SuggestsClientDelay(err); ok && time.Duration(s)*time.Second > d {
		d = time.Duration(s) * time.Second
	}
	return d
}

// continueFrom returns the continue token a 410 Expired list response offers, to go on
// from the next key.
func continueFrom(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Continue
	}
	return ""
}

// isRBACForbidden tells an RBAC denial (which will fail every object the same way) from
// an admission webhook's denial of one object.
func isRBACForbidden(err error) bool {
	return apierrors.IsForbidden(err) && !strings.Contains(err.Error(), "admission webhook")
}

// describe says why one object failed, in words an operator acts on.
func describe(err error) string {
	switch {
	case apierrors.IsInvalid(err):
		return "rejected as invalid (422): " + err.Error()
	case apierrors.IsForbidden(err):
		return "denied: " + err.Error()
	case apierrors.IsConflict(err):
		return "conflict: " + err.Error()
	}
	return err.Error()
}

// StorageSwitchError says a target would switch a live CRD's storage version (a reverse
// migration, or the storage switch of a bridge) and Options.AllowStorageSwitch did not
// allow it.
type StorageSwitchError struct {
	CRD, From, To string
}

func (e *StorageSwitchError) Error() string {
	return fmt.Sprintf("%s needs its storage version switched from %s to %s (a reverse migration), which changes the live CRD and was not allowed", e.CRD, e.From, e.To)
}

// PatchForbiddenError says RBAC denies patching the custom resources of a CRD: every
// object would fail the same way, so the run stops.
type PatchForbiddenError struct {
	CRD, Resource string
	Err           error
}

func (e *PatchForbiddenError) Error() string {
	return fmt.Sprintf("not allowed to patch %s: grant the patch verb on %s: %v", e.Resource, e.Resource, e.Err)
}

func (e *PatchForbiddenError) Unwrap() error { return e.Err }

// CRDNotFoundError says a CRD to grant or migrate is not on the cluster.
type CRDNotFoundError struct{ Name string }

func (e *CRDNotFoundError) Error() string { return "CRD " + e.Name + " not found" }

// IsMigratingElsewhere reports whether err says that someone else is migrating the CRD:
// another run holds its migration Lease (*LeaseHeldError), or a StorageVersionMigration
// upgradeguard did not create is in progress (*InProgressError). Every caller treats both
// the same way: wait for the other run, or stop and say so. It is the one place that
// classification is made.
func IsMigratingElsewhere(err error) bool {
	var held *LeaseHeldError
	var inProgress *InProgressError
	return errors.As(err, &held) || errors.As(err, &inProgress)
}
