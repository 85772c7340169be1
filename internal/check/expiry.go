package check

import (
	"fmt"

	"github.com/kefirdb/kefir/internal/level"
)

// Key expiry (docs/design/expiry.md). A Put with ExpireAt sets a value that
// must read as absent once ExpireAt has passed and as present before it. The
// server decides expiry with clocks that may differ from the recorder's (the
// leader's, a follower's plus its skew allowance); bound is how far they may
// be apart, in the recorder's units, and the checker allows it both ways.
//
// Keys written with an expiry vanish without a write the history shows, so
// the other checkers (which know no such thing) must not judge them:
// SplitExpiring separates them.

// SplitExpiring splits h into the operations on keys no Put gave an expiry
// (for All) and those on keys some Put did (for Expiry). Crashes go to both.
func SplitExpiring(h History) (plain, expiring History) {
	ttl := map[string]bool{}
	for i := range h.Ops {
		if h.Ops[i].Kind == Put && h.Ops[i].ExpireAt != 0 {
			ttl[h.Ops[i].Key] = true
		}
	}
	plain.Crashes, expiring.Crashes = h.Crashes, h.Crashes
	for _, op := range h.Ops {
		if ttl[op.Key] {
			op.ID = len(expiring.Ops)
			expiring.Ops = append(expiring.Ops, op)
		} else {
			op.ID = len(plain.Ops)
			plain.Ops = append(plain.Ops, op)
		}
	}
	return plain, expiring
}

// Expiry checks, for keys whose values are unique per key (as the other
// checkers assume):
//   - absent after expiry: no read, at any level, that began more than bound
//     after a value's expiry returned that value;
//   - present before expiry: a linearizable read (or one at the default level)
//     that began after a Put completed and ended more than bound before the
//     Put's expiry returns the Put's value, unless another write of the key
//     may have taken effect in between (it may have begun before the read
//     ended and ended after the Put began). Weaker reads may lag, so only
//     the first rule judges them.
func Expiry(h History, bound int64) Verdict {
	v := Verdict{Checker: "expiry", OK: true}
	for _, k := range indexKeys(&h) {
		for _, r := range k.reads {
			v.Checked++
			if r.Found {
				// A value several Puts wrote expires at the latest of them.
				var w *Op
				for _, p := range k.byValue[r.Result] {
					if p.Kind == Put && (w == nil || laterExpiry(p.ExpireAt, w.ExpireAt)) {
						w = p
					}
				}
				if w != nil && w.ExpireAt != 0 && r.Invoke > w.ExpireAt+bound {
					v.add(Violation{Key: k.key, Reason: fmt.Sprintf("read returned a value %d after its expiry (bound %d)", r.Invoke-w.ExpireAt, bound), Ops: []Op{*w, *r}})
				}
			}
			if !r.Cons.IsZero() && r.Cons.Kind != level.Linearizable {
				continue
			}
			for _, w := range k.writes {
				if w.Kind != Put || w.Outcome != OK || !w.Precedes(r) {
					continue
				}
				if w.ExpireAt != 0 && r.Return >= w.ExpireAt-bound {
					continue
				}
				if r.Found && r.Result == w.Value {
					continue
				}
				if overwritten(k, w, r) {
					continue
				}
				got := "nothing"
				if r.Found {
					got = fmt.Sprintf("%q", r.Result)
				}
				v.add(Violation{Key: k.key, Reason: fmt.Sprintf("linearizable read before the expiry of the only write it can see returned %s", got), Ops: []Op{*w, *r}})
			}
		}
	}
	return v
}

// laterExpiry reports whether expiry a is later than b (0: never, the latest).
func laterExpiry(a, b int64) bool { return a == 0 || (b != 0 && a > b) }

// overwritten reports whether a write of the key other than w may have taken
// effect after w and before r.
func overwritten(k *keyIndex, w, r *Op) bool {
	for _, x := range k.writes {
		if x != w && x.Invoke < r.Return && x.Return > w.Invoke {
			return true
		}
	}
	return false
}
