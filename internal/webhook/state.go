package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
)

// AnnotationGate holds the gate's state on a HelmRelease, as JSON (State).
const AnnotationGate = "upgradeguard.io/gate"

// State is the value of AnnotationGate: the last decision on a chart change and the
// conditions StorageMigrationRequired, StorageMigrationInProgress and
// StorageMigrationFailed. It lives in an annotation because the status belongs to
// helm-controller.
type State struct {
	// Decision is admitted, migrating, blocked or error.
	Decision string `json:"decision"`
	// Operation is upgrade or rollback.
	Operation string `json:"operation,omitempty"`
	// Chart is the incoming chart (name@version when resolved).
	Chart string `json:"chart,omitempty"`
	// StorageMigration is the StorageMigration the decision waits on or came from.
	StorageMigration string             `json:"storageMigration,omitempty"`
	Message          string             `json:"message"`
	Conditions       []metav1.Condition `json:"conditions,omitempty"`
}

// ParseState reads the annotation; a missing or unreadable one gives a zero State.
func ParseState(obj metav1.Object) State {
	var s State
	if v := obj.GetAnnotations()[AnnotationGate]; v != "" {
		_ = json.Unmarshal([]byte(v), &s)
	}
	return s
}

// record emits the event and queues the annotation for a decision.
func (g *Gate) record(old *helmv2.HelmRelease, d decision) {
	typ := corev1.EventTypeWarning
	if d.kind == kindAdmitted || d.kind == kindNotChecked || d.reason == ReasonMigrationStarted {
		typ = corev1.EventTypeNormal
	}
	note := d.message
	for _, w := range d.warnings {
		if w != d.message {
			note += ". Warning: " + w
		}
	}
	// The events API folds events with the same regarding object, reason and action into
	// one series that keeps the first note; a denied update leaves the HelmRelease's
	// resourceVersion as it was, so the chart goes into the action to keep each chart
	// change's decision readable.
	g.recorder.Eventf(old, nil, typ, d.reason, truncate("Gate "+d.chart, 128), "%s", truncate(note, 1000))

	prev := ParseState(old)
	next := State{Decision: d.kind.outcome(), Operation: string(d.operation), Chart: d.chart, StorageMigration: d.migration, Message: d.message,
		Conditions: prev.Conditions}
	if !d.noState {
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		for _, c := range d.conditions {
			c.LastTransitionTime = now
			meta.SetStatusCondition(&next.Conditions, c)
		}
	}
	data, err := json.Marshal(next)
	if err != nil {
		return
	}
	if string(data) == old.GetAnnotations()[AnnotationGate] {
		return
	}
	g.annotator.enqueue(client.ObjectKeyFromObject(old), string(data))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// annotator patches AnnotationGate after the admission response, so the webhook never
// writes the object under admission. It keeps only the latest value per HelmRelease and
// retries a failed patch a few times; the next decision writes it again anyway. It runs
// on every replica (webhooks are served by all of them), not only the leader.
type annotator struct {
	c       client.Client
	mu      sync.Mutex
	pending map[types.NamespacedName]string
	wake    chan struct{}
}

func newAnnotator(c client.Client) *annotator {
	return &annotator{c: c, pending: map[types.NamespacedName]string{}, wake: make(chan struct{}, 1)}
}

func (a *annotator) enqueue(key types.NamespacedName, value string) {
	a.mu.Lock()
	a.pending[key] = value
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// NeedLeaderElection is false: every replica serving the webhook writes its decisions.
func (a *annotator) NeedLeaderElection() bool { return false }

// Start drains the queue until ctx ends.
func (a *annotator) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("gate-annotator")
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.wake:
		}
		a.mu.Lock()
		batch := a.pending
		a.pending = map[types.NamespacedName]string{}
		a.mu.Unlock()
		for key, value := range batch {
			if err := a.patch(ctx, key, value); err != nil {
				logger.Error(err, "annotate HelmRelease with the gate state", "helmRelease", key.String())
			}
		}
	}
}

func (a *annotator) patch(ctx context.Context, key types.NamespacedName, value string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationGate: value}}})
	if err != nil {
		return err
	}
	hr := &helmv2.HelmRelease{}
	hr.Namespace, hr.Name = key.Namespace, key.Name
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 4}
	return wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		err := a.c.Patch(ctx, hr, client.RawPatch(types.MergePatchType, body))
		switch {
		case err == nil, apierrors.IsNotFound(err):
			return true, nil
		case apierrors.IsConflict(err), apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsServiceUnavailable(err):
			return false, nil
		}
		return false, fmt.Errorf("patch %s: %w", key, err)
	})
}
