package check

import (
	"fmt"
	"time"

	"github.com/kefirdb/kefir/internal/level"
)

// phantoms reports reads that returned a value no write on the key produced.
func phantoms(v *Verdict, k *keyIndex, judged func(*Op) bool) {
	for _, r := range k.reads {
		if !judged(r) {
			continue
		}
		if _, ok := k.readSpan(r); !ok {
			v.add(Violation{Key: k.key, Reason: "read returned a value no write produced", Ops: []Op{*r}})
		}
	}
}

func readSpans(k *keyIndex, judged func(*Op) bool) []spanned {
	var out []spanned
	for _, r := range k.reads {
		if !judged(r) {
			continue
		}
		if s, ok := k.readSpan(r); ok {
			out = append(out, spanned{r, s})
		}
	}
	return out
}

// SessionOptions tunes Session.
type SessionOptions struct {
	// AllReads judges every read; by default only reads at session level or
	// stronger (session, cross-client monotonic, linearizable, default).
	AllReads bool
	// NoMonotonicWrites skips monotonic writes and judges reads only: for
	// histories where an acknowledged write may be lost (cad or async in a
	// replica group), whose session learns of the loss at its next read
	// (ErrSessionLost) — a write it made before that read may then carry an
	// older version than the lost one (op numbers are reused after a view
	// change drops ops).
	NoMonotonicWrites bool
}

func sessionRead(r *Op) bool {
	return r.Cons.IsZero() || r.Cons.Kind == level.Session || r.Cons.Kind == level.Linearizable || r.Cons.Kind == level.CrossClientMonotonic
}

// Session checks the session guarantees, per session (Op.SessionID):
//   - read-my-writes: a read never returns a version older than a write the
//     session completed before the read began;
//   - monotonic reads: a read never returns a version older than one an earlier
//     read of the session returned;
//   - monotonic writes: the session's writes take effect in session order. This
//     needs server versions (it is invisible in real-time order alone); keys
//     without them are skipped and the verdict says so.
func Session(h History, o SessionOptions) Verdict {
	v := Verdict{Checker: "session", OK: true}
	judged := sessionRead
	if o.AllReads {
		judged = func(*Op) bool { return true }
	}
	unversioned := 0
	for _, k := range indexKeys(&h) {
		phantoms(&v, k, judged)
		reads := map[string][]spanned{}
		for _, r := range readSpans(k, judged) {
			reads[r.op.SessionID()] = append(reads[r.op.SessionID()], r)
			v.Checked++
		}
		writes := map[string][]spanned{}
		for _, w := range k.writes {
			if w.Outcome == OK {
				writes[w.SessionID()] = append(writes[w.SessionID()], spanned{w, k.writeSpan(w)})
			}
		}
		// Where versions may go backwards (NoMonotonicWrites: a lost write's
		// op number reused), a read owes the session's latest earlier write,
		// which superseded the ones before it, not the newest version.
		rmw := sweepOlder
		if o.NoMonotonicWrites {
			rmw = sweepLatest
		}
		for _, sess := range sortedKeys(reads) {
			rmw(writes[sess], reads[sess], func(w, r spanned) {
				v.add(Violation{Key: k.key, Reason: fmt.Sprintf("read-my-writes: session %s read a version older than its own earlier write", sess), Ops: []Op{*w.op, *r.op}})
			})
			sweepOlder(append([]spanned(nil), reads[sess]...), reads[sess], func(a, b spanned) {
				v.add(Violation{Key: k.key, Reason: fmt.Sprintf("monotonic reads: session %s read a version older than one it read before", sess), Ops: []Op{*a.op, *b.op}})
			})
		}
		if o.NoMonotonicWrites {
			continue
		}
		if !k.versioned {
			if len(k.writes) > 0 {
				unversioned++
			}
			continue
		}
		for _, sess := range sortedKeys(writes) {
			// Versioned spans are exact, so "older than an earlier write of
			// the session" is the same sweep as for reads.
			ws := writes[sess]
			sweepOlder(append([]spanned(nil), ws...), ws, func(a, b spanned) {
				v.add(Violation{Key: k.key, Reason: fmt.Sprintf("monotonic writes: session %s's later write got an older version", sess), Ops: []Op{*a.op, *b.op}})
			})
		}
	}
	if unversioned > 0 {
		v.Note = fmt.Sprintf("monotonic writes not checked on %d key(s) without server versions", unversioned)
	}
	return v
}

// CrossClientMonotonic checks that no read returns a version older than one
// returned by any read (any client, any session) that completed before it
// began — across crashes too, since the history's clock runs through them
// (CAD/Orca, digest 003 §5.4). Judged: reads at cross-client-monotonic or
// linearizable (including the default) level, both as witnesses and as suspects.
func CrossClientMonotonic(h History) Verdict {
	v := Verdict{Checker: "cross-client-monotonic", OK: true}
	for _, k := range indexKeys(&h) {
		phantoms(&v, k, strongRead)
		reads := readSpans(k, strongRead)
		v.Checked += len(reads)
		sweepOlder(append([]spanned(nil), reads...), reads, func(a, b spanned) {
			v.add(Violation{Key: k.key, Reason: "read returned a version older than one an earlier read (any client) returned", Ops: []Op{*a.op, *b.op}})
		})
	}
	return v
}

// BoundedStaleness checks reads made at bounded(n versions) and bounded(t):
//   - bounded(n): at most n acknowledged writes, all completed before the read
//     began, are definitely newer than what the read returned;
//   - bounded(t): no write definitely newer than what the read returned had
//     completed more than t before the read began.
//
// Times are the history's clock; t must be comparable with it (nanoseconds).
func BoundedStaleness(h History) Verdict {
	v := Verdict{Checker: "bounded-staleness", OK: true}
	bounded := func(r *Op) bool {
		return r.Cons.Kind == level.BoundedVersions || r.Cons.Kind == level.BoundedTime
	}
	for _, k := range indexKeys(&h) {
		phantoms(&v, k, bounded)
		for _, r := range readSpans(k, bounded) {
			v.Checked++
			newer, oldest := newerWrites(k, r)
			switch r.op.Cons.Kind {
			case level.BoundedVersions:
				if uint64(len(newer)) > r.op.Cons.Versions {
					ops := []Op{*r.op}
					for _, w := range newer[:r.op.Cons.Versions+1] {
						ops = append(ops, *w)
					}
					v.add(Violation{Key: k.key, Reason: fmt.Sprintf("read is %d versions stale, bound is %d", len(newer), r.op.Cons.Versions), Ops: ops})
				}
			case level.BoundedTime:
				if oldest != nil && oldest.Return < r.op.Invoke-int64(r.op.Cons.Staleness) {
					v.add(Violation{Key: k.key, Reason: fmt.Sprintf("read's version was superseded %dns before the read began, bound is %s", r.op.Invoke-oldest.Return, r.op.Cons.Staleness), Ops: []Op{*oldest, *r.op}})
				}
			}
		}
	}
	return v
}

// Eventual checks reads at eventual level against the eventual window:
//   - the read returned a value some write produced (or absence, when the
//     key may have been absent), never a phantom;
//   - no write definitely newer than what the read returned had completed
//     more than window before the read began.
//
// This is bounded(window) for every eventual read (docs/consistency.md: a
// replica serves eventual reads only while its state is at most window
// old). window must be comparable with the history's clock (nanoseconds).
func Eventual(h History, window time.Duration) Verdict {
	v := Verdict{Checker: "eventual", OK: true}
	eventual := func(r *Op) bool { return r.Cons.Kind == level.Eventual }
	for _, k := range indexKeys(&h) {
		phantoms(&v, k, eventual)
		for _, r := range readSpans(k, eventual) {
			v.Checked++
			if _, w := newerWrites(k, r); w != nil && w.Return < r.op.Invoke-int64(window) {
				v.add(Violation{Key: k.key, Reason: fmt.Sprintf("eventual read's version was superseded %dns before the read began, window is %s", r.op.Invoke-w.Return, window), Ops: []Op{*w, *r.op}})
			}
		}
	}
	return v
}

// newerWrites returns the acknowledged writes that completed before read r
// began and are definitely newer than what it returned, and the one of them
// that completed first (nil if none).
func newerWrites(k *keyIndex, r spanned) (newer []*Op, oldest *Op) {
	for _, w := range k.writes {
		if w.Outcome != OK || !w.Precedes(r.op) || !r.s.olderThan(k.writeSpan(w)) {
			continue
		}
		newer = append(newer, w)
		if oldest == nil || w.Return < oldest.Return {
			oldest = w
		}
	}
	return newer, oldest
}

// Durability checks the durability promise of each level across the crashes
// recorded in the history. After a crash at time C, reads that promise at least
// cross-client monotonicity and begin after C must not return a version
// definitely older than:
//   - any sync write acknowledged before C (nothing acknowledged is lost), and
//   - any version a read (at any level) returned before C, unless that version
//     was written with async durability (cad: a value once read is never lost).
func Durability(h History) Verdict {
	v := Verdict{Checker: "durability", OK: true}
	if len(h.Crashes) == 0 {
		v.Note = "no crashes in the history"
		return v
	}
	type pair struct{ a, b int }
	reported := map[pair]bool{}
	for _, k := range indexKeys(&h) {
		after := readSpans(k, strongRead)
		all := readSpans(k, func(*Op) bool { return true })
		for _, c := range h.Crashes {
			var late []spanned
			for _, r := range after {
				if r.op.Invoke > c.At {
					late = append(late, r)
				}
			}
			v.Checked += len(late)
			if len(late) == 0 {
				continue
			}
			var syncW, seen []spanned
			for _, w := range k.writes {
				if w.Outcome == OK && w.Dur == level.Sync && w.Return < c.At {
					syncW = append(syncW, spanned{w, k.writeSpan(w)})
				}
			}
			for _, r := range all {
				if r.op.Return >= c.At {
					continue
				}
				if src := k.readSource(r.op); src != nil && src.Dur == level.Async {
					continue
				}
				seen = append(seen, r)
			}
			report := func(reason string) func(a, b spanned) {
				return func(a, b spanned) {
					// Simultaneous crashes (a whole-cluster power cut) would
					// repeat the same pair once per node.
					if reported[pair{a.op.ID, b.op.ID}] {
						return
					}
					reported[pair{a.op.ID, b.op.ID}] = true
					v.add(Violation{Key: k.key, Reason: fmt.Sprintf("%s (crash of node %d at %d)", reason, c.Node, c.At), Ops: []Op{*a.op, *b.op}})
				}
			}
			// The crash separates witnesses from suspects, so "earlier" here is
			// "before the crash", not just "before the read".
			lateCopy := append([]spanned(nil), late...)
			sweepOlder(syncW, late, report("sync write acknowledged before the crash is lost after it"))
			sweepOlder(seen, lateCopy, report("value read before the crash is lost after it"))
		}
	}
	return v
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}
