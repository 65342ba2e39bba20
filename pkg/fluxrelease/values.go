package fluxrelease

import (
	"context"
	"errors"
	"fmt"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"github.com/fluxcd/pkg/chartutil"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Values composes the values helm-controller installs the HelmRelease's chart with: each
// spec.valuesFrom reference in order (a ConfigMap or Secret in the HelmRelease's
// namespace, key valuesKey or values.yaml, merged whole or, with targetPath, set at that
// path with Helm's --set syntax, or verbatim with literal), a missing optional reference
// skipped, then spec.values merged on top. It calls fluxcd/pkg/chartutil's
// ChartValuesFromReferences, the function helm-controller itself calls, so the result is
// the one helm-controller would compute from the same objects.
//
// A reference that helm-controller could not resolve either is a *ValuesError: the
// release would fail with ValuesError and nothing would be installed. Any other error
// (a forbidden or failed read) means the values could not be composed. No error carries
// the content of a ConfigMap or Secret.
func Values(ctx context.Context, r Reader, hr *helmv2.HelmRelease) (map[string]any, error) {
	if len(hr.Spec.ValuesFrom) == 0 {
		return hr.GetValues(), nil
	}
	v, err := chartutil.ChartValuesFromReferences(ctx, logr.FromContextOrDiscard(ctx), getter{r: r},
		hr.Namespace, hr.GetValues(), hr.Spec.ValuesFrom...)
	if err != nil {
		return nil, valuesError(hr, err)
	}
	return v, nil
}

// ValuesSources names what Values composes, for messages: "ConfigMap flux-system/a
// (key values.yaml), Secret flux-system/b (key install, targetPath installCRDs,
// optional) and spec.values". Names and keys only, never content.
func ValuesSources(hr *helmv2.HelmRelease) string {
	s := ""
	for i, ref := range hr.Spec.ValuesFrom {
		if i > 0 {
			s += ", "
		}
		s += describeRef(hr.Namespace, ref.Kind, ref.Name, ref.GetValuesKey())
		if ref.TargetPath != "" {
			s += " targetPath " + ref.TargetPath
		}
		if ref.Optional {
			s += " (optional)"
		}
	}
	if s == "" {
		return "spec.values"
	}
	return s + ", then spec.values"
}

// ValuesError says that a spec.valuesFrom reference cannot be resolved the way
// helm-controller resolves it. Its message names the HelmRelease, the reference and what
// to do; it never holds the referenced data.
type ValuesError struct {
	// HelmRelease is the HelmRelease's namespace and name.
	HelmRelease types.NamespacedName
	// Kind, Name (in the HelmRelease's namespace), Key and TargetPath name the reference.
	Kind, Name, Key, TargetPath string
	// Reason is one of chartutil's ErrResourceNotFound, ErrKeyNotFound,
	// ErrValuesDataRead, ErrValueMerge and ErrUnsupportedRefKind; errors.Is matches it.
	Reason error
}

func (e *ValuesError) Error() string {
	hr := fmt.Sprintf("HelmRelease %s", e.HelmRelease)
	ref := fmt.Sprintf("spec.valuesFrom %s", describeRef(e.HelmRelease.Namespace, e.Kind, e.Name, e.Key))
	const fails = "helm-controller fails the release with ValuesError and installs nothing until this is fixed"
	switch {
	case errors.Is(e.Reason, chartutil.ErrResourceNotFound):
		return fmt.Sprintf("%s: %s does not exist; %s: create the %s, or mark the reference optional: true", hr, ref, fails, e.Kind)
	case errors.Is(e.Reason, chartutil.ErrKeyNotFound):
		return fmt.Sprintf("%s: spec.valuesFrom %s %s/%s has no key %s; %s: add the key, set valuesKey to the key that holds the values, or mark the reference optional: true",
			hr, e.Kind, e.HelmRelease.Namespace, e.Name, e.Key, fails)
	case errors.Is(e.Reason, chartutil.ErrValuesDataRead):
		return fmt.Sprintf("%s: %s does not hold a YAML map of values (content not shown); %s: fix the data under key %s, or set targetPath to place a single value", hr, ref, fails, e.Key)
	case errors.Is(e.Reason, chartutil.ErrValueMerge):
		return fmt.Sprintf("%s: %s cannot be set at targetPath %s with Helm's --set syntax (content not shown); %s: fix the value, or set literal: true to take it verbatim", hr, ref, e.TargetPath, fails)
	case errors.Is(e.Reason, chartutil.ErrUnsupportedRefKind):
		return fmt.Sprintf("%s: spec.valuesFrom kind %q (name %s) is not supported; %s: use ConfigMap or Secret", hr, e.Kind, e.Name, fails)
	}
	return fmt.Sprintf("%s: %s cannot be resolved; %s", hr, ref, fails)
}

// Unwrap returns the reason only: the underlying parse error may quote the data.
func (e *ValuesError) Unwrap() error { return e.Reason }

// valuesError turns chartutil's error into one that names the HelmRelease and what to
// do, and drops any cause that may quote the referenced data (YAML and --set parse
// errors do). Errors that are not about a reference (a forbidden read) are wrapped.
func valuesError(hr *helmv2.HelmRelease, err error) error {
	var ref *chartutil.ErrValuesReference
	if !errors.As(err, &ref) {
		return fmt.Errorf("HelmRelease %s/%s: read spec.valuesFrom (%s): %w; the gate and audit need get on the ConfigMaps and Secrets it names",
			hr.Namespace, hr.Name, ValuesSources(hr), err)
	}
	out := &ValuesError{HelmRelease: types.NamespacedName{Namespace: hr.Namespace, Name: hr.Name},
		Kind: ref.Kind, Name: ref.Name.Name, Key: ref.Key, Reason: ref.Reason}
	for _, r := range hr.Spec.ValuesFrom {
		if r.Kind == ref.Kind && r.Name == ref.Name.Name && r.GetValuesKey() == ref.Key {
			out.TargetPath = r.TargetPath
			break
		}
	}
	if out.Reason == nil {
		out.Reason = chartutil.ErrUnknown
	}
	return out
}

func describeRef(ns, kind, name, key string) string {
	return fmt.Sprintf("%s %s/%s key %s", kind, ns, name, key)
}

// getter lets chartutil, which asks for a whole client but only reads with Get, read
// through a Reader. The embedded Client is nil: any other call would be a bug in that
// assumption, and the tests exercise every path chartutil takes.
type getter struct {
	client.Client
	r Reader
}

func (g getter) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return g.r.Get(ctx, key, obj, opts...)
}
