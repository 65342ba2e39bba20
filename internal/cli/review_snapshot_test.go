package cli_test

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
	"github.com/upgradeguard/upgradeguard/pkg/review"
)

// reviewVerdicts are what a review's rows decide, each CRD with its verdict, reason, objects
// at stake, pruned paths and fix: what a snapshot must give as the live cluster does.
func reviewVerdicts(t *testing.T, r result) string {
	t.Helper()
	type crd struct {
		Name, Verdict, Reason, Action string
		Objects                       *int64
		Pruned                        []string
	}
	type row struct {
		Cluster, Subject, From, To, NotJudged string
		Safe                                  bool
		Chart, Version                        string
		FromRevision                          int
		CRDs                                  []crd
		NextSteps                             []string
	}
	var out []row
	for _, r := range reviewRows(t, r) {
		w := row{Cluster: r.Cluster, Subject: r.Subject, From: r.From, To: r.To, NotJudged: r.NotJudged}
		if p := r.Report; p != nil {
			w.Safe, w.Chart, w.Version, w.FromRevision, w.NextSteps = p.Safe, p.Chart, p.ChartVersion, p.FromRevision, p.NextSteps
			for _, c := range p.CRDs {
				w.CRDs = append(w.CRDs, crd{Name: c.Name, Verdict: string(c.Verdict), Reason: c.Reason, Action: c.Action, Objects: c.Objects})
				if c.Schema != nil {
					w.CRDs[len(w.CRDs)-1].Pruned = c.Schema.PrunedPaths()
				}
			}
		}
		out = append(out, w)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// takeSnapshots takes a snapshot of each cluster with the snapshot command, into files,
// or pushed to the OCI registry on loopback at oci when it is not "", and returns the
// review flags that read them: --snapshot NAME=REF each.
func takeSnapshots(t *testing.T, clusters map[string]*testenv.ControlPlane, oci string) []string {
	t.Helper()
	dir := t.TempDir()
	var flags []string
	for name, c := range clusters {
		ref := filepath.Join(dir, name+".json")
		take := []string{"--kubeconfig", c.Kubeconfig, "snapshot", "-o", ref}
		if oci != "" {
			ref = "oci://" + oci + "/fleet/snapshots:" + name
			take = []string{"--kubeconfig", c.Kubeconfig, "snapshot", "--push", ref, "--plain-http"}
		}
		if s := run(t, take...); s.code != 0 {
			t.Fatalf("snapshot of %s: exit %d\n%s", name, s.code, s.stderr)
		}
		flags = append(flags, "--snapshot", name+"="+ref)
	}
	if oci != "" {
		flags = append(flags, "--plain-http")
	}
	return flags
}

// sameFromSnapshots runs the review of args live, and again with no cluster credentials
// at all (the kubeconfig does not exist) from the snapshots, and fails unless every row
// gives the same verdicts and the same exit. It returns the snapshot review's arguments.
func sameFromSnapshots(t *testing.T, args, snapshots []string) []string {
	t.Helper()
	live := run(t, append(slices.Clone(args), "-o", "json")...)
	snapArgs := slices.Clone(args)
	i := slices.Index(snapArgs, "--kubeconfig")
	snapArgs[i+1] = filepath.Join(t.TempDir(), "no-kubeconfig")
	snapArgs = append(snapArgs, snapshots...)
	snap := run(t, append(slices.Clone(snapArgs), "-o", "json")...)
	if snap.code != live.code {
		t.Errorf("from snapshots: exit %d, live %d\n%s", snap.code, live.code, snap.stderr)
	}
	if got, want := reviewVerdicts(t, snap), reviewVerdicts(t, live); got != want {
		t.Errorf("from snapshots, the verdicts differ from the live cluster's:\nsnapshot: %s\nlive: %s", got, want)
	}
	var rep review.Report
	if err := json.Unmarshal([]byte(snap.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Snapshots) != len(snapshots)/2 || len(rep.Snapshots) == 0 || rep.Snapshots[0].Age == "" {
		t.Errorf("snapshots in the JSON report: %+v, want one per snapshot with its age", rep.Snapshots)
	}
	return snapArgs
}

// contextOf is the current context of a control plane's kubeconfig: the cluster name a
// review without --cluster gives.
func contextOf(t *testing.T, cp *testenv.ControlPlane) string {
	t.Helper()
	c, err := clientcmd.LoadFromFile(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return c.CurrentContext
}

// ociRegistry runs an OCI registry on loopback for the test.
func ociRegistry(t *testing.T) string {
	t.Helper()
	host, stop := servers.ServeOCI()
	t.Cleanup(stop)
	return host
}

// snapshotAgeShown checks that each output format of a review from snapshots says the
// snapshot's age.
func snapshotAgeShown(t *testing.T, args []string) {
	t.Helper()
	for _, format := range []string{"text", "markdown"} {
		r := run(t, append(slices.Clone(args), "-o", format)...)
		if !strings.Contains(r.stdout, "judged from a snapshot taken") || !strings.Contains(r.stdout, " ago)") {
			t.Errorf("-o %s does not say the snapshot's age:\n%s", format, r.stdout)
		}
	}
}
