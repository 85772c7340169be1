package vrshard

import "testing"

// A flush is every key's latest update though it names none: a pending
// write before it must stop answering reads of its key from the overlay,
// one after it must not, and the index is incomplete below it.
func TestFlushRetiresEarlierOverlayEntries(t *testing.T) {
	u := newKeyUpdates(0)
	u.add(10, [][]byte{[]byte("a")})
	u.setOverlay(10, [][]byte{[]byte("a")}, [][]byte{[]byte("old")}, nil, false, false, 1)
	if ov := u.overlayFor([][]byte{[]byte("a")}, false); ov["a"].op != 10 {
		t.Fatalf("before the flush the pending write answers: %+v", ov)
	}
	u.flushed(11)
	if ov := u.overlayFor([][]byte{[]byte("a")}, false); len(ov) != 0 {
		t.Fatalf("a write before the flush still answers reads: %+v", ov)
	}
	if u.complete(10) {
		t.Fatal("the index claims to know every op above 10 across a flush at 11")
	}
	u.add(12, [][]byte{[]byte("b")})
	u.setOverlay(12, [][]byte{[]byte("b")}, [][]byte{[]byte("new")}, nil, false, false, 1)
	u.flushed(11) // replayed indexing of the same flush
	if ov := u.overlayFor([][]byte{[]byte("b")}, false); ov["b"].op != 12 {
		t.Fatalf("a write after the flush lost its overlay entry: %+v", ov)
	}
}
