package redact_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/upgradeguard/upgradeguard/pkg/redact"
)

const manifest = `---
apiVersion: v1
kind: Secret
metadata:
  name: db
data:
  password: aHVudGVyMi1zZW50aW5lbA==
stringData:
  token: plain-token-sentinel
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  mode: visible-mode
`

func TestRedactor(t *testing.T) {
	r := redact.New()
	r.AddValues(map[string]any{"db": map[string]any{"password": "values-sentinel", "replicas": float64(3)}, "list": []any{"in-a-list"}, "on": "yes"})
	r.AddManifest(manifest)
	msg := `ConfigMap "x" is invalid: metadata.labels: Invalid value: "values-sentinel"; hunter2-sentinel; aHVudGVyMi1zZW50aW5lbA==; ` +
		`plain-token-sentinel; cGxhaW4tdG9rZW4tc2VudGluZWw=; in-a-list; visible-mode; yes`
	got := r.String(msg)
	for _, leak := range []string{"values-sentinel", "hunter2-sentinel", "aHVudGVyMi1zZW50aW5lbA==", "plain-token-sentinel", "cGxhaW4tdG9rZW4tc2VudGluZWw=", "in-a-list"} {
		if strings.Contains(got, leak) {
			t.Errorf("%q still shows %q", got, leak)
		}
	}
	for _, keep := range []string{"visible-mode", "yes", `ConfigMap "x" is invalid`} {
		if !strings.Contains(got, keep) {
			t.Errorf("%q lost %q (not a secret, or too short to hide)", got, keep)
		}
	}

	api := apierrors.NewInvalid(schema.GroupKind{Kind: "ConfigMap"}, "x", nil)
	wrapped := fmt.Errorf("%w: values-sentinel", api)
	red := r.Error(wrapped)
	if strings.Contains(red.Error(), "values-sentinel") || !apierrors.IsInvalid(red) || !errors.Is(red, wrapped) {
		t.Errorf("redacted error %q: want the value hidden and the chain kept", red)
	}
	if r.Error(nil) != nil {
		t.Error("nil error redacted to non-nil")
	}
}

// TestWhatIsHidden pins the rule every report shares: values and Secret data alike are
// hidden from MinLen bytes on, blank strings never, and a short Secret value's base64
// form (which is longer) still is.
func TestWhatIsHidden(t *testing.T) {
	r := redact.New()
	r.AddValues(map[string]any{"three": "abc", "four": "abcd", "blank": "     "})
	r.AddManifest("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\nstringData:\n  short: xyz\n  long: wxyz\n")
	for in, want := range map[string]string{
		"abc":           "abc",
		"abcd":          redact.Mask,
		"xyz":           "xyz",
		"eHl6":          redact.Mask, // base64 of xyz
		"wxyz":          redact.Mask,
		"d3h5eg==":      redact.Mask, // base64 of wxyz
		"a:     b":      "a:     b",
		"abcde + xyzw.": redact.Mask + "e + xyzw.",
	} {
		if got := r.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAddManifestReadsEveryDocument: a document that does not parse hides nothing, but
// the Secrets of the documents after it still are, and so is a Secret in a List (Helm
// applies a List's items as objects of their own).
func TestAddManifestReadsEveryDocument(t *testing.T) {
	r := redact.New()
	r.AddManifest("apiVersion: v1\nkind: Secret\nmetadata:\n  name: before\nstringData:\n  k: before-sentinel\n" +
		"---\nkind: [unclosed\n" +
		"---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: after\nstringData:\n  k: after-sentinel\n" +
		"---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Secret\n  metadata:\n    name: listed\n  stringData:\n    k: listed-sentinel\n" +
		"---\napiVersion: example.com/v1\nkind: Secret\nmetadata:\n  name: not-core\nstringData:\n  k: other-group-sentinel\n")
	got := r.String("before-sentinel after-sentinel listed-sentinel other-group-sentinel")
	if want := redact.Mask + " " + redact.Mask + " " + redact.Mask + " other-group-sentinel"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}
