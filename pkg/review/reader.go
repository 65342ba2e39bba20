package review

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v4/pkg/cli"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// scheme knows the objects a HelmRelease reads: its sources and the ConfigMaps and
// Secrets of its values. It is built at its first use, not in every command's start-up.
var scheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = sourcev1.AddToScheme(s)
	return s
})

// treeReader reads objects from a revision's files as a client reads them from a cluster,
// the object nearest to a file first (Tree.Find): what a HelmRelease in that file reads
// once Flux applies the revision. An object the tree lacks is NotFound, and the message
// says it is not in the repository.
type treeReader struct {
	tree *Tree
	near string
	// settings carry Helm's paths for fetching a GitRepository chart's dependencies.
	settings *cli.EnvSettings
}

var _ client.Reader = treeReader{}

func (r treeReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	gvk, err := apiutil.GVKForObject(obj, scheme())
	if err != nil {
		return err
	}
	o, ok := r.tree.Find(Key{GroupKind: gvk.GroupKind(), Namespace: key.Namespace, Name: key.Name}, r.near)
	if !ok {
		// A manifest without a namespace takes the one its Kustomization or the HelmRelease
		// gives it.
		o, ok = r.tree.Find(Key{GroupKind: gvk.GroupKind(), Name: key.Name}, r.near)
	}
	if !ok {
		return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
			Message: fmt.Sprintf("%s %s is not in the repository at %s", gvk.Kind, key, r.tree.Revision)}}
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, obj); err != nil {
		return fmt.Errorf("%s %s in %s: %w", gvk.Kind, key, o.File, err)
	}
	if obj.GetNamespace() == "" {
		obj.SetNamespace(key.Namespace)
	}
	return nil
}

func (r treeReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return fmt.Errorf("a repository's objects are read one by one, not listed")
}
