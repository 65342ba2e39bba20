package cli_test

import (
	"testing"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestSteppingStoneFromRepository: a cluster on Crossplane 1.10 (CompositionRevision
// stored at v1alpha1 only) asks about 2.0.0, which keeps only v1. check reads the
// repository's index over HTTP, renders older versions, and names 1.12.2: the newest
// that still serves v1alpha1 and already stores at v1.
func TestSteppingStoneFromRepository(t *testing.T) {
	needCluster(t)
	const revs = "compositionrevisions.apiextensions.crossplane.io"
	file := func(v string) string {
		return "crds/crossplane/v" + v + "/apiextensions.crossplane.io_compositionrevisions.yaml"
	}
	pkgs := t.TempDir()
	for _, v := range []string{"1.10.2", "1.11.1", "1.12.2", "1.13.0", "1.20.0", "2.0.0"} {
		if _, err := testenv.Package(fixtureChart(t, "crossplane-revs", v, file(v)), pkgs); err != nil {
			t.Fatal(err)
		}
	}
	url, stop, err := servers.ServeRepo(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	live, err := testenv.ReadCRDs(file("1.10.2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := testenv.ApplyCRD(t.Context(), apiextclient.NewForConfigOrDie(cp.Config), live[0]); err != nil {
		t.Fatal(err)
	}

	r := ug(t, "check", "--chart", "crossplane-revs", "--repo", url, "--version", "2.0.0", "-o", "json")
	if r.code != cli.ExitFindings {
		t.Fatalf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	migrate := "upgradeguard migrate --crd " + revs
	stoneAction := func(r result, want string) {
		t.Helper()
		for _, c := range report(t, r).CRDs {
			if c.Name == revs && (c.Verdict != predict.Bridge || c.SteppingStone != "1.12.2" || c.Action != want) {
				t.Errorf("verdict %s stepping stone %q action %q, want bridge via 1.12.2 with %q", c.Verdict, c.SteppingStone, c.Action, want)
			}
		}
	}
	stoneAction(r, "two steps: "+migrate+"; upgrade to chart version 1.12.2; "+migrate+"; then upgrade to 2.0.0")

	// An Argo CD Application of the same chart: the steps are targetRevision commits.
	createApplication(t, "revs", appSpec(map[string]any{"repoURL": url, "chart": "crossplane-revs", "targetRevision": "2.0.0"}, "crossplane-system"))
	r = ug(t, "check", "--argocd-app", "argocd/revs", "-o", "json")
	if r.code != cli.ExitFindings {
		t.Fatalf("check --argocd-app: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	revision := func(v string) string {
		return `commit targetRevision: "` + v + `" to the Helm source of Application argocd/revs (or: argocd app set argocd/revs --revision ` + v + ")"
	}
	stoneAction(r, "two steps: "+migrate+"; "+revision("1.12.2")+"; "+migrate+"; then "+revision("2.0.0"))
	r = ug(t, "check", "--chart", "crossplane-revs", "--repo", url, "--version", "2.0.0", "--no-stepping-stone", "-o", "json")
	for _, c := range report(t, r).CRDs {
		if c.SteppingStone != "" {
			t.Errorf("--no-stepping-stone still named %q", c.SteppingStone)
		}
	}
}
