package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The streams in testdata are `go test -json` of a small package (shortened paths and
// stack traces): full.json has a passing, a skipping, a subtest-skipping and a failing
// test; short.json the same package with -short; timeout.json a -timeout panic;
// buildfail.json a package that does not compile and one without test files.
func TestFilter(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream string
		env    string
		short  bool
		run    string // -want
		want   string
		code   int
	}{{
		name:   "skips and a failure",
		stream: "full.json",
		want: `=== RUN   TestFails
    a_test.go:19: context
    a_test.go:19: boom
--- FAIL: TestFails (0.00s)
FAIL
FAIL	example.com/skipdemo	0.066s
noskip: 2 tests skipped outside -short; every test must run or fail (fix the cause, or fail naming the step that provides what is missing):
  example.com/skipdemo TestSkips: a_test.go:7: git is missing
  example.com/skipdemo TestSub/skips: a_test.go:15: needs bin/helm
`,
		code: 1,
	}, {
		name:   "a skip in a passing run fails it",
		stream: "short.json",
		want: `ok  	example.com/skipdemo	0.026s
noskip: 1 test skipped outside -short; every test must run or fail (fix the cause, or fail naming the step that provides what is missing):
  example.com/skipdemo TestSub/skips: a_test.go:13: slow
`,
		code: 1,
	}, {
		name:   "skips are allowed with -short",
		stream: "short.json",
		short:  true,
		want:   "ok  \texample.com/skipdemo\t0.026s\n",
	}, {
		name:   "a timeout panic shows the test it interrupted",
		stream: "timeout.json",
		want: `=== RUN   TestHangs
    s_test.go:8: waiting
panic: test timed out after 1s
	running tests:
		TestHangs (1s)
time.Sleep(0xdf8475800)
example.com/skipdemo/slow.TestHangs(0x3ad8d0a94248?)
	/src/skipdemo/slow/s_test.go:8 +0x49
FAIL	example.com/skipdemo/slow	1.025s
`,
		code: 1,
	}, {
		name:   "build failure; no test files is no skip",
		stream: "buildfail.json",
		want: `# example.com/skipdemo/broken [example.com/skipdemo/broken.test]
broken/b_test.go:5:28: undefined: undefined
FAIL	example.com/skipdemo/broken [build failed]
?   	example.com/skipdemo/notests	[no test files]
`,
		code: 1,
	}, {
		name:   "a shuffled run names the order that failed, and only for the failed package",
		stream: "shuffle.json",
		env:    "UPGRADEGUARD_KUBE_VERSION=1.32",
		want: `=== RUN   TestFails
    a_test.go:7: boom
--- FAIL: TestFails (0.00s)
FAIL
FAIL	example.com/skipdemo	0.314s
noskip: example.com/skipdemo ran its tests in shuffled order; the same order again: UPGRADEGUARD_KUBE_VERSION=1.32 go test -count=1 -shuffle=1700000000 example.com/skipdemo
ok  	example.com/skipdemo/ok	0.003s
`,
		code: 1,
	}, {
		name:   "every test the run was to run ran",
		stream: "short.json",
		short:  true,
		run:    "TestSub",
		want:   "ok  \texample.com/skipdemo\t0.026s\n",
	}, {
		name:   "a test the run was to run and did not fails it",
		stream: "short.json",
		short:  true,
		run:    "TestSub,TestRenamed, TestGone",
		want: "ok  \texample.com/skipdemo\t0.026s\n" +
			"noskip: the run was to run TestRenamed, TestGone, which did not run: a test renamed or removed? Update the list the run was selected with\n",
		code: 1,
	}, {
		name:   "lines that are not events pass through",
		stream: "",
		want:   "go: downloading example.com/x v1.0.0\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			in := "go: downloading example.com/x v1.0.0\n"
			if tc.stream != "" {
				data, err := os.ReadFile(filepath.Join("testdata", tc.stream))
				if err != nil {
					t.Fatal(err)
				}
				in = string(data)
			}
			var out strings.Builder
			r, err := filter(strings.NewReader(in), &out, tc.env)
			if err != nil {
				t.Fatal(err)
			}
			code := r.report(&out, tc.short, tc.run)
			if diff := cmp.Diff(tc.want, out.String()); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
			if code != tc.code {
				t.Errorf("exit code %d, want %d", code, tc.code)
			}
		})
	}
}
