package argocd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
)

// health is what Argo CD keeps of a health script's answer (gitops-engine's
// health.HealthStatus).
type health struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

// The statuses Argo CD accepts from a script; anything else becomes Unknown.
var validStatuses = map[string]bool{"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true, "Degraded": true, "Missing": true}

// runHealth runs a health script as Argo CD v3's util/lua runs an argocd-cm health
// customization (resource.customizations.health.GROUP_KIND, useOpenLibs false):
//   - a fresh gopher-lua state without the standard libraries, then only package, base
//     and table opened (Argo also opens a reduced os library, for time functions only;
//     these scripts use none);
//   - a one-second deadline on the script;
//   - the global obj converted from the object the way Argo's decodeValue converts
//     (numbers of any Go type to Lua numbers, json.Number to a string, arrays to
//     sequences, maps to tables, nil and anything else to nil); newer Argo CD versions
//     may leave metadata.managedFields and the last-applied annotation out of a health
//     script's obj, which these scripts never read;
//   - the value the chunk returns encoded with gopher-json and decoded into a health
//     status: an empty table (encoded as []) and nil give an empty status, a status Argo
//     does not know gives Unknown with Argo's message, any other type is an error.
func runHealth(ctx context.Context, script string, obj map[string]any) (health, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return health{}, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decodeValue(l, obj))
	if err := l.DoString(script); err != nil {
		return health{}, err
	}
	ret := l.Get(-1)
	switch ret.Type() {
	case lua.LTNil:
		return health{}, nil
	case lua.LTTable:
	default:
		return health{}, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	data, err := luajson.Encode(ret)
	if err != nil {
		return health{}, err
	}
	var h health
	if err := json.Unmarshal(data, &h); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Value == "array" {
			return health{}, nil
		}
		return health{}, err
	}
	if !validStatuses[h.Status] {
		return health{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
	}
	return h, nil
}

// decodeValue is Argo CD's conversion of an object to Lua values.
func decodeValue(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case json.Number:
		return lua.LString(v)
	case int:
		return lua.LNumber(v)
	case int32:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case []any:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}

// The shipped scripts, by the argocd-cm key suffix their file is named after.
const (
	keyCRD              = "apiextensions.k8s.io_CustomResourceDefinition"
	keySVM              = "storagemigration.k8s.io_StorageVersionMigration"
	keyStorageMigration = "upgradeguard.io_StorageMigration"
)

// script reads a shipped health script.
func script(t *testing.T, key string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("health", key+".lua"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// judge runs the shipped script for key on obj and fails the test if it does not run.
func judge(t *testing.T, key string, obj map[string]any) health {
	t.Helper()
	h, err := runHealth(t.Context(), script(t, key), obj)
	if err != nil {
		t.Fatalf("%s on %s: %v", key, describe(obj), err)
	}
	return h
}

func describe(obj map[string]any) string {
	data, _ := json.Marshal(obj)
	return strings.TrimSpace(string(data))
}

// TestRunHealthAsArgo proves the harness answers as Argo CD does for what a script may
// return, so that a shipped script passing here passes in Argo.
func TestRunHealthAsArgo(t *testing.T) {
	obj := map[string]any{"metadata": map[string]any{"name": "x", "generation": int64(3)}, "spec": map[string]any{"n": json.Number("7"), "list": []any{"a", "b"}}}
	for _, tc := range []struct {
		name, script string
		want         health
		wantErr      string
	}{
		{name: "table", script: `return {status="Healthy", message="fine"}`, want: health{"Healthy", "fine"}},
		{name: "int64 is a number", script: `return {status="Healthy", message=tostring(obj.metadata.generation + 1)}`, want: health{"Healthy", "4"}},
		{name: "json.Number is a string", script: `return {status="Healthy", message=type(obj.spec.n)}`, want: health{"Healthy", "string"}},
		{name: "arrays are sequences", script: `return {status="Healthy", message=table.concat(obj.spec.list, " ") .. " " .. #obj.spec.list}`, want: health{"Healthy", "a b 2"}},
		{name: "invalid status", script: `return {status="Fine"}`, want: health{"Unknown", "Lua returned an invalid health status"}},
		{name: "empty table", script: `return {}`, want: health{}},
		{name: "nil", script: `return nil`, want: health{}},
		{name: "not a table", script: `return "Healthy"`, wantErr: "expect table output from Lua script, not string"},
		{name: "no string library", script: `return {status="Healthy", message=string.format("%d", 1)}`, wantErr: "string"},
		{name: "deadline", script: `while true do end`, wantErr: "context deadline exceeded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := runHealth(t.Context(), tc.script, obj)
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
