package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"
)

// LeaseHeldError says that another run holds the migration lease of a CRD.
type LeaseHeldError struct {
	CRD, Holder, Namespace, Lease string
	Until                         time.Time
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("%s is being migrated by %s (Lease %s/%s, held until %s): wait for that run (Options.Wait) or check it",
		e.CRD, e.Holder, e.Namespace, e.Lease, e.Until.Format(time.RFC3339))
}

// lease is a coordination.k8s.io Lease held for one CRD while it is migrated, so that two
// runs (two operators, or the CLI and the controller) never migrate it at once.
type lease struct {
	client   coordclient.LeaseInterface
	name     string
	holder   string
	duration time.Duration
	crd      string
	ns       string
}

func leaseName(crd string) string {
	name := "upgradeguard-migrate-" + crd
	if len(name) > 253 {
		name = name[:253]
	}
	return name
}

// Annotations on a migration Lease that record where an interrupted run stopped, so the
// next run (CLI, gate or controller) resumes there instead of listing from the start.
const (
	annotationResumeContinue = "upgradeguard.io/resume-continue"
	annotationResumeStorage  = "upgradeguard.io/resume-storage-version"
	annotationResumeCRDUID   = "upgradeguard.io/resume-crd-uid"
)

// resumePoint is where a run stopped with every object before it migrated cleanly at
// storageVersion, on the CRD with uid.
type resumePoint struct {
	Continue, StorageVersion, CRDUID string
}

// acquire takes the lease, waiting for it while wait is true and ctx allows, and returns
// the resume point the last run left (nil when none).
func (l *lease) acquire(ctx context.Context, wait bool) (*resumePoint, error) {
	for {
		rp, err := l.tryAcquire(ctx)
		if err == nil {
			return rp, nil
		}
		var held *LeaseHeldError
		if !errors.As(err, &held) || !wait {
			return nil, err
		}
		// Poll until the holder releases it or it expires.
		delay := min(max(time.Until(held.Until), 200*time.Millisecond), 2*time.Second)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %w: %w", err, ctx.Err())
		case <-time.After(delay):
		}
	}
}

func (l *lease) tryAcquire(ctx context.Context) (*resumePoint, error) {
	now := metav1.NewMicroTime(time.Now())
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       ptr.To(l.holder),
		LeaseDurationSeconds: ptr.To(int32(l.duration.Seconds())),
		AcquireTime:          &now,
		RenewTime:            &now,
	}
	cur, err := l.client.Get(ctx, l.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = l.client.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: l.name, Labels: map[string]string{"app.kubernetes.io/managed-by": "upgradeguard"},
				Annotations: map[string]string{"upgradeguard.io/crd": l.crd}},
			Spec: spec,
		}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return l.tryAcquire(ctx)
		}
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("read Lease %s/%s: %w", l.ns, l.name, err)
	}
	if h := ptr.Deref(cur.Spec.HolderIdentity, ""); h != "" && h != l.holder && cur.Spec.RenewTime != nil {
		until := cur.Spec.RenewTime.Add(time.Duration(ptr.Deref(cur.Spec.LeaseDurationSeconds, 0)) * time.Second)
		if time.Now().Before(until) {
			return nil, &LeaseHeldError{CRD: l.crd, Holder: h, Namespace: l.ns, Lease: l.name, Until: until}
		}
	}
	var rp *resumePoint
	if a := cur.Annotations; a[annotationResumeContinue] != "" {
		rp = &resumePoint{Continue: a[annotationResumeContinue], StorageVersion: a[annotationResumeStorage], CRDUID: a[annotationResumeCRDUID]}
	}
	cur.Spec = spec
	_, err = l.client.Update(ctx, cur, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return l.tryAcquire(ctx)
	}
	return rp, err
}

// keepRenewed renews the lease until ctx ends; it stops the migration (through cancel)
// if the lease is lost, so that two runs never overlap.
func (l *lease) keepRenewed(ctx context.Context, cancel context.CancelCauseFunc) {
	_ = wait.PollUntilContextCancel(ctx, l.duration/3, false, func(ctx context.Context) (bool, error) {
		cur, err := l.client.Get(ctx, l.name, metav1.GetOptions{})
		if err != nil {
			return false, nil // transient: try again at the next tick; expiry is far off
		}
		if ptr.Deref(cur.Spec.HolderIdentity, "") != l.holder {
			cancel(fmt.Errorf("lost the migration Lease %s/%s to %s", l.ns, l.name, ptr.Deref(cur.Spec.HolderIdentity, "")))
			return true, nil
		}
		now := metav1.NewMicroTime(time.Now())
		cur.Spec.RenewTime = &now
		_, _ = l.client.Update(ctx, cur, metav1.UpdateOptions{})
		return false, nil
	})
}

// release gives the lease up so that a waiting run starts at once, recording where this
// run stopped (nil: nothing to resume).
func (l *lease) release(ctx context.Context, rp *resumePoint) error {
	cur, err := l.client.Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return client404(err)
	}
	if ptr.Deref(cur.Spec.HolderIdentity, "") != l.holder {
		return nil
	}
	cur.Spec.HolderIdentity = nil
	cur.Spec.RenewTime = nil
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	delete(cur.Annotations, annotationResumeContinue)
	delete(cur.Annotations, annotationResumeStorage)
	delete(cur.Annotations, annotationResumeCRDUID)
	if rp != nil {
		cur.Annotations[annotationResumeContinue] = rp.Continue
		cur.Annotations[annotationResumeStorage] = rp.StorageVersion
		cur.Annotations[annotationResumeCRDUID] = rp.CRDUID
	}
	_, err = l.client.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

func client404(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
