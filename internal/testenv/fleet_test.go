package testenv_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// TestFleetClustersAreSeparate: three API servers on one etcd are three clusters: a
// ConfigMap created through one is not served by the others.
func TestFleetClustersAreSeparate(t *testing.T) {
	f := testenv.FleetForTest(t, 3)
	ctx := t.Context()
	clients := make([]kubernetes.Interface, len(f.Clusters))
	for i, cp := range f.Clusters {
		clients[i] = kubernetes.NewForConfigOrDie(cp.Config)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "only-in-c1", Namespace: "default"}}
	if _, err := clients[1].CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := clients[1].CoreV1().ConfigMaps("default").Get(ctx, cm.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("c1 does not serve its own ConfigMap: %v", err)
	}
	for _, i := range []int{0, 2} {
		_, err := clients[i].CoreV1().ConfigMaps("default").Get(ctx, cm.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("c%d: get c1's ConfigMap: %v, want NotFound", i, err)
		}
	}
	if f.Clusters[0].Config.Host == f.Clusters[1].Config.Host {
		t.Errorf("two clusters share the address %s", f.Clusters[0].Config.Host)
	}
}
