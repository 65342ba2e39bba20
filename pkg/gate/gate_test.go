package gate_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/gate"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

func read(t *testing.T, files ...string) []chartcrds.CRD {
	t.Helper()
	crds, err := testenv.ReadCRDs(files...)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]chartcrds.CRD, 0, len(crds))
	for _, c := range crds {
		out = append(out, chartcrds.CRD{CRD: c, Source: predict.Templates})
	}
	return out
}

// emptyCluster removes every CRD before and after a test.
func emptyCluster(t *testing.T) apiextclient.Interface {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	if err := cp.DeleteAllCRDs(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.DeleteAllCRDs(context.WithoutCancel(t.Context())) })
	return apiextclient.NewForConfigOrDie(cp.Config)
}

func applyAll(t *testing.T, cs apiextclient.Interface, crds []chartcrds.CRD) error {
	t.Helper()
	for _, c := range crds {
		if err := testenv.ApplyCRD(t.Context(), cs, c.CRD); err != nil {
			return err
		}
	}
	return nil
}

func condition(t *testing.T, d *gate.Decision, typ string) metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(d.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, d.Conditions)
	}
	return *c
}

// TestDecideConverges: a version bump across the storage boundary is blocked while
// automatic migration is off; with it on, Decide reports Migrating while its budget runs
// out, then Proceed once the migration completes, and the incoming CRDs are accepted.
func TestDecideConverges(t *testing.T) {
	ctx := t.Context()
	cs := emptyCluster(t)
	if err := applyAll(t, cs, read(t, "crds/flux-source-controller/v1.2.0/source.toolkit.fluxcd.io_helmrepositories.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := testenv.CreateObjects(ctx, cp.Config, testenv.Objects{GVR: schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1beta2", Resource: "helmrepositories"},
		Kind: "HelmRepository", Namespaces: []string{"a"}, PerNS: 60, Spec: map[string]any{"url": "https://charts.example.com", "interval": "10m"}}); err != nil {
		t.Fatal(err)
	}
	if err := applyAll(t, cs, read(t, "charts/flux2-2.17.2/rendered/crds.yaml")); err != nil {
		t.Fatal(err)
	}
	incoming := read(t, "charts/flux2-2.18.2/rendered/crds.yaml")
	o := gate.Options{ObservedGeneration: 3, Migrate: migrate.Options{LeaseNamespace: "default", Holder: "my-operator", PageSize: 10}}

	d, err := gate.Decide(ctx, cp.Config, incoming, o)
	if err != nil || d.Outcome != gate.Blocked {
		t.Fatalf("auto off: %v %+v", err, d)
	}
	if c := condition(t, d, gate.ConditionRequired); c.Status != metav1.ConditionTrue || c.Reason != gate.ReasonMigrationRequired || c.ObservedGeneration != 3 {
		t.Errorf("required condition %+v", c)
	}
	if c := condition(t, d, gate.ConditionInProgress); c.Status != metav1.ConditionFalse || c.Reason != gate.ReasonAutoMigrationOff {
		t.Errorf("in-progress condition %+v", c)
	}
	// The message names the command that migrates exactly the CRDs to migrate.
	if want := (cmdline.Migrate{CRDs: d.ToMigrate}).String(); len(d.ToMigrate) == 0 || !strings.Contains(d.Message, want) {
		t.Errorf("message %q does not name %q", d.Message, want)
	}

	// A rate limit and a short budget: the first call cannot finish. On a loaded machine
	// a budget can run out before the first page is rewritten; the calls go on (as a
	// controller's retries do) until one has saved a place past some objects.
	slow := migrate.RateLimit(cp.Config, 20, 1)
	o.AutoMigrate, o.Budget = true, time.Second
	for try := 1; ; try++ {
		d, err = gate.Decide(ctx, slow, incoming, o)
		if err != nil || d.Outcome != gate.Migrating {
			t.Fatalf("first auto call (try %d): %v %+v", try, err, d)
		}
		if len(d.Migrations) == 1 && d.Migrations[0].Objects > 0 {
			break
		}
		if try == 10 {
			t.Fatalf("ten calls of a second each rewrote nothing: %+v", d.Migrations)
		}
	}
	if c := condition(t, d, gate.ConditionInProgress); c.Status != metav1.ConditionTrue || c.Reason != gate.ReasonMigrating {
		t.Errorf("in-progress condition %+v", c)
	}
	if err := applyAll(t, cs, incoming); err == nil {
		t.Fatal("the incoming CRDs were accepted while the migration was still running")
	}

	o.Budget = time.Minute
	d, err = gate.Decide(ctx, cp.Config, incoming, o)
	if err != nil || d.Outcome != gate.Proceed {
		t.Fatalf("second auto call: %v %+v", err, d)
	}
	// It carried on where the first call's budget ran out, instead of listing from the start.
	if len(d.Migrations) != 1 {
		t.Errorf("second auto call: %d migrations, want 1", len(d.Migrations))
	} else if m := d.Migrations[0]; !m.Resumed || m.Objects >= 60 {
		t.Errorf("second auto call's migration %+v, want it resumed with fewer than 60 objects left", *m)
	}
	if c := condition(t, d, gate.ConditionRequired); c.Status != metav1.ConditionFalse || c.Reason != gate.ReasonMigrated {
		t.Errorf("required condition after the migration %+v", c)
	}
	if err := applyAll(t, cs, incoming); err != nil {
		t.Fatalf("incoming CRDs rejected after Proceed: %v", err)
	}
	if d, err = gate.Decide(ctx, cp.Config, incoming, o); err != nil || d.Outcome != gate.Proceed || len(d.Migrations) != 0 {
		t.Errorf("after the upgrade: %v %+v", err, d)
	}
}

// TestDecideBlocksBridge: a bridge cannot be automated; Decide blocks with the reason.
func TestDecideBlocksBridge(t *testing.T) {
	cs := emptyCluster(t)
	if err := applyAll(t, cs, read(t, "crds/flux-image-reflector-controller/v0.35.2/image.toolkit.fluxcd.io_imagepolicies.yaml")); err != nil {
		t.Fatal(err)
	}
	d, err := gate.Decide(t.Context(), cp.Config, read(t, "crds/flux-image-reflector-controller/v1.2.0/image.toolkit.fluxcd.io_imagepolicies.yaml"),
		gate.Options{AutoMigrate: true, Migrate: migrate.Options{LeaseNamespace: "default"}})
	if err != nil || d.Outcome != gate.Blocked || len(d.Migrations) != 0 {
		t.Fatalf("%v %+v", err, d)
	}
	if c := condition(t, d, gate.ConditionRequired); c.Reason != gate.ReasonBridgeRequired || c.Status != metav1.ConditionTrue {
		t.Errorf("required condition %+v", c)
	}
}
