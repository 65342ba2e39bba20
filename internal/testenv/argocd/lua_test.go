package argocd_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
)

// TestRunHealthAsArgo proves the harness answers as Argo CD does for what a script may
// return, so that a shipped script passing here passes in Argo. test/argocd compares it
// with the real Argo CD on the same objects.
func TestRunHealthAsArgo(t *testing.T) {
	obj := map[string]any{"metadata": map[string]any{"name": "x", "generation": int64(3)}, "spec": map[string]any{"n": json.Number("7"), "list": []any{"a", "b"}}}
	for _, tc := range []struct {
		name, script string
		want         argocd.Health
		wantErr      string
	}{
		{name: "table", script: `return {status="Healthy", message="fine"}`, want: argocd.Health{Status: "Healthy", Message: "fine"}},
		{name: "int64 is a number", script: `return {status="Healthy", message=tostring(obj.metadata.generation + 1)}`, want: argocd.Health{Status: "Healthy", Message: "4"}},
		{name: "json.Number is a string", script: `return {status="Healthy", message=type(obj.spec.n)}`, want: argocd.Health{Status: "Healthy", Message: "string"}},
		{name: "arrays are sequences", script: `return {status="Healthy", message=table.concat(obj.spec.list, " ") .. " " .. #obj.spec.list}`, want: argocd.Health{Status: "Healthy", Message: "a b 2"}},
		{name: "invalid status", script: `return {status="Fine"}`, want: argocd.Health{Status: "Unknown", Message: "Lua returned an invalid health status"}},
		{name: "empty table", script: `return {}`, want: argocd.Health{}},
		{name: "nil", script: `return nil`, want: argocd.Health{}},
		{name: "not a table", script: `return "Healthy"`, wantErr: "expect table output from Lua script, not string"},
		{name: "no string library", script: `return {status="Healthy", message=string.format("%d", 1)}`, wantErr: "string"},
		{name: "deadline", script: `while true do end`, wantErr: "context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := argocd.RunHealth(t.Context(), tc.script, obj)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %+v, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
