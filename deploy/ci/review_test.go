package ci_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/test/scenario"
)

// asCLI, set in a child's environment, makes the test binary the upgradeguard command
// (cmd/upgradeguard's main), so the script runs the real review without a second build.
const asCLI = "UPGRADEGUARD_CI_TEST_AS_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(asCLI) == "1" {
		os.Exit(cli.Execute(context.Background(), os.Args[1:], cli.Streams{Out: os.Stdout, ErrOut: os.Stderr, In: os.Stdin}))
	}
	os.Exit(m.Run())
}

const (
	marker    = "<!-- upgradeguard:review -->"
	token     = "tok-sentinel-5f2c91"
	helmrepos = "helmrepositories.source.toolkit.fluxcd.io"
	pageSize  = 2 // the server's page size, so that the comments span pages
)

// forge is a local HTTP server that speaks the part of GitHub's (or GitLab's) REST API the
// script uses: list a pull request's comments page by page, create one, update one. It
// records every request and refuses one without the token.
type forge struct {
	gitlab bool
	mu     sync.Mutex
	byID   map[int]string // comment id -> body
	order  []int
	next   int
	reqs   []string // "METHOD /path"
	srv    *httptest.Server
}

func newForge(t *testing.T, gitlab bool) *forge {
	f := &forge{gitlab: gitlab, byID: map[int]string{}, next: 100}
	// Comments already on the pull request, on three pages: one quotes the marker without
	// starting with it.
	for _, b := range []string{"LGTM", "Renovate: update flux2", "quoting an old one: " + marker, "ship it", "rebased"} {
		f.add(b)
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *forge) add(body string) int {
	f.next++
	f.byID[f.next] = body
	f.order = append(f.order, f.next)
	return f.next
}

func (f *forge) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, r.Method+" "+r.URL.Path)
	authOK := r.Header.Get("Authorization") == "Bearer "+token
	list, create, update := "/repos/acme/fleet/issues/7/comments", "/repos/acme/fleet/issues/7/comments", "/repos/acme/fleet/issues/comments/"
	if f.gitlab {
		authOK = r.Header.Get("PRIVATE-TOKEN") == token
		list, create, update = "/api/v4/projects/42/merge_requests/3/notes", "/api/v4/projects/42/merge_requests/3/notes", "/api/v4/projects/42/merge_requests/3/notes/"
	}
	if !authOK {
		http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
		return
	}
	readBody := func() (string, bool) {
		var in struct {
			Body *string `json:"body"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Body == nil {
			http.Error(w, `{"message":"no body"}`, http.StatusUnprocessableEntity)
			return "", false
		}
		return *in.Body, true
	}
	reply := func(code, id int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "body": f.byID[id]})
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == list:
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		page = max(page, 1)
		from, to := min((page-1)*pageSize, len(f.order)), min(page*pageSize, len(f.order))
		if to < len(f.order) {
			if f.gitlab {
				w.Header().Set("X-Next-Page", strconv.Itoa(page+1))
			} else {
				w.Header().Set("Link", fmt.Sprintf(`<%s%s?per_page=100&page=%d>; rel="next", <%s%s?page=99>; rel="last"`, f.srv.URL, list, page+1, f.srv.URL, list))
			}
		}
		out := []map[string]any{}
		for _, id := range f.order[from:to] {
			out = append(out, map[string]any{"id": id, "body": f.byID[id]})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	case r.Method == http.MethodPost && r.URL.Path == create:
		if b, ok := readBody(); ok {
			reply(http.StatusCreated, f.add(b))
		}
	case (r.Method == http.MethodPatch && !f.gitlab || r.Method == http.MethodPut && f.gitlab) && strings.HasPrefix(r.URL.Path, update):
		id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, update))
		if _, ok := f.byID[id]; err != nil || !ok {
			http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
			return
		}
		if b, ok := readBody(); ok {
			f.byID[id] = b
			reply(http.StatusOK, id)
		}
	default:
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
	}
}

// take returns the requests since the last take, and the comments that start with the marker.
func (f *forge) take() (reqs []string, marked map[int]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	reqs, f.reqs = f.reqs, nil
	marked = map[int]string{}
	for id, b := range f.byID {
		if strings.HasPrefix(b, marker) {
			marked[id] = b
		}
	}
	return reqs, marked
}

// pullRequest is a real pull request: flux2 bumped from 2.17.2 to 2.18.2 in clusters/prod-eu/,
// on a real API server where storedVersions still holds v1beta2 for the HelmRepositories,
// Buckets and HelmCharts, so review finds that the bump fails there (exit 1). The chart
// comes from a real Helm repository on loopback.
type pullRequest struct {
	repo, base, head, docs string
	kubeconfig, context    string
}

func newPullRequest(t *testing.T) pullRequest {
	if testing.Short() {
		t.Skip("needs a control plane")
	}
	cp := testenv.ForTest(t)
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	if err := scenario.FluxStoredV1beta2(t.Context(), cp, t.TempDir()); err != nil {
		t.Fatal(err)
	}

	charts, err := servers.NewChartRepo(filepath.Join(t.TempDir(), "charts"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(charts.Close)
	for _, v := range []string{"2.17.2", "2.18.2"} {
		if err := charts.Add(filepath.Join(fx, "charts", "flux2-"+v)); err != nil {
			t.Fatal(err)
		}
	}
	g := servers.NewGitRepo(t)
	files := func(version string) map[string]string {
		return map[string]string{"README.md": "fleet\n", "clusters/prod-eu/flux.yaml": scenario.FluxGitManifests(charts.URL, version)}
	}
	base := g.Commit("flux2 2.17.2", files("2.17.2"))
	head := g.Commit("Update Helm release flux2 to v2.18.2", files("2.18.2"))
	docs := g.Commit("docs only", map[string]string{"README.md": "fleet of one\n"})
	kc, err := clientcmd.LoadFromFile(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return pullRequest{repo: g.Dir, base: base.String(), head: head.String(), docs: docs.String(), kubeconfig: cp.Kubeconfig, context: kc.CurrentContext}
}

type result struct {
	code           int
	stdout, stderr string
}

// runScript runs deploy/ci/upgradeguard-review.sh MODE in the repository with env on top
// of a clean environment (no CI variables of the machine running the test).
func runScript(t *testing.T, s pullRequest, mode string, env map[string]string) result {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("upgradeguard-review.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "bash", script, mode)
	cmd.Dir = s.repo
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GITHUB_") && !strings.HasPrefix(kv, "CI_") && !strings.HasPrefix(kv, "KUBECONFIG=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, asCLI+"=1", "UPGRADEGUARD="+self, "KUBECONFIG="+s.kubeconfig,
		"UPGRADEGUARD_CLUSTERS=clusters/prod-eu/="+s.context)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	r := result{stdout: out.String(), stderr: errOut.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run %s: %v", script, err)
	}
	if strings.Contains(r.stdout+r.stderr, token) {
		t.Errorf("the script printed the token:\n%s%s", r.stdout, r.stderr)
	}
	return r
}

func count(reqs []string, prefix string) int {
	n := 0
	for _, r := range reqs {
		if strings.HasPrefix(r, prefix) {
			n++
		}
	}
	return n
}

// onlyMarked returns the one comment that starts with the marker.
func onlyMarked(t *testing.T, marked map[int]string) (int, string) {
	t.Helper()
	if len(marked) != 1 {
		t.Fatalf("%d comments start with the marker, want 1: %v", len(marked), marked)
	}
	for id, b := range marked {
		return id, b
	}
	return 0, ""
}

// TestGitHubAction runs the action's script as the action does on a pull_request event: the
// first run creates the comment, reading every page of the existing ones first; the second
// updates that comment (a PATCH to its id, no second POST); a run that cannot review says
// so in the same comment and exits 2. Each run exits with review's code and writes SARIF.
func TestGitHubAction(t *testing.T) {
	s := newPullRequest(t)
	f := newForge(t, false)
	dir := t.TempDir()
	event := func(base, head string) string {
		p := filepath.Join(dir, "event-"+base[:8]+".json")
		ev := map[string]any{"action": "synchronize", "number": 7, "pull_request": map[string]any{
			"number": 7, "base": map[string]any{"sha": base}, "head": map[string]any{"sha": head}}}
		data, _ := json.Marshal(ev)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sarif, output := filepath.Join(dir, "upgradeguard.sarif"), filepath.Join(dir, "github-output")
	env := func(eventPath string) map[string]string {
		return map[string]string{"GITHUB_API_URL": f.srv.URL, "GITHUB_REPOSITORY": "acme/fleet", "GITHUB_EVENT_PATH": eventPath,
			"GITHUB_TOKEN": token, "UPGRADEGUARD_SARIF": sarif, "GITHUB_OUTPUT": output}
	}
	bump := event(s.base, s.head)

	// First run: the bump fails on prod-eu; the comment is created.
	r := runScript(t, s, "github", env(bump))
	if r.code != cli.ExitFindings {
		t.Fatalf("first run: exit %d, want 1 (review's)\n%s%s", r.code, r.stdout, r.stderr)
	}
	reqs, marked := f.take()
	id, body := onlyMarked(t, marked)
	if count(reqs, "POST ") != 1 || count(reqs, "PATCH ") != 0 || count(reqs, "GET /repos/acme/fleet/issues/7/comments") != 3 {
		t.Errorf("first run: requests %v, want the 3 pages of comments read, then one POST", reqs)
	}
	for _, want := range []string{helmrepos, "upgradeguard migrate", "#### " + s.context} {
		if !strings.Contains(body, want) {
			t.Errorf("comment lacks %q:\n%s", want, body)
		}
	}
	var log struct {
		Version string `json:"version"`
		Runs    []struct {
			Results []struct {
				RuleID string `json:"ruleId"`
			} `json:"results"`
		} `json:"runs"`
	}
	data, err := os.ReadFile(sarif)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &log); err != nil || log.Version != "2.1.0" || len(log.Runs) != 1 || len(log.Runs[0].Results) == 0 {
		t.Errorf("SARIF: %v, version %q, want 2.1.0 with results:\n%s", err, log.Version, data)
	}
	if out, err := os.ReadFile(output); err != nil || !strings.Contains(string(out), "exit-code=1\n") {
		t.Errorf("GITHUB_OUTPUT: %v %q, want exit-code=1", err, out)
	}

	// Second run, on the same pull request: the same comment is updated.
	r = runScript(t, s, "github", env(bump))
	reqs, marked = f.take()
	id2, body2 := onlyMarked(t, marked)
	if r.code != cli.ExitFindings || id2 != id || body2 != body {
		t.Errorf("second run: exit %d, comment %d, want exit 1 and comment %d unchanged\n%s", r.code, id2, id, r.stderr)
	}
	if want := fmt.Sprintf("PATCH /repos/acme/fleet/issues/comments/%d", id); count(reqs, "POST ") != 0 || count(reqs, want) != 1 {
		t.Errorf("second run: requests %v, want %s and no POST", reqs, want)
	}

	// A change review cannot read: exit 2, and the comment says it could not run.
	r = runScript(t, s, "github", env(event(strings.Repeat("0", 40), s.head)))
	_, marked = f.take()
	if _, body := onlyMarked(t, marked); r.code != cli.ExitCouldNot || !strings.Contains(body, "could not run") {
		t.Errorf("unreadable base: exit %d, comment %q; want exit 2 and could not run\n%s", r.code, body, r.stderr)
	}

	// A change that touches no HelmRelease: exit 0, the comment says so.
	r = runScript(t, s, "github", env(event(s.head, s.docs)))
	_, marked = f.take()
	if _, body := onlyMarked(t, marked); r.code != cli.ExitSafe || !strings.Contains(body, "nothing to judge") {
		t.Errorf("docs-only change: exit %d, comment %q; want exit 0\n%s", r.code, body, r.stderr)
	}

	// A wrong token: review's verdict cannot be posted, so the job could not run.
	bad := env(bump)
	bad["GITHUB_TOKEN"] = "wrong"
	if r = runScript(t, s, "github", bad); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "HTTP 401") {
		t.Errorf("wrong token: exit %d, want 2 with HTTP 401\n%s", r.code, r.stderr)
	}
}

// TestGitLabTemplate runs the template's script as a merge request pipeline does: the first
// run creates the note, the second updates it (a PUT to its id, no second POST), and each
// writes the JUnit report GitLab reads from artifacts:reports:junit.
func TestGitLabTemplate(t *testing.T) {
	s := newPullRequest(t)
	f := newForge(t, true)
	junit := filepath.Join(t.TempDir(), "upgradeguard-junit.xml")
	env := map[string]string{"CI_API_V4_URL": f.srv.URL + "/api/v4", "CI_PROJECT_ID": "42", "CI_MERGE_REQUEST_IID": "3",
		"CI_MERGE_REQUEST_DIFF_BASE_SHA": s.base, "CI_COMMIT_SHA": s.head, "UPGRADEGUARD_GITLAB_TOKEN": token,
		"UPGRADEGUARD_JUNIT": junit}

	r := runScript(t, s, "gitlab", env)
	if r.code != cli.ExitFindings {
		t.Fatalf("first run: exit %d, want 1 (review's)\n%s%s", r.code, r.stdout, r.stderr)
	}
	reqs, marked := f.take()
	id, body := onlyMarked(t, marked)
	if count(reqs, "POST ") != 1 || count(reqs, "PUT ") != 0 || count(reqs, "GET /api/v4/projects/42/merge_requests/3/notes") != 3 {
		t.Errorf("first run: requests %v, want the 3 pages of notes read, then one POST", reqs)
	}
	if !strings.Contains(body, helmrepos) {
		t.Errorf("note lacks %s:\n%s", helmrepos, body)
	}
	var suites struct {
		XMLName xml.Name `xml:"testsuites"`
		Suites  []struct {
			Failures int `xml:"failures,attr"`
		} `xml:"testsuite"`
	}
	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(data, &suites); err != nil || len(suites.Suites) == 0 || suites.Suites[0].Failures == 0 {
		t.Errorf("JUnit: %v, want a suite with failures:\n%s", err, data)
	}

	r = runScript(t, s, "gitlab", env)
	reqs, marked = f.take()
	if id2, _ := onlyMarked(t, marked); r.code != cli.ExitFindings || id2 != id {
		t.Errorf("second run: exit %d, note %d, want exit 1 and note %d\n%s", r.code, id2, id, r.stderr)
	}
	if want := fmt.Sprintf("PUT /api/v4/projects/42/merge_requests/3/notes/%d", id); count(reqs, "POST ") != 0 || count(reqs, want) != 1 {
		t.Errorf("second run: requests %v, want %s and no POST", reqs, want)
	}
}
