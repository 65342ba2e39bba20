// Package webhook is the admission gate for Flux HelmReleases: a validating webhook on
// helm.toolkit.fluxcd.io/v2 HelmRelease updates that change the chart (and, with
// Options.GateValuesChanges, updates that change only the values). It predicts the
// change with pkg/fluxrelease (and so pkg/check), admits what is safe, starts a
// StorageMigration when a migration fixes the rest and a policy allows it, and denies
// what cannot be fixed with check's actionable reason. It is a thin front end: the
// prediction lives in pkg/, this package only turns it into an admission response,
// events, an annotation and a metric.
//
// The gate never writes the object under admission and never touches the HelmRelease's
// status, which belongs to helm-controller. It records its state in the annotation
// upgradeguard.io/gate, patched asynchronously after the response; that patch does not
// change the chart, so the webhook's matchConditions keep it (and helm-controller's own
// metadata and finalizer updates) away from the webhook.
//
// The same server holds the paths that never update a HelmRelease (see
// docs/design/2026-12-01-every-path.md): the release-record gate (ReleasePath), on the
// pending release record Secret every Helm client writes before it applies anything, and
// the CRD gate (CRDPath), a mutating webhook that never patches, on CRD updates the API
// server would reject on status.storedVersions. Both decide with the same engine
// (check.Predict, gate.Judge) and fail open. The CRD deletion guard (CRDDeletePath), a
// validating webhook on CRD DELETEs from any client, denies the deletion of a CRD that
// still holds objects (predict.DecideDeleted, decided and worded by gate.JudgeDeletion); its
// webhook fails closed by default, and a CRD annotated upgradeguard.io/allow-delete=true
// never reaches it.
//
// Every path is a door: a door value holds what it adds to an answer (the change it
// names, how the deployer retries, its event reasons), and answer.go alone words the
// library's decision for it: upgradeDoor.answer gate.Judge's, deletionDoor.answer
// gate.JudgeDeletion's. The library's sentence (gate.Decision.Message) and
// conditions are shown as they are, so a controller that calls pkg/gate and a user behind
// the webhook read the same words (docs/design/2026-12-04-answers.md).
package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v4/pkg/cli"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/fluxrelease"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
)

// Path is where the webhook server serves the gate (the contract with the chart and
// config/webhook/manifests.yaml).
const Path = "/validate-helm-toolkit-fluxcd-io-v2-helmrelease"

// Options tune the gate.
type Options struct {
	// Timeout bounds one decision: fetching the chart, reading the target and check.
	// Keep it below the ValidatingWebhookConfiguration's timeoutSeconds (30 in the
	// shipped manifest) so the gate answers with its own message. Default 25s.
	Timeout time.Duration
	// HelmCacheDir holds downloaded indexes and charts. Default: a directory under
	// os.TempDir().
	HelmCacheDir string
	// AllowOnError admits a chart change the gate could not check (a repository that is
	// down, an unreachable target). Default false: deny with the reason, so the change is
	// retried once the gate can check it. This is the gate's own policy; the
	// webhook's failurePolicy covers the gate being unreachable.
	AllowOnError bool
	// IndexTTL is how long a repository index (or an OCI tag's resolution) is reused
	// between decisions, so a semver range picks up a new chart version at most this
	// late. Default 1 minute. Charts of an exact resolved version are kept regardless.
	IndexTTL time.Duration
	// ChartCacheSize bounds how many chart archives the gate keeps between decisions
	// (least recently used go first). Default 64; negative keeps none and fetches every
	// chart and index on every decision.
	ChartCacheSize int
	// GateValuesChanges also decides updates that change only spec.values or
	// spec.valuesFrom (a value can switch a chart's CRDs on or off). Default false: only
	// chart changes are decided. The webhook configuration must send such updates too
	// (the chart's webhook.gateValuesChanges does both).
	GateValuesChanges bool
	// RecordTimeout bounds one decision of the release-record and CRD gates. Keep it
	// below their webhooks' timeoutSeconds (10 in the shipped manifest): they fail open,
	// and a Helm client waits for them. Default 8s.
	RecordTimeout time.Duration
	// Clock is the clock of the index TTL, for tests. Default: the real clock.
	Clock clock.PassiveClock
	// LocalCRDs reads the local cluster's CRDs from memory: Setup passes the manager's
	// cache, whose CRD informer the controller shares. With ChartCacheSize negative the
	// gate keeps no target between decisions either.
	LocalCRDs client.Reader
}

// Outcomes, the values of metrics.GateDecisions' outcome label.
const (
	OutcomeAdmitted  = "admitted"
	OutcomeMigrating = "migrating"
	OutcomeBlocked   = "blocked"
	OutcomeError     = "error"
)

// Setup registers the gate on the manager's webhook server at Path, and the annotation
// writer as a runnable. The scheme gains the Flux and upgradeguard types it reads.
func Setup(mgr manager.Manager, o Options) error {
	for _, add := range []func(*runtime.Scheme) error{helmv2.AddToScheme, sourcev1.AddToScheme, v1alpha1.AddToScheme, corev1.AddToScheme, apiextv1.AddToScheme} {
		if err := add(mgr.GetScheme()); err != nil {
			return fmt.Errorf("webhook: register types: %w", err)
		}
	}
	if o.LocalCRDs == nil {
		o.LocalCRDs = mgr.GetCache()
	}
	reader := mgr.GetAPIReader()
	if o.ChartCacheSize >= 0 {
		// The gate keeps state between decisions: so does what it reads (memoryReader).
		reader = newMemoryReader(mgr.GetCache(), mgr.GetAPIReader())
	}
	g, err := New(reader, mgr.GetClient(), mgr.GetConfig(), mgr.GetEventRecorder("upgradeguard-gate"), o)
	if err != nil {
		return err
	}
	if err := mgr.Add(g.annotator); err != nil {
		return err
	}
	if g.clusters != nil {
		if err := mgr.Add(g.clusters); err != nil {
			return err
		}
		w := &warmer{g: g, mapper: mgr.GetRESTMapper()}
		if err := mgr.Add(w); err != nil {
			return err
		}
		if err := mgr.AddReadyzCheck("gate-warm", w.ready); err != nil {
			return err
		}
	}
	mgr.GetWebhookServer().Register(Path, &ctrlwebhook.Admission{Handler: g.helmReleaseEnvelope()})
	mgr.GetWebhookServer().Register(ReleasePath, &ctrlwebhook.Admission{Handler: (&releaseGate{g: g}).envelope()})
	mgr.GetWebhookServer().Register(CRDPath, &ctrlwebhook.Admission{Handler: (&crdGate{g: g}).envelope()})
	mgr.GetWebhookServer().Register(CRDDeletePath, &ctrlwebhook.Admission{Handler: (&crdDeleteGuard{g: g}).envelope()})
	return setupArgoDiffs(mgr, g)
}

// Gate is the admission.Handler.
type Gate struct {
	reader    client.Reader
	writer    client.Client
	local     *rest.Config
	recorder  events.EventRecorder
	settings  *cli.EnvSettings
	opts      Options
	cache     *chartsource.Cache
	clusters  *livecluster.Clusters
	annotator *annotator
}

// New builds the gate. reader should read through to the API server (Secrets and
// sources are not worth caching cluster-wide); writer creates StorageMigrations and
// patches the annotation.
func New(reader client.Reader, writer client.Client, local *rest.Config, recorder events.EventRecorder, o Options) (*Gate, error) {
	if o.Timeout <= 0 {
		o.Timeout = 25 * time.Second
	}
	if o.RecordTimeout <= 0 {
		o.RecordTimeout = 8 * time.Second
	}
	if o.HelmCacheDir == "" {
		o.HelmCacheDir = filepath.Join(os.TempDir(), "upgradeguard-helm")
	}
	if err := os.MkdirAll(o.HelmCacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("webhook: Helm cache directory: %w", err)
	}
	s := cli.New()
	s.RepositoryCache = filepath.Join(o.HelmCacheDir, "repository")
	s.RepositoryConfig = filepath.Join(o.HelmCacheDir, "repositories.yaml")
	s.RegistryConfig = filepath.Join(o.HelmCacheDir, "registry", "config.json")
	s.ContentCache = filepath.Join(o.HelmCacheDir, "content")
	g := &Gate{reader: reader, writer: writer, local: local, recorder: recorder, settings: s, opts: o,
		annotator: newAnnotator(writer)}
	if o.ChartCacheSize >= 0 {
		g.cache = chartsource.NewCache(chartsource.CacheOptions{IndexTTL: o.IndexTTL, MaxCharts: o.ChartCacheSize, Clock: o.Clock})
		g.clusters = livecluster.NewClusters(livecluster.ClustersOptions{Local: o.LocalCRDs})
	}
	return g, nil
}

// Handle decides one HelmRelease UPDATE (the envelope of Path).
func (g *Gate) Handle(ctx context.Context, req admission.Request) admission.Response {
	return g.helmReleaseEnvelope().Handle(ctx, req)
}

// helmReleaseHandler is the HelmRelease door's envelope: an update that changes the chart
// (or, with GateValuesChanges, only the values) is decided; its decision is recorded on
// the HelmRelease as it was.
func (g *Gate) helmReleaseEnvelope() *envelope {
	return &envelope{operations: []admissionv1.Operation{admissionv1.Update}, skip: "only updates are gated", timeout: g.opts.Timeout, logged: "gate decision",
		read: func(req admission.Request) (*call, string, error) {
			var old, hr helmv2.HelmRelease
			if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
				return nil, "", fmt.Errorf("decode the old HelmRelease: %w", err)
			}
			if err := json.Unmarshal(req.Object.Raw, &hr); err != nil {
				return nil, "", fmt.Errorf("decode the HelmRelease: %w", err)
			}
			valuesOnly := false
			if !fluxrelease.ChartChanged(&old, &hr) {
				if !g.opts.GateValuesChanges || !fluxrelease.ValuesChanged(&old, &hr) {
					return nil, "the chart does not change", nil
				}
				valuesOnly = true
			}
			return &call{
				decide:   func(ctx context.Context, dryRun bool) decision { return g.decide(ctx, &hr, dryRun, valuesOnly) },
				log:      []any{"helmRelease", client.ObjectKeyFromObject(&hr).String(), "chart", fluxrelease.Describe(&hr)},
				recorded: func(d decision) { g.record(&old, d) },
			}, "", nil
		}}
}

// runWithin runs f and gives up when ctx ends first. Helm's chart download does not take
// a context, so a slow repository is cut off here; the abandoned call ends on its own.
func runWithin[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f(ctx)
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("no answer within the gate's timeout: %w", ctx.Err())
	}
}
