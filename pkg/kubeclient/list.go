package kubeclient

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// PageSize is the LIST page ListAll asks for when the caller names none.
const PageSize = 500

// Lister lists one resource, in one namespace or all: a dynamic.ResourceInterface is one.
type Lister interface {
	List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error)
}

// ListAll reads every object r lists, page by page: opts.Limit per page (PageSize when 0),
// then each page's continue token until there is none, so that no single response holds a
// whole large collection. opts may also carry selectors. An error is the LIST's own,
// unwrapped, so that the caller can tell a resource type the cluster does not serve from
// a failure, and name what it listed.
func ListAll(ctx context.Context, r Lister, opts metav1.ListOptions) ([]unstructured.Unstructured, error) {
	if opts.Limit == 0 {
		opts.Limit = PageSize
	}
	var out []unstructured.Unstructured
	for {
		list, err := r.List(ctx, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, list.Items...)
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			return out, nil
		}
	}
}
