// Package fluxgate_test runs the fluxtest scenarios (the kyverno 1.12 -> 1.13 storage
// boundary, on every path by which helm-controller upgrades a release) with upgradeguard
// running: the controller's manager with the HelmRelease gate, the release-record gate
// and the CRD gate on a real webhook server, the canonical webhook configuration
// (config/webhook) installed on the API server, and a StorageMigrationPolicy with
// autoMigrate for kyverno.io. Each case ends upgraded (Ready=True at the new chart,
// objects readable, storedVersions pruned), or held at the current revision with the
// reason on the HelmRelease.
package fluxgate_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/upgradeguard/upgradeguard/internal/testenv/flux"
	"github.com/upgradeguard/upgradeguard/test/fluxtest"
)

var env fluxtest.Env

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	stop, err := setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "setup:", err)
		if stop != nil {
			stop()
		}
		return 2
	}
	code := m.Run()
	if code != 0 && env.Flux != nil {
		fmt.Fprintln(os.Stderr, env.Flux.LogTail(80))
	}
	stop()
	return code
}

func setup() (func(), error) {
	ctrllog.SetLogger(logr.Discard()) // the tests read the API, not the manager's logs
	g, err := fluxtest.StartGated(context.Background())
	stop := func() { _ = g.Stop() }
	if err != nil {
		return stop, err
	}
	env = g.Env
	return stop, nil
}

func needCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane and Flux")
	}
}

// TestSemverRangeHeldMigratedUpgraded: the repository gains the breaking chart version
// while the HelmRelease (version "3.x") is unchanged; helm-controller upgrades by itself.
// See Scenario.RecordHeld.
func TestSemverRangeHeldMigratedUpgraded(t *testing.T) {
	needCluster(t)
	fluxtest.SemverRange(t, env, "semver-range", fluxtest.Options{}).RecordHeld(t)
}

func TestOCISemverHeldMigratedUpgraded(t *testing.T) {
	needCluster(t)
	fluxtest.OCISemver(t, env, "oci-semver", fluxtest.Options{}).RecordHeld(t)
}

func TestOCIMovedTagHeldMigratedUpgraded(t *testing.T) {
	needCluster(t)
	fluxtest.OCIMovedTag(t, env, "oci-tag", fluxtest.Options{}).RecordHeld(t)
}

// TestValuesSwitchHeldMigratedUpgraded: a values change turns the chart's CRDs on, and
// they would drop v2alpha1; the HelmRelease gate does not decide values changes (by
// default), the release-record gate holds helm-controller's upgrade.
func TestValuesSwitchHeldMigratedUpgraded(t *testing.T) {
	needCluster(t)
	s := fluxtest.ValuesSwitch(t, env, "values-switch", fluxtest.Options{})
	before := s.ReleaseRevision
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.Migration(t)
	hr, err := s.Flux.WaitHelmRelease(t.Context(), s.Name, s.Name, 4*time.Minute, func(hr *helmv2.HelmRelease) bool {
		l := hr.Status.History.Latest()
		return flux.ReadyAtGeneration(metav1.ConditionTrue)(hr) && l != nil && l.Version > before
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Flux.LogTail(40))
	}
	t.Logf("Ready: %s", fluxtest.ReadyMessage(hr))
	s.AssertUpgraded(t, before)
	s.Retried(t, "")
}

// TestVersionBumpHeldMigratedUpgraded: a pinned version bump, through the HelmRelease
// gate, ends upgraded by the real helm-controller.
func TestVersionBumpHeldMigratedUpgraded(t *testing.T) {
	needCluster(t)
	s := fluxtest.VersionBump(t, env, "version-bump", fluxtest.Options{})
	before := s.ReleaseRevision
	s.BumpThroughHelmReleaseGate(t)
	s.WaitUpgraded(t)
	s.AssertUpgraded(t, before)
}

// TestRemediationRollbackNotNeeded: with upgrade.remediation.strategy rollback, the
// upgrade across the boundary is held and migrated first, so it never fails and
// helm-controller never rolls back.
func TestRemediationRollbackNotNeeded(t *testing.T) {
	needCluster(t)
	s := fluxtest.RemediationRollback(t, env, "remediation", fluxtest.Options{})
	before := s.ReleaseRevision
	s.BumpThroughHelmReleaseGate(t)
	hr := s.WaitUpgraded(t)
	s.AssertUpgraded(t, before)
	if hr.Status.UpgradeFailures != 0 || hr.Status.Failures != 0 {
		t.Errorf("failures %d, upgrade failures %d; want none", hr.Status.Failures, hr.Status.UpgradeFailures)
	}
}

// TestCRDsCreateHeldByCRDGate: with upgrade.crds Create, helm-controller server-side
// applies the chart's crds/ (a forced upsert) before its release record. The HelmRelease
// gate does not predict crds/ for Create; the CRD gate denies the update that drops
// v2alpha1, starts the migration, and helm-controller's retry succeeds.
func TestCRDsCreateHeldByCRDGate(t *testing.T) {
	needCluster(t)
	fluxtest.CRDsPolicy(t, env, "crds-create", helmv2.Create, fluxtest.Options{}).HeldByCRDGate(t)
}

// TestCRDsCreateReplaceHeldByHelmReleaseGate: with upgrade.crds CreateReplace, the
// HelmRelease gate predicts crds/ and holds the version bump itself.
func TestCRDsCreateReplaceHeldByHelmReleaseGate(t *testing.T) {
	needCluster(t)
	s := fluxtest.CRDsPolicy(t, env, "crds-create-replace", helmv2.CreateReplace, fluxtest.Options{})
	before := s.ReleaseRevision
	if err := s.Trigger(t.Context()); err == nil || !strings.Contains(err.Error(), "denied the request: upgradeguard is holding the upgrade") {
		t.Fatalf("the version bump: %v; want it held", err)
	}
	s.ReapplyUntilAdmitted(t)
	s.WaitUpgraded(t)
	s.AssertUpgraded(t, before)
}
