// Package sariftest validates SARIF logs against the published SARIF 2.1.0 schema, for
// the tests of every command that writes them.
package sariftest

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Validate fails the test when log is not a SARIF 2.1.0 log.
func Validate(t testing.TB, log string) {
	t.Helper()
	_, self, _, _ := runtime.Caller(0)
	f, err := os.Open(filepath.Join(filepath.Dir(self), "..", "testdata", "sarif-schema-2.1.0.json"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	schema, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("sarif-schema-2.1.0.json", schema); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("sarif-schema-2.1.0.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(log))
	if err != nil {
		t.Fatalf("not JSON: %v\n%s", err, log)
	}
	if err := sch.Validate(doc); err != nil {
		t.Errorf("not SARIF 2.1.0: %v\n%s", err, log)
	}
}
