package check

import (
	"math"
	"sort"

	"github.com/kefirdb/kefir/internal/level"
)

// The weaker checkers (session, cross-client monotonic, bounded staleness,
// durability) need to know when one version of a key is older than another.
// They use the order the history implies, and flag a read only when it is
// *definitely* too old, whichever write it may have returned:
//
//   - versioned keys (every acknowledged write carries a server Version, and
//     reads report the Version they returned): version order, exactly;
//   - otherwise real-time order between writes (a write that returned before
//     another was invoked is older), with each read mapped by value to the
//     writes it may have returned. Values should be unique per key; duplicates
//     only make the check more lenient, never wrong. This assumes the system
//     orders writes consistently with real time, as every Kefir engine does
//     (one ordering point per shard); a last-writer-wins store with skewed
//     clocks would need versions.
//
// Both reduce to spans: a read or write is a span [lo, hi] and A is definitely
// older than B iff A.hi < B.lo.

type span struct{ lo, hi int64 }

func (a span) olderThan(b span) bool { return a.hi < b.lo }

var initialRT = span{math.MinInt64, math.MinInt64}

// keyIndex is the per-key view the ordering checkers share.
type keyIndex struct {
	key       string
	versioned bool
	writes    []*Op // writes that took or may have taken effect
	byValue   map[string][]*Op
	deletes   []*Op
	unkIncr   []*Op
	reads     []*Op // acknowledged reads
	ttls      []*Op // acknowledged expiry reads (TTL: Expiry judges them)
}

// tookEffect reports whether a write changed (or may have changed) the key.
func tookEffect(w *Op) bool {
	switch w.Outcome {
	case Failed, Pending:
		return false
	case Unknown:
		return w.Kind.IsWrite()
	}
	switch w.Kind {
	case Get:
		return false
	case CAS:
		return w.Found
	}
	return true
}

// writtenValue is the value w leaves behind; ok is false for deletes and for
// unknown incrs (whose result nobody saw).
func writtenValue(w *Op) (string, bool) {
	switch w.Kind {
	case Put, CAS:
		return w.Value, true
	case Incr:
		if w.Outcome == OK {
			return w.Result, true
		}
	}
	return "", false
}

func indexKeys(h *History) []*keyIndex {
	keys, byKey := h.byKey()
	out := make([]*keyIndex, 0, len(keys))
	for _, key := range keys {
		k := &keyIndex{key: key, versioned: true, byValue: make(map[string][]*Op)}
		for _, i := range byKey[key] {
			op := &h.Ops[i]
			if op.Kind == Get {
				if op.Outcome == OK {
					k.reads = append(k.reads, op)
				}
				continue
			}
			if op.Kind == TTL {
				if op.Outcome == OK {
					k.ttls = append(k.ttls, op)
				}
				continue
			}
			if !tookEffect(op) {
				continue
			}
			k.writes = append(k.writes, op)
			if op.Outcome == OK && op.Version == 0 {
				k.versioned = false
			}
			switch {
			case op.Kind == Delete:
				k.deletes = append(k.deletes, op)
			case op.Kind == Incr && op.Outcome != OK:
				k.unkIncr = append(k.unkIncr, op)
			case op.Kind == Expire || op.Kind == Persist:
				// They keep the value: only its expiry changes.
			default:
				v, _ := writtenValue(op)
				k.byValue[v] = append(k.byValue[v], op)
			}
		}
		if len(k.writes) == 0 {
			k.versioned = false
		}
		// Version order needs every read to say which version it saw. A read
		// of a present key without a version, or of an absent key without the
		// tombstone's version when deletes exist, would pass for the initial
		// state: fall back to real-time order for the key.
		for _, r := range k.reads {
			if r.Version == 0 && (r.Found || len(k.deletes) > 0) {
				k.versioned = false
			}
		}
		out = append(out, k)
	}
	return out
}

// writeSpan is the span of a write that took effect.
func (k *keyIndex) writeSpan(w *Op) span {
	if k.versioned && w.Outcome == OK {
		return span{int64(w.Version), int64(w.Version)}
	}
	if k.versioned {
		// An unknown write's version is unknown: it may sit anywhere after
		// everything acknowledged before it was invoked.
		return span{math.MinInt64, math.MaxInt64}
	}
	return span{w.Invoke, w.Return}
}

// readSpan is the span covering every write r may have returned. ok is false
// when r returned a value no write produced (a phantom).
func (k *keyIndex) readSpan(r *Op) (s span, ok bool) {
	if k.versioned {
		return span{int64(r.Version), int64(r.Version)}, true
	}
	var cands []*Op
	if r.Found {
		cands = append(cands, k.byValue[r.Result]...)
		cands = append(cands, k.unkIncr...)
	} else {
		cands = k.deletes
	}
	s = span{math.MaxInt64, math.MinInt64}
	if !r.Found {
		s = initialRT
	}
	for _, w := range cands {
		// A write invoked after the read returned cannot be what it read;
		// the linearizability checker reports such reads from the future.
		if w.Invoke > r.Return {
			continue
		}
		s.lo = min(s.lo, w.Invoke)
		s.hi = max(s.hi, w.Return)
	}
	return s, s.lo <= s.hi
}

// readSource is the one write r can have returned, or nil when that is not
// determined (several candidates, or the initial state).
func (k *keyIndex) readSource(r *Op) *Op {
	if k.versioned {
		for _, w := range k.writes {
			if w.Outcome == OK && w.Version == r.Version {
				return w
			}
		}
		return nil
	}
	// A read of nothing may have seen the initial state or any delete.
	if cands := k.byValue[r.Result]; r.Found && len(cands) == 1 && len(k.unkIncr) == 0 {
		return cands[0]
	}
	return nil
}

// strongRead reports whether a read promised at least cross-client monotonic
// reads (the default level is linearizable).
func strongRead(r *Op) bool {
	return r.Cons.IsZero() || r.Cons.Kind == level.Linearizable || r.Cons.Kind == level.CrossClientMonotonic
}

// spanned is an operation with the span of what it saw or wrote.
type spanned struct {
	op *Op
	s  span
}

// sweepOlder finds, for each later read, an earlier operation that returned
// before the read was invoked and saw or wrote something definitely newer than
// anything the read may have returned. It calls report for each such pair
// (the earlier witness with the newest lo), in order of the later read's
// invocation. O(n log n).
func sweepOlder(earlier, later []spanned, report func(before, after spanned)) {
	sort.SliceStable(earlier, func(i, j int) bool { return earlier[i].op.Return < earlier[j].op.Return })
	sort.SliceStable(later, func(i, j int) bool { return later[i].op.Invoke < later[j].op.Invoke })
	best := -1
	j := 0
	for _, r := range later {
		for j < len(earlier) && earlier[j].op.Return < r.op.Invoke {
			if best < 0 || earlier[j].s.lo > earlier[best].s.lo {
				best = j
			}
			j++
		}
		if best >= 0 && r.s.olderThan(earlier[best].s) {
			report(earlier[best], r)
		}
	}
}

// sweepLatest is sweepOlder with the most recent earlier operation (the
// last to return before the later one was invoked) as the witness, not the
// one with the newest version: for a session whose versions may go
// backwards — op numbers reused after a lost write — a later write of the
// session supersedes an earlier one whatever their versions.
func sweepLatest(earlier, later []spanned, report func(before, after spanned)) {
	sort.SliceStable(earlier, func(i, j int) bool { return earlier[i].op.Return < earlier[j].op.Return })
	sort.SliceStable(later, func(i, j int) bool { return later[i].op.Invoke < later[j].op.Invoke })
	last := -1
	j := 0
	for _, r := range later {
		for j < len(earlier) && earlier[j].op.Return < r.op.Invoke {
			last = j
			j++
		}
		if last >= 0 && r.s.olderThan(earlier[last].s) {
			report(earlier[last], r)
		}
	}
}

func sortStrings(s []string) { sort.Strings(s) }
