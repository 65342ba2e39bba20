package chartmigrate

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPair(t *testing.T) {
	cases := []struct {
		name             string
		old, new         []string
		explicit         map[string]string
		want             [][2]string
		oldLeft, newLeft []string
	}{
		{name: "same names", old: []string{"data", "logs"}, new: []string{"logs", "data"},
			want: [][2]string{{"data", "data"}, {"logs", "logs"}}},
		{name: "release name taken out", old: []string{"olddb-data", "olddb-logs"}, new: []string{"newdb-logs", "newdb-data"},
			want: [][2]string{{"olddb-data", "newdb-data"}, {"olddb-logs", "newdb-logs"}}},
		{name: "one left with one left", old: []string{"olddb-db-data"}, new: []string{"data-newdb"},
			want: [][2]string{{"olddb-db-data", "data-newdb"}}},
		{name: "ambiguous stays unpaired", old: []string{"a", "b"}, new: []string{"x", "y"},
			oldLeft: []string{"a", "b"}, newLeft: []string{"x", "y"}},
		{name: "explicit first", old: []string{"a", "b"}, new: []string{"x", "y"}, explicit: map[string]string{"a": "y", "b": "x"},
			want: [][2]string{{"a", "y"}, {"b", "x"}}},
		{name: "explicit to a name the chart does not render is ignored", old: []string{"a", "b"}, new: []string{"x", "y"}, explicit: map[string]string{"a": "z"},
			oldLeft: []string{"a", "b"}, newLeft: []string{"x", "y"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, oldLeft, newLeft := pair(tc.old, tc.new, "olddb", "newdb", tc.explicit)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("pairs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.oldLeft, oldLeft); diff != "" {
				t.Errorf("old left (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.newLeft, newLeft); diff != "" {
				t.Errorf("new left (-want +got):\n%s", diff)
			}
		})
	}
}
