package fluxtest_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/apis/meta"
	"github.com/google/go-cmp/cmp"
	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
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
	f, err := cp.StartFluxControllers(context.Background())
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

// rejection is the API server's answer to a CRD update that drops a stored version.
func rejection(i int, v string) string {
	return fmt.Sprintf(`status.storedVersions[%d]: Invalid value: %q: missing from spec.versions; %s was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in %s and removes %s from status.storedVersions`, i, v, v, v, v)
}

// upgradeFailed is helm-controller's Ready message prefix for a failed upgrade
// (internal/reconcile/upgrade.go fmtUpgradeFailure).
func upgradeFailed(s *fluxtest.Scenario) string {
	return fmt.Sprintf("Helm upgrade failed for release %s/%s with chart %s@%s: ", s.Name, s.Name, fluxtest.ChartName, fluxtest.To)
}

// history is `helm history` reduced to revision, status and chart.
func history(t *testing.T, s *fluxtest.Scenario) []string {
	t.Helper()
	var out []string
	for _, r := range s.History(t) {
		out = append(out, fmt.Sprintf("%d %s %s", r.Revision, r.Status, r.Chart))
	}
	return out
}

func ready(hr *helmv2.HelmRelease) string {
	c := apimeta.FindStatusCondition(hr.Status.Conditions, meta.ReadyCondition)
	if c == nil {
		return "<no Ready condition>"
	}
	return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
}

// assertIncident checks what every storedVersions failure leaves behind: the API server
// rejected both breaking CRDs, which keep kyverno 1.12's spec; the upgrade's other CRD
// (updaterequests) was applied; the objects are still readable.
func assertIncident(t *testing.T, s *fluxtest.Scenario, msg string) {
	t.Helper()
	for _, crd := range fluxtest.BreakingCRDs {
		if !strings.Contains(msg, crd) {
			t.Errorf("message does not name %s:\n%s", crd, msg)
		}
	}
	if !strings.Contains(msg, rejection(0, "v2alpha1")) {
		t.Errorf("message does not carry the API server's storedVersions rejection:\n%s", msg)
	}
	crds := s.CRDs(t)
	for _, name := range fluxtest.BreakingCRDs {
		want := fluxtest.CRDState{Storage: "v2beta1", Versions: []string{"v2alpha1", "v2beta1", "v2"}, StoredVersions: []string{"v2alpha1", "v2beta1"}}
		if diff := cmp.Diff(want, crds[name]); diff != "" {
			t.Errorf("%s after the failed upgrade (-want +got):\n%s", name, diff)
		}
	}
	if errs := s.ReadObjects(t); len(errs) > 0 {
		t.Errorf("objects unreadable after the failed upgrade: %v", errs)
	}
}

// observe logs what a scenario left behind, for the operator guide.
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
	t.Logf("configmap version=%s; failures=%d installFailures=%d upgradeFailures=%d lastAttempted=%s", s.ChartVersionInCluster(t), hr.Status.Failures, hr.Status.InstallFailures, hr.Status.UpgradeFailures, hr.Status.LastAttemptedRevision)
}

func TestVersionBump(t *testing.T) {
	needCluster(t)
	s := fluxtest.VersionBump(t, env, "version-bump", fluxtest.Options{})
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	hr := s.WaitFailed(t, "storedVersions")
	observe(t, s, hr)
	assertIncident(t, s, ready(hr))
}

func TestSemverRange(t *testing.T) {
	needCluster(t)
	s := fluxtest.SemverRange(t, env, "semver-range", fluxtest.Options{})
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	hr := s.WaitFailed(t, "storedVersions")
	observe(t, s, hr)
	assertIncident(t, s, ready(hr))
}

func TestOCISemver(t *testing.T) {
	needCluster(t)
	s := fluxtest.OCISemver(t, env, "oci-semver", fluxtest.Options{})
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	hr := s.WaitFailed(t, "storedVersions")
	observe(t, s, hr)
	assertIncident(t, s, ready(hr))
}

func TestOCIMovedTag(t *testing.T) {
	needCluster(t)
	s := fluxtest.OCIMovedTag(t, env, "oci-tag", fluxtest.Options{})
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	hr := s.WaitFailed(t, "storedVersions")
	observe(t, s, hr)
	assertIncident(t, s, ready(hr))
}

func TestRemediationRollback(t *testing.T) {
	needCluster(t)
	s := fluxtest.RemediationRollback(t, env, "remediation", fluxtest.Options{})
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	hr := s.WaitCondition(t, meta.StalledCondition, "True", "")
	observe(t, s, hr)
}

func TestCRDsCreate(t *testing.T) {
	needCluster(t)
	s := fluxtest.CRDsPolicy(t, env, "crds-create", helmv2.Create, fluxtest.Options{})
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	hr := s.WaitFailed(t, "storedVersions")
	observe(t, s, hr)
}

func TestCRDsCreateReplace(t *testing.T) {
	needCluster(t)
	s := fluxtest.CRDsPolicy(t, env, "crds-create-replace", helmv2.CreateReplace, fluxtest.Options{})
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	hr := s.WaitFailed(t, "storedVersions")
	observe(t, s, hr)
}

func TestValuesSwitch(t *testing.T) {
	needCluster(t)
	s := fluxtest.ValuesSwitch(t, env, "values-switch", fluxtest.Options{})
	if err := s.Trigger(t.Context()); err != nil {
		t.Fatal(err)
	}
	hr := s.WaitFailed(t, "storedVersions")
	observe(t, s, hr)
}
