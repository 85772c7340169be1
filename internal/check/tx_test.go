package check

import "testing"

func TestIncrementsCatchesLostUpdates(t *testing.T) {
	good := []Increment{{1, 0}, {2, 1}, {1, 2}}
	if v := Increments("c", 0, good, 3); !v.OK {
		t.Fatalf("a serial history refused: %v", v.Err())
	}
	// Two clients read 1 and both committed: the counter ends at 3 after
	// four commits.
	lost := []Increment{{1, 0}, {2, 1}, {3, 1}, {1, 2}}
	v := Increments("c", 0, lost, 3)
	if v.OK || len(v.Violations) != 2 {
		t.Fatalf("a lost update accepted: %+v", v)
	}
	// A commit of a value that was never there.
	if v := Increments("c", 0, []Increment{{1, 7}}, 1); v.OK {
		t.Fatal("an increment of a value no commit produced accepted")
	}
}
