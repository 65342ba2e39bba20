// Package output is every command's -o: the flag and its validation, and the JSON and
// table writers. A command hands its typed result and its text renderer to Write; the
// format decides which one runs, so no renderer starts with `if format == "json"`.
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/pflag"
)

// The formats every command offers.
const (
	Text = "text"
	JSON = "json"
)

// Validate says whether format is one of the formats, with what to pass instead.
func Validate(format string) error {
	if format != Text && format != JSON {
		return fmt.Errorf("unknown output format %q: use -o text or -o json", format)
	}
	return nil
}

// AddFlag registers -o/--output on fs, bound to format and set to text. An unknown value
// fails when the flags are parsed, before the command connects anywhere.
func AddFlag(fs *pflag.FlagSet, format *string) {
	*format = Text
	fs.VarP((*flagValue)(format), "output", "o", "output format: text or json")
}

type flagValue string

func (f *flagValue) String() string { return string(*f) }
func (f *flagValue) Type() string   { return "string" }
func (f *flagValue) Set(s string) error {
	if err := Validate(s); err != nil {
		return err
	}
	*f = flagValue(s)
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
