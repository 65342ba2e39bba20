package check

import (
	"testing"
	"time"
)

// TestPagesWaitForTheCRDToSettle: a LIST made soon after its CRD changed may have been
// served by the API server's storage for the old CRD, and is not kept; once the CRD has
// held its resourceVersion for crdSettle, LISTs are kept again.
func TestPagesWaitForTheCRDToSettle(t *testing.T) {
	w := newWatches(t.Context())
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	if w.settled("gadgets.example.io", "1") {
		t.Fatal("a resourceVersion first read now is settled")
	}
	now = now.Add(crdSettle - time.Millisecond)
	if w.settled("gadgets.example.io", "1") {
		t.Fatalf("settled %v after it was first read, want %v", crdSettle-time.Millisecond, crdSettle)
	}
	now = now.Add(time.Millisecond)
	if !w.settled("gadgets.example.io", "1") {
		t.Fatalf("not settled %v after it was first read", crdSettle)
	}
	if w.settled("gadgets.example.io", "2") {
		t.Fatal("a changed resourceVersion is settled at once")
	}
	if w.settled("widgets.example.io", "1") {
		t.Fatal("another CRD's resourceVersion is settled at once")
	}
}
