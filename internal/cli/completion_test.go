package cli_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// completions runs cobra's hidden __complete command, as the shell scripts of
// `upgradeguard completion bash|zsh|fish|powershell` do, and returns the candidates.
func completions(t *testing.T, args ...string) []string {
	t.Helper()
	r := ug(t, append([]string{"__complete"}, args...)...)
	if r.code != 0 {
		t.Fatalf("__complete %v: exit %d\n%s", args, r.code, r.stderr)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if !strings.HasPrefix(l, ":") { // the last line is the directive
			out = append(out, strings.SplitN(l, "\t", 2)[0])
		}
	}
	return out
}

// TestCompletion: release names come from Helm's storage in the namespace (and driver)
// of the command line being completed, CRD names from the API server.
func TestCompletion(t *testing.T) {
	needCluster(t)
	chart, err := testenv.WriteChart(t.TempDir(), "app", "1.0.0", map[string]string{
		"templates/cm.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\ndata: {}\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	mustHelm(t, nil, "install", "compl-one", chart, "-n", "compl", "--create-namespace")
	mustHelm(t, nil, "install", "compl-two", chart, "-n", "compl")
	mustHelm(t, []string{"HELM_DRIVER=configmap"}, "install", "compl-cm", chart, "-n", "compl")
	if err := testenv.ApplyUpgradeguardCRDs(t.Context(), cp.Config); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"positional release", []string{"-n", "compl", "release", "uninstall-check", ""}, []string{"compl-one", "compl-two"}},
		{"prefix", []string{"-n", "compl", "release", "diff-failed", "compl-t"}, []string{"compl-two"}},
		{"check RELEASE", []string{"-n", "compl", "check", ""}, []string{"compl-one", "compl-two"}},
		{"--release", []string{"-n", "compl", "check", "--rollback", "--release", ""}, []string{"compl-one", "compl-two"}},
		{"configmap driver", []string{"-n", "compl", "release", "apply-check", "--helm-driver", "configmap", ""}, []string{"compl-cm"}},
		{"other namespace", []string{"-n", "default", "release", "uninstall-check", ""}, nil},
		{"second argument", []string{"-n", "compl", "release", "uninstall-check", "compl-one", ""}, nil},
		{"output", []string{"check", "-o", ""}, []string{"text", "json"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := completions(t, tc.args...); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}

	crds := completions(t, "migrate", "--crd", "storagemigration")
	if !slices.Contains(crds, "storagemigrations.upgradeguard.io") || slices.ContainsFunc(crds, func(s string) bool { return !strings.HasPrefix(s, "storagemigration") }) {
		t.Errorf("--crd completion: %v", crds)
	}
	if ns := completions(t, "-n", "comp"); !slices.Equal(ns, []string{"compl"}) {
		t.Errorf("-n completion: %v", ns)
	}

	// Every shell's script generates.
	for _, sh := range []string{"bash", "zsh", "fish", "powershell"} {
		if r := run(t, "completion", sh); r.code != 0 || !strings.Contains(r.stdout, "upgradeguard") {
			t.Errorf("completion %s: exit %d\n%s", sh, r.code, r.stderr)
		}
	}
}

func TestVersion(t *testing.T) {
	r := run(t, "version", "-o", "json")
	var b cli.BuildInfo
	if err := json.Unmarshal([]byte(r.stdout), &b); r.code != 0 || err != nil {
		t.Fatalf("version -o json: exit %d %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if b.Version == "" || b.GoVersion == "" || b.Platform == "" {
		t.Errorf("version -o json = %+v", b)
	}
	if r := run(t, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "upgradeguard "+b.Version+"\n") || !strings.Contains(r.stdout, "commit: ") {
		t.Errorf("version: exit %d\n%s", r.code, r.stdout)
	}
	if r := run(t, "version", "-o", "yaml"); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "-o json") {
		t.Errorf("version -o yaml: exit %d %s", r.code, r.stderr)
	}
}

// TestCheckReleaseArgument: check takes the release as Helm does, positionally; naming
// two different releases is a usage error.
func TestCheckReleaseArgument(t *testing.T) {
	r := run(t, "check", "a", "--release", "b", "--chart", "x")
	if r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "differ") {
		t.Errorf("check a --release b: exit %d %s", r.code, r.stderr)
	}
	if r := run(t, "check", "a", "b", "--chart", "x"); r.code != cli.ExitCouldNot || !strings.Contains(r.stderr, "accepts at most 1 arg") {
		t.Errorf("check a b: exit %d %s", r.code, r.stderr)
	}
}
