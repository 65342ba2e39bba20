package chartmigrate

import (
	"slices"
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

func TestPairClaims(t *testing.T) {
	sts := func(sts, tmpl string, ords ...int) []stsClaim {
		var out []stsClaim
		for _, o := range ords {
			out = append(out, stsClaim{name: StatefulSetClaimName(tmpl, sts, o), sts: sts, template: tmpl, ordinal: o})
		}
		return out
	}
	namesOf := func(plain []string, cs ...[]stsClaim) []string {
		out := slices.Clone(plain)
		for _, c := range cs {
			for _, x := range c {
				out = append(out, x.name)
			}
		}
		slices.Sort(out)
		return out
	}
	cases := []struct {
		name             string
		oldPlain         []string
		old              [][]stsClaim
		newPlain         []string
		new              [][]stsClaim
		explicit         map[string]string
		want             [][2]string
		oldLeft, newLeft []string
	}{
		{name: "StatefulSets renamed: pair by template and ordinal",
			old:  [][]stsClaim{sts("olddb-db", "data", 0, 1)},
			new:  [][]stsClaim{sts("newdb-mysql", "storage", 0, 1)},
			want: [][2]string{{"data-olddb-db-0", "storage-newdb-mysql-0"}, {"data-olddb-db-1", "storage-newdb-mysql-1"}}},
		{name: "two templates, paired by name",
			old:  [][]stsClaim{sts("olddb-db", "data", 0), sts("olddb-db", "logs", 0)},
			new:  [][]stsClaim{sts("newdb-db", "logs", 0), sts("newdb-db", "data", 0)},
			want: [][2]string{{"data-olddb-db-0", "data-newdb-db-0"}, {"logs-olddb-db-0", "logs-newdb-db-0"}}},
		{name: "more new replicas: the extra ordinal is fresh",
			old:     [][]stsClaim{sts("olddb-db", "data", 0)},
			new:     [][]stsClaim{sts("newdb-db", "data", 0, 1)},
			want:    [][2]string{{"data-olddb-db-0", "data-newdb-db-0"}},
			newLeft: []string{"data-newdb-db-1"}},
		{name: "explicit mapping first, crossing ordinals",
			old:      [][]stsClaim{sts("olddb-db", "data", 0, 1)},
			new:      [][]stsClaim{sts("newdb-db", "data", 0, 1)},
			explicit: map[string]string{"data-olddb-db-0": "data-newdb-db-1"},
			want:     [][2]string{{"data-olddb-db-0", "data-newdb-db-1"}, {"data-olddb-db-1", "data-newdb-db-0"}}},
		{name: "a Deployment's claim to a StatefulSet's, the one left with the one left",
			oldPlain: []string{"olddb-data"},
			new:      [][]stsClaim{sts("newdb", "data", 0)},
			want:     [][2]string{{"olddb-data", "data-newdb-0"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, oldLeft, newLeft := pairClaims(namesOf(tc.oldPlain, tc.old...), namesOf(tc.newPlain, tc.new...),
				slices.Concat(tc.old...), slices.Concat(tc.new...), "olddb", "newdb", tc.explicit)
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
