package review

import (
	"context"
	"strings"

	"helm.sh/helm/v4/pkg/cli"
)

// inputs are the changes found beside the HelmReleases of the repository's files: those
// of kustomize builds, Argo CD Applications and CRD manifests.
type inputs struct {
	changes []Change
	// built are the files a kustomize build reads at the head revision: a HelmRelease in
	// one is judged as the build leaves it, not as the file holds it.
	built map[string]bool
}

// inputChanges finds what else the change touches: HelmReleases whose effective spec a
// kustomize build changes (kustomize.go), Argo CD Applications whose Helm source changes
// (argocd.go), and CRD manifests (manifests.go).
func inputChanges(ctx context.Context, base, head *Tree) (*inputs, error) {
	in := &inputs{built: map[string]bool{}}
	if err := kustomizeChanges(ctx, base, head, in); err != nil {
		return nil, err
	}
	apps, err := applicationChanges(base, head)
	if err != nil {
		return nil, err
	}
	in.changes = append(in.changes, apps...)
	in.changes = append(in.changes, manifestChanges(base, head)...)
	return in, nil
}

// firstChangedLine is the first line at which after differs from before (1-based); the
// line after the last when after only drops lines.
func firstChangedLine(before, after []byte) int {
	b, a := strings.Split(string(before), "\n"), strings.Split(string(after), "\n")
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i + 1
		}
	}
	return max(len(a), 1)
}

// placeFile is the file that says which clusters the change lands on.
func (c Change) placeFile() string {
	if c.place != "" {
		return c.place
	}
	return c.File
}

// judgeOther fills the row of a change that is not a HelmRelease's own chart judged
// with its head tree: an Application, CRD manifests, or what could not be judged.
func (c Change) judgeOther(ctx context.Context, cl Cluster, settings *cli.EnvSettings, row *Row) error {
	if c.notJudged != "" {
		row.NotJudged = c.notJudged
		return nil
	}
	rep, why, err := c.judge(ctx, cl, settings)
	if err != nil {
		return err
	}
	row.Report, row.NotJudged = rep, why
	return nil
}
