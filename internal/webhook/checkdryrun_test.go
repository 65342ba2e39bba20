package webhook_test

import (
	"context"
	"strings"
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/livecluster"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestCheckRecognisesGateDryRun: check asks the API server about each incoming CRD with a
// dry-run write, which reaches the CRD gate registered by the shipped webhook
// configuration. For an update that drops a stored version (the bridge verdict) and one
// whose schema drops fields stored objects hold (data loss), the gate denies the dry run;
// its denial carries the gate's cause, so check reports the finding it predicts itself,
// once: no refusal beside it, and the dry run not named as unasked.
func TestCheckRecognisesGateDryRun(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	cs := apiextclient.NewForConfigOrDie(s.cp.Config)
	const group, ns = "dryrun.upgradeguard.io", "crdgate-dryrun"
	namespace(t, s.c, ns)

	// A CRD stored at v1alpha1, and one whose objects hold spec.legacy.
	probes := testenv.TwoVersionCRD(group, "probes", "Probe")
	var gauges apiextv1.CustomResourceDefinition
	if err := yaml.Unmarshal([]byte(gaugeCRD(group, true)), &gauges); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*apiextv1.CustomResourceDefinition{probes, &gauges} {
		if err := testenv.ApplyCRD(ctx, cs, c); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = s.cp.DeleteCRDs(context.WithoutCancel(ctx), func(c *apiextv1.CustomResourceDefinition) bool { return c.Spec.Group != group })
	})
	createGauges(t, group, ns, map[string]any{"legacy": "keep-me"})

	// The incoming CRDs: probes without v1alpha1 (stored), gauges without spec.legacy.
	dropped := probes.DeepCopy()
	dropped.Spec.Versions = dropped.Spec.Versions[1:]
	dropped.Spec.Versions[0].Storage = true
	var narrowed apiextv1.CustomResourceDefinition
	if err := yaml.Unmarshal([]byte(gaugeCRD(group, false)), &narrowed); err != nil {
		t.Fatal(err)
	}
	want := map[string]predict.Verdict{probes.Name: predict.Bridge, gauges.Name: predict.DataLoss}

	// The dry run itself: the gate denies it, and the API server passes its cause on.
	crds := cs.ApiextensionsV1().CustomResourceDefinitions()
	for _, next := range []*apiextv1.CustomResourceDefinition{dropped, &narrowed} {
		r, err := crdschema.Admit(ctx, crds, liveCRD(t, next.Name), next)
		if err != nil || r == nil || !r.Gate || !r.Admission || !strings.Contains(r.Message(), `admission webhook "crd.upgradeguard.io" denied the request`) {
			t.Errorf("dry run of %s: refusal %+v, %v; want the CRD gate's denial, recognised as the gate's", next.Name, r, err)
		}
	}

	cluster, err := livecluster.NewKubeCluster(s.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := check.Run(ctx, cluster, check.Request{Operation: predict.Upgrade, Incoming: []chartcrds.CRD{
		{CRD: dropped, Source: predict.Templates}, {CRD: &narrowed, Source: predict.Templates}}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Safe || len(rep.Unasked) != 0 {
		t.Errorf("check: safe %v, unasked %+v; want not safe, and every question asked (the gate's denial is an answer)", rep.Safe, rep.Unasked)
	}
	for _, c := range rep.CRDs {
		if c.Verdict != want[c.Name] || c.Refusal != nil || c.AdmissionError != "" {
			t.Errorf("%s: verdict %s (%s), refusal %+v, admission error %q; want %s alone", c.Name, c.Verdict, c.Reason, c.Refusal, c.AdmissionError, want[c.Name])
		}
	}
	if len(rep.CRDs) != len(want) {
		t.Errorf("check judged %d CRDs, want %d", len(rep.CRDs), len(want))
	}
}
