package argoapp

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
)

const webTemplate = `apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}
  namespace: {{ .Release.Namespace }}
data:
  from: {{ .Values.from | quote }}
  file: {{ .Values.file | quote }}
  inline: {{ .Values.inline.key | quote }}
  hosts: {{ .Values.hosts | quote }}
  port: {{ .Values.port | quote }}
  text: {{ .Values.text | quote }}
`

// gitChart is a git repository with the chart web at charts/web (version per commit),
// a values file beside it and one at the repository root, and a Kustomize directory.
func gitChart(t *testing.T) (repo *servers.GitRepo, first, second string) {
	t.Helper()
	servers.NeedGitCLI(t) // go-git clones file:// URLs with git-upload-pack
	repo = servers.NewGitRepo(t)
	files := map[string]string{
		"charts/web/Chart.yaml":         "apiVersion: v2\nname: web\nversion: 1.0.0\n",
		"charts/web/values.yaml":        "from: chart\nfile: none\ninline: {key: none}\nhosts: none\nport: none\ntext: none\n",
		"charts/web/templates/cm.yaml":  webTemplate,
		"charts/web/values-prod.yaml":   "from: values-prod\n",
		"env/prod.yaml":                 "file: env-prod\n",
		"kustomize/kustomization.yaml":  "resources: []\n",
		"plain/configmap.yaml":          "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
		"charts/web/files/settings.txt": "from a file",
	}
	h1 := repo.Commit("web 1.0.0", files)
	gitTag(t, repo.Dir, "v1.0.0", h1.String())
	h2 := repo.Commit("web 1.2.0", map[string]string{"charts/web/Chart.yaml": "apiVersion: v2\nname: web\nversion: 1.2.0\n"})
	gitTag(t, repo.Dir, "v1.2.0", h2.String())
	return repo, h1.String(), h2.String()
}

func gitTag(t *testing.T, dir, tag, commit string) {
	t.Helper()
	if out, err := exec.Command("git", "-C", dir, "tag", tag, commit).CombinedOutput(); err != nil {
		t.Fatalf("git tag: %v: %s", err, out)
	}
}

func gitApp(url, path, revision string, h *Helm) *Application {
	return &Application{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "argocd"}, Spec: Spec{
		Source:      &Source{RepoURL: url, Path: path, TargetRevision: revision, Helm: h},
		Destination: Destination{Server: "https://kubernetes.default.svc", Namespace: "web-ns"},
	}}
}

// render resolves and renders the Application with the Helm SDK, as check does.
func render(t *testing.T, a *Application, o Options) (*Chart, string) {
	t.Helper()
	c, err := Resolve(t.Context(), a, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ch, err := chartsource.Load(t.Context(), c.Options)
	if err != nil {
		t.Fatal(err)
	}
	return c, ch.Manifest
}

func TestResolveGitValues(t *testing.T) {
	repo, _, second := gitChart(t)
	h := &Helm{
		ValueFiles:              []string{"values-prod.yaml", "../../env/prod.yaml", "missing.yaml"},
		IgnoreMissingValueFiles: true,
		Values:                  "inline: {key: from-values}\n",
		ValuesObject:            &runtime.RawExtension{Raw: []byte(`{"inline":{"key":"from-valuesObject"}}`)},
		Parameters:              []Parameter{{Name: "hosts", Value: "a.example.com,b.example.com"}, {Name: "port", Value: "8080", ForceString: true}},
		FileParameters:          []FileParameter{{Name: "text", Path: "files/settings.txt"}},
	}
	c, manifest := render(t, gitApp("file://"+repo.Dir, "charts/web", "HEAD", h), Options{})
	for _, want := range []string{
		"name: web\n", "namespace: web-ns\n", `from: "values-prod"`, `file: "env-prod"`, `inline: "from-valuesObject"`,
		`hosts: "a.example.com,b.example.com"`, `port: "8080"`, `text: "from a file"`,
	} {
		if !strings.Contains(manifest, want) {
			t.Errorf("rendered manifest lacks %q:\n%s", want, manifest)
		}
	}
	if c.Kind != Git || c.Commit != second || c.Policy != check.PolicyCreateReplace || !c.Local() {
		t.Errorf("chart %+v, want git at %s under create-replace", c, second)
	}
	dir := c.dir
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Close left %s: %v", dir, err)
	}
}

func TestResolveGitRevisions(t *testing.T) {
	repo, first, second := gitChart(t)
	repo.Branch("release-1.0", plumbing.NewHash(first))
	// The repository's HEAD is now release-1.0: HEAD is the remote's HEAD, as git clones it.
	for _, tc := range []struct{ revision, commit, version string }{
		{"", first, "1.0.0"},
		{"HEAD", first, "1.0.0"},
		{"master", second, "1.2.0"},
		{"release-1.0", first, "1.0.0"},
		{"v1.0.0", first, "1.0.0"},
		{first, first, "1.0.0"},
		{"~1.0", first, "1.0.0"},
		{">=1.0.0", second, "1.2.0"},
	} {
		t.Run(tc.revision, func(t *testing.T) {
			c, err := Resolve(t.Context(), gitApp("file://"+repo.Dir, "charts/web", tc.revision, nil), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			ch, err := chartsource.Fetch(c.Options)
			if err != nil {
				t.Fatal(err)
			}
			if c.Commit != tc.commit || ch.Metadata.Version != tc.version {
				t.Errorf("commit %s version %s, want %s %s", c.Commit, ch.Metadata.Version, tc.commit, tc.version)
			}
		})
	}
}

func TestResolveGitUnsupported(t *testing.T) {
	repo, _, _ := gitChart(t)
	url := "file://" + repo.Dir
	for _, tc := range []struct {
		name string
		app  *Application
		want string
	}{
		{"kustomize directory", gitApp(url, "kustomize", "HEAD", nil), "is a Kustomize directory"},
		{"plain manifests", gitApp(url, "plain", "HEAD", nil), "is not a Helm chart"},
		{"$ref values file", gitApp(url, "charts/web", "HEAD", &Helm{ValueFiles: []string{"$values/env/prod.yaml"}}), "reads another source ($ref)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Resolve(t.Context(), tc.app, Options{})
			var u *UnsupportedError
			if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "argocd app manifests web") {
				t.Fatalf("error %v, want an UnsupportedError with %q and the manifests command", err, tc.want)
			}
		})
	}
	_, err := Resolve(t.Context(), gitApp(url, "charts/web", "HEAD", &Helm{ValueFiles: []string{"../../../outside.yaml"}}), Options{})
	if err == nil || !strings.Contains(err.Error(), "outside the git") {
		t.Errorf("a values file outside the repository: %v", err)
	}
	_, err = Resolve(t.Context(), gitApp(url, "charts/web", "no-such-branch", nil), Options{})
	if err == nil || !strings.Contains(err.Error(), `no branch, tag or commit "no-such-branch"`) {
		t.Errorf("an unknown revision: %v", err)
	}
}

// TestResolveHelmRepository: a chart of a chart repository behind basic auth, with the
// credentials of Argo CD's repository Secret, a semver range as targetRevision (the
// highest match, as Argo CD resolves it) and a values file inside the chart (unpacked).
func TestResolveHelmRepository(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []string{"1.0.0", "1.1.0", "2.0.0"} {
		chartDir, err := testenv.WriteChart(t.TempDir(), "web", v, map[string]string{
			"values.yaml": "from: chart\nfile: none\ninline: {key: none}\nhosts: none\nport: none\ntext: none\n", "values-prod.yaml": "from: values-prod-" + v + "\n",
			"templates/cm.yaml": webTemplate})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.Package(chartDir, dir); err != nil {
			t.Fatal(err)
		}
	}
	url, stop, err := servers.ServeRepoBasicAuth(dir, "dev", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	secrets := fake.NewClientset(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "charts", Namespace: "argocd", Labels: map[string]string{SecretTypeLabel: "repository"}},
		Data:       map[string][]byte{"url": []byte(url), "username": []byte("dev"), "password": []byte("s3cret")},
	}).CoreV1()
	t.Setenv("HELM_REPOSITORY_CACHE", t.TempDir())
	a := &Application{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "argocd"}, Spec: Spec{
		Source:      &Source{RepoURL: url, Chart: "web", TargetRevision: "^1.0", Helm: &Helm{ReleaseName: "site", ValueFiles: []string{"values-prod.yaml"}, SkipCrds: true}},
		Destination: Destination{Namespace: "web-ns"},
	}}
	c, manifest := render(t, a, Options{Secrets: secrets})
	if !strings.Contains(manifest, `from: "values-prod-1.1.0"`) || !strings.Contains(manifest, "name: site\n") {
		t.Errorf("rendered manifest is not 1.1.0's with its values file and release name site:\n%s", manifest)
	}
	if c.Kind != HelmRepository || c.Credentials != "argocd/charts" || c.Policy != check.PolicyHelm || !c.Local() {
		t.Errorf("chart %+v, want a helm repository chart unpacked with argocd/charts, policy helm (skipCrds)", c)
	}

	// Without the Secret the repository refuses: a chart load error that names the
	// Secret to add.
	_, err = Resolve(t.Context(), a, Options{})
	var load *chartsource.LoadError
	var re *RepositoryError
	if !errors.As(err, &load) || !errors.As(err, &re) || re.PlainHTTP ||
		!strings.Contains(err.Error(), "repository wants credentials, add one (argocd repo add "+url+" --type helm --username USER --password PASSWORD)") {
		t.Errorf("without credentials: %v, want a chartsource.LoadError explained as a RepositoryError", err)
	}
	// From a snapshot, which holds no repository Secret: the failure says so.
	_, err = Resolve(t.Context(), a, Options{Recorded: true})
	if !errors.As(err, &re) || !re.NoSecrets || !strings.Contains(err.Error(), "a snapshot holds no repository credentials") ||
		!strings.Contains(err.Error(), "if the repository wants credentials, review the Application against the live cluster") {
		t.Errorf("from a snapshot: %v, want a RepositoryError that says a snapshot holds no credentials", err)
	}
}

// TestExplainOCIRegistry: a chart in a plain-HTTP OCI registry, read as Argo CD reads
// it: over HTTPS unless the repository Secret says insecureOCIForceHttp. The failure
// names the Secret to add, or the one to fix; with the field set the chart loads.
func TestExplainOCIRegistry(t *testing.T) {
	host, stop := servers.ServeOCI()
	defer stop()
	chartDir, err := testenv.WriteChart(t.TempDir(), "web", "1.0.0", map[string]string{"templates/cm.yaml": webTemplate,
		"values.yaml": "inline: {key: none}\n"})
	if err != nil {
		t.Fatal(err)
	}
	tgz, err := testenv.Package(chartDir, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := servers.PushOCI(tgz, host, "charts"); err != nil {
		t.Fatal(err)
	}
	t.Setenv("HELM_REPOSITORY_CACHE", t.TempDir())
	repo := host + "/charts"
	secret := func(data map[string]string) Options {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: "argocd", Labels: map[string]string{SecretTypeLabel: "repository"}},
			Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return Options{Secrets: fake.NewClientset(s).CoreV1()}
	}
	for _, tc := range []struct {
		name     string
		o        Options
		secret   string
		mentions []string
	}{
		{"no Secret", Options{}, "", []string{"no Argo CD repository Secret in namespace argocd has url " + repo, `insecureOCIForceHttp: "true"`,
			"argocd repo add " + repo + " --type helm --enable-oci --insecure-oci-force-http"}},
		{"a Secret without insecureOCIForceHttp", secret(map[string]string{"url": repo, "enableOCI": "true", "username": "u", "password": "p"}),
			"argocd/registry", []string{"repository Secret argocd/registry does not say insecureOCIForceHttp"}},
		{"a snapshot", Options{Recorded: true}, "", []string{"speaks plain HTTP", "a snapshot holds no repository Secret", "against the live cluster"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := &Application{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "argocd"}, Spec: Spec{
				Source: &Source{RepoURL: repo, Chart: "web", TargetRevision: "1.0.0"}, Destination: Destination{Namespace: "web"}}}
			c, err := Resolve(t.Context(), app, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			_, err = chartsource.Load(t.Context(), c.Options)
			var re *RepositoryError
			if !errors.As(c.Explain(err), &re) || !re.PlainHTTP || re.Secret != tc.secret || !errors.As(re, new(*chartsource.LoadError)) {
				t.Fatalf("explained %v as %+v, want a plain-HTTP RepositoryError with Secret %q wrapping the load error", err, re, tc.secret)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(re.Error(), m) {
					t.Errorf("%q lacks %q", re.Error(), m)
				}
			}
		})
	}

	ok := secret(map[string]string{"url": repo, "enableOCI": "true", "insecureOCIForceHttp": "true"})
	app := &Application{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "argocd"}, Spec: Spec{
		Source: &Source{RepoURL: repo, Chart: "web", TargetRevision: "1.0.0"}, Destination: Destination{Namespace: "web"}}}
	if c, manifest := render(t, app, ok); c.Kind != OCI || c.Credentials != "argocd/registry" || !strings.Contains(manifest, "namespace: web\n") {
		t.Errorf("with insecureOCIForceHttp: chart %+v rendered\n%s", c, manifest)
	}
	// A digest is no Helm chart revision to Argo CD: said before any fetch.
	for _, rev := range []string{"sha256:" + strings.Repeat("0f", 32), "1.0.0@sha256:" + strings.Repeat("0f", 32)} {
		app.Spec.Source.TargetRevision = rev
		if _, err := Resolve(t.Context(), app, ok); err == nil || !strings.Contains(err.Error(), "is a digest") || errors.As(err, new(*RepositoryError)) {
			t.Errorf("targetRevision %s: %v, want an error that says it is a digest", rev, err)
		}
	}
	// An OCI registry that wants credentials, from a snapshot: Helm's registry login.
	if msg := (&RepositoryError{Subject: "Application/argocd/web", Kind: OCI, RepoURL: "oci://" + repo, NoSecrets: true, Err: errors.New("401")}).Error(); !strings.Contains(msg, "helm registry login "+host+")") {
		t.Errorf("an OCI registry from a snapshot: %q, want helm registry login %s", msg, host)
	}
	other := errors.New("render failed")
	if c := (&Chart{Kind: OCI}); !errors.Is(c.Explain(other), other) || errors.As(c.Explain(other), new(*RepositoryError)) || c.Explain(nil) != nil {
		t.Error("Explain changed an error that is not the chart server's")
	}
}
