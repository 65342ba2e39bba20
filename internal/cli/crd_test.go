package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/crdbackup"
)

// TestCRDBackupRestore is the round trip a user runs before deleting a CRD on purpose:
// `crd backup` exits 0, the CRD is deleted with its objects, `crd restore` brings them
// back and exits 0; an object changed since is listed and exits 1; a backup that did not
// finish is refused with exit 2 and the command that takes one.
func TestCRDBackupRestore(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	crds := apiextclient.NewForConfigOrDie(cp.Config)
	dyn := dynamic.NewForConfigOrDie(cp.Config)
	crd := testenv.TwoVersionCRD("cli-backup.example.com", "sprockets", "Sprocket")
	if err := testenv.ApplyCRD(ctx, crds, crd); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "cli-backup.example.com", Version: "v1alpha1", Resource: "sprockets"}
	for _, ns := range []string{"cli-backup-a", "cli-backup-b"} {
		if _, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"s-0", "s-1"} {
			o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cli-backup.example.com/v1alpha1", "kind": "Sprocket",
				"metadata": map[string]any{"name": name, "namespace": ns}, "spec": map[string]any{"teeth": int64(12)}}}
			if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := filepath.Join(t.TempDir(), "sprockets")
	r := ug(t, "crd", "backup", crd.Name, "--dir", dir)
	if r.code != cli.ExitSafe || !strings.Contains(r.stdout, "Backed up 1 CRD(s) with 4 object(s)") || !strings.Contains(r.stdout, "upgradeguard crd restore --dir "+dir) {
		t.Fatalf("crd backup: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := ug(t, "crd", "backup", crd.Name, "--dir", dir); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "already holds a backup") {
		t.Errorf("a second backup into the same directory: exit %d, %s", r.code, r.stderr)
	}

	if err := crds.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, crd.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("CRD not deleted: %v", err)
	}

	r = ug(t, "crd", "restore", "--dir", dir, "-o", "json")
	var out struct {
		crdbackup.RestoreResult
		Complete bool `json:"complete"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || r.code != cli.ExitSafe {
		t.Fatalf("crd restore: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if len(out.CRDs) != 1 || out.CRDs[0].CRD != crdbackup.Created || out.CRDs[0].Created != 4 || !out.Complete {
		t.Errorf("crd restore: %+v", out)
	}
	got, err := dyn.Resource(gvr).Namespace("cli-backup-b").Get(ctx, "s-1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("restored object: %v", err)
	}
	if teeth, _, _ := unstructured.NestedInt64(got.Object, "spec", "teeth"); teeth != 12 {
		t.Errorf("restored spec.teeth %d, want 12", teeth)
	}

	if err := unstructured.SetNestedField(got.Object, int64(13), "spec", "teeth"); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(gvr).Namespace("cli-backup-b").Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r = ug(t, "crd", "restore", "--dir", dir)
	if r.code != cli.ExitFindings || !strings.Contains(r.stdout, "INCOMPLETE: 1 object(s)") || !strings.Contains(r.stdout, "Sprocket/cli-backup-b/s-1") {
		t.Errorf("restore over a changed object: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	if err := os.Remove(filepath.Join(dir, backup.IndexFile)); err != nil {
		t.Fatal(err)
	}
	r = ug(t, "crd", "restore", "--dir", dir)
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "holds no complete backup") || !strings.Contains(r.stderr, "upgradeguard crd backup CRD... --dir DIR") {
		t.Errorf("restore without an index: exit %d, %s", r.code, r.stderr)
	}
	if r := ug(t, "crd", "backup", crd.Name); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, `"dir" not set`) {
		t.Errorf("crd backup without --dir: exit %d, %s", r.code, r.stderr)
	}
}
