package webhook_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	sourcev1 "github.com/fluxcd/source-controller/api/v1"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestSameNextStepsBothDoors asks the CLI's check and the admission gate the same
// question: the release runs a chart whose CRD stores at v1alpha1 only, and the update
// goes to a version that keeps only v1 (Crossplane's CompositionRevision, 1.10 -> 2.0,
// under a group of its own). Both read the same chart repository on loopback and must
// give the same next steps, the stepping stone 1.12.2 included.
func TestSameNextStepsBothDoors(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	const ns, release, crd = "stones", "stones", "compositionrevisions.stones.example.io"
	url := steppingStoneRelease(t, ns, release)

	// The CLI's door.
	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, []string{"--kubeconfig", s.cp.Kubeconfig, "check", "--chart", "stones", "--repo", url, "--version", "2.0.0",
		"--release", release, "-n", ns, "-o", "json"}, cli.Streams{Out: &out, ErrOut: &errOut})
	if code != cli.ExitFindings {
		t.Fatalf("check exit %d, want %d\n%s%s", code, cli.ExitFindings, out.String(), errOut.String())
	}
	var rep check.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("check -o json: %v\n%s", err, out.String())
	}
	stone := false
	for _, c := range rep.CRDs {
		stone = stone || (c.Name == crd && c.Verdict == predict.Bridge && c.SteppingStone == "1.12.2")
	}
	if !stone || len(rep.NextSteps) == 0 {
		t.Fatalf("the CLI names no stepping stone 1.12.2 for %s: %+v", crd, rep)
	}

	// The gate's door: the same change as a HelmRelease update.
	err := setVersion(ctx, s.c, ns, release, "2.0.0")
	mustDeny(t, err, "Next steps: "+strings.Join(rep.NextSteps, "; then ")+"; then re-apply the change", "upgrade to chart version 1.12.2")
}

// steppingStoneRelease serves, on loopback, a chart named like the release whose versions
// carry Crossplane's CompositionRevision CRD from 1.10.2 to 2.0.0 under a group of the
// release's own (1.12.2 is the stepping stone to 2.0.0), installs 1.10.2 with the real
// Helm CLI, and creates the HelmRepository and the HelmRelease at that version. It returns
// the repository URL.
func steppingStoneRelease(t *testing.T, ns, release string) string {
	t.Helper()
	fx, err := testenv.Fixtures()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, v := range []string{"1.10.2", "1.11.1", "1.12.2", "1.13.0", "2.0.0"} {
		data, err := os.ReadFile(filepath.Join(fx, "crds/crossplane/v"+v+"/apiextensions.crossplane.io_compositionrevisions.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		src, err := testenv.WriteChart(filepath.Join(dir, "src", v), release, v,
			map[string]string{"templates/crd.yaml": strings.ReplaceAll(string(data), "apiextensions.crossplane.io", release+".example.io")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := testenv.Package(src, filepath.Join(dir, "repo")); err != nil {
			t.Fatal(err)
		}
	}
	url, stop, err := servers.ServeRepo(filepath.Join(dir, "repo"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	if out, err := s.cp.Helm("install", release, release, "--repo", url, "--version", "1.10.2", "-n", ns, "--create-namespace").CombinedOutput(); err != nil {
		t.Fatalf("helm install: %v: %s", err, out)
	}
	helmRepo(t, ns, "charts", sourcev1.HelmRepositorySpec{URL: url})
	helmRelease(t, ns, release, release, "1.10.2", "charts")
	return url
}
