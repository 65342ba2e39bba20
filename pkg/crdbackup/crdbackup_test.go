package crdbackup_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/crdbackup"
)

const lwsFixture = "charts/lws-0.8.0/crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml"

var (
	lwsGVR    = schema.GroupVersionResource{Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"}
	gadgetGVR = schema.GroupVersionResource{Group: "backup.example.com", Version: "v1alpha1", Resource: "gadgets"}
)

// gadgetCRD is cluster-scoped, stores at v1alpha1 while v1 is served too, and has no
// status subresource: its status is a plain field.
func gadgetCRD() *apiextv1.CustomResourceDefinition {
	crd := testenv.TwoVersionCRD(gadgetGVR.Group, gadgetGVR.Resource, "Gadget")
	crd.Spec.Scope = apiextv1.ClusterScoped
	return crd
}

func lws(ns, name string, replicas int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]any{"team": ns}},
		"spec": map[string]any{"replicas": replicas, "leaderWorkerTemplate": map[string]any{"size": int64(3),
			"workerTemplate": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "worker", "image": "registry.example/infer:" + name}}}}}},
	}}
}

func lwsStatus(replicas int64) map[string]any {
	return map[string]any{"replicas": replicas, "readyReplicas": replicas - 1, "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=x",
		"conditions": []any{map[string]any{"type": "Available", "status": "True", "reason": "AllGroupsReady", "message": "all replicas are ready",
			"lastTransitionTime": "2026-03-01T10:00:00Z"}}}
}

type clients struct {
	crds apiextclient.Interface
	dyn  dynamic.Interface
	lib  *crdbackup.Clients
}

func newClients(t *testing.T) clients {
	t.Helper()
	lib, err := crdbackup.NewClients(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	return clients{crds: apiextclient.NewForConfigOrDie(cp.Config), dyn: dynamic.NewForConfigOrDie(cp.Config), lib: lib}
}

func createNamespaces(t *testing.T, names ...string) {
	t.Helper()
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	for _, n := range names {
		_, err := kube.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// deleteCRD deletes a CRD, as `kubectl delete crd` does, and waits until it is gone.
func deleteCRD(t *testing.T, c clients, name string) {
	t.Helper()
	ctx := t.Context()
	if err := c.crds.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("CRD %s not gone: %v", name, err)
	}
}

// saved is what a test compares before and after: what a user wrote and what a
// controller reported, not what the API server sets.
type saved struct {
	Labels map[string]string
	Spec   any
	Status any
	UID    types.UID
	Owners []metav1.OwnerReference
}

func snapshot(t *testing.T, c clients, gvr schema.GroupVersionResource) map[string]saved {
	t.Helper()
	list, err := c.dyn.Resource(gvr).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]saved{}
	for _, o := range list.Items {
		out[o.GetNamespace()+"/"+o.GetName()] = saved{Labels: o.GetLabels(), Spec: o.Object["spec"], Status: o.Object["status"], UID: o.GetUID(), Owners: o.GetOwnerReferences()}
	}
	return out
}

// TestRoundTrip backs up the real LeaderWorkerSet CRD of the lws chart with objects in
// three namespaces (each with a status), and a cluster-scoped CRD stored at an older
// version, deletes both CRDs (which deletes every object, down to etcd), and restores
// them into the now empty cluster: every object comes back with its spec and status, an
// owner reference follows its owner's new UID, and a second restore changes nothing.
func TestRoundTrip(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	c := newClients(t)
	if err := testenv.ApplyFixtureCRDs(ctx, c.crds, lwsFixture); err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApplyCRD(ctx, c.crds, gadgetCRD()); err != nil {
		t.Fatal(err)
	}
	namespaces := []string{"team-a", "team-b", "team-c"}
	createNamespaces(t, namespaces...)
	for _, ns := range namespaces {
		for i, name := range []string{"lws-0", "lws-1", "lws-2", "lws-3"} {
			created, err := c.dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, lws(ns, name, int64(i+2)), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			created.Object["status"] = lwsStatus(int64(i + 2))
			if _, err := c.dyn.Resource(lwsGVR).Namespace(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	owner, err := c.dyn.Resource(lwsGVR).Namespace("team-a").Get(ctx, "lws-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	child := lws("team-a", "lws-child", 1)
	child.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "leaderworkerset.x-k8s.io/v1", Kind: "LeaderWorkerSet", Name: "lws-0", UID: owner.GetUID()}})
	if _, err := c.dyn.Resource(lwsGVR).Namespace("team-a").Create(ctx, child, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"g-0", "g-1", "g-2"} {
		g := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "backup.example.com/v1alpha1", "kind": "Gadget",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"size": int64(9007199254740993) + int64(i)},
			"status": map[string]any{"phase": "Ready"}}}
		if _, err := c.dyn.Resource(gadgetGVR).Create(ctx, g, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	beforeLWS, beforeGadgets := snapshot(t, c, lwsGVR), snapshot(t, c, gadgetGVR)
	if len(beforeLWS) != 13 || len(beforeGadgets) != 3 {
		t.Fatalf("set-up: %d LeaderWorkerSets, %d Gadgets", len(beforeLWS), len(beforeGadgets))
	}

	// Back up, in pages of 5.
	lwsName, gadgetName := "leaderworkersets.leaderworkerset.x-k8s.io", gadgetCRD().Name
	dir := filepath.Join(t.TempDir(), "crd-backup")
	last := map[string]crdbackup.Progress{}
	b, err := crdbackup.Backup(ctx, c.lib, []string{lwsName, gadgetName}, dir, crdbackup.BackupOptions{PageSize: 5,
		Progress: func(p crdbackup.Progress) { last[p.CRD] = p }})
	if err != nil {
		t.Fatal(err)
	}
	if b.Objects() != 16 || len(b.CRDs) != 2 || b.CRDs[0].Objects.Count != 13 || b.CRDs[1].Version != "v1alpha1" {
		t.Fatalf("backup %+v", b)
	}
	if p := last[lwsName]; p.Done != 13 || p.Total != 13 {
		t.Errorf("last progress %+v, want 13 of 13", p)
	}
	stream, err := os.ReadFile(filepath.Join(dir, b.CRDs[0].Objects.File))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stream, []byte("managedFields")) {
		t.Error("the backup keeps managedFields")
	}
	def, err := backup.ReadYAML(dir, b.CRDs[0].File)
	if err != nil {
		t.Fatal(err)
	}
	if u := (unstructured.Unstructured{Object: def}); def["status"] != nil || u.GetUID() != "" || u.GetResourceVersion() != "" || u.GetManagedFields() != nil {
		t.Errorf("the saved CRD keeps what the API server owns: %v", u.Object["metadata"])
	}

	// Delete the CRDs: every object goes with them, in etcd too.
	deleteCRD(t, c, lwsName)
	deleteCRD(t, c, gadgetName)
	for _, gvr := range []schema.GroupVersionResource{lwsGVR, gadgetGVR} {
		left, err := cp.StoredVersions(ctx, gvr.GroupResource())
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != 0 {
			t.Fatalf("%s: %d objects left in etcd after the CRD was deleted", gvr.GroupResource(), len(left))
		}
	}

	// Restore into the cluster without them.
	res, err := crdbackup.Restore(ctx, c.lib, dir, crdbackup.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []crdbackup.RestoredCRD{
		{Name: lwsName, Kind: "LeaderWorkerSet", Version: "v1", CRD: crdbackup.Created, Objects: 13, Created: 13, Kept: []string{}, StatusRestored: 12, OwnersRelinked: 1},
		{Name: gadgetName, Kind: "Gadget", Version: "v1alpha1", CRD: crdbackup.Created, Objects: 3, Created: 3, Kept: []string{}},
	}
	if diff := cmp.Diff(want, res.CRDs); diff != "" || !res.Complete() {
		t.Errorf("restore (-want +got):\n%s", diff)
	}
	for gvr, before := range map[schema.GroupVersionResource]map[string]saved{lwsGVR: beforeLWS, gadgetGVR: beforeGadgets} {
		after := snapshot(t, c, gvr)
		if len(after) != len(before) {
			t.Errorf("%s: %d objects after the restore, want %d", gvr.Resource, len(after), len(before))
		}
		for key, b := range before {
			a, ok := after[key]
			if !ok {
				t.Errorf("%s %s not restored", gvr.Resource, key)
				continue
			}
			if a.UID == b.UID {
				t.Errorf("%s %s has its old UID: it was not re-created", gvr.Resource, key)
			}
			if diff := cmp.Diff(b, a, cmpIgnoreIdentity()); diff != "" {
				t.Errorf("%s %s after the restore (-before +after):\n%s", gvr.Resource, key, diff)
			}
		}
	}
	restoredOwner, err := c.dyn.Resource(lwsGVR).Namespace("team-a").Get(ctx, "lws-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs := snapshot(t, c, lwsGVR)["team-a/lws-child"].Owners; len(refs) != 1 || refs[0].UID != restoredOwner.GetUID() {
		t.Errorf("lws-child's owner reference %v, want the restored lws-0 (%s)", refs, restoredOwner.GetUID())
	}

	// Again: everything is there already, nothing changes.
	again, err := crdbackup.Restore(ctx, c.lib, dir, crdbackup.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := again.CRDs[0]; got.CRD != crdbackup.Existed || got.Unchanged != 13 || got.Created != 0 || !again.Complete() {
		t.Errorf("second restore: %+v", got)
	}

	// An object changed since: kept as it is, unless --overwrite.
	changed, err := c.dyn.Resource(lwsGVR).Namespace("team-b").Get(ctx, "lws-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(changed.Object, int64(7), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.dyn.Resource(lwsGVR).Namespace("team-b").Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	keep, err := crdbackup.Restore(ctx, c.lib, dir, crdbackup.RestoreOptions{CRDs: []string{lwsName}})
	if err != nil {
		t.Fatal(err)
	}
	if len(keep.CRDs) != 1 || cmp.Diff([]string{"LeaderWorkerSet/team-b/lws-1"}, keep.CRDs[0].Kept) != "" || keep.Complete() {
		t.Errorf("restore over a changed object: %+v", keep.CRDs)
	}
	over, err := crdbackup.Restore(ctx, c.lib, dir, crdbackup.RestoreOptions{CRDs: []string{lwsName}, Overwrite: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := over.CRDs[0]; got.Overwritten != 1 || got.StatusRestored != 1 || len(got.Kept) != 0 {
		t.Errorf("restore with Overwrite: %+v", got)
	}
	if diff := cmp.Diff(beforeLWS["team-b/lws-1"], snapshot(t, c, lwsGVR)["team-b/lws-1"], cmpIgnoreIdentity()); diff != "" {
		t.Errorf("overwritten object (-backup +now):\n%s", diff)
	}
}

func cmpIgnoreIdentity() cmp.Option {
	return cmp.FilterPath(func(p cmp.Path) bool {
		f := p.Last().String()
		return f == ".UID" || f == ".Owners"
	}, cmp.Ignore())
}

// TestRefusesBrokenBackup: a backup without its index (cut short before the end) and
// one whose object stream is truncated are refused with a clear error, before anything
// is created; a backup is never written over, and a CRD that does not exist writes
// nothing.
func TestRefusesBrokenBackup(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	c := newClients(t)
	crd := testenv.TwoVersionCRD("truncated.example.com", "widgets", "Widget")
	if err := testenv.ApplyCRD(ctx, c.crds, crd); err != nil {
		t.Fatal(err)
	}
	createNamespaces(t, "trunc")
	gvr := schema.GroupVersionResource{Group: "truncated.example.com", Version: "v1alpha1", Resource: "widgets"}
	for _, name := range []string{"w-0", "w-1", "w-2"} {
		w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "truncated.example.com/v1alpha1", "kind": "Widget",
			"metadata": map[string]any{"name": name, "namespace": "trunc"}, "spec": map[string]any{"text": "a long enough value to cut in half"}}}
		if _, err := c.dyn.Resource(gvr).Namespace("trunc").Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	missing := filepath.Join(t.TempDir(), "never")
	if _, err := crdbackup.Backup(ctx, c.lib, []string{"nothere.example.com"}, missing, crdbackup.BackupOptions{}); !errors.As(err, new(*crdbackup.NotFoundError)) {
		t.Errorf("backup of a CRD that does not exist: %v, want NotFoundError", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed backup left its directory: %v", err)
	}

	noIndex, truncated := filepath.Join(t.TempDir(), "no-index"), filepath.Join(t.TempDir(), "truncated")
	for _, dir := range []string{noIndex, truncated} {
		if _, err := crdbackup.Backup(ctx, c.lib, []string{crd.Name}, dir, crdbackup.BackupOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := crdbackup.Backup(ctx, c.lib, []string{crd.Name}, noIndex, crdbackup.BackupOptions{}); !errors.As(err, new(*backup.ExistsError)) {
		t.Errorf("a second backup into the same directory: %v, want backup.ExistsError", err)
	}
	if err := os.Remove(filepath.Join(noIndex, backup.IndexFile)); err != nil {
		t.Fatal(err)
	}
	stream := filepath.Join(truncated, backup.ObjectsDir, crd.Name+".yaml")
	data, err := os.ReadFile(stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stream, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	deleteCRD(t, c, crd.Name)

	_, err = crdbackup.Restore(ctx, c.lib, noIndex, crdbackup.RestoreOptions{})
	if !errors.As(err, new(*backup.IncompleteError)) || !strings.Contains(err.Error(), "holds no complete backup") {
		t.Errorf("restore without an index: %v, want backup.IncompleteError", err)
	}
	t.Logf("without an index: %v", err)
	_, err = crdbackup.Restore(ctx, c.lib, truncated, crdbackup.RestoreOptions{})
	var corrupt *crdbackup.CorruptError
	if !errors.As(err, &corrupt) || corrupt.File != filepath.Join(backup.ObjectsDir, crd.Name+".yaml") || !strings.Contains(err.Error(), "does not match its SHA-256") {
		t.Errorf("restore of a truncated stream: %v, want a CorruptError naming the stream", err)
	}
	t.Logf("truncated: %v", err)
	if _, err := c.crds.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused restore created the CRD: %v", err)
	}
}
