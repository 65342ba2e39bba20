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
