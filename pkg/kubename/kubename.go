// Package kubename owns the one rule by which upgradeguard shortens a name it builds
// (a StorageMigration's, a Helm release's as helm-controller computes it, a label value)
// to the length the API server accepts.
package kubename

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Lengths the API server allows.
const (
	// MaxName is the longest object name (a DNS-1123 subdomain).
	MaxName = validation.DNS1123SubdomainMaxLength
	// MaxLabelValue is the longest label value.
	MaxLabelValue = validation.LabelValueMaxLength
)

// hashLength is how many hex digits of the key's SHA-256 a shortened name ends with.
const hashLength = 12

// Shorten returns name when it is at most max characters long; else its first
// max-13 characters (without a trailing dot, which would end a DNS label), a hyphen and
// the first 12 hex digits of the SHA-256 of key. key is what the name stands for (the
// name itself, or the parts it was built from), so the result is stable, at most max
// characters long, and distinct for distinct keys. With key = name and max 53 it is
// helm-controller's release name rule (internal/release.ShortenName) for every name
// Helm accepts. max must be more than 13.
func Shorten(name string, max int, key string) string {
	if len(name) <= max {
		return name
	}
	sum := sha256.Sum256([]byte(key))
	return strings.TrimRight(name[:max-(hashLength+1)], ".") + "-" + hex.EncodeToString(sum[:])[:hashLength]
}
