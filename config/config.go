// Package config embeds the generated CRDs of the upgradeguard.io API (make generate), for
// tests and for `upgradeguard controller --install-crds`.
package config

import "embed"

// CRDs holds crd/*.yaml.
//
//go:embed crd/*.yaml
var CRDs embed.FS
