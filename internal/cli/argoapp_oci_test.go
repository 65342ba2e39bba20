package cli_test

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv/argocd"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
)

// pushFlux pushes each packaged chart in pkgs (fluxSeries, or realFluxPackages) to
// host/charts, tagged with its version, and returns the OCI repository host/charts.
func pushFlux(t *testing.T, host, pkgs string) string {
	t.Helper()
	tgzs, err := filepath.Glob(filepath.Join(pkgs, "*.tgz"))
	if err != nil || len(tgzs) == 0 {
		t.Fatalf("no charts in %s: %v", pkgs, err)
	}
	for _, tgz := range tgzs {
		if _, err := servers.PushOCI(tgz, host, "charts"); err != nil {
			t.Fatal(err)
		}
	}
	return host + "/charts"
}

// ociRepositorySecret creates Argo CD's repository Secret for the plain-HTTP OCI Helm
// repository url, as `argocd repo add` writes it (--type oci for an oci:// url, else
// --type helm --enable-oci; both with --insecure-oci-force-http), deleted when the test
// ends.
func ociRepositorySecret(t *testing.T, name, url string) {
	t.Helper()
	typ := "helm"
	if strings.HasPrefix(url, "oci://") {
		typ = "oci"
	}
	secrets := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Secrets(argocd.Namespace)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{argoapp.SecretTypeLabel: "repository"}},
		StringData: map[string]string{"type": typ, "name": name, "url": url, "enableOCI": "true", "insecureOCIForceHttp": "true"},
	}
	if _, err := secrets.Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := secrets.Delete(context.WithoutCancel(t.Context()), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Secret %s: %v", name, err)
		}
	})
}

// TestCheckArgoCDAppOCI: the real flux2 charts pushed to an OCI registry on loopback
// (plain HTTP), an Application of flux2 from it, over live CRDs 2.17.2 left storing
// v1beta2, in both spellings Argo CD takes for an OCI Helm repository. With Argo CD's
// repository Secret (enableOCI, insecureOCIForceHttp) check --argocd-app gives the
// verdicts of check --chart from a Helm repository; without it, exit 2 naming the
// Secret to add.
func TestCheckArgoCDAppOCI(t *testing.T) {
	needCluster(t)
	fluxLiveStoresV1beta2(t)
	pkgs := realFluxPackages(t)
	host, stop := servers.ServeOCI()
	defer stop()
	repo := pushFlux(t, host, pkgs)
	url, stopHTTP, err := servers.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	defer stopHTTP()

	apps := []struct{ name, repoURL, add string }{
		{"flux-oci", "oci://" + repo, "argocd repo add oci://" + repo + " --type oci --insecure-oci-force-http"},
		{"flux-oci-bare", repo, "argocd repo add " + repo + " --type helm --enable-oci --insecure-oci-force-http"},
	}
	for _, a := range apps {
		createApplication(t, a.name, appSpec(map[string]any{"repoURL": a.repoURL, "chart": "flux2", "targetRevision": "2.18.2"}, "flux-system"))
	}
	// Without the repository Secret the registry is read over HTTPS, as Argo CD reads it:
	// exit 2, naming the Secret that makes it work.
	for _, a := range apps {
		for _, cmd := range []string{"check", "plan"} {
			r := ug(t, cmd, "--argocd-app", "argocd/"+a.name)
			want := []string{"Application/argocd/" + a.name + ": the registry of " + a.repoURL + " speaks plain HTTP",
				"no Argo CD repository Secret in namespace argocd has url " + a.repoURL, `insecureOCIForceHttp: "true"`, a.add}
			if r.code != cli.ExitCouldNot || !containsAll(r.stderr, want...) || strings.Contains(r.stderr, "--username") {
				t.Errorf("%s --argocd-app argocd/%s without a repository Secret: exit %d, want 2 with %q and no --username advice\n%s%s",
					cmd, a.name, r.code, want, r.stdout, r.stderr)
			}
		}
	}

	for _, a := range apps {
		ociRepositorySecret(t, a.name, a.repoURL)
		sameAsChart(t, "argocd/"+a.name, "--chart", "flux2", "--repo", url, "--version", "2.18.2", "-n", "flux-system")
	}
	// A semver range resolves against the registry's tags, as Argo CD resolves it:
	// ~2.17 is 2.17.2, whose CRDs are the live ones, and the sync is safe.
	createApplication(t, "flux-oci-safe", appSpec(map[string]any{"repoURL": repo, "chart": "flux2", "targetRevision": "~2.17"}, "flux-system"))
	safe := ug(t, "check", "--argocd-app", "argocd/flux-oci-safe", "-o", "json")
	if rep := report(t, safe); safe.code != cli.ExitSafe || rep.ChartVersion != "2.17.2" {
		t.Errorf("targetRevision ~2.17: exit %d at chart version %q, want 0 at 2.17.2\n%s", safe.code, rep.ChartVersion, safe.stderr)
	}
	// The registry's digest of 2.18.2 as targetRevision: Argo CD takes none for a Helm
	// chart, and neither does check.
	digest := manifestDigest(t, host, "charts/flux2", "2.18.2")
	createApplication(t, "flux-oci-digest", appSpec(map[string]any{"repoURL": repo, "chart": "flux2", "targetRevision": digest}, "flux-system"))
	if r := ug(t, "check", "--argocd-app", "argocd/flux-oci-digest"); r.code != cli.ExitCouldNot ||
		!containsAll(r.stderr, "targetRevision \""+digest+"\" is a digest", "set targetRevision to the chart version") {
		t.Errorf("targetRevision %s: exit %d, want 2 saying it is a digest\n%s%s", digest, r.code, r.stdout, r.stderr)
	}
	text := ug(t, "check", "--argocd-app", "argocd/flux-oci")
	for _, want := range []string{"to flux2 2.18.2", "upgradeguard migrate --crd " + buckets} {
		if !strings.Contains(text.stdout, want) {
			t.Errorf("text output lacks %q:\n%s", want, text.stdout)
		}
	}
}

// TestPlanArgoCDAppOCI: flux2 2.12 to 2.18.2 read from an OCI registry's tags, for an
// Application that last deployed 2.12.0 over live CRDs that store HelmRepositories at
// v1beta2. The registry also holds a channel tag and a pre-release, which are no chart
// versions to step through. plan --argocd-app walks the semver tags newer than the
// deployed version and words each step as a targetRevision to commit; the same chart
// as the second of two sources needs that source's position.
func TestPlanArgoCDAppOCI(t *testing.T) {
	needCluster(t)
	fluxLive212(t)
	pkgs := t.TempDir()
	fluxSeries(t, pkgs)
	host, stop := servers.ServeOCI()
	defer stop()
	repo := pushFlux(t, host, pkgs)
	for _, tag := range []string{"stable", "2.17.3-rc.1"} {
		if _, err := servers.PushOCITag(filepath.Join(pkgs, "flux2-2.18.2.tgz"), host, "charts", tag); err != nil {
			t.Fatal(err)
		}
	}
	createApplication(t, "flux-oci-plan", appSpec(map[string]any{"repoURL": repo, "chart": "flux2", "targetRevision": "2.18.2"}, "flux-system"))
	ociRepositorySecret(t, "flux-oci", repo)
	setApplicationStatus(t, "flux-oci-plan", map[string]any{"sync": map[string]any{"status": "OutOfSync", "revision": "2.18.2"},
		"history": []any{map[string]any{"id": int64(0), "revision": "2.12.0"}}})

	p := planOf(t, cli.ExitFindings, "--argocd-app", "argocd/flux-oci-plan")
	var steps, commands []string
	for _, s := range p.Steps {
		steps = append(steps, string(s.Kind)+" "+s.ChartVersion)
		commands = append(commands, s.Commands...)
	}
	if diff := cmp.Diff([]string{"upgrade 2.17.2", "migrate ", "upgrade 2.18.2"}, steps); diff != "" {
		t.Fatalf("steps (-want +got):\n%s", diff)
	}
	// 2.13.0, 2.14.0, 2.16.0, 2.17.2 and 2.18.2: newer than the deployed 2.12.0, and
	// neither the channel tag nor the pre-release.
	if p.From != "2.12.0" || p.FromSource != argoapp.FromHistory || p.VersionsConsidered != 5 {
		t.Errorf("plan from %q (%s) weighing %d versions, want from 2.12.0 (status.history) weighing 5", p.From, p.FromSource, p.VersionsConsidered)
	}
	for _, want := range []string{`commit targetRevision: "2.17.2"`, "argocd app set argocd/flux-oci-plan --revision 2.17.2",
		"upgradeguard migrate --crd " + buckets, "argocd app set argocd/flux-oci-plan --revision 2.18.2"} {
		if !slices.ContainsFunc(commands, func(c string) bool { return strings.Contains(c, want) }) {
			t.Errorf("plan commands lack %q:\n%s", want, strings.Join(commands, "\n"))
		}
	}

	// The same chart as the second of two sources (the first holds values): the
	// deployed version is that source's revision, and argocd app set names its position.
	createApplication(t, "flux-oci-multi", map[string]any{"project": "default",
		"destination": map[string]any{"server": argocd.InClusterServer, "namespace": "flux-system"},
		"sources": []any{
			map[string]any{"repoURL": "https://git.example.com/values.git", "ref": "values"},
			map[string]any{"repoURL": "oci://" + repo, "chart": "flux2", "targetRevision": "2.18.2"},
		}})
	ociRepositorySecret(t, "flux-oci-multi", "oci://"+repo)
	setApplicationStatus(t, "flux-oci-multi", map[string]any{"history": []any{map[string]any{"id": int64(0),
		"revisions": []any{"0123456789abcdef0123456789abcdef01234567", "2.12.0"}}}})
	multi := planOf(t, cli.ExitFindings, "--argocd-app", "argocd/flux-oci-multi")
	var first []string
	if len(multi.Steps) > 0 {
		first = multi.Steps[0].Commands
	}
	if want := "argocd app set argocd/flux-oci-multi --source-position 2 --revision 2.17.2"; multi.From != "2.12.0" ||
		!slices.ContainsFunc(first, func(c string) bool { return strings.Contains(c, want) }) {
		t.Errorf("multi-source plan from %q, first step %q; want from 2.12.0 and %q", multi.From, first, want)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// manifestDigest is the digest the registry at host gives repository:tag.
func manifestDigest(t *testing.T, host, repository, tag string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodHead, "http://"+host+"/v2/"+repository+"/manifests/"+tag, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	d := resp.Header.Get("Docker-Content-Digest")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(d, "sha256:") {
		t.Fatalf("HEAD %s:%s: %s, digest %q", repository, tag, resp.Status, d)
	}
	return d
}
