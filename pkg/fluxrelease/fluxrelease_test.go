package fluxrelease

import (
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

func newHR(mutate func(*helmv2.HelmRelease)) *helmv2.HelmRelease {
	hr := &helmv2.HelmRelease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "flux-system", Name: "flux"},
		Spec: helmv2.HelmReleaseSpec{Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
			Chart: "flux2", Version: "2.17.2",
			SourceRef: helmv2.CrossNamespaceObjectReference{Kind: "HelmRepository", Name: "charts"},
		}}},
	}
	if mutate != nil {
		mutate(hr)
	}
	return hr
}

func TestChartChanged(t *testing.T) {
	chartRef := func(hr *helmv2.HelmRelease) {
		hr.Spec.Chart = nil
		hr.Spec.ChartRef = &helmv2.CrossNamespaceSourceReference{Kind: "OCIRepository", Name: "flux2"}
	}
	for _, tc := range []struct {
		name   string
		update func(*helmv2.HelmRelease)
		old    func(*helmv2.HelmRelease)
		want   bool
	}{
		{name: "nothing", update: func(*helmv2.HelmRelease) {}},
		{name: "version", update: func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Version = "2.18.2" }, want: true},
		{name: "version moved back", update: func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Version = "2.16.0" }, want: true},
		{name: "chart name", update: func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Chart = "flux" }, want: true},
		{name: "source", update: func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.SourceRef.Name = "mirror" }, want: true},
		{name: "source namespace made explicit", update: func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.SourceRef.Namespace = "flux-system" }},
		{name: "source in another namespace", update: func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.SourceRef.Namespace = "other" }, want: true},
		{name: "values", update: func(hr *helmv2.HelmRelease) { hr.Spec.Values = &apiextv1.JSON{Raw: []byte(`{"a":1}`)} }},
		{name: "interval", update: func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Interval = &metav1.Duration{} }},
		{name: "suspend", update: func(hr *helmv2.HelmRelease) { hr.Spec.Suspend = true }},
		{name: "labels and finalizers", update: func(hr *helmv2.HelmRelease) {
			hr.Labels, hr.Finalizers = map[string]string{"a": "b"}, []string{"finalizers.fluxcd.io"}
		}},
		{name: "status", update: func(hr *helmv2.HelmRelease) { hr.Status.LastAttemptedRevision = "2.18.2" }},
		{name: "to chartRef", update: chartRef, want: true},
		{name: "chartRef unchanged", old: chartRef, update: chartRef},
		{name: "chartRef target", old: chartRef, update: func(hr *helmv2.HelmRelease) { chartRef(hr); hr.Spec.ChartRef.Name = "other" }, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ChartChanged(newHR(tc.old), newHR(tc.update)); got != tc.want {
				t.Errorf("ChartChanged = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestValuesChanged(t *testing.T) {
	values := func(raw string) func(*helmv2.HelmRelease) {
		return func(hr *helmv2.HelmRelease) { hr.Spec.Values = &apiextv1.JSON{Raw: []byte(raw)} }
	}
	from := func(refs ...helmv2.ValuesReference) func(*helmv2.HelmRelease) {
		return func(hr *helmv2.HelmRelease) { hr.Spec.ValuesFrom = refs }
	}
	secret := helmv2.ValuesReference{Kind: "Secret", Name: "values"}
	for _, tc := range []struct {
		name        string
		old, update func(*helmv2.HelmRelease)
		want        bool
	}{
		{name: "nothing"},
		{name: "values set", update: values(`{"installCRDs":true}`), want: true},
		{name: "values changed", old: values(`{"installCRDs":false}`), update: values(`{"installCRDs":true}`), want: true},
		{name: "values removed", old: values(`{"a":1}`), want: true},
		{name: "key order and spacing", old: values(`{"a":1,"b":{"c":true}}`), update: values(`{ "b": {"c": true}, "a": 1 }`)},
		{name: "empty values", update: values(`{}`)},
		{name: "valuesFrom added", update: from(secret), want: true},
		{name: "valuesFrom key", old: from(secret), update: from(helmv2.ValuesReference{Kind: "Secret", Name: "values", ValuesKey: "prod.yaml"}), want: true},
		{name: "valuesFrom order", old: from(secret, helmv2.ValuesReference{Kind: "ConfigMap", Name: "defaults"}),
			update: from(helmv2.ValuesReference{Kind: "ConfigMap", Name: "defaults"}, secret), want: true},
		{name: "valuesFrom same", old: from(secret), update: from(secret)},
		{name: "empty valuesFrom", update: from()},
		{name: "version only", update: func(hr *helmv2.HelmRelease) { hr.Spec.Chart.Spec.Version = "2.18.2" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ValuesChanged(newHR(tc.old), newHR(tc.update)); got != tc.want {
				t.Errorf("ValuesChanged = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReleaseName(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*helmv2.HelmRelease)
		want   string
	}{
		{name: "name", want: "flux"},
		{name: "releaseName", mutate: func(hr *helmv2.HelmRelease) { hr.Spec.ReleaseName = "flux2" }, want: "flux2"},
		{name: "targetNamespace", mutate: func(hr *helmv2.HelmRelease) { hr.Spec.TargetNamespace = "tenant" }, want: "tenant-flux"},
		{name: "shortened like helm-controller", mutate: func(hr *helmv2.HelmRelease) {
			hr.Spec.TargetNamespace, hr.Name = strings.Repeat("n", 30), strings.Repeat("r", 30)
		}, want: strings.Repeat("n", 30) + "-" + strings.Repeat("r", 9) + "-"},
		{name: "history wins", mutate: func(hr *helmv2.HelmRelease) {
			hr.Spec.ReleaseName = "new"
			hr.Status.History = helmv2.Snapshots{{Name: "installed", Namespace: "flux-system", Version: 3}}
		}, want: "installed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ReleaseName(newHR(tc.mutate))
			if strings.HasSuffix(tc.want, "-") {
				if !strings.HasPrefix(got, tc.want) || len(got) != 53 {
					t.Errorf("ReleaseName = %q (%d chars), want prefix %q and 53 chars", got, len(got), tc.want)
				}
				return
			}
			if got != tc.want {
				t.Errorf("ReleaseName = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRollbackRemediation(t *testing.T) {
	for _, tc := range []struct {
		name string
		rem  *helmv2.UpgradeRemediation
		want bool
	}{
		{name: "none"},
		{name: "retries", rem: &helmv2.UpgradeRemediation{Retries: 3}, want: true},
		{name: "remediateLastFailure", rem: &helmv2.UpgradeRemediation{RemediateLastFailure: ptr.To(true)}, want: true},
		{name: "uninstall strategy", rem: &helmv2.UpgradeRemediation{Retries: 3, Strategy: ptr.To(helmv2.UninstallRemediationStrategy)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hr := newHR(func(hr *helmv2.HelmRelease) { hr.Spec.Upgrade = &helmv2.Upgrade{Remediation: tc.rem} })
			if got := RollbackRemediation(hr); got != tc.want {
				t.Errorf("RollbackRemediation = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestUninstallRemediation(t *testing.T) {
	hr := newHR(func(hr *helmv2.HelmRelease) {
		hr.Spec.Upgrade = &helmv2.Upgrade{Remediation: &helmv2.UpgradeRemediation{Retries: 1, Strategy: ptr.To(helmv2.UninstallRemediationStrategy)}}
	})
	if !UninstallRemediation(hr) || RollbackRemediation(hr) {
		t.Error("uninstall strategy with retries: want uninstall remediation only")
	}
	if UninstallRemediation(newHR(nil)) {
		t.Error("no remediation configured: want none")
	}
}

func TestOlder(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"2.17.2", "2.18.2", true}, {"2.18.2", "2.17.2", false}, {"2.18.2", "2.18.2", false},
		{"v1.17.3", "1.18.0", true}, {"latest", "1.0.0", false},
	} {
		if got := Older(tc.a, tc.b); got != tc.want {
			t.Errorf("Older(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

const ocirepos = "ocirepositories.source.toolkit.fluxcd.io"

func crd(storage string, stored []string, versions ...string) *apiextv1.CustomResourceDefinition {
	c := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: ocirepos}}
	for _, v := range versions {
		c.Spec.Versions = append(c.Spec.Versions, apiextv1.CustomResourceDefinitionVersion{Name: v, Served: true, Storage: v == storage})
	}
	c.Status.StoredVersions = stored
	return c
}

// TestRemediationRisk: OCIRepository 1.5 -> 1.6 moves storage to v1; a rollback to 1.5,
// which lacks v1, would be rejected (the fixture README's 1.6 -> 1.5 case).
func TestRemediationRisk(t *testing.T) {
	const name = ocirepos
	live := map[string]*apiextv1.CustomResourceDefinition{name: crd("v1beta2", []string{"v1beta2"}, "v1beta2")}
	incoming := []chartcrds.CRD{{CRD: crd("v1", nil, "v1beta2", "v1"), Source: predict.Templates}}
	current := []chartcrds.CRD{{CRD: crd("v1beta2", nil, "v1beta2"), Source: predict.Templates}}
	if got := remediationRisk(live, incoming, current, predict.PolicyHelm); len(got) != 1 || got[0] != name {
		t.Errorf("remediationRisk = %v, want [%s]", got, name)
	}
	// The same storage version on both sides: a rollback stays safe.
	incoming[0].CRD = crd("v1beta2", nil, "v1beta2", "v1")
	if got := remediationRisk(live, incoming, current, predict.PolicyHelm); len(got) != 0 {
		t.Errorf("remediationRisk = %v, want none", got)
	}
}

// TestRemediationRiskCreateReplace: the CRD moves from templates/ to crds/ with the new
// storage version. It leaves the release manifest, so the upgrade deletes it unless the
// live CRD carries helm.sh/resource-policy: keep (predict.Removals). Kept, under
// upgrade.crds=CreateReplace the upgrade applies it, and the rollback remediation (a Helm
// rollback, which applies templates/ only) re-applies the old templates/ CRD, which lacks
// the new storage version: rejected. Under plain Helm the upgrade leaves the live CRD as
// it is, and the rollback stays safe. Not kept, the upgrade deletes it: the rollback
// meets no live CRD, and the deletion is check's finding.
func TestRemediationRiskCreateReplace(t *testing.T) {
	kept := crd("v1beta2", []string{"v1beta2"}, "v1beta2")
	kept.Annotations = map[string]string{predict.KeepAnnotation: predict.KeepValue}
	live := map[string]*apiextv1.CustomResourceDefinition{ocirepos: kept}
	incoming := []chartcrds.CRD{{CRD: crd("v1", nil, "v1beta2", "v1"), Source: predict.CRDsDir}}
	current := []chartcrds.CRD{{CRD: crd("v1beta2", nil, "v1beta2"), Source: predict.Templates}}
	if got := remediationRisk(live, incoming, current, predict.PolicyCreateReplace); len(got) != 1 || got[0] != ocirepos {
		t.Errorf("create-replace: remediationRisk = %v, want [%s]", got, ocirepos)
	}
	if got := remediationRisk(live, incoming, current, predict.PolicyHelm); len(got) != 0 {
		t.Errorf("helm: remediationRisk = %v, want none", got)
	}
	live[ocirepos] = crd("v1beta2", []string{"v1beta2"}, "v1beta2")
	for _, p := range []predict.Policy{predict.PolicyHelm, predict.PolicyCreateReplace} {
		if got := remediationRisk(live, incoming, current, p); len(got) != 0 {
			t.Errorf("%s, not kept: remediationRisk = %v, want none (the upgrade deletes the CRD)", p, got)
		}
	}
	if got := predict.Deletes(predict.ReleaseChange{Deployer: helmController, Operation: predict.Upgrade, Live: live, Current: current, Incoming: incoming}); len(got) != 1 || got[0] != ocirepos {
		t.Errorf("Deletes = %v, want [%s]", got, ocirepos)
	}
}
