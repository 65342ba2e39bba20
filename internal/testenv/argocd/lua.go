package argocd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
)

// Health is what Argo CD keeps of a health script's answer (gitops-engine's
// health.HealthStatus), and what it reports of an Application's resource.
type Health struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

// The statuses Argo CD accepts from a script; anything else becomes Unknown.
var validStatuses = map[string]bool{"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true, "Degraded": true, "Missing": true}

// RunHealth runs a health script as Argo CD v3's util/lua runs an argocd-cm health
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
func RunHealth(ctx context.Context, script string, obj map[string]any) (Health, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return Health{}, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", decodeValue(l, obj))
	if err := l.DoString(script); err != nil {
		return Health{}, err
	}
	ret := l.Get(-1)
	switch ret.Type() {
	case lua.LTNil:
		return Health{}, nil
	case lua.LTTable:
	default:
		return Health{}, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	data, err := luajson.Encode(ret)
	if err != nil {
		return Health{}, err
	}
	var h Health
	if err := json.Unmarshal(data, &h); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Value == "array" {
			return Health{}, nil
		}
		return Health{}, err
	}
	if !validStatuses[h.Status] {
		return Health{Status: "Unknown", Message: "Lua returned an invalid health status"}, nil
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
