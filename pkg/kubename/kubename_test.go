package kubename_test

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/upgradeguard/upgradeguard/pkg/kubename"
)

// TestShortenKeepsShortNames: a name within the limit is returned as it is.
func TestShortenKeepsShortNames(t *testing.T) {
	for _, n := range []string{"hr-flux-system-flux", strings.Repeat("a", kubename.MaxName)} {
		if got := kubename.Shorten(n, kubename.MaxName, n); got != n {
			t.Errorf("Shorten(%q) = %q, want it unchanged", n, got)
		}
	}
}

// TestShortenLimits: a long name comes back within the limit, valid as an object name or
// a label value, the same every time, and distinct for distinct keys, even when the cut
// lands on a dot or a hyphen.
func TestShortenLimits(t *testing.T) {
	crd := strings.Repeat("x", 229) + ".long-group-of-examples.example.io" // the cut at 240 lands on the dot
	for _, tc := range []struct {
		desc, name, key, other string
		max                    int
		valid                  func(string) []string
	}{
		{"object name", "proactive-" + crd, crd, crd + "s", kubename.MaxName, validation.IsDNS1123Subdomain},
		{"label value", strings.Repeat("release-", 20), "a", "b", kubename.MaxLabelValue, validation.IsValidLabelValue},
		{"cut on a hyphen", strings.Repeat("ab-", 30), "ns/x", "ns/y", kubename.MaxLabelValue, validation.IsDNS1123Subdomain},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got := kubename.Shorten(tc.name, tc.max, tc.key)
			if len(got) > tc.max {
				t.Errorf("%d characters, want at most %d: %q", len(got), tc.max, got)
			}
			if errs := tc.valid(got); len(errs) > 0 {
				t.Errorf("%q is not valid: %v", got, errs)
			}
			if again := kubename.Shorten(tc.name, tc.max, tc.key); again != got {
				t.Errorf("not stable: %q then %q", got, again)
			}
			if other := kubename.Shorten(tc.name, tc.max, tc.other); other == got {
				t.Errorf("keys %q and %q both give %q", tc.key, tc.other, got)
			}
		})
	}
}

// TestShortenIsHelmControllersRule: with max 53 and the name as key, the result is what
// helm-controller's release.ShortenName gives (its rule written out here).
func TestShortenIsHelmControllersRule(t *testing.T) {
	name := "flux-system-kube-prometheus-stack-with-a-name-longer-than-fifty-three"
	want := name[:40] + "-" + fmt.Sprintf("%x", sha256.Sum256([]byte(name)))[:12]
	if got := kubename.Shorten(name, 53, name); got != want {
		t.Errorf("Shorten = %q, want helm-controller's %q", got, want)
	}
}
