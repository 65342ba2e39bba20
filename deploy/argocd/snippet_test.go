package argocd_test

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite argocd-cm.yaml and the snippet in docs/operator-guide.md from health/*.lua")

const (
	snippetFile = "argocd-cm.yaml"
	guide       = "../../docs/operator-guide.md"
	docBegin    = "<!-- argocd-cm: generated from deploy/argocd/health by `go test ./deploy/argocd -update` -->"
	docEnd      = "<!-- end argocd-cm -->"
)

// scripts are the shipped health scripts by argocd-cm key suffix.
func scripts(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("health", "*.lua"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no health/*.lua: %v", err)
	}
	out := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".lua")] = string(data)
	}
	return out
}

// snippet renders the argocd-cm ConfigMap that carries every shipped script, each under
// resource.customizations.health.GROUP_KIND as a literal block.
func snippet(t *testing.T) string {
	t.Helper()
	s := scripts(t)
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(`# upgradeguard's Argo CD health checks. Generated from deploy/argocd/health/*.lua
# (go test ./deploy/argocd -update); merge it into argocd-cm:
#   kubectl -n argocd patch configmap argocd-cm --patch-file argocd-cm.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: argocd-cm
  namespace: argocd
  labels:
    app.kubernetes.io/name: argocd-cm
    app.kubernetes.io/part-of: argocd
data:
`)
	for _, k := range keys {
		b.WriteString("  resource.customizations.health." + k + ": |\n")
		for _, line := range strings.Split(strings.TrimRight(s[k], "\n"), "\n") {
			if line == "" {
				b.WriteString("\n")
				continue
			}
			b.WriteString("    " + line + "\n")
		}
	}
	return b.String()
}

// TestConfigMapSnippet: argocd-cm.yaml is generated from the scripts, and reads back as
// exactly the scripts, one key each.
func TestConfigMapSnippet(t *testing.T) {
	want := snippet(t)
	if *update {
		if err := os.WriteFile(snippetFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(snippetFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: run go test ./deploy/argocd -update", snippetFile)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(got, &cm); err != nil {
		t.Fatal(err)
	}
	s := scripts(t)
	if len(cm.Data) != len(s) {
		t.Errorf("%s has %d keys, want %d", snippetFile, len(cm.Data), len(s))
	}
	for k, lua := range s {
		if got := cm.Data["resource.customizations.health."+k]; got != lua {
			t.Errorf("%s: key for %s does not read back as health/%s.lua:\n%s", snippetFile, k, k, got)
		}
	}
}

// TestGuideShowsSnippet: the operator guide's Argo CD section shows argocd-cm.yaml as it is.
func TestGuideShowsSnippet(t *testing.T) {
	doc, err := os.ReadFile(guide)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := bytes.Index(doc, []byte(docBegin)), bytes.Index(doc, []byte(docEnd))
	if begin < 0 || end < begin {
		t.Fatalf("%s has no %q ... %q block", guide, docBegin, docEnd)
	}
	block := docBegin + "\n\n```yaml\n" + snippet(t) + "```\n\n"
	if *update {
		doc = slices.Concat(doc[:begin], []byte(block), doc[end:])
		if err := os.WriteFile(guide, doc, 0o644); err != nil {
			t.Fatal(err)
		}
		begin, end = bytes.Index(doc, []byte(docBegin)), bytes.Index(doc, []byte(docEnd))
	}
	if got := string(doc[begin:end]); got != block {
		t.Fatalf("the argocd-cm snippet in %s is stale: run go test ./deploy/argocd -update", guide)
	}
}

// TestSnippetPatchesArgoCDConfigMap runs the guide's command with the real kubectl: the
// patch adds the three keys to an argocd-cm that already holds settings, and keeps them.
func TestSnippetPatchesArgoCDConfigMap(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the control plane")
	}
	ctx := t.Context()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	ns := "argocd"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	existing := map[string]string{"url": "https://argocd.example.com", "resource.customizations.health.example.io_Thing": "return {status=\"Healthy\"}\n"}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "argocd-cm"}, Data: existing}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(cp.KubeBin, "kubectl"), "--kubeconfig", cp.Kubeconfig,
		"-n", ns, "patch", "configmap", "argocd-cm", "--patch-file", snippetFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "argocd-cm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range existing {
		if cm.Data[k] != v {
			t.Errorf("%s: %q after the patch, want %q kept", k, cm.Data[k], v)
		}
	}
	for k, lua := range scripts(t) {
		if got := cm.Data["resource.customizations.health."+k]; got != lua {
			t.Errorf("resource.customizations.health.%s after the patch:\n%s\nwant health/%s.lua", k, got, k)
		}
	}
}
