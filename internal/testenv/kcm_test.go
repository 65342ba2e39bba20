package testenv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

func TestControllerManagerMissingBinary(t *testing.T) {
	cp := &testenv.ControlPlane{KubeBin: t.TempDir()}
	err := cp.StartControllerManager()
	if err == nil || !strings.Contains(err.Error(), "run `make testbin` first") {
		t.Fatalf("error = %v, want one that says to run make testbin", err)
	}
}

// TestControllerManagerBindsPVC proves the real persistentvolume-binder runs: a PVC with
// a matching pre-provisioned PV reaches Bound, and the PV points back at the claim.
func TestControllerManagerBindsPVC(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	cp := testenv.ForTest(t, testenv.Options{ControllerManager: true})
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	ctx := t.Context()
	size := resource.MustParse("1Gi")
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "data-pv"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "manual",
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: "test.csi.upgradeguard.dev", VolumeHandle: "vol-1"},
			},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "db"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := "manual"
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "db"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims("db").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = cs.CoreV1().PersistentVolumeClaims("db").Get(ctx, "data", metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.ClaimBound, err
	})
	if err != nil {
		t.Fatalf("PVC not Bound within a minute (phase %q): %v", got.Status.Phase, err)
	}
	if got.Spec.VolumeName != "data-pv" {
		t.Errorf("PVC bound to %q, want data-pv", got.Spec.VolumeName)
	}
	live, err := cs.CoreV1().PersistentVolumes().Get(ctx, "data-pv", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ref := live.Spec.ClaimRef; ref == nil || ref.Namespace != "db" || ref.Name != "data" || ref.UID != got.UID {
		t.Errorf("PV claimRef = %+v, want db/data with the claim's UID %s", ref, got.UID)
	}
}
