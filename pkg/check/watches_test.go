package check

import (
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPagesWaitForTheCRDToSettle: a LIST made soon after its CRD changed may have been
// served by the API server's storage for the old CRD, and is not kept; once the CRD has
// not been written for crdSettle, LISTs are kept again. The last write is the newest
// managedFields time, or, without managedFields, when the resourceVersion was first read.
func TestPagesWaitForTheCRDToSettle(t *testing.T) {
	w := newWatches(t.Context())
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	crd := func(rv string, written ...time.Time) *apiextv1.CustomResourceDefinition {
		c := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "gadgets.example.io", ResourceVersion: rv}}
		for _, at := range written {
			c.ManagedFields = append(c.ManagedFields, metav1.ManagedFieldsEntry{Manager: "m", Time: &metav1.Time{Time: at}})
		}
		return c
	}

	// By managedFields: the newest entry counts.
	old := now.Add(-time.Hour)
	if !w.settled(crd("1", old)) {
		t.Error("a CRD last written an hour ago is not settled")
	}
	if w.settled(crd("2", old, now.Add(-crdSettle+time.Second))) {
		t.Error("a CRD written less than crdSettle ago is settled")
	}
	if !w.settled(crd("2", now.Add(-crdSettle), old)) {
		t.Error("a CRD written crdSettle ago is not settled")
	}

	// Without managedFields: from when this resourceVersion was first read.
	if w.settled(crd("3")) {
		t.Fatal("a resourceVersion first read now is settled")
	}
	now = now.Add(crdSettle - time.Millisecond)
	if w.settled(crd("3")) {
		t.Fatalf("settled %v after it was first read, want %v", crdSettle-time.Millisecond, crdSettle)
	}
	now = now.Add(time.Millisecond)
	if !w.settled(crd("3")) {
		t.Fatalf("not settled %v after it was first read", crdSettle)
	}
	if w.settled(crd("4")) {
		t.Fatal("a changed resourceVersion is settled at once")
	}
}
