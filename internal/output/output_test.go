package output_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/upgradeguard/upgradeguard/internal/output"
)

func TestFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string
		wantErr string
	}{
		{nil, "text", ""},
		{[]string{"-o", "json"}, "json", ""},
		{[]string{"--output=text"}, "text", ""},
		{[]string{"-o", "yaml"}, "", `unknown output format "yaml": use -o text or -o json`},
	} {
		var format string
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		output.AddFlag(fs, &format)
		err := fs.Parse(tc.args)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || format != tc.want):
			t.Errorf("%v: %q %v, want %q", tc.args, format, err, tc.want)
		}
	}
}

func TestWrite(t *testing.T) {
	v := struct {
		Name string `json:"name"`
	}{"x"}
	text := func(w io.Writer) error {
		tb := output.NewTable(w, "NAME", "N")
		tb.Row(v.Name, 10)
		tb.Row("longer", 2)
		return tb.Flush()
	}
	var buf bytes.Buffer
	if err := output.Write(&buf, output.JSON, v, text); err != nil || buf.String() != "{\n  \"name\": \"x\"\n}\n" {
		t.Errorf("json: %q %v", buf.String(), err)
	}
	buf.Reset()
	if err := output.Write(&buf, output.Text, v, text); err != nil || buf.String() != "NAME    N\nx       10\nlonger  2\n" {
		t.Errorf("text: %q %v", buf.String(), err)
	}
	if err := output.Write(&buf, "yaml", v, text); err == nil {
		t.Error("yaml accepted")
	}
}
