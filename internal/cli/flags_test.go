package cli_test

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/upgradeguard/upgradeguard/internal/cli"
	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
)

// commands lists every command of the tree by its path ("release migrate").
func commands() map[string]*cobra.Command {
	out := map[string]*cobra.Command{}
	var walk func(string, *cobra.Command)
	walk = func(path string, c *cobra.Command) {
		out[path] = c
		for _, sub := range c.Commands() {
			walk(strings.TrimSpace(path+" "+sub.Name()), sub)
		}
	}
	walk("", cli.NewRootCmd(cli.Streams{Out: io.Discard, ErrOut: io.Discard}))
	return out
}

// TestChartSourceFlags: every command that loads a chart takes the one chart-source flag
// set, credentials included, with the same help; none declares a chart flag of its own.
func TestChartSourceFlags(t *testing.T) {
	loads := map[string]cliflag.ChartRef{
		"check": cliflag.Chart, "plan": cliflag.Chart, "migrate": cliflag.Chart, "rbac": cliflag.Chart,
		"release apply-check": cliflag.Chart, "release migrate": cliflag.ToChart, "crd adopt": cliflag.AdoptChart,
	}
	cmds := commands()
	for path, ref := range loads {
		c, ok := cmds[path]
		if !ok {
			t.Errorf("no command %q", path)
			continue
		}
		want := pflag.NewFlagSet(path, pflag.ContinueOnError)
		cliflag.AddChartSource(want, ref, &chartsource.Options{})
		want.VisitAll(func(w *pflag.Flag) {
			got := c.Flags().Lookup(w.Name)
			switch {
			case got == nil:
				t.Errorf("%s: no --%s", path, w.Name)
			case got.Value.Type() != w.Value.Type() || got.Shorthand != w.Shorthand:
				t.Errorf("%s --%s: %s -%s, want %s -%s", path, w.Name, got.Value.Type(), got.Shorthand, w.Value.Type(), w.Shorthand)
			case got.Usage != w.Usage && path != "plan": // plan words --version as its target
				t.Errorf("%s --%s: help %q, want the chart-source set's %q", path, w.Name, got.Usage, w.Usage)
			}
		})
	}
	for path, c := range cmds {
		if _, ok := loads[path]; !ok && (c.Flags().Lookup("chart") != nil || c.Flags().Lookup("to-chart") != nil) {
			t.Errorf("%s takes a chart: add it to this test's list of commands that load charts", path)
		}
	}
}

// TestTypedFlags: every --helm-driver, --crd-policy and --engine is the typed flag,
// validated when the flags are parsed.
func TestTypedFlags(t *testing.T) {
	drivers, policies, engines := 0, 0, 0
	for path, c := range commands() {
		if f := c.Flags().Lookup(cliflag.HelmDriverFlag); f != nil {
			drivers++
			if _, ok := f.Value.(*cliflag.HelmDriver); !ok {
				t.Errorf("%s: --helm-driver is a %T, not cliflag.AddHelmDriver's", path, f.Value)
			}
		}
		if f := c.Flags().Lookup(cliflag.CRDPolicyFlag); f != nil {
			policies++
			if err := f.Value.Set("always"); err == nil {
				t.Errorf("%s: --crd-policy always accepted: not cliflag.AddCRDPolicy's", path)
			}
		}
		if f := c.Flags().Lookup(cliflag.EngineFlag); f != nil {
			engines++
			if err := f.Value.Set("svm"); err == nil {
				t.Errorf("%s: --engine svm accepted: not cliflag.AddEngine's", path)
			}
		}
	}
	if engines != 2 {
		t.Errorf("%d commands take --engine, want 2 (migrate and rbac)", engines)
	}
	// check, plan, migrate, rbac, audit, crd adopt and release apply-check,
	// rollback-check, uninstall-check, diff-failed and migrate; the CRD policy on those
	// that predict CRDs.
	if drivers != 11 || policies != 6 {
		t.Errorf("%d commands take --helm-driver and %d --crd-policy, want 11 and 6", drivers, policies)
	}
}

// TestManifestsFlag: the commands that judge a chart's CRDs take --manifests, cliflag's
// one flag; plan takes it hidden, to refuse it with advice.
func TestManifestsFlag(t *testing.T) {
	var path string
	ref := &cobra.Command{Use: "ref"}
	cliflag.AddManifests(ref, &path)
	w := ref.Flags().Lookup(cliflag.ManifestsFlag)
	var got []string
	for name, c := range commands() {
		f := c.Flags().Lookup(cliflag.ManifestsFlag)
		if f == nil {
			continue
		}
		got = append(got, name)
		if f.Usage != w.Usage || f.Value.Type() != w.Value.Type() {
			t.Errorf("%s --manifests: %q, want cliflag.AddManifests's %q", name, f.Usage, w.Usage)
		}
		if f.Hidden != (name == "plan") {
			t.Errorf("%s --manifests hidden: %v", name, f.Hidden)
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"check", "migrate", "plan", "rbac"}) {
		t.Errorf("commands with --manifests: %v, want check, migrate, plan and rbac", got)
	}
}
