package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

func TestCommandName(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	for _, tc := range []struct {
		argv0 string
		env   func(string) string
		want  string
	}{
		{"/usr/local/bin/upgradeguard", env(), "upgradeguard"},
		{"/home/me/.krew/bin/kubectl-upgradeguard", env(), "kubectl upgradeguard"},
		{`C:\krew\bin\kubectl-upgradeguard.exe`, env(), "kubectl upgradeguard"},
		{"/helm/plugins/upgradeguard/upgradeguard", env("HELM_PLUGIN_NAME", "upgradeguard"), "helm upgradeguard"},
		{"/usr/local/bin/upgradeguard", env("HELM_PLUGIN_NAME", "diff"), "upgradeguard"},
	} {
		if got := commandName(strings.ReplaceAll(tc.argv0, `\`, "/"), tc.env); got != tc.want {
			t.Errorf("commandName(%q) = %q, want %q", tc.argv0, got, tc.want)
		}
	}
}

// TestFrontDoors: help, usage and examples speak as the command the user typed; the
// Helm plugin also offers the release commands at its top level.
func TestFrontDoors(t *testing.T) {
	help := func(name string, args ...string) string {
		var out bytes.Buffer
		root := NewRootCmd(Streams{Out: &out, ErrOut: &out})
		adaptFrontDoor(root, name, func() *cobra.Command {
			return newReleaseCmd(Streams{Out: &out, ErrOut: &out}, genericclioptions.NewConfigFlags(true))
		})
		root.SetArgs(append(args, "--help"))
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}
	kc := help(nameKubectl, "release", "uninstall-check")
	if !strings.Contains(kc, "kubectl upgradeguard release uninstall-check NAME") || strings.Contains(kc, "\n  upgradeguard ") {
		t.Errorf("kubectl help:\n%s", kc)
	}
	hc := help(nameHelm)
	for _, want := range []string{"helm upgradeguard [command]", "apply-check", "uninstall-check", "diff-failed"} {
		if !strings.Contains(hc, want) {
			t.Errorf("helm help lacks %q:\n%s", want, hc)
		}
	}
	if ex := help(nameHelm, "apply-check"); !strings.Contains(ex, "helm upgradeguard apply-check") {
		t.Errorf("helm apply-check help:\n%s", ex)
	}
}

func TestApplyHelmEnv(t *testing.T) {
	kube := genericclioptions.NewConfigFlags(true)
	env := map[string]string{
		"HELM_NAMESPACE": "apps", "HELM_KUBECONTEXT": "prod", "HELM_KUBEASUSER": "alice",
		"HELM_KUBEASGROUPS": "a,b", "HELM_KUBEINSECURE_SKIP_TLS_VERIFY": "false", "HELM_KUBETOKEN": "",
	}
	applyHelmEnv(kube, func(k string) string { return env[k] })
	if *kube.Namespace != "apps" || *kube.Context != "prod" || *kube.Impersonate != "alice" ||
		strings.Join(*kube.ImpersonateGroup, ",") != "a,b" || *kube.Insecure || *kube.BearerToken != "" {
		t.Errorf("flags after HELM_* env: ns %q ctx %q as %q groups %v insecure %v", *kube.Namespace, *kube.Context, *kube.Impersonate, *kube.ImpersonateGroup, *kube.Insecure)
	}
}
