package webhook_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/pkg/plan"
)

// TestBridgeDenialNamesPlan: a HelmRelease on a chart whose CRD stores at v1alpha1 only
// moves to a version that keeps only v1 (Crossplane's CompositionRevision, 1.10 -> 2.0,
// under a group of its own). The gate denies it and names the plan command; that
// command, run through the CLI, gives the spec.chart.spec.version values to commit
// (the stepping stone, then the target) with the migration between them, and the gate
// admits the first value, as the plan predicts.
func TestBridgeDenialNamesPlan(t *testing.T) {
	skipShort(t)
	ctx := t.Context()
	const ns, release = "planhr", "planhr"
	steppingStoneRelease(t, ns, release)

	const planCmd = "upgradeguard plan --helmrelease planhr/planhr --version 2.0.0"
	mustDeny(t, setVersion(ctx, s.c, ns, release, "2.0.0"), "The whole safe path: "+planCmd)

	var out, errOut bytes.Buffer
	args := append([]string{"--kubeconfig", s.cp.Kubeconfig}, strings.Fields(planCmd)[1:]...)
	code := cli.Execute(ctx, append(args, "-o", "json"), cli.Streams{Out: &out, ErrOut: &errOut})
	if code != cli.ExitFindings {
		t.Fatalf("plan exit %d, want 1\n%s%s", code, out.String(), errOut.String())
	}
	var p plan.Plan
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatalf("plan -o json: %v\n%s", err, out.String())
	}
	var versions []string
	for _, st := range p.Steps {
		versions = append(versions, string(st.Kind)+" "+st.ChartVersion)
		if st.Kind == plan.Upgrade && !strings.Contains(st.Commands[0], `spec.chart.spec.version: "`+st.ChartVersion+`"`) {
			t.Errorf("step %q does not name the spec.chart.spec.version value to commit", st.Commands[0])
		}
	}
	if !slices.Equal(versions, []string{"upgrade 1.12.2", "migrate ", "upgrade 2.0.0"}) || p.From != "1.10.2" {
		t.Fatalf("plan from %s: %v, want 1.12.2, migrate, 2.0.0", p.From, versions)
	}
	if err := setVersion(ctx, s.c, ns, release, p.Steps[0].ChartVersion); err != nil {
		t.Errorf("the gate denied the plan's first step (%s): %v", p.Steps[0].ChartVersion, err)
	}
}
