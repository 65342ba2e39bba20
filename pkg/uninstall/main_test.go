package uninstall_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

var cp *testenv.ControlPlane

// The release-safety scenarios need PV binding, PVC protection and garbage collection:
// the control plane runs the real kube-controller-manager.
func TestMain(m *testing.M) {
	os.Exit(testenv.RunTests(m, &cp, testenv.Options{ControllerManager: true}))
}

func needCluster(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the control plane")
	}
}

func kube(t *testing.T) kubernetes.Interface {
	t.Helper()
	return kubernetes.NewForConfigOrDie(cp.Config)
}

func clients(t *testing.T) *uninstall.Clients {
	t.Helper()
	c, err := uninstall.NewClients(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func helm(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := cp.Helm(args...)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustHelm(t *testing.T, env []string, args ...string) string {
	t.Helper()
	out, err := helm(t, env, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// dbChart is a small database chart: a PVC, a credentials Secret and ConfigMaps, with
// the annotations each scenario needs coming from values.
const (
	pvcTemplate = `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: data
  {{- with .Values.pvcAnnotations }}
  annotations: {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {{ .Values.storageClass }}
  resources:
    requests:
      storage: 1Gi
`
	secretTemplate = `apiVersion: v1
kind: Secret
metadata:
  name: creds
type: Opaque
stringData:
  password: {{ .Values.password | quote }}
`
	configMapsTemplate = `{{- range $name, $ann := .Values.configMaps }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $name }}
  {{- with $ann }}
  annotations: {{- toYaml . | nindent 4 }}
  {{- end }}
data:
  x: "1"
{{- end }}
`
)

func dbChart(t *testing.T, version string, extra map[string]string) string {
	t.Helper()
	files := map[string]string{
		"values.yaml":            "storageClass: manual\npassword: changeme\nconfigMaps: {}\n",
		"templates/pvc.yaml":     pvcTemplate,
		"templates/secret.yaml":  secretTemplate,
		"templates/configs.yaml": configMapsTemplate,
	}
	for k, v := range extra {
		files[k] = v
	}
	p, err := testenv.WriteChart(t.TempDir(), "db", version, files)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// createPV pre-provisions a CSI volume for storage class class (never hostPath: the
// controller would delete a hostPath directory on this machine under Delete).
func createPV(t *testing.T, name, class string, policy corev1.PersistentVolumeReclaimPolicy) {
	t.Helper()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: policy,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: "test.csi.upgradeguard.dev", VolumeHandle: name},
			},
		},
	}
	if _, err := kube(t).CoreV1().PersistentVolumes().Create(t.Context(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func waitBound(t *testing.T, ns, pvc string) *corev1.PersistentVolumeClaim {
	t.Helper()
	var got *corev1.PersistentVolumeClaim
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = kube(t).CoreV1().PersistentVolumeClaims(ns).Get(ctx, pvc, metav1.GetOptions{})
		return err == nil && got.Status.Phase == corev1.ClaimBound, err
	})
	if err != nil {
		t.Fatalf("PVC %s/%s not Bound within a minute: %v", ns, pvc, err)
	}
	return got
}

// waitGone polls until get returns NotFound.
func waitGone(t *testing.T, what string, get func(ctx context.Context) error) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := get(ctx)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("%s still exists: %v", what, err)
	}
}

func objectByKind(rep *uninstall.Report, kind, name string) *uninstall.Object {
	for i := range rep.Objects {
		if rep.Objects[i].Kind == kind && rep.Objects[i].Name == name {
			return &rep.Objects[i]
		}
	}
	return nil
}

func findings(rep *uninstall.Report, check string) []uninstall.Finding {
	var out []uninstall.Finding
	for _, f := range rep.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

func check(t *testing.T, o uninstall.Options) *uninstall.Report {
	t.Helper()
	rep, err := uninstall.Check(t.Context(), clients(t), o)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return rep
}

func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	return dynamic.NewForConfigOrDie(cp.Config)
}

func createUnstructured(ctx context.Context, dyn dynamic.Interface, gvr schema.GroupVersionResource, ns string, obj map[string]any) error {
	_, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	return err
}

func waitGoneConfigMap(t *testing.T, ns, name string) {
	t.Helper()
	waitGone(t, "ConfigMap "+ns+"/"+name, func(ctx context.Context) error {
		_, err := kube(t).CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		return err
	})
}
