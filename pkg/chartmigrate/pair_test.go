package chartmigrate

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
			checkPairs(t, got, oldLeft, newLeft, tc.want, tc.oldLeft, tc.newLeft)
		})
	}
}

// checkPairs compares a pairing and what it left on each side with what was wanted.
func checkPairs(t *testing.T, got [][2]string, oldLeft, newLeft []string, want [][2]string, wantOld, wantNew []string) {
	t.Helper()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pairs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantOld, oldLeft); diff != "" {
		t.Errorf("old left (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantNew, newLeft); diff != "" {
		t.Errorf("new left (-want +got):\n%s", diff)
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
			checkPairs(t, got, oldLeft, newLeft, tc.want, tc.oldLeft, tc.newLeft)
		})
	}
}

func TestClaimsBeyond(t *testing.T) {
	claims := func(names ...string) []corev1.PersistentVolumeClaim {
		out := make([]corev1.PersistentVolumeClaim, 0, len(names))
		for _, n := range names {
			out = append(out, corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
		return out
	}
	sts := func(replicas, start int32) *appsv1.StatefulSet {
		s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: appsv1.StatefulSetSpec{Replicas: &replicas}}
		if start > 0 {
			s.Spec.Ordinals = &appsv1.StatefulSetOrdinals{Start: start}
		}
		return s
	}
	live := claims("data-db-0", "data-db-1", "data-db-2", "data-db-10", "data-db-2-0", "data-db-02", "data-db-", "scratch", "logs-db-3")
	for _, tc := range []struct {
		name string
		sts  *appsv1.StatefulSet
		want []string
	}{
		{name: "two replicas", sts: sts(2, 0), want: []string{"PersistentVolumeClaim/ns/data-db-2", "PersistentVolumeClaim/ns/data-db-10"}},
		{name: "ordinals from 1", sts: sts(2, 1), want: []string{"PersistentVolumeClaim/ns/data-db-0", "PersistentVolumeClaim/ns/data-db-10"}},
		{name: "scaled to zero", sts: sts(0, 0), want: []string{"PersistentVolumeClaim/ns/data-db-0", "PersistentVolumeClaim/ns/data-db-1", "PersistentVolumeClaim/ns/data-db-2", "PersistentVolumeClaim/ns/data-db-10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, f := range claimsBeyond(live, tc.sts, "data", "ns") {
				if f.Check != CheckSTSClaimBeyond || f.Blocks() || f.Remediation == "" {
					t.Errorf("finding %+v, want a non-blocking %s with a remediation", f, CheckSTSClaimBeyond)
				}
				got = append(got, f.Subject)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("claims beyond the replicas %v, want %v", got, tc.want)
			}
		})
	}
}
