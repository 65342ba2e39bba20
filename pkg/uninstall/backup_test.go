package uninstall_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

// TestBackupRestores takes a backup, lets the real uninstall delete the claim and the
// credentials, and restores from the files alone: the Secret comes back with its value and
// the re-created claim binds (by the real PV binder) to the same retained volume.
func TestBackupRestores(t *testing.T) {
	needCluster(t)
	ns := "backup"
	const sentinel = "s3ntinel-backup-7f1c9e"
	createPV(t, "pv-backup-data", "sc-backup", corev1.PersistentVolumeReclaimRetain)
	mustHelm(t, nil, "install", "db", dbChart(t, "1.0.0", nil), "-n", ns, "--create-namespace",
		"--set", "storageClass=sc-backup", "--set", "password="+sentinel)
	bound := waitBound(t, ns, "data")
	ctx := t.Context()
	c := clients(t)
	dir := filepath.Join(t.TempDir(), "backup")
	res, err := uninstall.Backup(ctx, c, uninstall.Options{Release: "db", Namespace: ns}, dir)
	if err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for _, f := range res.Files {
		subjects = append(subjects, f.Subject)
	}
	wantSubjects := []string{"Secret/backup/creds", "PersistentVolumeClaim/backup/data", "PersistentVolume/pv-backup-data"}
	if !sameSet(subjects, wantSubjects) {
		t.Fatalf("backed up %v, want %v", subjects, wantSubjects)
	}

	// Modes, the index, and no Secret value outside the Secret's own file.
	for _, p := range []string{dir, filepath.Join(dir, uninstall.ObjectsDir)} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v err %v, want 0700", p, st.Mode().Perm(), err)
		}
	}
	index, err := os.ReadFile(filepath.Join(dir, uninstall.IndexFile))
	if err != nil {
		t.Fatal(err)
	}
	var fromIndex uninstall.BackupResult
	if err := json.Unmarshal(index, &fromIndex); err != nil || len(fromIndex.Files) != 3 {
		t.Fatalf("index: %v, %d files", err, len(fromIndex.Files))
	}
	if bytes.Contains(index, []byte(sentinel)) || bytes.Contains(index, []byte(base64.StdEncoding.EncodeToString([]byte(sentinel)))) {
		t.Error("the index holds the Secret's value")
	}
	files := map[string]map[string]any{}
	for _, f := range append(fromIndex.Files, uninstall.BackupFile{Kind: "index", File: uninstall.IndexFile}) {
		st, err := os.Stat(filepath.Join(dir, f.File))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v err %v, want 0600", f.File, st.Mode().Perm(), err)
		}
		if f.Kind == "index" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, f.File))
		if err != nil {
			t.Fatal(err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(data, &obj); err != nil {
			t.Fatal(err)
		}
		files[f.Kind] = obj
		if f.Kind != "Secret" && bytes.Contains(data, []byte(base64.StdEncoding.EncodeToString([]byte(sentinel)))) {
			t.Errorf("%s holds the Secret's value", f.File)
		}
		u := unstructured.Unstructured{Object: obj}
		if u.GetUID() != "" || u.GetResourceVersion() != "" || u.GetManagedFields() != nil || u.GetOwnerReferences() != nil ||
			hasKey(obj, "metadata", "creationTimestamp") || obj["status"] != nil {
			t.Errorf("%s is not sanitised: %v", f.File, obj["metadata"])
		}
	}
	if got := fromIndex.Files[indexOf(fromIndex.Files, "Secret")].Keys; len(got) != 1 || got[0] != "password" {
		t.Errorf("Secret keys in index: %v", got)
	}
	ref, _, _ := unstructured.NestedMap(files["PersistentVolume"], "spec", "claimRef")
	if ref["uid"] != nil || ref["resourceVersion"] != nil || ref["name"] != "data" || ref["namespace"] != ns {
		t.Errorf("PV claimRef %v: want namespace/name kept, uid and resourceVersion cleared", ref)
	}

	if hasKey(files["PersistentVolumeClaim"], "metadata", "annotations", "pv.kubernetes.io/bind-completed") {
		t.Error("the claim keeps the binder's bind-completed annotation: re-created, it would go Lost")
	}

	read, err := uninstall.ReadBackup(dir)
	if err != nil || read.Dir != dir || len(read.Files) != 3 || read.Revision != res.Revision {
		t.Errorf("ReadBackup: %+v, %v", read, err)
	}
	if read.Kind != backup.KindRelease || read.Format != backup.Format {
		t.Errorf("index header %+v, want a %s backup in format %s", read.Header, backup.KindRelease, backup.Format)
	}
	if _, err := uninstall.ReadBackup(t.TempDir()); !errors.As(err, new(*backup.IncompleteError)) {
		t.Errorf("ReadBackup of an empty directory: %v, want backup.IncompleteError", err)
	}

	// A second backup never overwrites the first.
	if _, err := uninstall.Backup(ctx, c, uninstall.Options{Release: "db", Namespace: ns}, dir); !errors.As(err, new(*backup.ExistsError)) {
		t.Errorf("second backup into the same directory: %v, want backup.ExistsError", err)
	}

	// The real uninstall deletes the claim and the Secret; the Retain volume stays.
	mustHelm(t, nil, "uninstall", "db", "-n", ns)
	cs := kube(t)
	waitGone(t, "claim data", func(ctx context.Context) error {
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		return err
	})

	// Restore from the files alone: Secret and claim created as they are, the volume
	// replaced by its sanitised definition.
	dyn := dynamicClient(t)
	create := func(kind, resource string, namespaced bool) {
		gvr := schema.GroupVersionResource{Version: "v1", Resource: resource}
		u := &unstructured.Unstructured{Object: files[kind]}
		var err error
		if namespaced {
			_, err = dyn.Resource(gvr).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		} else {
			_, err = dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatalf("restore %s from the backup: %v", kind, err)
		}
	}
	if err := cs.CoreV1().PersistentVolumes().Delete(ctx, "pv-backup-data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "PV pv-backup-data", func(ctx context.Context) error {
		_, err := cs.CoreV1().PersistentVolumes().Get(ctx, "pv-backup-data", metav1.GetOptions{})
		return err
	})
	create("Secret", "secrets", true)
	create("PersistentVolumeClaim", "persistentvolumeclaims", true)
	create("PersistentVolume", "persistentvolumes", false)
	restored := waitBound(t, ns, "data")
	if restored.Spec.VolumeName != bound.Spec.VolumeName {
		t.Errorf("restored claim bound to %q, want the same volume %q", restored.Spec.VolumeName, bound.Spec.VolumeName)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, "pv-backup-data", metav1.GetOptions{})
		return err == nil && pv.Status.Phase == corev1.VolumeBound && pv.Spec.ClaimRef.UID == restored.UID && pv.Spec.CSI.VolumeHandle == "pv-backup-data", err
	})
	if err != nil {
		t.Errorf("restored PV not bound to the restored claim: %v", err)
	}
	s, err := cs.CoreV1().Secrets(ns).Get(ctx, "creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(s.Data["password"]) != sentinel {
		t.Error("restored Secret does not hold the original value")
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, s := range a {
		m[s]++
	}
	for _, s := range b {
		m[s]--
	}
	for _, v := range m {
		if v != 0 {
			return false
		}
	}
	return true
}

func indexOf(files []uninstall.BackupFile, kind string) int {
	for i, f := range files {
		if f.Kind == kind {
			return i
		}
	}
	return -1
}

func hasKey(obj map[string]any, path ...string) bool {
	_, found, _ := unstructured.NestedFieldNoCopy(obj, path...)
	return found
}
