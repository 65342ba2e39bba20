package crdbackup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/backup"
)

// verify reads a CRD's files whole and checks them against the index; it collects the
// namespaces and UIDs the objects had.
func (r *restorer) verify(crd CRD, namespaces map[string]bool) error {
	corrupt := func(file, format string, args ...any) error {
		return &CorruptError{Dir: r.dir, File: file, Reason: fmt.Sprintf(format, args...)}
	}
	def, err := backup.ReadYAML(r.dir, crd.File)
	if err != nil {
		return corrupt(crd.File, "cannot be read (%v)", err)
	}
	if u := (unstructured.Unstructured{Object: def}); u.GetKind() != "CustomResourceDefinition" || u.GetName() != crd.Name {
		return corrupt(crd.File, "is not CustomResourceDefinition %s", crd.Name)
	}
	f, err := backup.Open(r.dir, crd.Objects.File)
	if err != nil {
		return corrupt(crd.Objects.File, "cannot be read (%v)", err)
	}
	defer func() { _ = f.Close() }() // read only
	// The whole file is hashed, even past a document that does not read: a file cut
	// short or altered is named as such first.
	h := sha256.New()
	in := io.TeeReader(f, h)
	var n int64
	var bad error
	err = backup.ReadObjects(in, func(obj map[string]any) error {
		n++
		u := unstructured.Unstructured{Object: obj}
		if u.GetKind() != crd.Kind || u.GetName() == "" || (u.GetNamespace() != "") != crd.Namespaced {
			if bad == nil {
				bad = fmt.Errorf("object %d is not a %s", n, crd.Kind)
			}
			return nil
		}
		if crd.Namespaced {
			namespaces[u.GetNamespace()] = true
		}
		if uid := u.GetUID(); uid != "" {
			r.inBackup[uid] = true
		}
		return nil
	})
	if _, cerr := io.Copy(io.Discard, in); cerr != nil {
		return corrupt(crd.Objects.File, "cannot be read (%v)", cerr)
	}
	if err == nil {
		err = bad
	}
	switch {
	case hex.EncodeToString(h.Sum(nil)) != crd.Objects.SHA256:
		return corrupt(crd.Objects.File, "does not match its SHA-256 in the index (it was cut short or altered after the backup)")
	case err != nil:
		return corrupt(crd.Objects.File, "cannot be read (%v)", err)
	case n != crd.Objects.Count:
		return corrupt(crd.Objects.File, "holds %d object(s) where the index says %d", n, crd.Objects.Count)
	}
	return nil
}

var namespaceResource = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// checkNamespaces fails when a namespace the objects live in does not exist.
func (r *restorer) checkNamespaces(ctx context.Context, namespaces map[string]bool) error {
	var missing []string
	for ns := range namespaces {
		_, err := r.c.Dynamic.Resource(namespaceResource).Get(ctx, ns, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, ns)
		case err != nil:
			return fmt.Errorf("read namespace %s: %w", ns, err)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return &MissingNamespacesError{Names: missing}
	}
	return nil
}
