// Command noskip reads `go test -json` on stdin and prints what a plain `go test` would:
// each package's result line, build errors, and the output of every test that failed
// or never finished (a -timeout panic). It exits 1 when a test or package failed, and
// also when a test skipped, listing each skipped test with its message, unless -short
// says the run was `go test -short`, where skipping what needs a control plane is the
// point. A skip outside -short hides a test that did not run: fix its cause, or make
// the test fail and name the step (`make testbin`, an apt-get package) that provides
// what it needs.
//
// Under `go test -shuffle`, a package's "-test.shuffle N" line is kept back; when the
// package fails, noskip prints the command that runs its tests in the same order again,
// so a failure that depends on order can be reproduced. -env names the environment the
// run had (for example UPGRADEGUARD_KUBE_VERSION=1.32), for that command.
//
// -want names tests (comma-separated) that the run was selected to run (go test -run):
// noskip fails when one of them did not run, so a list that a rename or a removal no
// longer matches cannot drop a test out of CI silently.
//
//	set -o pipefail; go test -json -shuffle=on ./... | go run ./hack/noskip
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	short := flag.Bool("short", false, "the run was go test -short: report skips without failing")
	env := flag.String("env", "", "the run's environment (NAME=VALUE ...), named in the command that repeats a shuffled order")
	want := flag.String("want", "", "tests (comma-separated, top-level names) the run must have run: one that did not fails it")
	flag.Parse()
	r, err := filter(os.Stdin, os.Stdout, *env)
	if err != nil {
		fmt.Fprintln(os.Stderr, "noskip:", err)
		os.Exit(2)
	}
	os.Exit(r.report(os.Stdout, *short, *want))
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// skip is a test that skipped, with what it said.
type skip struct{ pkg, test, msg string }

// result is what filter saw.
type result struct {
	skips  []skip
	failed bool
	// ran are the top-level tests that started.
	ran map[string]bool
}

type testKey struct{ pkg, test string }

// filter copies the human-readable part of the stream in to out, as it arrives.
func filter(in io.Reader, out io.Writer, env string) (result, error) {
	f := &filterState{out: out, env: env, running: map[testKey][]string{}, seeds: map[string]string{},
		result: result{ran: map[string]bool{}}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, sc.Text()) // not an event: pass it on
			continue
		}
		f.handle(e)
	}
	return f.result, sc.Err()
}

type filterState struct {
	out     io.Writer
	env     string               // the run's environment, for the repeat command
	seeds   map[string]string    // a package's -test.shuffle seed
	running map[testKey][]string // output of tests that have not finished
	order   []testKey            // tests in the order they started
	result
}

func (f *filterState) handle(e event) {
	k := testKey{e.Package, e.Test}
	switch {
	case e.Action == "build-output":
		fmt.Fprint(f.out, e.Output)
	case e.Test == "" && e.Action == "output" && strings.HasPrefix(e.Output, shufflePrefix):
		f.seeds[e.Package] = strings.TrimSpace(strings.TrimPrefix(e.Output, shufflePrefix))
	case e.Test == "" && e.Action == "output":
		// Output outside any test, such as the package's result line: a test still
		// running then never finishes (a -timeout panic); print it first.
		f.flush(e.Package)
		if e.Output != "PASS\n" {
			fmt.Fprint(f.out, e.Output)
		}
	case e.Test == "" && (e.Action == "pass" || e.Action == "fail"):
		f.flush(e.Package)
		if e.Action == "fail" {
			f.failed = true
			f.repeat(e.Package)
		}
	case e.Test == "":
		// start, or skip: a package without test files
	case e.Action == "run":
		if !strings.Contains(e.Test, "/") {
			f.ran[e.Test] = true
		}
		f.running[k] = nil
		f.order = append(f.order, k)
	case e.Action == "output":
		if !framing(e.Output) {
			f.running[k] = append(f.running[k], e.Output)
		}
	case e.Action == "fail":
		fmt.Fprint(f.out, strings.Join(f.running[k], ""))
		delete(f.running, k)
		f.failed = true
	case e.Action == "skip":
		f.skips = append(f.skips, skip{e.Package, e.Test, message(f.running[k])})
		delete(f.running, k)
	case e.Action == "pass":
		delete(f.running, k)
	}
}

// shufflePrefix starts the line `go test -shuffle` prints before a package's tests.
const shufflePrefix = "-test.shuffle "

// repeat prints, for a failed package that ran shuffled, the command that runs its
// tests in the same order again.
func (f *filterState) repeat(pkg string) {
	seed, ok := f.seeds[pkg]
	if !ok {
		return
	}
	env := ""
	if f.env != "" {
		env = f.env + " "
	}
	fmt.Fprintf(f.out, "noskip: %s ran its tests in shuffled order; the same order again: %sgo test -count=1 -shuffle=%s %s\n", pkg, env, seed, pkg)
}

// flush prints the output of pkg's tests that have not finished.
func (f *filterState) flush(pkg string) {
	for _, t := range f.order {
		if lines, ok := f.running[t]; ok && t.pkg == pkg {
			fmt.Fprint(f.out, strings.Join(lines, ""))
			delete(f.running, t)
		}
	}
}

// framing is the test runner's own bookkeeping between parallel tests.
func framing(line string) bool {
	for _, p := range []string{"=== PAUSE", "=== CONT", "=== NAME"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

// message is what a skipped test logged, without the runner's lines.
func message(lines []string) string {
	var msg []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "=== RUN") && !strings.HasPrefix(l, "--- SKIP") {
			msg = append(msg, l)
		}
	}
	if len(msg) == 0 {
		return "(no message)"
	}
	return strings.Join(msg, "; ")
}

// report lists the skips unless short, and the tests of want (comma-separated) that did
// not run, and returns the exit code.
func (r result) report(out io.Writer, short bool, want string) int {
	code := 0
	if r.failed || r.missing(out, want) {
		code = 1
	}
	if len(r.skips) == 0 || short {
		return code
	}
	tests := "tests"
	if len(r.skips) == 1 {
		tests = "test"
	}
	fmt.Fprintf(out, "noskip: %d %s skipped outside -short; every test must run or fail (fix the cause, or fail naming the step that provides what is missing):\n", len(r.skips), tests)
	for _, s := range r.skips {
		fmt.Fprintf(out, "  %s %s: %s\n", s.pkg, s.test, s.msg)
	}
	return 1
}

// missing reports, and prints, the tests of want (comma-separated) that did not run.
func (r result) missing(out io.Writer, want string) bool {
	var absent []string
	for _, t := range strings.Split(want, ",") {
		if t = strings.TrimSpace(t); t != "" && !r.ran[t] {
			absent = append(absent, t)
		}
	}
	if len(absent) == 0 {
		return false
	}
	fmt.Fprintf(out, "noskip: the run was to run %s, which did not run: a test renamed or removed? Update the list the run was selected with\n",
		strings.Join(absent, ", "))
	return true
}
