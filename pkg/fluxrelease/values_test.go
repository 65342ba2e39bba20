package fluxrelease

import (
	"context"
	"errors"
	"strings"
	"testing"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/chartutil"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// sentinel stands for Secret content: it must never reach an error.
const sentinel = "SENTINEL-c0ffee"

func ref(kind, name string, mutate ...func(*helmv2.ValuesReference)) helmv2.ValuesReference {
	r := helmv2.ValuesReference{Kind: kind, Name: name}
	for _, m := range mutate {
		m(&r)
	}
	return r
}

// TestValues covers the composition rules through chartutil (order, default key,
// targetPath, optional) and the errors this package builds on top of it. The API
// server's part (reading the objects) is tested in internal/webhook and pkg/audit.
func TestValues(t *testing.T) {
	objs := []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "flux-system", Name: "base"},
			Data: map[string]string{"values.yaml": "installCRDs: false\na: {b: 1, c: 1}\n", "other.yaml": "a: {c: 2}\n"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "flux-system", Name: "creds"},
			Data: map[string][]byte{"values.yaml": []byte("installCRDs: true\nsentinel: " + sentinel + "\n"),
				"flag": []byte("true"), "broken": []byte("a: [" + sentinel), "set": []byte("x," + sentinel), "lit": []byte("x," + sentinel)}},
	}
	r := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(objs...).Build()
	tgt := func(p string) func(*helmv2.ValuesReference) {
		return func(r *helmv2.ValuesReference) { r.TargetPath = p }
	}
	key := func(k string) func(*helmv2.ValuesReference) {
		return func(r *helmv2.ValuesReference) { r.ValuesKey = k }
	}
	opt := func(r *helmv2.ValuesReference) { r.Optional = true }
	lit := func(r *helmv2.ValuesReference) { r.Literal = true }

	for _, tc := range []struct {
		name   string
		refs   []helmv2.ValuesReference
		inline string
		want   map[string]any
		reason error
		says   []string
	}{
		{name: "inline only", inline: `{"installCRDs":true}`, want: map[string]any{"installCRDs": true}},
		{name: "in order, later wins, default key values.yaml",
			refs: []helmv2.ValuesReference{ref("ConfigMap", "base"), ref("ConfigMap", "base", key("other.yaml"))},
			want: map[string]any{"installCRDs": false, "a": map[string]any{"b": float64(1), "c": float64(2)}}},
		{name: "inline on top of the references",
			refs: []helmv2.ValuesReference{ref("ConfigMap", "base")}, inline: `{"a":{"b":3}}`,
			want: map[string]any{"installCRDs": false, "a": map[string]any{"b": float64(3), "c": float64(1)}}},
		{name: "targetPath with --set syntax",
			refs: []helmv2.ValuesReference{ref("ConfigMap", "base"), ref("Secret", "creds", key("flag"), tgt("installCRDs"))},
			want: map[string]any{"installCRDs": true, "a": map[string]any{"b": float64(1), "c": float64(1)}}},
		{name: "literal targetPath keeps the value verbatim",
			refs: []helmv2.ValuesReference{ref("Secret", "creds", key("lit"), tgt("x.y"), lit)},
			want: map[string]any{"x": map[string]any{"y": "x," + sentinel}}},
		{name: "optional missing object and key are skipped",
			refs: []helmv2.ValuesReference{ref("Secret", "nope", opt), ref("ConfigMap", "base", key("nokey"), opt), ref("Secret", "creds", key("flag"), tgt("installCRDs"))},
			want: map[string]any{"installCRDs": true}},
		{name: "missing object", refs: []helmv2.ValuesReference{ref("Secret", "nope")}, reason: chartutil.ErrResourceNotFound,
			says: []string{"HelmRelease flux-system/flux", "Secret flux-system/nope key values.yaml does not exist", "create the Secret, or mark the reference optional: true"}},
		{name: "missing key", refs: []helmv2.ValuesReference{ref("ConfigMap", "base", key("nokey"))}, reason: chartutil.ErrKeyNotFound,
			says: []string{"spec.valuesFrom ConfigMap flux-system/base has no key nokey", "set valuesKey"}},
		{name: "unreadable YAML", refs: []helmv2.ValuesReference{ref("Secret", "creds", key("broken"))}, reason: chartutil.ErrValuesDataRead,
			says: []string{"does not hold a YAML map of values (content not shown)"}},
		{name: "bad --set value", refs: []helmv2.ValuesReference{ref("Secret", "creds", key("set"), tgt("x"))}, reason: chartutil.ErrValueMerge,
			says: []string{"cannot be set at targetPath x", "literal: true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hr := newHR(func(hr *helmv2.HelmRelease) {
				hr.Spec.ValuesFrom = tc.refs
				if tc.inline != "" {
					hr.Spec.Values = &apiextv1.JSON{Raw: []byte(tc.inline)}
				}
			})
			got, err := Values(t.Context(), r, hr)
			if tc.reason == nil {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("values (-want +got):\n%s", diff)
				}
				return
			}
			var verr *ValuesError
			if !errors.As(err, &verr) || !errors.Is(err, tc.reason) {
				t.Fatalf("want a *ValuesError for %v, got %T %v", tc.reason, err, err)
			}
			for _, s := range append(tc.says, "helm-controller fails the release with ValuesError") {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q:\n%v", s, err)
				}
			}
			if strings.Contains(err.Error(), sentinel) {
				t.Errorf("error carries the Secret's content")
			}
		})
	}
}

// forbidden is a Reader the API server refuses.
type forbidden struct{ client.Reader }

func (forbidden) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "creds", errors.New("no RBAC"))
}

func TestValuesForbidden(t *testing.T) {
	hr := newHR(func(hr *helmv2.HelmRelease) { hr.Spec.ValuesFrom = []helmv2.ValuesReference{ref("Secret", "creds")} })
	_, err := Values(t.Context(), forbidden{}, hr)
	var verr *ValuesError
	if err == nil || errors.As(err, &verr) || !apierrors.IsForbidden(err) {
		t.Fatalf("want a wrapped Forbidden that is not a *ValuesError, got %v", err)
	}
	for _, s := range []string{"HelmRelease flux-system/flux", "Secret flux-system/creds key values.yaml", "need get on the ConfigMaps and Secrets"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error does not say %q: %v", s, err)
		}
	}
}
