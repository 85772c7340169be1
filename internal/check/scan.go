package check

import (
	"fmt"
	"sort"
)

// Iteration is one keyspace iteration a client ran (SCAN from cursor 0 back
// to 0, KEYS, redis-cli --scan): from its first call's invocation to its
// last call's return, on the same clock as the history's operations, and
// every key its calls returned (duplicates allowed).
type Iteration struct {
	Client         int
	Invoke, Return int64
	Keys           []string
	// Match is the iteration's MATCH filter (nil: every key).
	Match func(key string) bool
}

// ScanComplete checks Redis's SCAN guarantee (issue 27): every key present
// for the whole of an iteration was returned by it at least once. A key is
// surely present for the whole iteration when a write that creates it (a put,
// an increment) was acknowledged before the iteration began and no deletion
// of it that may have taken effect (acknowledged, or of unknown outcome)
// overlaps the span from that write's invocation to the iteration's end.
// Keys written or deleted during the iteration may or may not be returned;
// a returned key is never judged (SCAN may return a key twice, or one
// deleted meanwhile).
func ScanComplete(h History, its []Iteration) Verdict {
	v := Verdict{Checker: "scan-complete", OK: true}
	creates := map[string][]*Op{}
	deletes := map[string][]*Op{}
	for i := range h.Ops {
		op := &h.Ops[i]
		switch {
		case op.Kind == Delete && op.Outcome != Failed:
			deletes[op.Key] = append(deletes[op.Key], op)
		case (op.Kind == Put || op.Kind == Incr) && op.Outcome == OK:
			creates[op.Key] = append(creates[op.Key], op)
		}
	}
	for _, it := range its {
		returned := make(map[string]bool, len(it.Keys))
		for _, k := range it.Keys {
			returned[k] = true
		}
		keys := make([]string, 0, len(creates))
		for k := range creates {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if it.Match != nil && !it.Match(k) {
				continue
			}
			w := presentThroughout(creates[k], deletes[k], it)
			if w == nil {
				continue
			}
			v.Checked++
			if !returned[k] {
				v.add(Violation{Key: k, Reason: fmt.Sprintf(
					"present for the whole iteration of client %d (written by #%d, acknowledged before it began, no deletion until it ended) but not returned by it",
					it.Client, w.ID), Ops: []Op{*w}})
			}
		}
	}
	return v
}

// presentThroughout returns a create of the key that shows it present for
// all of it (nil if none does).
func presentThroughout(creates, deletes []*Op, it Iteration) *Op {
	for _, w := range creates {
		if w.Return >= it.Invoke {
			continue
		}
		overlaps := false
		for _, d := range deletes {
			// d may have taken effect anywhere in [d.Invoke, d.Return]
			// (Return is Never for an unknown outcome).
			if d.Return >= w.Invoke && d.Invoke <= it.Return {
				overlaps = true
				break
			}
		}
		if !overlaps {
			return w
		}
	}
	return nil
}
