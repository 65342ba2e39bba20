package kubeclient

import (
	"context"
	"iter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// PageSize is the LIST page Pages and ListAll ask for when the caller names none.
const PageSize = 500

// Lister lists one resource, in one namespace or all: a dynamic.ResourceInterface is one.
type Lister interface {
	List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error)
}

// ListFunc lists one page. A typed client's, a dynamic client's or a metadata client's
// List method is one, so the same pager reads full objects where the caller needs their
// spec and metadata only where names, owners and versions are enough.
type ListFunc[L metav1.ListInterface] func(ctx context.Context, opts metav1.ListOptions) (L, error)

// Pages lists page by page: opts.Limit per page (PageSize when 0), then each page's
// continue token until a page carries none, so that no single response holds a whole
// large collection. opts may also carry selectors, and a continue token to resume from.
// It yields each page with a nil error, or a LIST's error, unwrapped, and then stops: the
// caller names what it listed and can tell a resource type the cluster does not serve
// from a failure. Breaking out of the loop stops the paging.
func Pages[L metav1.ListInterface](ctx context.Context, list ListFunc[L], opts metav1.ListOptions) iter.Seq2[L, error] {
	return func(yield func(L, error) bool) {
		o := opts
		if o.Limit == 0 {
			o.Limit = PageSize
		}
		for {
			page, err := list(ctx, o)
			if err != nil {
				var none L
				yield(none, err)
				return
			}
			if !yield(page, nil) {
				return
			}
			if o.Continue = page.GetContinue(); o.Continue == "" {
				return
			}
		}
	}
}

// ListAll reads every object r lists, with Pages. An error is the LIST's own, unwrapped.
func ListAll(ctx context.Context, r Lister, opts metav1.ListOptions) ([]unstructured.Unstructured, error) {
	var out []unstructured.Unstructured
	for page, err := range Pages(ctx, r.List, opts) {
		if err != nil {
			return nil, err
		}
		out = append(out, page.Items...)
	}
	return out, nil
}
