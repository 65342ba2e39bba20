package testenv

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
)

// StoredVersions reads every custom resource of gr straight from etcd, bypassing the API
// server (which converts what it reads to the version asked for), and returns the
// apiVersion each is stored at, keyed "namespace/name" ("name" for a cluster-scoped
// one). Only etcd can show that a migration re-persisted an object at the storage
// version: through the API every object reads the same before and after.
//
// It uses etcd's JSON gateway (/v3/kv/range on the client URL), so the tests need no
// etcd client; kube-apiserver stores custom resources as JSON under
// /registry/<group>/<resource>/.
func (cp *ControlPlane) StoredVersions(ctx context.Context, gr schema.GroupResource) (map[string]string, error) {
	e := cp.env.ControlPlane.Etcd
	if e == nil || e.URL == nil {
		return nil, fmt.Errorf("etcd is not running")
	}
	prefix := "/registry/" + gr.Group + "/" + gr.Resource + "/"
	kvs, err := etcdRange(ctx, e.URL.String(), prefix)
	if err != nil {
		return nil, fmt.Errorf("read %s from etcd: %w", gr, err)
	}
	out := make(map[string]string, len(kvs))
	for key, value := range kvs {
		var obj struct {
			APIVersion string `json:"apiVersion"`
		}
		if err := json.Unmarshal(value, &obj); err != nil {
			return nil, fmt.Errorf("etcd key %s is not a JSON object: %w", key, err)
		}
		out[strings.TrimPrefix(key, prefix)] = obj.APIVersion
	}
	return out, nil
}

// etcdRange returns every key under prefix with its value, in pages.
func etcdRange(ctx context.Context, endpoint, prefix string) (map[string][]byte, error) {
	enc := base64.StdEncoding.EncodeToString
	end := []byte(prefix)
	end[len(end)-1]++ // the range [prefix, prefix with its last byte incremented)
	out := map[string][]byte{}
	key := []byte(prefix)
	for {
		body, err := json.Marshal(map[string]any{"key": enc(key), "range_end": enc(end), "limit": 500})
		if err != nil {
			return nil, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/v3/kv/range", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s: %s", resp.Status, data)
		}
		var page struct {
			KVs []struct {
				Key   []byte `json:"key"`
				Value []byte `json:"value"`
			} `json:"kvs"`
			More bool `json:"more"`
		}
		if err := json.Unmarshal(data, &page); err != nil {
			return nil, fmt.Errorf("etcd range answer: %w", err)
		}
		for _, kv := range page.KVs {
			out[string(kv.Key)] = kv.Value
		}
		if !page.More || len(page.KVs) == 0 {
			return out, nil
		}
		// The next page starts just after the last key.
		last := page.KVs[len(page.KVs)-1].Key
		key = append(slices.Clip(last), 0)
	}
}

// RewriteAt re-persists every object of gvr with an empty patch until etcd holds each at
// apiVersion: after a CRD's storage version changed, the API server switches to it a
// moment later, so a write that came too early is repeated. Tests use it to put objects
// back at an older storage version before a migration runs again.
func (cp *ControlPlane) RewriteAt(ctx context.Context, gvr schema.GroupVersionResource, apiVersion string) error {
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	var stale []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		stored, err := cp.StoredVersions(ctx, gvr.GroupResource())
		if err != nil {
			return false, err
		}
		stale = stale[:0]
		for key, v := range stored {
			if v == apiVersion {
				continue
			}
			stale = append(stale, key)
			ns, name, ok := strings.Cut(key, "/")
			if !ok {
				ns, name = "", key
			}
			ri := dyn.Resource(gvr).Namespace(ns)
			if _, err := ri.Patch(ctx, name, types.MergePatchType, []byte("{}"), metav1.PatchOptions{}); err != nil {
				return false, fmt.Errorf("rewrite %s %s: %w", gvr.Resource, key, err)
			}
		}
		return len(stale) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%s not stored at %s in etcd: %v: %w", gvr.Resource, apiVersion, stale, err)
	}
	return nil
}

// WaitStorageVersion waits until the API server writes new objects of gvr at apiVersion
// (its CRD's storage version changed a moment ago): it creates a copy of one object of
// namespace, under another name, until etcd holds the copy at apiVersion, and deletes
// it. The existing objects are not written.
func (cp *ControlPlane) WaitStorageVersion(ctx context.Context, gvr schema.GroupVersionResource, namespace, apiVersion string) error {
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	ri := dyn.Resource(gvr).Namespace(namespace)
	list, err := ri.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return err
	}
	if len(list.Items) == 0 {
		return fmt.Errorf("no %s in namespace %q to copy", gvr.Resource, namespace)
	}
	const probe = "storage-version-probe"
	key := probe
	if namespace != "" {
		key = namespace + "/" + probe
	}
	template := list.Items[0]
	var got string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": template.GetAPIVersion(), "kind": template.GetKind(),
			"metadata": map[string]any{"name": probe, "namespace": namespace}, "spec": template.Object["spec"]}}
		if _, err := ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return false, fmt.Errorf("create %s %s: %w", gvr.Resource, key, err)
		}
		stored, err := cp.StoredVersions(ctx, gvr.GroupResource())
		if err != nil {
			return false, err
		}
		got = stored[key]
		if err := ri.Delete(ctx, probe, metav1.DeleteOptions{}); err != nil {
			return false, fmt.Errorf("delete %s %s: %w", gvr.Resource, key, err)
		}
		return got == apiVersion, nil
	})
	if err != nil {
		return fmt.Errorf("new %s stored at %q, want %s: %w", gvr.Resource, got, apiVersion, err)
	}
	return nil
}

// Unmigrate undoes a migration of CRD name: every object is stored at version old again
// (as etcd held them before the migration), the storage version is the one it was, and
// status.storedVersions is [old, storage]. A test runs another engine after it, and the
// objects it reads back from etcd then show that engine's rewrite, not an earlier one's.
func (cp *ControlPlane) Unmigrate(ctx context.Context, name, old string) error {
	cs, err := apiextclient.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	storage := ""
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storage = v.Name
		}
	}
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: storage, Resource: crd.Spec.Names.Plural}
	if err := setStorageVersion(ctx, cs, name, old); err != nil {
		return err
	}
	if err := cp.RewriteAt(ctx, gvr, crd.Spec.Group+"/"+old); err != nil {
		return err
	}
	if err := setStorageVersion(ctx, cs, name, storage); err != nil {
		return err
	}
	stored, err := cp.StoredVersions(ctx, gvr.GroupResource())
	if err != nil {
		return err
	}
	for key := range stored {
		ns, _, namespaced := strings.Cut(key, "/")
		if !namespaced {
			ns = ""
		}
		if err := cp.WaitStorageVersion(ctx, gvr, ns, crd.Spec.Group+"/"+storage); err != nil {
			return err
		}
		break
	}
	return SetStoredVersions(ctx, cs, name, old, storage)
}

// setStorageVersion makes version the CRD's storage version.
func setStorageVersion(ctx context.Context, cs apiextclient.Interface, name, version string) error {
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range crd.Spec.Versions {
			crd.Spec.Versions[i].Storage = crd.Spec.Versions[i].Name == version
		}
		_, err = api.Update(ctx, crd, metav1.UpdateOptions{})
		return err
	})
}
