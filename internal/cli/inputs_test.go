package cli

import (
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/pkg/audit"
	"github.com/upgradeguard/upgradeguard/pkg/chartmigrate"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
)

// TestInputFlags: every library option a finding names is worded as a flag that the
// command reporting the finding has, with the finding's value.
func TestInputFlags(t *testing.T) {
	commandOf := map[string][]string{
		chartmigrate.OptionNewRelease: {"release", "migrate"},
		chartmigrate.OptionMapPVC:     {"release", "migrate"},
		chartmigrate.OptionMapSecret:  {"release", "migrate"},
		slots.OptionEquivalent:        {"slots"},
	}
	if len(commandOf) != len(inputFlags) {
		t.Errorf("%d options worded, %d checked", len(inputFlags), len(commandOf))
	}
	root := NewRootCmd(Streams{})
	for option, path := range commandOf {
		cmd, _, err := root.Find(path)
		if err != nil {
			t.Fatalf("%v: %v", path, err)
		}
		flag, ok := inputFlags[option]
		if name := strings.TrimPrefix(strings.Fields(flag + " -")[0], "--"); !ok || cmd.Flags().Lookup(name) == nil {
			t.Errorf("%s: worded %q, which upgradeguard %s does not have", option, flag, strings.Join(path, " "))
		}
	}

	for _, tc := range []struct {
		in   *finding.Input
		want string
	}{
		{nil, "restore it under the name the new chart reads"},
		{&finding.Input{Option: chartmigrate.OptionMapSecret, Value: "db=NEW-NAME"}, "restore it under the name the new chart reads (--map-secret db=NEW-NAME)"},
		{&finding.Input{Option: slots.OptionEquivalent}, "restore it under the name the new chart reads (--equivalent FILE)"},
	} {
		if got := withFlag("restore it under the name the new chart reads", tc.in); got != tc.want {
			t.Errorf("withFlag(%+v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestAuditChartNamesRegistryFlag: the audit library notes that a chart is not in the
// registry; the CLI says which flag adds it, where the release ships CRDs to protect.
func TestAuditChartNamesRegistryFlag(t *testing.T) {
	for _, tc := range []struct {
		r    audit.Release
		want string
	}{
		{audit.Release{Chart: "kro", Version: "0.4.0", ShipsCRDs: true}, "kro 0.4.0, not in the registry (add an entry with --registry FILE)"},
		{audit.Release{Chart: "plain", Version: "1.0.0"}, "plain 1.0.0, not in the registry"},
		{audit.Release{Chart: "flux2", Version: "2.18.0", Known: true, ShipsCRDs: true}, "flux2 2.18.0"},
	} {
		if got := auditChart(tc.r); got != tc.want {
			t.Errorf("auditChart(%s) = %q, want %q", tc.r.Chart, got, tc.want)
		}
	}
}
