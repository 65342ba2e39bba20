// Package crdversions owns reading CustomResourceDefinitions out of manifests and
// summarising their version sets: which versions exist, which are served, which one is
// the storage version and what the conversion strategy is. It is the vocabulary every
// other package uses to talk about CRD versions.
package crdversions

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Version is one entry of a CRD's spec.versions.
type Version struct {
	Name       string `json:"name"`
	Served     bool   `json:"served"`
	Storage    bool   `json:"storage"`
	Deprecated bool   `json:"deprecated,omitempty"`
}

// String renders a version the way operators read it: v1(storage), v1beta1(served=false).
func (v Version) String() string {
	var flags []string
	if v.Storage {
		flags = append(flags, "storage")
	}
	if !v.Served {
		flags = append(flags, "served=false")
	}
	if v.Deprecated {
		flags = append(flags, "deprecated")
	}
	if len(flags) == 0 {
		return v.Name
	}
	return v.Name + "(" + strings.Join(flags, ",") + ")"
}

// Versions lists spec.versions of a CRD in manifest order.
func Versions(crd *apiextv1.CustomResourceDefinition) []Version {
	out := make([]Version, 0, len(crd.Spec.Versions))
	for _, v := range crd.Spec.Versions {
		out = append(out, Version{Name: v.Name, Served: v.Served, Storage: v.Storage, Deprecated: v.Deprecated})
	}
	return out
}

// StorageVersion returns the name of the version marked storage, or "" when none is.
func StorageVersion(crd *apiextv1.CustomResourceDefinition) string {
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			return v.Name
		}
	}
	return ""
}

// Conversion returns the conversion strategy, defaulting to None as the API server does.
func Conversion(crd *apiextv1.CustomResourceDefinition) string {
	if crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy == "" {
		return string(apiextv1.NoneConverter)
	}
	return string(crd.Spec.Conversion.Strategy)
}

// Has reports whether name is one of the CRD's spec.versions.
func Has(crd *apiextv1.CustomResourceDefinition, name string) bool {
	for _, v := range crd.Spec.Versions {
		if v.Name == name {
			return true
		}
	}
	return false
}

// Serves reports whether name is a served version of the CRD.
func Serves(crd *apiextv1.CustomResourceDefinition, name string) bool {
	for _, v := range crd.Spec.Versions {
		if v.Name == name {
			return v.Served
		}
	}
	return false
}

// ServedVersion picks the version to read objects at: the storage version when it is
// served, otherwise the first served version. It returns "" when nothing is served.
func ServedVersion(crd *apiextv1.CustomResourceDefinition) string {
	if s := StorageVersion(crd); s != "" && Serves(crd, s) {
		return s
	}
	for _, v := range crd.Spec.Versions {
		if v.Served {
			return v.Name
		}
	}
	return ""
}

// ParseError says which document of which file could not be read as a CRD.
type ParseError struct {
	File     string
	Document int
	Err      error
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("%s (document %d): %v", e.File, e.Document, e.Err)
}

func (e *ParseError) Unwrap() error { return e.Err }

// FromManifest returns every CustomResourceDefinition in a multi-document YAML
// manifest. Other kinds are skipped. A document that claims to be a CRD but does not
// decode strictly, or lacks the fields the API server requires, is an error, so that a
// broken chart is reported instead of silently ignored.
func FromManifest(file string, data []byte) ([]*apiextv1.CustomResourceDefinition, error) {
	reader := utilyaml.NewYAMLReader(bufioReader(data))
	var out []*apiextv1.CustomResourceDefinition
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, &ParseError{File: file, Document: doc, Err: err}
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		// One YAML parse per document (CRDs are large and a chart can hold megabytes of
		// them): strictly, so that a CRD with a duplicate key is refused, and leniently
		// only when that fails, for the documents of other kinds.
		js, strictErr := yaml.YAMLToJSONStrict(raw)
		if strictErr != nil {
			if js, err = yaml.YAMLToJSON(raw); err != nil {
				return nil, &ParseError{File: file, Document: doc, Err: fmt.Errorf("not valid YAML: %w", err)}
			}
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(js, &head); err != nil {
			return nil, &ParseError{File: file, Document: doc, Err: fmt.Errorf("not valid YAML: %w", err)}
		}
		if head.Kind != "CustomResourceDefinition" {
			continue
		}
		if head.APIVersion != apiextv1.SchemeGroupVersion.String() {
			return nil, &ParseError{File: file, Document: doc,
				Err: fmt.Errorf("CustomResourceDefinition has apiVersion %q; only %s is served by current API servers", head.APIVersion, apiextv1.SchemeGroupVersion)}
		}
		if strictErr != nil {
			return nil, &ParseError{File: file, Document: doc, Err: fmt.Errorf("invalid CustomResourceDefinition: %w", strictErr)}
		}
		crd := &apiextv1.CustomResourceDefinition{}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		if err := dec.Decode(crd); err != nil {
			return nil, &ParseError{File: file, Document: doc, Err: fmt.Errorf("invalid CustomResourceDefinition: %w", err)}
		}
		if err := validate(crd); err != nil {
			return nil, &ParseError{File: file, Document: doc, Err: err}
		}
		out = append(out, crd)
	}
}

func validate(crd *apiextv1.CustomResourceDefinition) error {
	if crd.Name == "" {
		return errors.New("invalid CustomResourceDefinition: metadata.name is empty")
	}
	if len(crd.Spec.Versions) == 0 {
		return fmt.Errorf("invalid CustomResourceDefinition %s: spec.versions is empty", crd.Name)
	}
	storage := 0
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storage++
		}
	}
	if storage != 1 {
		return fmt.Errorf("invalid CustomResourceDefinition %s: exactly one version must be storage, found %d", crd.Name, storage)
	}
	if want := crd.Spec.Names.Plural + "." + crd.Spec.Group; crd.Name != want {
		return fmt.Errorf("invalid CustomResourceDefinition %s: metadata.name must be %q (spec.names.plural + \".\" + spec.group)", crd.Name, want)
	}
	return nil
}

func bufioReader(data []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(data)) }
