package node

import (
	"slices"
	"testing"
)

func TestSplitRule(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{"-A INPUT -j KUBE-FIREWALL", []string{"-A", "INPUT", "-j", "KUBE-FIREWALL"}},
		{`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			[]string{"-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}},
		{`-A X --comment "" -j Y`, []string{"-A", "X", "--comment", "", "-j", "Y"}},
	} {
		if got := splitRule(c.line); !slices.Equal(got, c.want) {
			t.Errorf("splitRule(%q) = %q, want %q", c.line, got, c.want)
		}
	}
}
