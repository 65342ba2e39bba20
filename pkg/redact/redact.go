// Package redact owns keeping release values and Secret data out of reports and errors:
// it is the one place that says what is hidden (see MinLen) and how, for every package
// that reports on releases (applycheck, releasediff, ...).
// A Redactor is built from what must never be shown (a release's values and the data of
// the Secrets its manifests render) and replaces every occurrence in a string or an
// error with [redacted]. Library reports that copy API-server messages (which echo the
// values they reject) run them through one, by default.
package redact

import (
	"bytes"
	"encoding/base64"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// Mask replaces what a Redactor hides.
const Mask = "[redacted]"

// MinLen is the shortest string hidden, for values and Secret data alike. Shorter ones
// ("1", "on", "v1", "yes") are everywhere in messages: hiding them would hide the
// message, not a secret, and a secret that short is guessed, not leaked. Its base64 form
// (four bytes or more) is still hidden. A string of only white space is never hidden
// (it would blank out indentation).
const MinLen = 4

// Redactor hides a set of strings.
type Redactor struct {
	secrets []string // longest first, so a secret inside another is not half-hidden
}

// New hides secrets (those shorter than MinLen bytes, or blank, are ignored).
func New(secrets ...string) *Redactor {
	r := &Redactor{}
	r.Add(secrets...)
	return r
}

// Add hides more strings.
func (r *Redactor) Add(secrets ...string) {
	for _, s := range secrets {
		if len(s) >= MinLen && strings.TrimSpace(s) != "" && !slices.Contains(r.secrets, s) {
			r.secrets = append(r.secrets, s)
		}
	}
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
}

// AddValues hides every string in a release's values (or any decoded YAML or JSON).
func (r *Redactor) AddValues(v any) {
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			r.AddValues(x)
		}
	case []any:
		for _, x := range v {
			r.AddValues(x)
		}
	case string:
		r.Add(v)
	}
}

// AddManifest hides the data of every Secret a manifest renders (manifest.Objects: List
// items included), both base64-encoded (as stored) and decoded (as a message may quote
// it). A document that does not parse adds nothing; the Secrets of the others are still
// hidden.
func (r *Redactor) AddManifest(text string) {
	objs, _ := manifest.Objects(text) // what does not parse brings no Secret to hide
	for _, u := range objs {
		if u.GetKind() != "Secret" || u.GroupVersionKind().Group != "" {
			continue
		}
		obj := u.Object
		data, _, _ := unstructured.NestedMap(obj, "data")
		for _, v := range data {
			if s, ok := v.(string); ok {
				r.Add(s)
				if b, err := base64.StdEncoding.DecodeString(s); err == nil {
					r.Add(string(b))
				}
			}
		}
		plain, _, _ := unstructured.NestedMap(obj, "stringData")
		for _, v := range plain {
			if s, ok := v.(string); ok {
				r.Add(s, base64.StdEncoding.EncodeToString([]byte(s)))
			}
		}
	}
}

// String returns s with every hidden string replaced by Mask.
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	for _, v := range r.secrets {
		if strings.Contains(s, v) {
			s = strings.ReplaceAll(s, v, Mask)
		}
	}
	return s
}

// Error returns err with a redacted message; errors.Is and errors.As still see the
// original chain (an API status, a typed error). nil stays nil.
func (r *Redactor) Error(err error) error {
	if err == nil || r == nil {
		return err
	}
	msg := r.String(err.Error())
	if msg == err.Error() {
		return err
	}
	return &redacted{msg: msg, err: err}
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// Contains says whether s still holds any hidden string: for tests and assertions.
func (r *Redactor) Contains(s []byte) bool {
	return slices.ContainsFunc(r.secrets, func(v string) bool { return bytes.Contains(s, []byte(v)) })
}
