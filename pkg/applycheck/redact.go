package applycheck

import (
	"encoding/base64"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ValueStrings lists the string leaves of release values at least 4 characters long:
// they must never reach a report, even inside an API server error.
func ValueStrings(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			out = append(out, ValueStrings(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, ValueStrings(x)...)
		}
	case string:
		if len(v) >= 4 {
			out = append(out, v)
		}
	}
	return out
}

// SecretStrings lists the data of every Secret of a manifest, encoded and decoded.
func SecretStrings(manifest string) []string {
	objs, _ := Objects(manifest)
	var out []string
	for _, obj := range objs {
		if obj.GetKind() != "Secret" || obj.GroupVersionKind().Group != "" {
			continue
		}
		data, _, _ := unstructured.NestedMap(obj.Object, "data")
		for _, v := range data {
			if s, ok := v.(string); ok {
				out = append(out, s)
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					out = append(out, string(b))
				}
			}
		}
		plain, _, _ := unstructured.NestedMap(obj.Object, "stringData")
		for _, v := range plain {
			if s, ok := v.(string); ok {
				out = append(out, s, base64.StdEncoding.EncodeToString([]byte(s)))
			}
		}
	}
	return out
}
