package cli_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdmove"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// moveCharts are the charts of a CRD's move from release widgets (chart widgets, which
// renders it from templates/ at 1.0.0 and no longer at 2.0.0) to release widgets-crds
// (chart widgets-crds: 0.1.0 without it, 1.0.0 rendering it as widgets 1.0.0 did, 2.0.0
// with a changed CRD, the category "widgets" added).
type moveCharts struct{ a1, a2, b0, b1, b2 string }

func writeMoveCharts(t *testing.T, crd string) moveCharts {
	t.Helper()
	dir := t.TempDir()
	b2crd := strings.Replace(crd, "    kind: LeaderWorkerSet\n", "    kind: LeaderWorkerSet\n    categories:\n    - widgets\n", 1)
	if b2crd == crd {
		t.Fatal("the CRD's names.kind line was not found: the fixture changed")
	}
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\ndata:\n  chart: {{ .Chart.Name }}\n"
	write := func(name, version string, files map[string]string) string {
		files["templates/configmap.yaml"] = cm
		p, err := testenv.WriteChart(filepath.Join(dir, name+"-"+version), name, version, files)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return moveCharts{
		a1: write("widgets", "1.0.0", map[string]string{"templates/crd.yaml": crd}),
		a2: write("widgets", "2.0.0", map[string]string{}),
		b0: write("widgets-crds", "0.1.0", map[string]string{}),
		b1: write("widgets-crds", "1.0.0", map[string]string{"templates/crd.yaml": crd}),
		b2: write("widgets-crds", "2.0.0", map[string]string{"templates/crd.yaml": b2crd}),
	}
}

// adopt runs crd adopt with args and -o json, and returns its result; want is the exit
// code.
func adopt(t *testing.T, want int, args ...string) (*crdmove.Result, result) {
	t.Helper()
	r := ug(t, append(append([]string{"crd", "adopt"}, args...), "-o", "json")...)
	if r.code != want {
		t.Fatalf("crd adopt %s: exit %d, want %d\n%s%s", strings.Join(args, " "), r.code, want, r.stdout, r.stderr)
	}
	if want != cli.ExitSafe {
		return nil, r
	}
	var res crdmove.Result
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("crd adopt JSON: %v\n%s", err, r.stdout)
	}
	return &res, r
}

// manifestHas says whether helm get manifest of release lists crd.
func manifestHas(t *testing.T, h helmBin, release, ns, crd string) bool {
	t.Helper()
	out, err := h.cmd("get", "manifest", release, "-n", ns).Output()
	if err != nil {
		t.Fatalf("%s get manifest %s: %v", h.name, release, err)
	}
	return strings.Contains(string(out), "name: "+crd+"\n")
}

// TestCRDMovesBetweenReleases moves a CRD holding 12 objects from release widgets to
// release widgets-crds with the real Helm 4 and Helm 3, the way a chart split into an
// operator chart and a -crds chart asks for (lws#880, cozystack#2036): check of
// widgets-crds' upgrade to the chart that renders the CRD gives the move verdict and the
// crd adopt command; crd adopt refuses a chart that does not render it, plans without
// writing, then writes and is idempotent; widgets-crds takes the CRD, widgets is upgraded
// without it (check is safe first), widgets-crds upgrades the CRD later. Every object
// stays, and only widgets-crds' manifest lists the CRD.
func TestCRDMovesBetweenReleases(t *testing.T) {
	needCluster(t)
	for _, h := range bothHelms(t) {
		t.Run(h.name, func(t *testing.T) {
			group := "adopt-" + h.name + ".move.test"
			crd := "leaderworkersets." + group
			text, err := testenv.LWSCRDText(group)
			if err != nil {
				t.Fatal(err)
			}
			c := writeMoveCharts(t, text)
			ns := "adopt-" + h.name
			from, to := ns+"/widgets", ns+"/widgets-crds"
			h.install(t, "widgets", ns, c.a1, group)
			h.must(t, "install", "widgets-crds", c.b0, "-n", ns)
			t.Cleanup(func() { _ = h.cmd("uninstall", "widgets-crds", "-n", ns).Run() })

			// check recognises the move from the side the CRD joins.
			r := ug(t, "check", "--release", "widgets-crds", "--chart", c.b1, "-n", ns, "-o", "json")
			rep := report(t, r)
			row := findCRD(rep, crd)
			if r.code != cli.ExitFindings || row == nil || row.Verdict != predict.Move || row.Move == nil ||
				row.Move.From.String() != from || row.Move.To.String() != to {
				t.Fatalf("check of widgets-crds: exit %d, %s is %+v; want 1 and a move from %s to %s\n%s", r.code, crd, row, from, to, r.stdout)
			}
			wantStep := fmt.Sprintf("upgradeguard crd adopt %s --from %s --to %s --chart %s --apply", crd, from, to, c.b1)
			if !slices.Contains(rep.NextSteps, wantStep) {
				t.Errorf("check's next steps %q lack %q", rep.NextSteps, wantStep)
			}
			// Helm agrees: it refuses the CRD while its ownership names widgets.
			if out, err := h.cmd("upgrade", "widgets-crds", c.b1, "-n", ns).CombinedOutput(); err == nil || !strings.Contains(string(out), "invalid ownership metadata") {
				t.Fatalf("%s upgrade widgets-crds before the move: %v, want Helm's ownership refusal\n%s", h.name, err, out)
			}

			// crd adopt refuses a chart that does not render the CRD, and plans first.
			if _, r := adopt(t, cli.ExitCouldNot, crd, "--from", from, "--to", to, "--chart", c.b0); !strings.Contains(r.stderr, "does not render it") {
				t.Errorf("adopt with a chart without the CRD: %s", r.stderr)
			}
			if _, r := adopt(t, cli.ExitCouldNot, crd, "--from", from, "--to", to); !strings.Contains(r.stderr, "does not render it from templates/") {
				t.Errorf("adopt with the installed revision, which lacks the CRD: %s", r.stderr)
			}
			res, _ := adopt(t, cli.ExitSafe, crd, "--from", from, "--to", to, "--chart", c.b1)
			// (The managed-by label is Helm already: widgets set it.)
			if pending := res.Pending(); !res.DryRun || res.Changed || len(pending) != 2 || pending[0].Kind != predict.MoveKeep ||
				pending[1].Kind != predict.MoveOwnership || !res.FromRenders {
				t.Errorf("dry run: %+v, want the keep and ownership steps to do and nothing written", res)
			}
			if got := liveOwner(t, crd); got != "widgets" {
				t.Fatalf("the dry run wrote the ownership: %q", got)
			}

			// The move, as check said: its next step pasted, then once more (nothing left).
			runUpgradeguard(t, wantStep)
			again, _ := adopt(t, cli.ExitSafe, crd, "--from", from, "--to", to, "--chart", c.b1, "--apply")
			if again.Changed || len(again.Pending()) != 0 {
				t.Errorf("a second adopt: %+v, want nothing to write", again)
			}
			if r := ug(t, "check", "--release", "widgets-crds", "--chart", c.b1, "-n", ns); r.code != cli.ExitSafe {
				t.Errorf("check of widgets-crds after the move: exit %d, want 0\n%s%s", r.code, r.stdout, r.stderr)
			}
			h.must(t, "upgrade", "widgets-crds", c.b1, "-n", ns)

			// widgets lets go of it: check is safe and names the move; Helm leaves it.
			r = ug(t, "check", "--release", "widgets", "--chart", c.a2, "-n", ns, "-o", "json")
			if row := findCRD(report(t, r), crd); r.code != cli.ExitSafe || row == nil || row.Move == nil || !strings.Contains(row.Reason, "moved to release "+to) {
				t.Errorf("check of widgets without the CRD: exit %d, %+v; want 0 and the move named\n%s", r.code, row, r.stdout)
			}
			h.must(t, "upgrade", "widgets", c.a2, "-n", ns)
			assertIntact(t, crd, group)

			// widgets-crds updates the CRD from now on.
			h.must(t, "upgrade", "widgets-crds", c.b2, "-n", ns)
			live, err := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), crd, metav1.GetOptions{})
			if err != nil || !slices.Contains(live.Spec.Names.Categories, "widgets") {
				t.Errorf("after widgets-crds 2.0.0 the CRD is %v (%v), want the category widgets its chart added", live.Spec.Names, err)
			}
			assertIntact(t, crd, group)
			if manifestHas(t, h, "widgets", ns, crd) || !manifestHas(t, h, "widgets-crds", ns, crd) {
				t.Errorf("helm get manifest: widgets lists %s: %v, widgets-crds: %v; want widgets-crds only", crd,
					manifestHas(t, h, "widgets", ns, crd), manifestHas(t, h, "widgets-crds", ns, crd))
			}
		})
	}
}

// findCRD is the report's row of crd, nil when it has none.
func findCRD(rep *check.Report, crd string) *check.CRDReport {
	for i := range rep.CRDs {
		if rep.CRDs[i].Name == crd {
			return &rep.CRDs[i]
		}
	}
	return nil
}

// liveOwner is the release the live CRD's Helm ownership annotation names.
func liveOwner(t *testing.T, crd string) string {
	t.Helper()
	live, err := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions().Get(t.Context(), crd, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return live.Annotations[predict.ReleaseNameAnnotation]
}

// runUpgradeguard runs an upgradeguard command a report printed, as a user would paste
// it, and wants exit 0.
func runUpgradeguard(t *testing.T, command string) {
	t.Helper()
	f := strings.Fields(command)
	if len(f) == 0 || f[0] != "upgradeguard" {
		t.Fatalf("%q is not an upgradeguard command", command)
	}
	if r := ug(t, f[1:]...); r.code != cli.ExitSafe {
		t.Fatalf("%s: exit %d\n%s%s", command, r.code, r.stdout, r.stderr)
	}
}
