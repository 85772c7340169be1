package check

import (
	"strings"
	"testing"
)

// The checker passes a complete iteration and fails one that misses a key
// present throughout; keys written or deleted during the iteration, or
// outside its MATCH, are not demanded.
func TestScanComplete(t *testing.T) {
	h := History{Ops: []Op{
		{ID: 0, Kind: Put, Key: "a", Invoke: 1, Return: 2, Outcome: OK},
		{ID: 1, Kind: Put, Key: "b", Invoke: 1, Return: 2, Outcome: OK},
		{ID: 2, Kind: Put, Key: "c", Invoke: 3, Return: 4, Outcome: OK},
		// d: deleted during the iteration (unknown outcome).
		{ID: 3, Kind: Put, Key: "d", Invoke: 1, Return: 2, Outcome: OK},
		{ID: 4, Kind: Delete, Key: "d", Invoke: 12, Return: Never, Outcome: Unknown},
		// e: written during the iteration.
		{ID: 5, Kind: Put, Key: "e", Invoke: 12, Return: 13, Outcome: OK},
		// f: deleted before the iteration, written again before it: present.
		{ID: 6, Kind: Delete, Key: "f", Invoke: 1, Return: 2, Outcome: OK},
		{ID: 7, Kind: Put, Key: "f", Invoke: 3, Return: 4, Outcome: OK},
		// g: a failed delete changes nothing.
		{ID: 8, Kind: Put, Key: "g", Invoke: 1, Return: 2, Outcome: OK},
		{ID: 9, Kind: Delete, Key: "g", Invoke: 12, Return: 13, Outcome: Failed},
		{ID: 10, Kind: Put, Key: "x:1", Invoke: 1, Return: 2, Outcome: OK},
	}}
	it := Iteration{Client: 1, Invoke: 10, Return: 20, Keys: []string{"a", "b", "c", "c", "f", "g", "x:1"}}
	if v := ScanComplete(h, []Iteration{it}); !v.OK || v.Checked != 6 {
		t.Fatalf("complete iteration: %+v", v)
	}
	broken := it
	broken.Keys = []string{"a", "c", "f", "g", "x:1"} // b missing
	v := ScanComplete(h, []Iteration{broken})
	if v.OK || len(v.Violations) != 1 || v.Violations[0].Key != "b" || !strings.Contains(v.Violations[0].Reason, "not returned") {
		t.Fatalf("an iteration missing b: %+v", v)
	}
	// MATCH x:* demands only x:1.
	m := Iteration{Client: 1, Invoke: 10, Return: 20, Keys: []string{"x:1"}, Match: func(k string) bool { return strings.HasPrefix(k, "x:") }}
	if v := ScanComplete(h, []Iteration{m}); !v.OK || v.Checked != 1 {
		t.Fatalf("MATCH x:*: %+v", v)
	}
	m.Keys = nil
	if v := ScanComplete(h, []Iteration{m}); v.OK {
		t.Fatal("MATCH x:* returning nothing passed")
	}
}
