package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/go-logr/logr"
	eventsv1 "k8s.io/api/events/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
	"github.com/upgradeguard/upgradeguard/internal/webhook"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

// waitFluxBuild waits until the background build of Flux's controllers that `make demo`
// started has written its exit status to statusPath. Nothing to wait for when statusPath
// is empty (make demo-flux builds first).
func waitFluxBuild(ctx context.Context, logPath, statusPath string) error {
	if statusPath == "" {
		return nil
	}
	said := false
	for {
		data, err := os.ReadFile(statusPath)
		if err == nil && strings.TrimSpace(string(data)) != "" {
			if code := strings.TrimSpace(string(data)); code != "0" {
				return fmt.Errorf("building Flux's controllers failed (exit %s); the log is %s. Retry with `make demo-flux`", code, logPath)
			}
			return nil
		}
		if !said {
			step("Waiting for Flux's source-controller and helm-controller, which build in the background the first\ntime (about 15 minutes on 2 cores; cached afterwards). Build log: " + logPath + "\nCtrl-C is fine: `make demo-flux` runs this last act alone later.")
			said = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// flux is the last act: the real source-controller and helm-controller upgrade a
// HelmRelease with a semver range across the kyverno storage-version boundary while the
// HelmRelease never changes (the path that used to bypass the gate). The gate holds the
// upgrade at the Helm release record, migrates, and helm-controller upgrades.
func flux(ctx context.Context) (err error) {
	ctrllog.SetLogger(logr.Discard()) // the demo shows the API, not the manager's logs

	step(`The real Flux. A fresh control plane with upgradeguard's webhook configuration (config/webhook),
Flux's source-controller v1.9.1 and helm-controller v1.6.2 (bin/flux, running outside the
cluster), and upgradeguard's controller with its gates. A StorageMigrationPolicy lets it
migrate kyverno.io by itself (autoMigrate), only when an upgrade needs it.`)
	g, err := fluxtest.StartGated(ctx)
	defer func() {
		step("Tear down Flux, upgradeguard and the control plane.")
		err = errors.Join(err, g.Stop())
	}()
	if err != nil {
		return err
	}

	t := &demoT{ctx: ctx}
	defer t.cleanup()
	var s *fluxtest.Scenario
	step(`A HelmRelease follows the kyverno chart with version "3.x" from a chart repository (served on
loopback). It installed chart ` + fluxtest.Old + ` (kyverno 1.10, storage v2alpha1), objects were created, and
when the repository gained ` + fluxtest.From + ` (kyverno 1.12, storage v2beta1) helm-controller upgraded by
itself. storedVersions still lists v2alpha1.`)
	if err := t.do(func() { s = fluxtest.SemverRange(t, g.Env, "team-a", fluxtest.Options{}) }); err != nil {
		return err
	}
	hr, err := helmRelease(ctx, g, s.HelmRelease)
	if err != nil {
		return err
	}
	fmt.Printf("  HelmRelease %s: spec.chart.spec.version %q, Ready=%s at revision %d (chart %s)\n", s.HelmRelease,
		hr.Spec.Chart.Spec.Version, readyStatus(hr), s.ReleaseRevision, hr.Status.History.Latest().ChartVersion)
	if err := printStoredVersions(ctx, g); err != nil {
		return err
	}
	before := s.ReleaseRevision

	const reports = "admissionreports.kyverno.io"
	step(`Chart ` + fluxtest.To + ` also stops rendering ` + reports + `; Helm would delete that CRD with every
AdmissionReport, which the gate refuses with its own reason. This cluster keeps it, as the
refusal would say:`)
	fmt.Printf("\n$ kubectl annotate crd %s helm.sh/resource-policy=keep\n", reports)
	keep := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"helm.sh/resource-policy":"keep"}}}`))
	if err := g.UG.Patch(ctx, &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: reports}}, keep); err != nil {
		return err
	}

	step(`The repository gains chart ` + fluxtest.To + ` (kyverno 1.13, which drops v2alpha1: kyverno#12633). Nobody
touches the HelmRelease: source-controller fetches the index, and helm-controller starts the
upgrade by itself. Without upgradeguard the API server would reject the CRDs half-way.`)
	if err := s.Trigger(ctx); err != nil {
		return err
	}

	// Follow the HelmRelease until it is Ready at To, keeping what it showed on the way.
	var held *metav1.Condition
	var decisions []string
	hr, err = g.Flux.WaitHelmRelease(ctx, s.HelmRelease.Namespace, s.HelmRelease.Name, 4*time.Minute, func(hr *helmv2.HelmRelease) bool {
		if c := apimeta.FindStatusCondition(hr.Status.Conditions, meta.ReadyCondition); held == nil && c != nil && strings.Contains(c.Message, "upgradeguard is holding") {
			held = c.DeepCopy()
		}
		if d := webhook.ParseState(hr).Decision; d != "" && (len(decisions) == 0 || decisions[len(decisions)-1] != d) {
			decisions = append(decisions, d)
		}
		l := hr.Status.History.Latest()
		return readyStatus(hr) == metav1.ConditionTrue && hr.Status.ObservedGeneration == hr.Generation && l != nil && strings.HasPrefix(l.ChartVersion, fluxtest.To)
	})
	if err != nil {
		return err
	}

	step(`The gate denied the release record that helm-controller writes before it applies anything:
nothing of ` + fluxtest.To + ` was applied, no revision was stored. What ` + "`kubectl describe helmrelease`" + ` showed
while it was held:`)
	fmt.Printf("  Annotations:  %s: decision %s\n", webhook.AnnotationGate, strings.Join(decisions, " -> "))
	if held != nil {
		fmt.Printf("  Status:\n    Conditions:\n      Type: %s  Status: %s  Reason: %s\n      Message: %s\n", held.Type, held.Status, held.Reason, wrap(held.Message, "        "))
	} else {
		fmt.Println("  (helm-controller retried before the demo read the held Ready condition; the events say the same)")
	}
	if err := printEvents(ctx, g, s.HelmRelease); err != nil {
		return err
	}

	step("Meanwhile the gate's StorageMigration re-persisted every object and pruned storedVersions:")
	name := webhook.MigrationName(s.HelmRelease.Namespace, s.HelmRelease.Name)
	sm := &v1alpha1.StorageMigration{}
	if err := g.UG.Get(ctx, client.ObjectKey{Name: name}, sm); err != nil {
		return err
	}
	fmt.Printf("  StorageMigration %s: %s\n", sm.Name, sm.Status.Phase)
	fmt.Printf("    holds: %s\n", shorten(sm.Annotations[webhook.AnnotationHolds]))
	for _, r := range sm.Status.Resources {
		fmt.Printf("    %s: %d objects, %d rewritten, storedVersions %v -> %v\n", r.Name, r.Objects, r.Rewritten, r.StoredVersionsBefore, r.StoredVersionsAfter)
	}

	step(`Then upgradeguard asked helm-controller to retry at once, and the real helm-controller upgraded:`)
	fmt.Printf("  HelmRelease %s: Ready=%s: %s\n", s.HelmRelease, readyStatus(hr), fluxtest.ReadyMessage(hr))
	var history []fluxtest.Revision
	if err := t.do(func() { history = s.History(t) }); err != nil {
		return err
	}
	fmt.Println("\n$ helm history " + s.Name + " -n " + s.Name)
	for _, r := range history {
		fmt.Printf("  %d  %-10s  %s  %s\n", r.Revision, r.Status, r.Chart, r.Description)
	}
	if l := history[len(history)-1]; l.Revision != before+1 || l.Status != "deployed" {
		return fmt.Errorf("the upgrade stored revision %d (%s), want %d deployed: a revision failed on the way", l.Revision, l.Status, before+1)
	}
	fmt.Println("  v2alpha1 is gone from storedVersions (kyverno 1.13 stores v2, which the API server added):")
	return printStoredVersions(ctx, g)
}

// wrap breaks a long message into lines of about 100 characters, each after the first
// starting with prefix.
func wrap(msg, prefix string) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(msg) {
		if i > 0 && n+len(w) > 100 {
			b.WriteString("\n" + prefix)
			n = 0
		} else if i > 0 {
			b.WriteString(" ")
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}

func helmRelease(ctx context.Context, g *fluxtest.Gated, key types.NamespacedName) (*helmv2.HelmRelease, error) {
	hr := &helmv2.HelmRelease{}
	return hr, g.UG.Get(ctx, key, hr)
}

func readyStatus(hr *helmv2.HelmRelease) metav1.ConditionStatus {
	if c := apimeta.FindStatusCondition(hr.Status.Conditions, meta.ReadyCondition); c != nil {
		return c.Status
	}
	return metav1.ConditionUnknown
}

func printStoredVersions(ctx context.Context, g *fluxtest.Gated) error {
	for _, name := range fluxtest.BreakingCRDs {
		crd := &apiextv1.CustomResourceDefinition{}
		if err := g.UG.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return err
		}
		fmt.Printf("  %s status.storedVersions = %v\n", name, crd.Status.StoredVersions)
	}
	return nil
}

// printEvents prints the HelmRelease's events the gate recorded, as the Events table of
// kubectl describe does.
func printEvents(ctx context.Context, g *fluxtest.Gated, key types.NamespacedName) error {
	cs, err := kubernetes.NewForConfig(g.CP.Config)
	if err != nil {
		return err
	}
	evs, err := cs.EventsV1().Events(key.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	slices.SortFunc(evs.Items, func(a, b eventsv1.Event) int { return a.CreationTimestamp.Compare(b.CreationTimestamp.Time) })
	fmt.Println("  Events:\n    Type     Reason            From               Message")
	for _, e := range evs.Items {
		if e.Regarding.Kind != helmv2.HelmReleaseKind || e.Regarding.Name != key.Name || !strings.HasPrefix(e.Reason, "Upgrade") {
			continue
		}
		note := e.Note
		if len(note) > 150 {
			note = note[:150] + " ..."
		}
		fmt.Printf("    %-7s  %-16s  %-17s  %s\n", e.Type, e.Reason, e.ReportingController, note)
	}
	return nil
}

// demoT lets the demo use fluxtest's scenario builders, which take a testing.TB: the
// methods they call are implemented here; Fatal ends the builder (see do).
type demoT struct {
	testing.TB // nil: a method not implemented below would panic
	ctx        context.Context
	cleanups   []func()
	errs       []string
}

type fatal struct{}

func (t *demoT) Helper()                  {}
func (t *demoT) Name() string             { return "demo" }
func (t *demoT) Context() context.Context { return t.ctx }
func (t *demoT) Cleanup(f func())         { t.cleanups = append(t.cleanups, f) }
func (t *demoT) Failed() bool             { return len(t.errs) > 0 }
func (t *demoT) Log(...any)               {}
func (t *demoT) Logf(string, ...any)      {}
func (t *demoT) Error(args ...any)        { t.errs = append(t.errs, fmt.Sprint(args...)) }
func (t *demoT) Errorf(f string, args ...any) {
	t.errs = append(t.errs, fmt.Sprintf(f, args...))
}
func (t *demoT) Fatal(args ...any) { t.Error(args...); panic(fatal{}) }
func (t *demoT) Fatalf(f string, args ...any) {
	t.Errorf(f, args...)
	panic(fatal{})
}

func (t *demoT) TempDir() string {
	dir, err := os.MkdirTemp("", "upgradeguard-demo-flux-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Clean(dir)
}

// do runs f, which calls fluxtest, and returns what it reported as an error.
func (t *demoT) do(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(fatal); !ok {
				panic(r)
			}
		}
		if len(t.errs) > 0 {
			err = errors.New(strings.Join(t.errs, "\n"))
		}
	}()
	f()
	return nil
}

func (t *demoT) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
