// Package output is every command's -o: the flag and its validation, and the JSON and
// table writers. A command hands its typed result and its text renderer to Write; the
// format decides which one runs, so no renderer starts with `if format == "json"`.
//
// A command whose result maps onto a finding.Report also speaks CI: a pull-request
// comment (markdown), SARIF 2.1.0, JUnit XML and GitHub workflow annotations, each
// rendered here once for every such command (WriteReport).
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/upgradeguard/upgradeguard/pkg/finding"
)

// The formats every command offers.
const (
	Text = "text"
	JSON = "json"
)

// The formats of a command whose result is a finding.Report too: what CI reads.
const (
	// Markdown is a pull-request comment's body, with a hidden marker that lets CI update
	// one comment instead of adding more.
	Markdown = "markdown"
	// SARIF is SARIF 2.1.0, for code scanning: one result per finding.
	SARIF = "sarif"
	// JUnit is JUnit XML: a suite per group, a case per judged subject.
	JUnit = "junit"
	// GitHub is GitHub Actions workflow commands: an annotation per finding.
	GitHub = "github"
)

var (
	plainFormats  = []string{Text, JSON}
	reportFormats = []string{Text, JSON, Markdown, SARIF, JUnit, GitHub}
)

// Validate says whether format is one of the formats every command offers, with what to
// pass instead.
func Validate(format string) error { return validate(format, plainFormats) }

func validate(format string, formats []string) error {
	if slices.Contains(formats, format) {
		return nil
	}
	opts := make([]string, len(formats))
	for i, f := range formats {
		opts[i] = "-o " + f
	}
	last := len(opts) - 1
	return fmt.Errorf("unknown output format %q: use %s or %s", format, strings.Join(opts[:last], ", "), opts[last])
}

// AddFlag registers -o/--output on fs, bound to format and set to text. An unknown value
// fails when the flags are parsed, before the command connects anywhere.
func AddFlag(fs *pflag.FlagSet, format *string) {
	*format = Text
	fs.VarP(&flagValue{format, plainFormats}, "output", "o", "output format: text or json")
}

// AddReportFlag is AddFlag for a command whose result is a finding.Report too: it also
// takes the CI formats (WriteReport).
func AddReportFlag(fs *pflag.FlagSet, format *string) {
	*format = Text
	fs.VarP(&flagValue{format, reportFormats}, "output", "o",
		"output format: text, json, or for CI markdown (a pull-request comment), sarif (2.1.0), junit or github (workflow annotations)")
}

type flagValue struct {
	v       *string
	formats []string
}

func (f *flagValue) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}
func (f *flagValue) Type() string { return "string" }
func (f *flagValue) Set(s string) error {
	if err := validate(s, f.formats); err != nil {
		return err
	}
	*f.v = s
	return nil
}

// Write renders v in format: indented JSON, or text by the command's own renderer.
func Write(w io.Writer, format string, v any, text func(io.Writer) error) error {
	if err := Validate(format); err != nil {
		return err
	}
	if format == JSON {
		return WriteJSON(w, v)
	}
	return text(w)
}

// WriteReport is Write for a command whose result is a finding.Report too: the CI formats
// render the report, text and JSON render v as Write does.
func WriteReport(w io.Writer, format string, v any, text func(io.Writer) error, report func() finding.Report) error {
	if err := validate(format, reportFormats); err != nil {
		return err
	}
	switch format {
	case Markdown:
		return WriteMarkdown(w, report())
	case SARIF:
		return WriteSARIF(w, report())
	case JUnit:
		return WriteJUnit(w, report())
	case GitHub:
		return WriteGitHub(w, report())
	case JSON:
		return WriteJSON(w, v)
	}
	return text(w)
}

// WriteJSON writes v as one indented JSON document.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// Table writes aligned columns: a header row, then one row per Row call, all at Flush.
type Table struct {
	tw *tabwriter.Writer
}

// NewTable starts a table with two spaces between columns and, when header is not empty,
// a header row.
func NewTable(w io.Writer, header ...string) *Table {
	t := &Table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	if len(header) > 0 {
		t.Row(toAny(header)...)
	}
	return t
}

// Row adds a row; each cell is formatted with %v.
func (t *Table) Row(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			_, _ = io.WriteString(t.tw, "\t")
		}
		_, _ = fmt.Fprint(t.tw, c)
	}
	_, _ = io.WriteString(t.tw, "\n")
}

// Rowf adds a row from a format whose cells are separated by tabs.
func (t *Table) Rowf(format string, args ...any) { _, _ = fmt.Fprintf(t.tw, format, args...) }

// Flush writes the aligned table.
func (t *Table) Flush() error { return t.tw.Flush() }

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
