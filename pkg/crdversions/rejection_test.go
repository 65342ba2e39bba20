package crdversions

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The API server's two wordings, exactly as kube-apiserver 1.32 and 1.33+ write them
// (k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation).
const (
	oldWording = `status.storedVersions[0]: Invalid value: "v1beta2": must appear in spec.versions`
	newWording = `status.storedVersions[0]: Invalid value: "v1beta2": missing from spec.versions; v1beta2 was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in v1beta2 and removes v1beta2 from status.storedVersions`

	buckets = "buckets.source.toolkit.fluxcd.io"
	repos   = "helmrepositories.source.toolkit.fluxcd.io"
)

// invalid is the 422 the API server returns, worded as it words it.
func invalid(name string, wording func(v string) string, versions ...string) error {
	var errs field.ErrorList
	for i, v := range versions {
		errs = append(errs, field.Invalid(field.NewPath("status", "storedVersions").Index(i), v, wording(v)))
	}
	return apierrors.NewInvalid(schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}, name, errs)
}

func mustAppear(string) string { return "must appear in spec.versions" }

func missingFrom(v string) string {
	return fmt.Sprintf("missing from spec.versions; %s was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in %s and removes %s from status.storedVersions", v, v, v)
}

func TestStoredVersionRejections(t *testing.T) {
	oldErr, newErr := invalid(buckets, mustAppear, "v1beta2"), invalid(buckets, missingFrom, "v1beta2")
	if oldErr.Error() != `CustomResourceDefinition.apiextensions.k8s.io "`+buckets+`" is invalid: `+oldWording ||
		newErr.Error() != `CustomResourceDefinition.apiextensions.k8s.io "`+buckets+`" is invalid: `+newWording {
		t.Fatalf("the API server's errors read\n%s\n%s", oldErr, newErr)
	}
	jsonMsg, err := json.Marshal(newErr.Error())
	if err != nil {
		t.Fatal(err)
	}
	helm := `Error: UPGRADE FAILED: failed to update resource: 2 errors occurred:` +
		"\n\t* " + invalid(buckets, mustAppear, "v1beta1", "v1beta2").Error() +
		"\n\t* " + invalid(repos, mustAppear, "v1beta2").Error()
	cases := []struct {
		name string
		msg  string
		want []StoredVersionRejection
	}{
		{"up to 1.32, bare", oldWording, []StoredVersionRejection{{Version: "v1beta2", Wording: WordingMustAppear, Message: oldWording}}},
		{"from 1.33, bare", newWording, []StoredVersionRejection{{Version: "v1beta2", Wording: WordingMissingFrom, Message: newWording}}},
		{"up to 1.32, API error", oldErr.Error(), []StoredVersionRejection{{CRD: buckets, Version: "v1beta2", Wording: WordingMustAppear, Message: oldWording}}},
		{"from 1.33, API error", newErr.Error(), []StoredVersionRejection{{CRD: buckets, Version: "v1beta2", Wording: WordingMissingFrom, Message: newWording}}},
		{"from 1.33, cut short", `"v1": missing from spec.versions; v1 was previously a storage version, and must remain in spec.versions until a storage migration ...` +
			` status.storedVersions[0]: Invalid value: "v1": missing from spec.versions; v1 was previously a storage version, and must remain in spec.versions until a storage migration ...`,
			[]StoredVersionRejection{{Version: "v1", Wording: WordingMissingFrom,
				Message: `status.storedVersions[0]: Invalid value: "v1": missing from spec.versions; v1 was previously a storage version, and must remain in spec.versions`}}},
		{"from 1.33, JSON-escaped", string(jsonMsg), []StoredVersionRejection{{CRD: buckets, Version: "v1beta2", Wording: WordingMissingFrom,
			Message: `status.storedVersions[0]: Invalid value: \"v1beta2\": missing from spec.versions; v1beta2 was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in v1beta2 and removes v1beta2 from status.storedVersions`}}},
		{"Helm, two CRDs, three entries", helm, []StoredVersionRejection{
			{CRD: buckets, Version: "v1beta1", Wording: WordingMustAppear, Message: `status.storedVersions[0]: Invalid value: "v1beta1": must appear in spec.versions`},
			{CRD: buckets, Version: "v1beta2", Wording: WordingMustAppear, Message: `status.storedVersions[1]: Invalid value: "v1beta2": must appear in spec.versions`},
			{CRD: repos, Version: "v1beta2", Wording: WordingMustAppear, Message: oldWording},
		}},
		{"the same entry twice", oldErr.Error() + "; retried: " + oldErr.Error(), []StoredVersionRejection{{CRD: buckets, Version: "v1beta2", Wording: WordingMustAppear, Message: oldWording}}},
		{"another 422", `CustomResourceDefinition.apiextensions.k8s.io "x" is invalid: spec.versions: Invalid value: ...: must have exactly one version marked as storage version`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if diff := cmp.Diff(c.want, StoredVersionRejections(c.msg)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestIsStoredVersionRejection(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"up to 1.32", invalid(buckets, mustAppear, "v1beta2"), true},
		{"from 1.33", invalid(buckets, missingFrom, "v1beta2"), true},
		{"wrapped", fmt.Errorf("apply %s: %w", buckets, invalid(buckets, missingFrom, "v1beta2")), true},
		{"Helm's plain error", fmt.Errorf("UPGRADE FAILED: %s", invalid(repos, mustAppear, "v1beta2").Error()), true},
		{"another 422", apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "x", field.ErrorList{field.Required(field.NewPath("data"), "")}), false},
		{"a 409 that quotes the text", apierrors.NewConflict(schema.GroupResource{Resource: "customresourcedefinitions"}, buckets, fmt.Errorf("%s", oldWording)), false},
		{"nil", nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := IsStoredVersionRejection(c.err); got != c.want {
				t.Errorf("IsStoredVersionRejection(%v) = %v, want %v", c.err, got, c.want)
			}
		})
	}
}

func TestWordingFor(t *testing.T) {
	for minor, want := range map[int]Wording{30: WordingMustAppear, 32: WordingMustAppear, 33: WordingMissingFrom, 37: WordingMissingFrom} {
		if got := WordingFor(minor); got != want {
			t.Errorf("WordingFor(%d) = %q, want %q", minor, got, want)
		}
	}
}
