package script

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
)

// A transaction's or script's range reads walk at most kv.OpRangeReadKeys
// keys in the op: past it DBSIZE, KEYS and SCAN answer the budget's error as
// their element (the transaction's other commands run, its writes land); in
// a script redis.call raises (none of its writes land) and redis.pcall
// returns the error. At exactly the budget everything reads as before.
func TestOpRangeReadsBudgetInOps(t *testing.T) {
	s := newStore()
	for i := range kv.OpRangeReadKeys - 1 {
		s.m[fmt.Sprintf("k%06d", i)] = rec{data: []byte("v"), ver: 1}
	}
	s.ver = 1
	errElem := "-" + kv.ErrOpRangeReads.Error() + "\r\n"
	// w brings the keyspace to the budget exactly: DBSIZE walks it once.
	if got, _ := s.exec(t, 1000, "SET w 1; DBSIZE", nil); got != fmt.Sprintf("*2\r\n+OK\r\n:%d\r\n", kv.OpRangeReadKeys) {
		t.Fatalf("DBSIZE at the budget: %q", got)
	}
	// Twice is over it: the second DBSIZE fails, the rest runs.
	got, out := s.exec(t, 1000, "DBSIZE; DBSIZE; GET w; SET x 2; KEYS *; SCAN 0", nil)
	want := fmt.Sprintf("*6\r\n:%d\r\n%s$1\r\n1\r\n+OK\r\n%s%s", kv.OpRangeReadKeys, errElem, errElem, errElem)
	if got != want || len(out) != 1 || out[0].key != "x" {
		t.Fatalf("over the budget:\n got %q\nwant %q\nrecords %+v", got, want, out)
	}
	// A pattern with a prefix walks its range only (the k... keys, one
	// fewer than the budget); KEYS * walks w and x too: over.
	if got, _ := s.exec(t, 1000, "KEYS k*", nil); !strings.HasPrefix(got, fmt.Sprintf("*1\r\n*%d\r\n", kv.OpRangeReadKeys-1)) {
		t.Fatalf("KEYS k*: %.40q", got)
	}
	if got, _ := s.exec(t, 1000, "KEYS *", nil); got != "*1\r\n"+errElem {
		t.Fatalf("KEYS * over the budget: %.200q", got)
	}
	got, out = s.eval(t, kv.KindEval, "redis.call('set', 'y', '1'); return #redis.call('keys', '*')", 0, 1000)
	if !strings.Contains(got, "may walk at most") || len(out) != 0 {
		t.Fatalf("script over the budget: %.200q, records %+v", got, out)
	}
	got, out = s.eval(t, kv.KindEval, "local r = redis.pcall('keys', '*'); redis.call('set', 'y', '1'); return r", 0, 1000)
	if got != errElem || len(out) != 1 {
		t.Fatalf("script with pcall over the budget: %.200q, records %+v", got, out)
	}
}
