package kubeclient

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// pager serves names in pages of the asked Limit, with the index of the next one as the
// continue token, and records each request.
type pager struct {
	names []string
	asked []metav1.ListOptions
	err   error
}

func (p *pager) List(_ context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	p.asked = append(p.asked, opts)
	if p.err != nil {
		return nil, p.err
	}
	from := 0
	if opts.Continue != "" {
		from, _ = strconv.Atoi(opts.Continue)
	}
	to := min(from+int(opts.Limit), len(p.names))
	list := &unstructured.UnstructuredList{}
	for _, n := range p.names[from:to] {
		u := unstructured.Unstructured{}
		u.SetName(n)
		list.Items = append(list.Items, u)
	}
	if to < len(p.names) {
		list.SetContinue(strconv.Itoa(to))
	}
	return list, nil
}

func TestListAll(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	for _, tc := range []struct {
		name      string
		opts      metav1.ListOptions
		wantAsked []metav1.ListOptions
	}{
		{name: "pages of the caller's limit, selector kept", opts: metav1.ListOptions{Limit: 2, LabelSelector: "x=y"}, wantAsked: []metav1.ListOptions{
			{Limit: 2, LabelSelector: "x=y"}, {Limit: 2, LabelSelector: "x=y", Continue: "2"}, {Limit: 2, LabelSelector: "x=y", Continue: "4"}}},
		{name: "PageSize when no limit is named", wantAsked: []metav1.ListOptions{{Limit: PageSize}}},
	} {
		p := &pager{names: names}
		items, err := ListAll(t.Context(), p, tc.opts)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got []string
		for _, u := range items {
			got = append(got, u.GetName())
		}
		if diff := cmp.Diff(names, got); diff != "" {
			t.Errorf("%s: items (-want +got):\n%s", tc.name, diff)
		}
		if diff := cmp.Diff(tc.wantAsked, p.asked); diff != "" {
			t.Errorf("%s: requests (-want +got):\n%s", tc.name, diff)
		}
	}

	// The LIST's error comes back as it is, for the caller to classify.
	refused := errors.New("refused")
	if _, err := ListAll(t.Context(), &pager{err: refused}, metav1.ListOptions{}); err != refused { //nolint:errorlint // the very error, unwrapped
		t.Errorf("error %v, want the LIST's own error", err)
	}
}

func TestPages(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	for _, tc := range []struct {
		name      string
		opts      metav1.ListOptions
		stopAfter int // pages read before the loop breaks; 0 reads them all
		want      []string
		wantAsked []metav1.ListOptions
	}{
		{name: "every page", opts: metav1.ListOptions{Limit: 2}, want: names, wantAsked: []metav1.ListOptions{
			{Limit: 2}, {Limit: 2, Continue: "2"}, {Limit: 2, Continue: "4"}}},
		{name: "resumes from the caller's token", opts: metav1.ListOptions{Limit: 2, Continue: "3"}, want: []string{"d", "e"},
			wantAsked: []metav1.ListOptions{{Limit: 2, Continue: "3"}}},
		{name: "a break asks for no further page", opts: metav1.ListOptions{Limit: 2}, stopAfter: 1, want: []string{"a", "b"},
			wantAsked: []metav1.ListOptions{{Limit: 2}}},
	} {
		p := &pager{names: names}
		var got []string
		pages := 0
		for page, err := range Pages(t.Context(), p.List, tc.opts) {
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			for _, u := range page.Items {
				got = append(got, u.GetName())
			}
			if pages++; pages == tc.stopAfter {
				break
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s: items (-want +got):\n%s", tc.name, diff)
		}
		if diff := cmp.Diff(tc.wantAsked, p.asked); diff != "" {
			t.Errorf("%s: requests (-want +got):\n%s", tc.name, diff)
		}
	}

	// A LIST's error is yielded once, as it is, and ends the paging.
	refused := errors.New("refused")
	var errs []error
	for page, err := range Pages(t.Context(), (&pager{err: refused}).List, metav1.ListOptions{}) {
		if page != nil {
			t.Errorf("a page %v with the error", page)
		}
		errs = append(errs, err)
	}
	if len(errs) != 1 || errs[0] != refused { //nolint:errorlint // the very error, unwrapped
		t.Errorf("errors %v, want the LIST's own error once", errs)
	}
}
