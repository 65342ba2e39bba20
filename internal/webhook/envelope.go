package webhook

import (
	"context"
	"net/http"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/internal/metrics"
)

// envelope is the one envelope of every door's requests, as controller-runtime's
// admission.Webhook is of its handlers: the operation filter, the decoding (the door's
// read), the dry-run flag, the time bound, the decision metric, the log line and the
// response (respond). A door says only which operations it judges, how it reads a
// request, and how it decides one.
type envelope struct {
	// operations are the operations the door judges, on the object itself: a request
	// for another operation or for a subresource is admitted with skip.
	operations []admissionv1.Operation
	skip       string
	// timeout bounds one decision.
	timeout time.Duration
	// logged is the log message of every decision: "CRD update decision".
	logged string
	// read decodes a request the door may judge: the call that decides it, or nil and
	// the message it is admitted with unjudged (it changes nothing the door judges). An
	// error is a request that cannot be decoded.
	read func(req admission.Request) (*call, string, error)
}

// call is one request a door decides, as its read found it.
type call struct {
	// decide decides the request; dryRun says that it changes nothing.
	decide func(ctx context.Context, dryRun bool) decision
	// log names what is decided, as key/value pairs of the log line.
	log []any
	// recorded, when set, records a decision of a request that is not a dry run (the
	// HelmRelease's event and annotation, a metric of the door's own).
	recorded func(d decision)
}

// Handle is the envelope: see envelope.
func (h *envelope) Handle(ctx context.Context, req admission.Request) admission.Response {
	if !slices.Contains(h.operations, req.Operation) || req.SubResource != "" {
		return admission.Allowed(h.skip)
	}
	c, skip, err := h.read(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if c == nil {
		return admission.Allowed(skip)
	}
	dryRun := req.DryRun != nil && *req.DryRun
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	d := c.decide(ctx, dryRun)
	metrics.GateDecisions.WithLabelValues(d.kind.outcome()).Inc()
	if !dryRun && c.recorded != nil {
		c.recorded(d)
	}
	log.FromContext(ctx).Info(h.logged, append(slices.Clip(c.log), "dryRun", dryRun, "outcome", d.kind.outcome(), "reason", d.reason, "storageMigration", d.migration)...)
	return respond(d)
}
