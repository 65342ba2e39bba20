//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/upgradeguard/upgradeguard/api/v1alpha1"
)

// e2eVersion2 is the version of the image the chart is upgraded to.
const e2eVersion2 = "v0.0.1-e2e"

var helmreleasesV2 = schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2", Resource: "helmreleases"}

// TestHelmUpgradeMidMigration: the chart as installed by default (one replica), upgraded
// with `helm upgrade` to an image of another version while a StorageMigration of 3,000
// HelmRepositories runs (rate-limited so that it outlasts the rollout; the upgrade starts
// once the migration has saved a place). The migration finishes under the new Pod, which
// resumes it: every object intact and stored at v1, storedVersions pruned once, two
// attempts, the new Pod's own counter under what was left. The new Pod reports the new
// version (upgradeguard_build_info, through the Pod) and runs the new image. Meanwhile a
// goroutine keeps sending a chart change of a HelmRelease (a server-side dry run, so the
// gate decides but nothing is stored) through the API server, which reaches the gate
// (failurePolicy Fail) through the Service; every answer is recorded with its time, and
// the window in which the API server could not reach the gate ("failed calling webhook")
// is measured and must be empty: with one replica the Deployment's rolling update starts
// the new Pod and waits for it to be Ready before it stops the old one, and the old Pod
// keeps serving for the chart's shutdownDelaySeconds, until its endpoint has left the
// Service (without that delay a 0.1 s window was seen).
func TestHelmUpgradeMidMigration(t *testing.T) {
	const (
		n         = 3000
		ns        = "upgrade-mid-run"
		appsNS    = "upgrade-apps"
		pageSize  = 500
		qps       = 30 // ~100 s for 3,000 objects: the rollout lands mid-run
		upgradeAt = 500
	)
	started := time.Now()
	_, newTag, newArchive := buildImage(t, e2eVersion2)
	crds, _ := fluxIncident(t, ns, n)
	rel := installChart(t, "ug-upgrade", "--set", "policy.create=false")
	ctx, cs := t.Context(), rel.cs
	if len(rel.pods) != 1 {
		t.Fatalf("%d upgradeguard pods, want 1", len(rel.pods))
	}
	oldPod := rel.pods[0].Name
	waitLeader(t, rel, func(p string) bool { return p == oldPod })
	// The new version's image on the node, as a user pushes it to their registry.
	out, err := rel.node.Ctr("images", "import", "--all-platforms", newArchive)
	must(t, err, "import the %s image into the node: %s", e2eVersion2, out)

	// A HelmRelease whose chart changes are gated, outside the release namespace.
	_, hr := gatedHelmRelease(t, appsNS)
	gate := startGateProbe(t, hr)
	if a := gate.waitAnswers(t, 1); a[0].class != answerAdmitted && a[0].class != answerDenied {
		t.Fatalf("before the upgrade the gate does not answer: %s", a[0].msg)
	} else {
		t.Logf("the gate's answer to the probe's chart change: %q", a[0].msg)
	}

	versions := watchStoredVersions(t, crds)
	c := ugClient(t)
	sm := &v1alpha1.StorageMigration{ObjectMeta: metav1.ObjectMeta{Name: "mid-upgrade"},
		Spec: v1alpha1.StorageMigrationSpec{Resources: []string{helmrepos}, Rate: v1alpha1.RateSettings{PageSize: pageSize, QPS: qps}}}
	must(t, c.Create(ctx, sm), "create StorageMigration %s", sm.Name)
	migrationStarted := time.Now()
	saved := waitMigration(t, sm.Name, 5*time.Minute, fmt.Sprintf("to save a place past object %d", upgradeAt), func(sm *v1alpha1.StorageMigration) bool {
		return len(sm.Status.Resources) == 1 && sm.Status.Resources[0].Objects >= upgradeAt && sm.Status.Resources[0].Continue != ""
	}).Status.Resources[0]
	if saved.Phase != v1alpha1.PhaseRunning || saved.Objects >= n {
		t.Fatalf("before the upgrade: progress %+v; want the first attempt part-way", saved)
	}

	// `helm upgrade` to the new image, as a user does: the same values and the new tag.
	upgradeStarted := time.Now()
	helm(t, "upgrade", "upgradeguard", chartDir(t), "-n", rel.ns,
		"--set", "image.tag="+newTag, "--set", "image.pullPolicy=Never", "--set", "certManager.enabled=false",
		"--set", "policy.create=false", "--wait", "--timeout", "4m")
	upgraded := time.Now()
	t.Logf("helm upgrade --wait took %v, %v into the migration (saved place %d objects)",
		upgraded.Sub(upgradeStarted).Round(time.Millisecond), upgradeStarted.Sub(migrationStarted).Round(time.Second), saved.Objects)

	// The rollout is over when the old Pod is gone and one new Pod is Ready.
	var newPod corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(rel.ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=upgradeguard"})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Name == oldPod || !podReady(&pods.Items[0]) {
			return false, err
		}
		newPod = pods.Items[0]
		return true, nil
	})
	must(t, err, "waiting for the old Pod %s to be gone and one new Pod Ready", oldPod)
	rolledOut := time.Now()
	if img := newPod.Spec.Containers[0].Image; !strings.HasSuffix(img, ":"+newTag) {
		t.Errorf("the new Pod %s runs image %s, want tag %s", newPod.Name, img, newTag)
	}
	if got := waitLeader(t, rel, func(p string) bool { return p == newPod.Name }); got != newPod.Name {
		t.Fatalf("the Lease is held by %s, want the new Pod %s", got, newPod.Name)
	}
	// A few more answers after the rollout, then the probe stops.
	gate.waitAfter(t, rolledOut, 10)
	answers := gate.stop()

	done := waitMigration(t, sm.Name, 10*time.Minute, "to finish", terminal)
	rp := assertSucceeded(t, done, n)
	if rp.Attempts != 2 {
		t.Errorf("%d attempts, want 2: the old Pod's and the new Pod's", rp.Attempts)
	}

	// The new Pod's own view: its version, and the part of the migration it did.
	body, err := cs.CoreV1().Pods(rel.ns).ProxyGet("http", newPod.Name, "8080", "/metrics", nil).DoRaw(ctx)
	must(t, err, "GET /metrics of %s", newPod.Name)
	if v, ok := metricSum(t, body, "upgradeguard_build_info", map[string]string{"version": e2eVersion2}); !ok || v != 1 {
		t.Errorf("the new Pod's upgradeguard_build_info{version=%q} = %v (present %v), want 1:\n%s", e2eVersion2, v, ok, grepLines(body, "upgradeguard_build_info"))
	}
	second, _ := metricSum(t, body, "upgradeguard_objects_rewritten_total", map[string]string{"cluster": "", "crd": helmrepos})
	if second <= 0 || second > float64(n-saved.Objects) {
		t.Errorf("the new Pod rewrote %v objects, want between 1 and %d (what was left after the saved place at %d)", second, n-saved.Objects, saved.Objects)
	}
	if decided, _ := metricSum(t, body, "upgradeguard_gate_decisions_total", nil); decided < 1 {
		t.Errorf("the new Pod's gate decided %v chart changes, want at least one: the probe's changes after the rollout reach it", decided)
	}
	seen, closed := versions.stop()
	if want := [][]string{{"v1beta2", "v1"}, {"v1"}}; !slices.EqualFunc(seen, want, slices.Equal) || closed {
		t.Errorf("storedVersions went %v (watch ended early: %v), want %v", seen, closed, want)
	}
	assertIntact(t, ns, n)

	// The gate through the rollout.
	w := measure(answers, upgradeStarted)
	t.Logf("gate probe: %d answers from %v before `helm upgrade` to %v after it (rollout done at +%v): %d by the gate (%d admitted, %d denied), %d unreachable, %d other; slowest answer %v",
		len(answers), answers[0].at.Sub(upgradeStarted).Round(time.Millisecond), answers[len(answers)-1].at.Sub(upgradeStarted).Round(time.Millisecond),
		rolledOut.Sub(upgradeStarted).Round(time.Millisecond), w.byGate, w.admitted, w.byGate-w.admitted, w.unreachable, w.other, w.slowest.Round(time.Millisecond))
	if w.unreachable > 0 {
		t.Errorf("the API server could not reach the gate for %d chart changes, from +%v to +%v after `helm upgrade` started (window %v); the first: %s",
			w.unreachable, w.first, w.last, w.last-w.first, w.firstMsg)
	}
	if w.other > 0 {
		t.Errorf("%d chart changes had an answer neither from the gate nor about reaching it; the first: %s", w.other, w.otherMsg)
	}
	t.Logf("TestHelmUpgradeMidMigration took %v (migration %v)", time.Since(started).Round(time.Second),
		done.Status.CompletionTime.Sub(migrationStarted).Round(time.Second))
}

// answerClass is who answered one chart change.
type answerClass int

const (
	answerAdmitted    answerClass = iota // the gate admitted it
	answerDenied                         // the gate denied it, with its own message
	answerUnreachable                    // the API server could not call the gate (failurePolicy Fail refuses it)
	answerOther                          // anything else (a client error, a conflict)
)

type answer struct {
	at    time.Time // when the answer came
	took  time.Duration
	class answerClass
	msg   string
}

// gateProbe sends the same chart change of a HelmRelease (a server-side dry run) again
// and again, ten a second, and records every answer.
type gateProbe struct {
	mu      sync.Mutex
	answers []answer
	cancel  context.CancelFunc
	done    chan struct{}
}

func startGateProbe(t *testing.T, hr *unstructured.Unstructured) *gateProbe {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Timeout = 45 * time.Second // above the webhook's timeoutSeconds
	cfg.QPS, cfg.Burst = -1, 0     // the probe sets its own pace
	dyn, err := dynamic.NewForConfig(cfg)
	must(t, err, "dynamic client")
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	p := &gateProbe{cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { p.stop() })
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			sent := time.Now()
			err := chartChange(ctx, dyn, hr)
			if ctx.Err() != nil {
				return
			}
			a := answer{at: time.Now(), took: time.Since(sent), class: classify(err)}
			if err != nil {
				a.msg = err.Error()
			}
			p.mu.Lock()
			p.answers = append(p.answers, a)
			p.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// classify tells the gate's own answers from the API server's failure to call it.
func classify(err error) answerClass {
	switch {
	case err == nil:
		return answerAdmitted
	case strings.Contains(err.Error(), `admission webhook "helmrelease.upgradeguard.io" denied the request`):
		return answerDenied
	case strings.Contains(err.Error(), "failed calling webhook"):
		return answerUnreachable
	}
	return answerOther
}

// waitAnswers waits until the probe has recorded k answers and returns them.
func (p *gateProbe) waitAnswers(t *testing.T, k int) []answer {
	t.Helper()
	var got []answer
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		got = slices.Clone(p.answers)
		return len(got) >= k, nil
	})
	must(t, err, "waiting for %d answers to the gate probe's chart changes", k)
	return got
}

// waitAfter waits until the probe has recorded k answers sent after since.
func (p *gateProbe) waitAfter(t *testing.T, since time.Time, k int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.answers) >= k && p.answers[len(p.answers)-k].at.Add(-p.answers[len(p.answers)-k].took).After(since), nil
	})
	must(t, err, "waiting for %d answers to the gate probe sent after the rollout", k)
}

// stop ends the probe and returns every answer, in order.
func (p *gateProbe) stop() []answer {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.answers)
}

// window sums up a probe's answers; first and last are the times (from the reference) of
// the first and last answer the API server gave because it could not reach the gate.
type window struct {
	byGate, admitted, unreachable, other int
	first, last, slowest                 time.Duration
	firstMsg, otherMsg                   string
}

func measure(answers []answer, ref time.Time) window {
	var w window
	for _, a := range answers {
		w.slowest = max(w.slowest, a.took)
		switch a.class {
		case answerAdmitted, answerDenied:
			w.byGate++
			if a.class == answerAdmitted {
				w.admitted++
			}
		case answerUnreachable:
			if w.unreachable == 0 {
				w.first, w.firstMsg = a.at.Sub(ref).Round(time.Millisecond), a.msg
			}
			w.unreachable++
			w.last = a.at.Sub(ref).Round(time.Millisecond)
		default:
			if w.other == 0 {
				w.otherMsg = a.msg
			}
			w.other++
		}
	}
	return w
}

func grepLines(body []byte, s string) string {
	var out []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
