package check_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

var cp *testenv.ControlPlane

func TestMain(m *testing.M) { os.Exit(testenv.RunTests(m, &cp)) }

// dir lists every CRD file of one fixture set, e.g. dir("flux-source-controller/v1.6.0").
func dir(t *testing.T, set string) []string {
	t.Helper()
	files, err := testenv.FixtureSet(set)
	if err != nil {
		t.Fatal(err)
	}
	return files
}

type scenario struct {
	name string
	// steps are fixture file sets applied in order, as successive releases would.
	steps [][]string
	// stored overrides status.storedVersions after the steps, for long-lived clusters.
	stored   map[string][]string
	incoming []string
	op       predict.Operation
	want     map[string]predict.Verdict
	// switchTo is the expected storage switch for bridge verdicts.
	switchTo map[string]string
}

const (
	gitrepos  = "gitrepositories.source.toolkit.fluxcd.io"
	helmrepos = "helmrepositories.source.toolkit.fluxcd.io"
	charts    = "helmcharts.source.toolkit.fluxcd.io"
	buckets   = "buckets.source.toolkit.fluxcd.io"
	ocirepos  = "ocirepositories.source.toolkit.fluxcd.io"
	hrs       = "helmreleases.helm.toolkit.fluxcd.io"
	ks        = "kustomizations.kustomize.toolkit.fluxcd.io"
	imgrepos  = "imagerepositories.image.toolkit.fluxcd.io"
	imgpols   = "imagepolicies.image.toolkit.fluxcd.io"
	imgauto   = "imageupdateautomations.image.toolkit.fluxcd.io"
	alerts    = "alerts.notification.toolkit.fluxcd.io"
	providers = "providers.notification.toolkit.fluxcd.io"
	receivers = "receivers.notification.toolkit.fluxcd.io"
)

func scenarios(t *testing.T) []scenario {
	d := func(set string) []string { return dir(t, set) }
	all := func(names ...string) map[string]predict.Verdict {
		m := map[string]predict.Verdict{}
		for _, n := range names {
			m[n] = predict.OK
		}
		return m
	}
	with := func(m map[string]predict.Verdict, v predict.Verdict, names ...string) map[string]predict.Verdict {
		for _, n := range names {
			m[n] = v
		}
		return m
	}
	fluxChart := func(v string) []string { return []string{"charts/flux2-" + v + "/rendered/crds.yaml"} }
	fluxAll := []string{hrs, imgauto, imgpols, imgrepos, ks, alerts, providers, receivers, buckets,
		"externalartifacts.source.toolkit.fluxcd.io", gitrepos, charts, helmrepos, ocirepos}
	return []scenario{
		// Flux source-controller.
		{name: "flux source 0.36.1->1.0.0 storage promotion", steps: [][]string{d("flux-source-controller/v0.36.1")},
			incoming: d("flux-source-controller/v1.0.0"), want: all(gitrepos)},
		{name: "flux source 1.2.0->1.3.0", steps: [][]string{d("flux-source-controller/v1.2.0")},
			incoming: d("flux-source-controller/v1.3.0"), want: all(helmrepos, charts, buckets)},
		{name: "flux source 1.3.0->1.4.0 bucket promotion", steps: [][]string{d("flux-source-controller/v1.2.0"), d("flux-source-controller/v1.3.0")},
			incoming: d("flux-source-controller/v1.4.0"), want: all(buckets)},
		{name: "flux source 1.5.0->1.6.0 OCIRepository promotion", steps: [][]string{d("flux-source-controller/v1.5.0")},
			incoming: d("flux-source-controller/v1.6.0"), want: all(ocirepos, gitrepos, helmrepos, charts, buckets)},
		{name: "flux source rollback 1.6.0->1.5.0", steps: [][]string{d("flux-source-controller/v1.5.0"), d("flux-source-controller/v1.6.0")},
			incoming: d("flux-source-controller/v1.5.0"), op: predict.Rollback,
			want: with(map[string]predict.Verdict{}, predict.Bridge, ocirepos), switchTo: map[string]string{ocirepos: "v1beta2"}},
		{name: "flux source 1.6.0->1.7.0 with every old version stored", steps: [][]string{d("flux-source-controller/v1.6.0")},
			stored: map[string][]string{gitrepos: {"v1beta1", "v1beta2", "v1"}, helmrepos: {"v1beta1", "v1beta2", "v1"},
				charts: {"v1beta1", "v1beta2", "v1"}, buckets: {"v1beta1", "v1beta2", "v1"}},
			incoming: d("flux-source-controller/v1.7.0"), want: with(all(ocirepos), predict.Migrate, gitrepos, helmrepos, charts, buckets)},
		{name: "flux source 1.6.0->1.7.0 with v1beta2,v1 stored", steps: [][]string{d("flux-source-controller/v1.6.0")},
			stored:   map[string][]string{gitrepos: {"v1beta2", "v1"}, helmrepos: {"v1beta2", "v1"}},
			incoming: d("flux-source-controller/v1.7.0"), want: all(ocirepos, gitrepos, helmrepos, charts, buckets)},
		{name: "flux source 1.7.0->1.8.0 with v1beta2 stored", steps: [][]string{d("flux-source-controller/v1.7.0")},
			stored: map[string][]string{gitrepos: {"v1", "v1beta2"}, helmrepos: {"v1beta2", "v1"}, charts: {"v1beta2", "v1"},
				buckets: {"v1beta2", "v1"}, ocirepos: {"v1beta2", "v1"}},
			incoming: d("flux-source-controller/v1.8.0"), want: with(all(), predict.Migrate, gitrepos, helmrepos, charts, buckets, ocirepos)},
		{name: "flux source 1.7.0->1.8.0 after migration", steps: [][]string{d("flux-source-controller/v1.7.0")},
			incoming: d("flux-source-controller/v1.8.0"), want: all(gitrepos, helmrepos, charts, buckets, ocirepos)},
		// Flux helm-controller.
		{name: "flux helm 0.36.2->0.37.4->1.0.0", steps: [][]string{d("flux-helm-controller/v0.36.2"), d("flux-helm-controller/v0.37.4")},
			incoming: d("flux-helm-controller/v1.0.0"), want: all(hrs)},
		{name: "flux helm 1.0.0->1.4.0 drops v2beta1", steps: [][]string{d("flux-helm-controller/v0.36.2"), d("flux-helm-controller/v0.37.4"), d("flux-helm-controller/v1.0.0")},
			incoming: d("flux-helm-controller/v1.4.0"), want: with(all(), predict.Migrate, hrs)},
		{name: "flux helm 1.4.0->1.5.0 drops v2beta2", steps: [][]string{d("flux-helm-controller/v1.4.0")},
			stored: map[string][]string{hrs: {"v2", "v2beta2"}}, incoming: d("flux-helm-controller/v1.5.0"), want: with(all(), predict.Migrate, hrs)},
		{name: "flux helm 1.4.0->1.5.0 after migration", steps: [][]string{d("flux-helm-controller/v1.4.0")},
			incoming: d("flux-helm-controller/v1.5.0"), want: all(hrs)},
		// Flux image controllers.
		{name: "flux image-reflector 0.35.2->1.0.0 storage switch and v1beta1 removal", steps: [][]string{d("flux-image-reflector-controller/v0.35.2")},
			stored:   map[string][]string{imgrepos: {"v1beta1", "v1beta2"}, imgpols: {"v1beta1", "v1beta2"}},
			incoming: d("flux-image-reflector-controller/v1.0.0"), want: with(all(), predict.Migrate, imgrepos, imgpols)},
		{name: "flux image-reflector 0.35.2->1.0.0 with v1beta2 stored", steps: [][]string{d("flux-image-reflector-controller/v0.35.2")},
			incoming: d("flux-image-reflector-controller/v1.0.0"), want: all(imgrepos, imgpols)},
		{name: "flux image-reflector 1.0.0->1.2.0 drops v1beta2", steps: [][]string{d("flux-image-reflector-controller/v0.35.2"), d("flux-image-reflector-controller/v1.0.0")},
			incoming: d("flux-image-reflector-controller/v1.2.0"), want: with(all(), predict.Migrate, imgrepos, imgpols)},
		{name: "flux image-reflector 0.35.2->1.2.0 skipping 1.0 needs a bridge", steps: [][]string{d("flux-image-reflector-controller/v0.35.2")},
			incoming: d("flux-image-reflector-controller/v1.2.0"), want: with(all(), predict.Bridge, imgrepos, imgpols)},
		{name: "flux image-automation 0.41.2->1.0.0", steps: [][]string{d("flux-image-automation-controller/v0.41.2")},
			stored: map[string][]string{imgauto: {"v1beta1", "v1beta2"}}, incoming: d("flux-image-automation-controller/v1.0.0"), want: with(all(), predict.Migrate, imgauto)},
		{name: "flux image-automation 1.0.0->1.2.0", steps: [][]string{d("flux-image-automation-controller/v0.41.2"), d("flux-image-automation-controller/v1.0.0")},
			incoming: d("flux-image-automation-controller/v1.2.0"), want: with(all(), predict.Migrate, imgauto)},
		{name: "flux image-automation 1.0.0->1.2.0 after migration", steps: [][]string{d("flux-image-automation-controller/v1.0.0")},
			incoming: d("flux-image-automation-controller/v1.2.0"), want: all(imgauto)},
		// Flux notification-controller.
		{name: "flux notification 0.33.0->1.1.0", steps: [][]string{d("flux-notification-controller/v0.33.0")},
			incoming: d("flux-notification-controller/v1.1.0"), want: all(alerts, providers, receivers)},
		{name: "flux notification 1.1.0->1.2.0", steps: [][]string{d("flux-notification-controller/v1.1.0")},
			incoming: d("flux-notification-controller/v1.2.0"), want: all(alerts, providers, receivers)},
		{name: "flux notification 1.2.0->1.7.0 with every old version stored", steps: [][]string{d("flux-notification-controller/v1.2.0")},
			stored:   map[string][]string{alerts: {"v1beta1", "v1beta2", "v1beta3"}, providers: {"v1beta1", "v1beta2", "v1beta3"}, receivers: {"v1beta1", "v1beta2", "v1"}},
			incoming: d("flux-notification-controller/v1.7.0"), want: with(all(), predict.Migrate, alerts, providers, receivers)},
		{name: "flux notification 1.7.0->1.9.0 with v1beta2 stored", steps: [][]string{d("flux-notification-controller/v1.7.0")},
			stored:   map[string][]string{alerts: {"v1beta2", "v1beta3"}, providers: {"v1beta2", "v1beta3"}, receivers: {"v1beta2", "v1"}},
			incoming: d("flux-notification-controller/v1.9.0"), want: with(all(), predict.Migrate, alerts, providers, receivers)},
		// Flux kustomize-controller.
		{name: "flux kustomize 0.35.1->1.0.0", steps: [][]string{d("flux-kustomize-controller/v0.35.1")},
			incoming: d("flux-kustomize-controller/v1.0.0"), want: all(ks)},
		{name: "flux kustomize 1.0.0->1.7.0 with every old version stored", steps: [][]string{d("flux-kustomize-controller/v1.0.0")},
			stored: map[string][]string{ks: {"v1", "v1beta1", "v1beta2"}}, incoming: d("flux-kustomize-controller/v1.7.0"), want: with(all(), predict.Migrate, ks)},
		{name: "flux kustomize 1.7.0->1.8.0 with v1beta2 stored", steps: [][]string{d("flux-kustomize-controller/v1.7.0")},
			stored: map[string][]string{ks: {"v1", "v1beta2"}}, incoming: d("flux-kustomize-controller/v1.8.0"), want: with(all(), predict.Migrate, ks)},
		{name: "flux kustomize 1.7.0->1.8.0 after migration", steps: [][]string{d("flux-kustomize-controller/v1.7.0")},
			incoming: d("flux-kustomize-controller/v1.8.0"), want: all(ks)},
		// The flux2 community chart: the production upgrade incident.
		{name: "flux2 chart 2.17.2->2.18.2 with old versions stored", steps: [][]string{fluxChart("2.17.2")},
			stored: map[string][]string{buckets: {"v1beta2", "v1"}, gitrepos: {"v1beta2", "v1"}, charts: {"v1beta2", "v1"}, helmrepos: {"v1beta2", "v1"},
				ocirepos: {"v1beta2", "v1"}, ks: {"v1beta2", "v1"}, hrs: {"v2beta2", "v2"}},
			incoming: fluxChart("2.18.2"), want: with(all(fluxAll...), predict.Migrate, buckets, gitrepos, charts, helmrepos, ocirepos, ks, hrs)},
		{name: "flux2 chart 2.18.2->2.18.3", steps: [][]string{fluxChart("2.18.2")}, incoming: fluxChart("2.18.3"), want: all(fluxAll...)},
		// External Secrets Operator.
		{name: "ESO 0.15.1->0.16.2 with v1alpha1 stored", steps: [][]string{d("external-secrets/v0.15.1")},
			stored: map[string][]string{"externalsecrets.external-secrets.io": {"v1alpha1", "v1beta1"}, "secretstores.external-secrets.io": {"v1alpha1", "v1beta1"},
				"clustersecretstores.external-secrets.io": {"v1alpha1", "v1beta1"}},
			incoming: d("external-secrets/v0.16.2"),
			want:     with(all(), predict.Migrate, "externalsecrets.external-secrets.io", "secretstores.external-secrets.io", "clustersecretstores.external-secrets.io")},
		{name: "ESO 0.15.1->0.16.2 with v1beta1 stored", steps: [][]string{d("external-secrets/v0.15.1")}, incoming: d("external-secrets/v0.16.2"),
			want: all("externalsecrets.external-secrets.io", "secretstores.external-secrets.io", "clustersecretstores.external-secrets.io")},
		{name: "ESO 0.16.2->0.17.0 stops serving v1beta1", steps: [][]string{d("external-secrets/v0.15.1"), d("external-secrets/v0.16.2")}, incoming: d("external-secrets/v0.17.0"),
			want: all("externalsecrets.external-secrets.io", "secretstores.external-secrets.io", "clustersecretstores.external-secrets.io")},
		// Kyverno: kyverno#12633, reached through its real release history.
		{name: "kyverno 1.12.6->1.13.4", steps: [][]string{d("kyverno/v1.10.7"), d("kyverno/v1.11.4"), d("kyverno/v1.12.6")}, incoming: d("kyverno/v1.13.4"),
			want: with(all("updaterequests.kyverno.io"), predict.Migrate, "cleanuppolicies.kyverno.io", "policyexceptions.kyverno.io")},
		// cert-manager.
		{name: "cert-manager 1.5.5->1.6.3 stops serving old versions", steps: [][]string{d("cert-manager/v1.5.5")},
			stored: map[string][]string{"certificates.cert-manager.io": {"v1alpha2", "v1alpha3", "v1beta1", "v1"}}, incoming: d("cert-manager/v1.6.3"),
			want: all("certificates.cert-manager.io", "certificaterequests.cert-manager.io", "issuers.cert-manager.io")},
		{name: "cert-manager 1.6.3->1.7.0 with v1alpha2 stored", steps: [][]string{d("cert-manager/v1.6.3")},
			stored: map[string][]string{"certificates.cert-manager.io": {"v1alpha2", "v1"}, "issuers.cert-manager.io": {"v1alpha2", "v1"}}, incoming: d("cert-manager/v1.7.0"),
			want: with(all("certificaterequests.cert-manager.io"), predict.Migrate, "certificates.cert-manager.io", "issuers.cert-manager.io")},
		{name: "cert-manager 1.6.3->1.7.0 after migration", steps: [][]string{d("cert-manager/v1.6.3")}, incoming: d("cert-manager/v1.7.0"),
			want: all("certificates.cert-manager.io", "certificaterequests.cert-manager.io", "issuers.cert-manager.io")},
		// Crossplane rollbacks.
		{name: "crossplane CompositionRevision rollback 1.11.1->1.10.2", steps: [][]string{d("crossplane/v1.10.2"), d("crossplane/v1.11.1")},
			incoming: d("crossplane/v1.10.2"), op: predict.Rollback,
			want: with(all(), predict.Bridge, "compositionrevisions.apiextensions.crossplane.io"), switchTo: map[string]string{"compositionrevisions.apiextensions.crossplane.io": "v1alpha1"}},
		{name: "crossplane EnvironmentConfig rollback 1.18.0->1.17.3", steps: [][]string{d("crossplane/v1.17.3"), d("crossplane/v1.18.0")},
			incoming: d("crossplane/v1.17.3"), op: predict.Rollback,
			want:     with(all("functions.pkg.crossplane.io", "functionrevisions.pkg.crossplane.io"), predict.Bridge, "environmentconfigs.apiextensions.crossplane.io"),
			switchTo: map[string]string{"environmentconfigs.apiextensions.crossplane.io": "v1alpha1"}},
		{name: "crossplane EnvironmentConfig rollback 1.18.2->1.17.3 (fixed storage)", steps: [][]string{d("crossplane/v1.17.3"), d("crossplane/v1.18.2")},
			incoming: d("crossplane/v1.17.3"), op: predict.Rollback,
			want: all("functions.pkg.crossplane.io", "functionrevisions.pkg.crossplane.io", "environmentconfigs.apiextensions.crossplane.io")},
		{name: "crossplane Function rollback 1.17.3->1.16.0", steps: [][]string{d("crossplane/v1.16.0"), d("crossplane/v1.17.3")},
			incoming: d("crossplane/v1.16.0"), op: predict.Rollback,
			want:     with(all(), predict.Bridge, "functions.pkg.crossplane.io", "functionrevisions.pkg.crossplane.io"),
			switchTo: map[string]string{"functions.pkg.crossplane.io": "v1beta1", "functionrevisions.pkg.crossplane.io": "v1beta1"}},
		{name: "crossplane 1.20.0->2.0.0 with every old version stored", steps: [][]string{d("crossplane/v1.20.0")},
			stored: map[string][]string{"environmentconfigs.apiextensions.crossplane.io": {"v1alpha1", "v1beta1"},
				"compositionrevisions.apiextensions.crossplane.io": {"v1alpha1", "v1beta1", "v1"}},
			incoming: d("crossplane/v2.0.0"),
			want: with(all("compositeresourcedefinitions.apiextensions.crossplane.io"), predict.Migrate,
				"environmentconfigs.apiextensions.crossplane.io", "compositionrevisions.apiextensions.crossplane.io")},
		// Controls: no version transition.
		{name: "velero 1.12.0->1.18.1", steps: [][]string{d("velero/v1.12.0")}, incoming: d("velero/v1.18.1"),
			want: all("backuprepositories.velero.io", "datauploads.velero.io")},
		{name: "kro 0.2.0->0.9.3", steps: [][]string{d("kro/v0.2.0")}, incoming: d("kro/v0.9.3"),
			want: all("resourcegraphdefinitions.kro.run", "graphrevisions.internal.kro.run")},
	}
}

// TestVerdictsAgreeWithAPIServer runs every fixture transition on the real API server:
// the verdict must match, and applying the incoming CRDs must be rejected exactly when the
// verdict is migrate or bridge. It then carries out the fix the verdict names (prune, or
// switch storage and prune; there are no objects to migrate here) and checks that the API
// server then accepts the incoming CRD.
func TestVerdictsAgreeWithAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cs := apiextclient.NewForConfigOrDie(cp.Config)
	cluster, err := livecluster.NewKubeCluster(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scenarios(t) {
		t.Run(sc.name, func(t *testing.T) {
			ctx := t.Context()
			if err := cp.DeleteAllCRDs(ctx); err != nil {
				t.Fatal(err)
			}
			for _, step := range sc.steps {
				applyAll(t, ctx, cs, mustRead(t, step...))
			}
			for name, stored := range sc.stored {
				if err := testenv.SetStoredVersions(ctx, cs, name, stored...); err != nil {
					t.Fatalf("set storedVersions of %s: %v", name, err)
				}
			}
			incoming := mustRead(t, sc.incoming...)
			op := sc.op
			if op == "" {
				op = predict.Upgrade
			}
			req := check.Request{Operation: op}
			for _, c := range incoming {
				req.Incoming = append(req.Incoming, chartcrds.CRD{CRD: c, Source: predict.Templates})
			}
			rep, err := check.Run(ctx, cluster, req)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]predict.Verdict{}
			for _, c := range rep.CRDs {
				got[c.Name] = c.Verdict
				if want := sc.switchTo[c.Name]; c.Verdict == predict.Bridge && c.StorageSwitchTo != want {
					t.Errorf("%s: storageSwitchTo = %q, want %q", c.Name, c.StorageSwitchTo, want)
				}
				if c.Verdict != predict.OK && c.Action == "" {
					t.Errorf("%s: verdict %s without an action", c.Name, c.Verdict)
				}
				if live := c.LiveStorageVersion != ""; live != (c.Objects != nil) || (live && *c.Objects != 0) {
					t.Errorf("%s: objects = %v for a CRD that is live=%v, want 0 for live ones and none for new ones", c.Name, c.Objects, live)
				}
			}
			if diff := diffVerdicts(sc.want, got); diff != "" {
				t.Errorf("verdicts (-want +got):\n%s", diff)
			}
			if rep.Safe != (len(rep.Findings()) == 0) {
				t.Errorf("safe = %v with %d findings", rep.Safe, len(rep.Findings()))
			}

			for _, in := range incoming {
				verdict := got[in.Name]
				err := testenv.ApplyCRD(ctx, cs, in)
				blocked := verdict == predict.Migrate || verdict == predict.Bridge
				switch {
				case blocked && err == nil:
					t.Errorf("%s: verdict %s, but the API server accepted the incoming CRD", in.Name, verdict)
				case blocked && !crdversions.IsStoredVersionRejection(err):
					t.Errorf("%s: verdict %s, want a storedVersions rejection, got %v", in.Name, verdict, err)
				case blocked:
					// The wording changed in 1.33 (kubernetes#128746): "must appear in
					// spec.versions" before, "missing from spec.versions; ... must remain
					// in spec.versions" since.
					for _, r := range crdversions.StoredVersionRejections(err.Error()) {
						if want := crdversions.WordingFor(cp.Minor); r.CRD != in.Name || r.Wording != want {
							t.Errorf("%s: Kubernetes 1.%d rejected %s %s worded %q, want %s worded %q", in.Name, cp.Minor, r.CRD, r.Version, r.Wording, in.Name, want)
						}
					}
				case !blocked && err != nil:
					t.Errorf("%s: verdict %s, but the API server rejected the incoming CRD: %v", in.Name, verdict, err)
				}
				if blocked {
					applyFix(t, ctx, cs, rep, in)
				}
			}
		})
	}
	if err := cp.DeleteAllCRDs(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// applyFix carries out what the verdict prescribes, on a cluster without objects, and
// checks that the incoming CRD is then accepted.
func applyFix(t *testing.T, ctx context.Context, cs apiextclient.Interface, rep *check.Report, in *apiextv1.CustomResourceDefinition) {
	t.Helper()
	var f *check.CRDReport
	for i := range rep.CRDs {
		if rep.CRDs[i].Name == in.Name {
			f = &rep.CRDs[i]
		}
	}
	target := f.LiveStorageVersion
	if f.Verdict == predict.Bridge {
		if f.StorageSwitchTo == "" {
			return // a stepping stone is needed; covered by the stepping-stone test
		}
		target = f.StorageSwitchTo
		live, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, in.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range live.Spec.Versions {
			live.Spec.Versions[i].Storage = live.Spec.Versions[i].Name == target
		}
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, live, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("%s: switch storage to %s: %v", in.Name, target, err)
		}
	}
	if err := testenv.SetStoredVersions(ctx, cs, in.Name, target); err != nil {
		t.Fatalf("%s: prune storedVersions to [%s]: %v", in.Name, target, err)
	}
	if err := testenv.ApplyCRD(ctx, cs, in); err != nil {
		t.Errorf("%s: after the fix the API server still rejects the incoming CRD: %v", in.Name, err)
	}
}

func applyAll(t *testing.T, ctx context.Context, cs apiextclient.Interface, crds []*apiextv1.CustomResourceDefinition) {
	t.Helper()
	for _, c := range crds {
		if err := testenv.ApplyCRD(ctx, cs, c); err != nil {
			t.Fatalf("apply %s (%s): %v", c.Name, crdversions.StorageVersion(c), err)
		}
	}
}

func mustRead(t *testing.T, files ...string) []*apiextv1.CustomResourceDefinition {
	t.Helper()
	crds, err := testenv.ReadCRDs(files...)
	if err != nil {
		t.Fatal(err)
	}
	return crds
}

func diffVerdicts(want, got map[string]predict.Verdict) string {
	var lines []string
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			lines = append(lines, fmt.Sprintf("-%s: %s\n+%s: %s", name, w, name, g))
		}
	}
	for name, g := range got {
		if _, ok := want[name]; !ok {
			lines = append(lines, fmt.Sprintf("+%s: %s (unexpected)", name, g))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
