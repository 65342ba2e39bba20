package fluxtest_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"regexp"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/google/go-cmp/cmp"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

var env fluxtest.Env

// TestMain runs one control plane and one pair of Flux controllers for the package. The
// scenarios run one after another: the kyverno CRDs are cluster-scoped, and each scenario
// deletes them (keeping Flux's own) when it ends.
func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	cp, err := testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	f, err := flux.StartControllers(context.Background(), cp)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	env = fluxtest.Env{CP: cp, Flux: f}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, f.LogTail(60))
	}
	if err := f.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code
}

func needCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane and Flux")
	}
}

// rejection is the API server's answer to a CRD update that drops a stored version, in
// the wording of the minor that runs: "must appear in spec.versions" up to 1.32, the
// long "missing from spec.versions; ..." from 1.33 (kubernetes#128746).
func rejection(i int, v string) string {
	if crdversions.WordingFor(env.CP.Minor) == crdversions.WordingMustAppear {
		return fmt.Sprintf(`status.storedVersions[%d]: Invalid value: %q: must appear in spec.versions`, i, v)
	}
	return fmt.Sprintf(`status.storedVersions[%d]: Invalid value: %q: missing from spec.versions; %s was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in %s and removes %s from status.storedVersions`, i, v, v, v, v)
}

// applyRejected is what Helm 4's server-side apply reports for a CRD the API server
// rejects on storedVersions.
func applyRejected(crd string) string {
	return fmt.Sprintf(`server-side apply failed for object /%s apiextensions.k8s.io/v1, Kind=CustomResourceDefinition: CustomResourceDefinition.apiextensions.k8s.io %q is invalid: `, crd, crd) + rejection(0, "v2alpha1")
}

// bothRejected is the error of an upgrade whose two breaking CRDs were both applied and
// rejected: Helm 4 applies every object and joins the errors.
func bothRejected() string {
	return applyRejected("cleanuppolicies.kyverno.io") + " && " + applyRejected("policyexceptions.kyverno.io")
}

// upgradeFailed is helm-controller's Ready message for a failed upgrade
// (internal/reconcile/upgrade.go fmtUpgradeFailure).
func upgradeFailed(s *fluxtest.Scenario, err string) string {
	return fmt.Sprintf("Helm upgrade failed for release %s/%s with chart %s@%s: %s", s.Name, s.Name, fluxtest.ChartName, fluxtest.To, err)
}

// ociDigest is the build metadata helm-controller appends to a chart version pulled
// through an OCIRepository; dropped before comparing.
var ociDigest = regexp.MustCompile(`\+[0-9a-f]{12}\b`)

func normalize(s string) string { return ociDigest.ReplaceAllString(s, "") }

// history is `helm history` (the real Helm CLI) reduced to revision, status and chart.
func history(t *testing.T, s *fluxtest.Scenario) []string {
	t.Helper()
	var out []string
	for _, r := range s.History(t) {
		out = append(out, normalize(fmt.Sprintf("%d %s %s", r.Revision, r.Status, r.Chart)))
	}
	return out
}

func condition(hr *helmv2.HelmRelease, typ string) string {
	c := apimeta.FindStatusCondition(hr.Status.Conditions, typ)
	if c == nil {
		return "<none>"
	}
	return normalize(fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message))
}

// The kyverno CRDs as the API server holds them.
var (
	// breakingUntouched: a CRD of kyverno 1.12 whose update to 1.13 was rejected.
	breakingUntouched = fluxtest.CRDState{Storage: "v2beta1", Versions: []string{"v2", "v2alpha1", "v2beta1"}, StoredVersions: []string{"v2alpha1", "v2beta1"}}
	// updateRequests112 is updaterequests as kyverno 1.12 left it; updateRequests113
	// after kyverno 1.13's CRD was applied (storage v2); updateRequestsBack after a
	// rollback to 1.12 re-applied 1.12's CRD over 1.13's.
	updateRequests112  = fluxtest.CRDState{Storage: "v1beta1", Versions: []string{"v1beta1", "v2"}, StoredVersions: []string{"v1beta1"}}
	updateRequests113  = fluxtest.CRDState{Storage: "v2", Versions: []string{"v1beta1", "v2"}, StoredVersions: []string{"v1beta1", "v2"}}
	updateRequestsBack = fluxtest.CRDState{Storage: "v1beta1", Versions: []string{"v1beta1", "v2"}, StoredVersions: []string{"v1beta1", "v2"}}
	// admissionReports: kyverno 1.13 drops this CRD; a failed upgrade leaves it.
	admissionReports = fluxtest.CRDState{Storage: "v1alpha2", Versions: []string{"v1alpha2", "v2"}, StoredVersions: []string{"v1alpha2"}}
)

func crdsAfter(updateRequests fluxtest.CRDState) map[string]fluxtest.CRDState {
	return map[string]fluxtest.CRDState{
		"admissionreports.kyverno.io": admissionReports,
		"cleanuppolicies.kyverno.io":  breakingUntouched,
		"policyexceptions.kyverno.io": breakingUntouched,
		"updaterequests.kyverno.io":   updateRequests,
	}
}

// TestWithoutUpgradeguard reproduces production: the real helm-controller upgrades a
// kyverno release from chart 3.2.8 to 3.3.7 (kyverno#12633) on every path by which Flux
// upgrades a release, with no upgradeguard running. Each case asserts the HelmRelease's
// conditions (helm-controller's own text around the API server's rejection), the Helm
// release history read by the real Helm CLI, and the partial state the failure leaves.
func TestWithoutUpgradeguard(t *testing.T) {
	needCluster(t)
	failedHistory := []string{"1 superseded kyverno-3.0.0", "2 deployed kyverno-3.2.8", "3 failed kyverno-3.3.7"}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) *fluxtest.Scenario
		// ready, stalled and released are the conditions after the last attempt; ready
		// and released take the scenario for its release name.
		ready, released func(s *fluxtest.Scenario) string
		// stalled is the Stalled condition after the last attempt; "" when helm-controller
		// never stalls and retries with back-off instead (wait is then for failures).
		stalled string
		history []string
		crds    map[string]fluxtest.CRDState
		// configMap is the chart version in the release's ConfigMap: which chart last
		// wrote the ordinary objects.
		configMap string
	}{{
		name: "pinned version bump",
		setup: func(t *testing.T) *fluxtest.Scenario {
			return fluxtest.VersionBump(t, env, "version-bump", fluxtest.Options{})
		},
		ready:     func(s *fluxtest.Scenario) string { return "False UpgradeFailed: " + upgradeFailed(s, bothRejected()) },
		stalled:   "True RetriesExceeded: Failed to upgrade after 1 attempt(s)",
		history:   failedHistory,
		crds:      crdsAfter(updateRequests113),
		configMap: fluxtest.To,
	}, {
		name: "semver range, repository gains the version",
		setup: func(t *testing.T) *fluxtest.Scenario {
			return fluxtest.SemverRange(t, env, "semver-range", fluxtest.Options{})
		},
		ready:     func(s *fluxtest.Scenario) string { return "False UpgradeFailed: " + upgradeFailed(s, bothRejected()) },
		stalled:   "True RetriesExceeded: Failed to upgrade after 1 attempt(s)",
		history:   failedHistory,
		crds:      crdsAfter(updateRequests113),
		configMap: fluxtest.To,
	}, {
		name: "OCIRepository semver",
		setup: func(t *testing.T) *fluxtest.Scenario {
			return fluxtest.OCISemver(t, env, "oci-semver", fluxtest.Options{})
		},
		ready:     func(s *fluxtest.Scenario) string { return "False UpgradeFailed: " + upgradeFailed(s, bothRejected()) },
		stalled:   "True RetriesExceeded: Failed to upgrade after 1 attempt(s)",
		history:   failedHistory,
		crds:      crdsAfter(updateRequests113),
		configMap: fluxtest.To,
	}, {
		name: "OCIRepository moved tag",
		setup: func(t *testing.T) *fluxtest.Scenario {
			return fluxtest.OCIMovedTag(t, env, "oci-tag", fluxtest.Options{})
		},
		ready:     func(s *fluxtest.Scenario) string { return "False UpgradeFailed: " + upgradeFailed(s, bothRejected()) },
		stalled:   "True RetriesExceeded: Failed to upgrade after 1 attempt(s)",
		history:   failedHistory,
		crds:      crdsAfter(updateRequests113),
		configMap: fluxtest.To,
	}, {
		// Rollback remediation, retries 1: upgrade, rollback, upgrade again, rollback
		// again. The rollback to 3.2.8 succeeds: 1.12's CRDs still hold every stored
		// version, and updaterequests goes back to storage v1beta1 with v2 left in
		// storedVersions. Helm keeps 5 revisions (helm-controller's default maxHistory).
		name: "remediation rollback",
		setup: func(t *testing.T) *fluxtest.Scenario {
			return fluxtest.RemediationRollback(t, env, "remediation", fluxtest.Options{})
		},
		ready: func(s *fluxtest.Scenario) string {
			return "False RollbackSucceeded: Helm rollback to previous release remediation/remediation.v4 with chart kyverno@3.2.8 succeeded"
		},
		released: func(s *fluxtest.Scenario) string { return "False UpgradeFailed: " + upgradeFailed(s, bothRejected()) },
		stalled:  "True RetriesExceeded: Failed to upgrade after 2 attempt(s)",
		history: []string{
			"2 superseded kyverno-3.2.8", "3 failed kyverno-3.3.7", "4 superseded kyverno-3.2.8",
			"5 failed kyverno-3.3.7", "6 deployed kyverno-3.2.8",
		},
		crds:      crdsAfter(updateRequestsBack),
		configMap: fluxtest.From,
	}, {
		// upgrade.crds: Create applies crds/ one CRD at a time (server-side, forced) before
		// the upgrade and stops at the first rejection: the upgrade never runs, so there is
		// no failed revision, and the CRDs after the rejected one are not applied. The
		// failure is a reconcile error, not a failed release: helm-controller never
		// stalls and tries again with back-off, failing the same way each time.
		name: "upgrade.crds Create",
		setup: func(t *testing.T) *fluxtest.Scenario {
			return fluxtest.CRDsPolicy(t, env, "crds-create", helmv2.Create, fluxtest.Options{})
		},
		ready: func(s *fluxtest.Scenario) string {
			return "False UpgradeFailed: " + upgradeFailed(s, "failed to apply CustomResourceDefinitions: failed to create CustomResourceDefinition cleanuppolicies.kyverno.io: "+applyRejected("cleanuppolicies.kyverno.io"))
		},
		history:   []string{"1 superseded kyverno-3.0.0", "2 deployed kyverno-3.2.8"},
		crds:      crdsAfter(updateRequests112),
		configMap: fluxtest.From,
	}, {
		// upgrade.crds: CreateReplace applies every CRD of crds/ and joins the errors:
		// updaterequests moves to 1.13; the upgrade itself never runs, and helm-controller
		// retries with back-off as for Create.
		name: "upgrade.crds CreateReplace",
		setup: func(t *testing.T) *fluxtest.Scenario {
			return fluxtest.CRDsPolicy(t, env, "crds-create-replace", helmv2.CreateReplace, fluxtest.Options{})
		},
		ready: func(s *fluxtest.Scenario) string {
			return "False UpgradeFailed: " + upgradeFailed(s, "failed to apply CustomResourceDefinitions: failed to update CustomResourceDefinition(s): "+bothRejected())
		},
		history:   []string{"1 superseded kyverno-3.0.0", "2 deployed kyverno-3.2.8"},
		crds:      crdsAfter(updateRequests113),
		configMap: fluxtest.From,
	}, {
		// The release went 3.0.0 (CRDs on) -> 3.2.8 -> CRDs off (kept) -> 3.3.7, all
		// fine; turning the CRDs on renders 1.13's CRDs over the kept 1.12 ones.
		name: "values switch CRDs on",
		setup: func(t *testing.T) *fluxtest.Scenario {
			return fluxtest.ValuesSwitch(t, env, "values-switch", fluxtest.Options{})
		},
		ready:   func(s *fluxtest.Scenario) string { return "False UpgradeFailed: " + upgradeFailed(s, bothRejected()) },
		stalled: "True RetriesExceeded: Failed to upgrade after 1 attempt(s)",
		history: []string{
			"1 superseded kyverno-3.0.0", "2 superseded kyverno-3.2.8", "3 superseded kyverno-3.2.8",
			"4 deployed kyverno-3.3.7", "5 failed kyverno-3.3.7",
		},
		crds:      crdsAfter(updateRequests113),
		configMap: fluxtest.To,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.setup(t)
			if err := s.Trigger(t.Context()); err != nil {
				t.Fatal(err)
			}
			var hr *helmv2.HelmRelease
			if tc.stalled != "" {
				// Stalled is helm-controller's last word: it retries no more.
				hr = s.WaitCondition(t, meta.StalledCondition, metav1.ConditionTrue, "")
			} else {
				// No last word: wait for a second failed attempt, proof of the retry loop.
				hr = s.WaitFailures(t, 2)
			}
			if t.Failed() || testing.Verbose() {
				observe(t, s, hr)
			}
			stalled := tc.stalled
			if stalled == "" {
				stalled = "<none>"
			}
			if diff := cmp.Diff(stalled, condition(hr, meta.StalledCondition)); diff != "" {
				t.Errorf("Stalled (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.ready(s), condition(hr, meta.ReadyCondition)); diff != "" {
				t.Errorf("Ready (-want +got):\n%s", diff)
			}
			released := tc.ready
			if tc.released != nil {
				released = tc.released
			}
			if diff := cmp.Diff(released(s), condition(hr, "Released")); diff != "" {
				t.Errorf("Released (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.history, history(t, s)); diff != "" {
				t.Errorf("helm history (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.crds, s.CRDs(t)); diff != "" {
				t.Errorf("kyverno CRDs (-want +got):\n%s", diff)
			}
			if got := s.ChartVersionInCluster(t); got != tc.configMap {
				t.Errorf("the release's ConfigMap was last written by chart %s, want %s", got, tc.configMap)
			}
			if errs := s.ReadObjects(t); len(errs) > 0 {
				t.Errorf("objects unreadable after the failed upgrade: %v", errs)
			}
		})
	}
}

// observe logs what a scenario left behind.
func observe(t *testing.T, s *fluxtest.Scenario, hr *helmv2.HelmRelease) {
	t.Helper()
	for _, c := range hr.Status.Conditions {
		t.Logf("condition %s=%s reason=%s: %s", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, h := range s.History(t) {
		t.Logf("history %d %s %s: %s", h.Revision, h.Status, h.Chart, h.Description)
	}
	for name, st := range s.CRDs(t) {
		t.Logf("crd %s storage=%s versions=%v stored=%v", name, st.Storage, st.Versions, st.StoredVersions)
	}
	t.Logf("configmap version=%s; failures=%d upgradeFailures=%d lastAttempted=%s", s.ChartVersionInCluster(t), hr.Status.Failures, hr.Status.UpgradeFailures, hr.Status.LastAttemptedRevision)
}
