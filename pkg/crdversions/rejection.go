package crdversions

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Wording names which of the API server's two wordings a storedVersions rejection uses.
// Every reader of these errors (diff-failed, apply-check, the demo, the tests) matches
// both through StoredVersionRejections, so that a cluster on either side of 1.33 gets the
// same answer.
type Wording string

const (
	// WordingMustAppear is the wording up to Kubernetes 1.32:
	//
	//	status.storedVersions[0]: Invalid value: "v1beta2": must appear in spec.versions
	WordingMustAppear Wording = "must appear in spec.versions"
	// WordingMissingFrom is the wording from Kubernetes 1.33 (kubernetes#128746):
	//
	//	status.storedVersions[0]: Invalid value: "v1beta2": missing from spec.versions;
	//	v1beta2 was previously a storage version, and must remain in spec.versions until a
	//	storage migration ensures no data remains persisted in v1beta2 and removes v1beta2
	//	from status.storedVersions
	WordingMissingFrom Wording = "missing from spec.versions"
)

// WordingFor returns the wording the API server of Kubernetes 1.minor uses.
func WordingFor(minor int) Wording {
	if minor <= 32 {
		return WordingMustAppear
	}
	return WordingMissingFrom
}

// StoredVersionRejection is one entry of a CRD's status.storedVersions that a CRD write
// left out of spec.versions, as the API server's 422 reports it. The write is refused
// until a storage migration re-persists the objects and removes Version from
// status.storedVersions.
type StoredVersionRejection struct {
	// CRD is the name of the rejected CRD, when the message names it.
	CRD string `json:"crd,omitempty"`
	// Version is the stored version the write dropped.
	Version string `json:"version"`
	// Wording says which wording the API server used (its version: up to 1.32, or 1.33 on).
	Wording Wording `json:"wording"`
	// Message is the API server's own text for this entry, quoted as it came.
	Message string `json:"message"`
}

// String says what the API server refused, naming the CRD when it is known.
func (r StoredVersionRejection) String() string {
	s := fmt.Sprintf("%s is still in status.storedVersions but missing from spec.versions", r.Version)
	if r.CRD != "" {
		s = r.CRD + ": " + s
	}
	return s
}

var (
	// rejectionRE matches one entry in either wording. A quote may arrive escaped (a
	// message read back from JSON), and the long 1.33 tail may be cut short by whoever
	// relayed the message, so only its start is required.
	rejectionRE = regexp.MustCompile(`status\.storedVersions\[\d+\]: Invalid value: \\?"([^"\\]+)\\?": ` +
		`(must appear in spec\.versions|missing from spec\.versions(?:; \S+ was previously a storage version, and must remain in spec\.versions(?: until a storage migration ensures no data remains persisted in \S+ and removes \S+ from status\.storedVersions)?)?)`)
	// crdNameRE finds the CRD a 422 is about: `CustomResourceDefinition.apiextensions.k8s.io "NAME" is invalid`.
	crdNameRE = regexp.MustCompile(`CustomResourceDefinition(?:\.apiextensions\.k8s\.io)? \\?"([^"\\]+)\\?" is invalid`)
)

// StoredVersionRejections finds every storedVersions rejection in msg, in either
// wording: an API server error, Helm's description of a failed revision, a Flux
// condition message or a command's output. Each names the CRD of the closest
// `CustomResourceDefinition "NAME" is invalid` before it. Duplicates are dropped; the
// order is the message's.
func StoredVersionRejections(msg string) []StoredVersionRejection {
	names := crdNameRE.FindAllStringSubmatchIndex(msg, -1)
	var out []StoredVersionRejection
	seen := map[[2]string]bool{}
	for _, m := range rejectionRE.FindAllStringSubmatchIndex(msg, -1) {
		r := StoredVersionRejection{Version: msg[m[2]:m[3]], Message: msg[m[0]:m[1]], Wording: WordingMissingFrom}
		if strings.HasPrefix(msg[m[4]:m[5]], string(WordingMustAppear)) {
			r.Wording = WordingMustAppear
		}
		for _, n := range names {
			if n[0] > m[0] {
				break
			}
			r.CRD = msg[n[2]:n[3]]
		}
		key := [2]string{r.CRD, r.Version}
		if !seen[key] {
			seen[key] = true
			out = append(out, r)
		}
	}
	return out
}

// IsStoredVersionRejection says whether err is (or wraps) the API server's refusal of a
// CRD write that drops a stored version, in either wording.
func IsStoredVersionRejection(err error) bool {
	if err == nil {
		return false
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) && !apierrors.IsInvalid(err) {
		return false
	}
	return len(StoredVersionRejections(err.Error())) > 0
}
