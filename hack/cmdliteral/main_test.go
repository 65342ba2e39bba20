package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCommand(t *testing.T) {
	for _, tc := range []struct {
		s, want string
	}{
		{"kubectl annotate crd a.x helm.sh/resource-policy=keep", "kubectl annotate"},
		{"see kubectl -n %s logs job/%s on the target", "kubectl -n"},
		{"as kubectl apply and Argo CD do", "kubectl apply"},
		{"run `upgradeguard check` on the blocked version", "upgradeguard check"},
		{"then run helm uninstall again", "helm uninstall"},
		{"list revisions with `helm history %s -n %s`", "helm history"},
		{"helm rollback %s %d", "helm rollback"},
		{"upgradeguard migrate --crd ", "upgradeguard migrate"},
		{"argocd repo add ", "argocd repo add"},
		{"(argocd app sync --prune, or automated prune)", "argocd app sync"},
		{"first run an upgrade, confirm with `helm get manifest ", "helm get manifest"},
		{"shared with 'upgradeguard migrate'", "upgradeguard migrate"},
		{"flux reconcile helmrelease %s -n %s --reset", "flux reconcile"},
		// Prose that names a tool or an operation is not a command.
		{"helm uninstall reads the stored manifest", ""},
		{"upgradeguard check needs get/list on customresourcedefinitions", ""},
		{"upgradeguard denied the update", ""},
		{"a priority level for upgradeguard migrate's writes", ""},
		{"helm.sh/resource-policy", ""},
		{"upgradeguard.io/allow-delete", ""},
		{"Helm version %q", ""},
		{"restore them with kubectl before removing any version", ""},
		{"kubectl upgradeguard", ""},
	} {
		if got := command(tc.s); got != tc.want {
			t.Errorf("command(%q) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

// TestCheck: a literal in product code is found; the same literal in a test, in
// pkg/cmdline and in the help text of a command or flag is not.
func TestCheck(t *testing.T) {
	root := t.TempDir()
	write := func(path, src string) {
		t.Helper()
		full := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const lit = `package p

const fix = "kubectl delete crd x.io"
`
	write("pkg/p/p.go", lit)
	write("pkg/p/p_test.go", lit)
	write("pkg/cmdline/c.go", lit)
	write("hack/h/h.go", lit)
	write("internal/cli/help.go", "package cli\n\nconst deleteLong = `run kubectl delete crd x.io`\n\n"+
		"func flags(f interface{ StringVar(*string, string, string, string) }, s *string) {\n"+
		"\tf.StringVar(s, \"dir\", \"\", \"the DIR 'upgradeguard crd backup' wrote\")\n}\n")
	got, err := check(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !strings.HasPrefix(got[0], "pkg/p/p.go:3: ") || !strings.Contains(got[0], "(kubectl delete)") {
		t.Errorf("check() = %q, want the one literal of pkg/p/p.go", got)
	}
}
