package helmrelease_test

import (
	"context"
	"strings"
	"testing"

	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
)

// TestDecodeSecret: a record written by the Helm SDK's own Secret driver (as every Helm
// client writes it) reads back through DecodeSecret, and RollbackTarget reads a pending
// rollback's target revision. The fake clientset only stores what the real driver
// encoded.
func TestDecodeSecret(t *testing.T) {
	cs := fake.NewClientset()
	d := driver.NewSecrets(cs.CoreV1().Secrets("apps"))
	rel := &release.Release{Name: "web", Namespace: "apps", Version: 4, Manifest: "---\n# Source: web/templates/cm.yaml\n",
		Chart: &chart.Chart{Metadata: &chart.Metadata{Name: "web", Version: "1.2.3"}},
		Info:  &release.Info{Status: common.StatusPendingRollback, Description: "Rollback to 2"}}
	if err := d.Create("sh.helm.release.v1.web.v4", rel); err != nil {
		t.Fatal(err)
	}
	sec, err := cs.CoreV1().Secrets("apps").Get(context.Background(), "sh.helm.release.v1.web.v4", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !helmrelease.Pending(sec.Labels[helmrelease.LabelStatus]) || sec.Labels[helmrelease.LabelOwner] != helmrelease.OwnerHelm {
		t.Errorf("labels %v are not a pending record's", sec.Labels)
	}
	got, err := helmrelease.DecodeSecret(sec)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "web" || got.Version != 4 || got.Chart.Metadata.Version != "1.2.3" || got.Manifest != rel.Manifest {
		t.Errorf("decoded %s v%d chart %s manifest %q", got.Name, got.Version, got.Chart.Metadata.Version, got.Manifest)
	}
	if n := helmrelease.RollbackTarget(got); n != 2 {
		t.Errorf("RollbackTarget = %d, want 2", n)
	}

	sec.Type = "Opaque"
	if _, err := helmrelease.DecodeSecret(sec); err == nil || !strings.Contains(err.Error(), "not a Helm release record") {
		t.Errorf("an Opaque Secret: %v", err)
	}
	sec.Type = helmrelease.SecretType
	sec.Data["release"] = []byte("sentinel-not-base64!")
	if _, err := helmrelease.DecodeSecret(sec); err == nil || strings.Contains(err.Error(), "sentinel") {
		t.Errorf("an undecodable record: %v (must fail without echoing the data)", err)
	}
}
