package cli

import (
	"github.com/upgradeguard/upgradeguard/pkg/chartmigrate"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
)

// inputFlags are the flags that set each library option a finding's Input names, with a
// placeholder where the option's value has no words of its own.
var inputFlags = map[string]string{
	chartmigrate.OptionNewRelease: "--new-release",
	chartmigrate.OptionMapPVC:     "--map-pvc",
	chartmigrate.OptionMapSecret:  "--map-secret",
	slots.OptionEquivalent:        "--equivalent FILE",
}

// withFlag is a finding's text followed by the flag that sets the input it advises: the
// library names the option, and the CLI names its flag.
func withFlag(text string, in *finding.Input) string {
	if in == nil {
		return text
	}
	flag := inputFlags[in.Option]
	if in.Value != "" {
		flag += " " + in.Value
	}
	return text + " (" + flag + ")"
}
