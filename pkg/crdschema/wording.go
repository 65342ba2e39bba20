package crdschema

import (
	"fmt"
	"regexp"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// BuiltMinor is the Kubernetes minor whose apiextensions-apiserver this package is built
// from: its validation is that minor's, word for word.
const BuiltMinor = 37

// tooFewRE is how 1.37 and older word a minItems or minProperties failure: OpenAPI's own
// text as an Invalid value.
var tooFewRE = regexp.MustCompile(`^\S+ in body should have at least (\d+) (?:items|properties)$`)

// asServer words one validation failure as the target server's minor does, where it words
// it differently from BuiltMinor; serverMinor 0 (not known) keeps BuiltMinor's words. The
// rule is the same: only the type and text the server answers with differ.
//   - 1.38 reports minItems and minProperties as "Too few" (kubernetes#141641).
func asServer(e *field.Error, serverMinor int) (typ, detail string) {
	typ, detail = e.Type.String(), e.Detail
	if serverMinor >= 38 && e.Type == field.ErrorTypeInvalid {
		if m := tooFewRE.FindStringSubmatch(e.Detail); m != nil {
			n, _ := strconv.Atoi(m[1])
			unit := "items"
			if n == 1 {
				unit = "item"
			}
			typ, detail = "Too few", fmt.Sprintf("must have at least %d %s", n, unit)
		}
	}
	return typ, detail
}
