package cli

import (
	"strings"
	"testing"

	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

// TestRenderSchemasConversionFallback: a schema read that fell back to the storage
// version because the conversion webhook did not answer is said in the text, with no
// finding beside it.
func TestRenderSchemasConversionFallback(t *testing.T) {
	var b strings.Builder
	renderSchemas(&b, []check.CRDReport{{Decision: predict.Decision{Name: "gadgets.example.com"}, Schema: &crdschema.Report{Objects: 40,
		ConversionFallbacks: []crdschema.ConversionFallback{{Version: "v1", ReadAt: "v1alpha1", Error: "conversion webhook for example.com/v1alpha1, Kind=Gadget failed"}}}}})
	want := "\ngadgets.example.com: 40 objects judged against the incoming schema\n" +
		"  not judged at v1: its conversion webhook did not answer, so the objects were read at the storage version v1alpha1 instead\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// TestMigrateNotesConversionRetries: the retries a run counted, and the changes of
// spec.conversion it waited for, are in the text too.
func TestMigrateNotesConversionRetries(t *testing.T) {
	var b strings.Builder
	migrateNotes(&b, &migrate.Result{Name: "gadgets.example.com", Status: migrate.Migrated, ConversionRetries: 8, ConversionChanges: 1})
	want := "\ngadgets.example.com: 8 requests retried because the conversion webhook did not answer; 1 changes of spec.conversion waited for\n"
	if b.String() != want {
		t.Errorf("got %q, want %q", b.String(), want)
	}
}
