package check

import (
	"fmt"
	"time"

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
// SplitExpiring separates them. So do the expiry kinds (Expire, Persist,
// TTL), which only this checker models.

// SplitExpiring splits h into the operations on keys no Put gave an expiry
// and no expiry op touched (for All) and those on the others (for Expiry).
// Crashes go to both.
func SplitExpiring(h History) (plain, expiring History) {
	ttl := map[string]bool{}
	for i := range h.Ops {
		switch op := &h.Ops[i]; {
		case op.Kind == Put && op.ExpireAt != 0, op.Kind == Expire, op.Kind == Persist, op.Kind == TTL:
			ttl[op.Key] = true
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
//
// An Expire or Persist that may have acted on a value between its Put and
// the read moves the value's expiry for the first rule (to the latest any
// of them set: the rule gives the server the benefit of the doubt).
//
// Expiry reads (TTL, PEXPIRETIME: the key's expiry on the recorder's
// clock, compared at millisecond resolution, the server's):
//   - an expiry read that began more than bound after the expiry it
//     answered must have found the key absent;
//   - the expiry it answered is one some Put or Expire of the key set;
//   - a linearizable expiry read that began after a write w completed
//     answers the state w left — its expiry (Put, Expire that was set), no
//     expiry (Persist that removed one, or absent), absent (Delete, Expire
//     of an absent key) — unless another write of the key may have taken
//     effect in between (as above) or w's expiry is within bound of the
//     read's end. When w is the reader's own last write this is
//     read-your-writes for expiry metadata: the rule that catches a read
//     served before its session's acknowledged write was applied;
//   - linearizable expiry reads do not go back in time: after one that
//     found the key live with expiry E1 (or none) returned, no linearizable
//     one finds it live with an expiry E0 (or none) that only writes
//     preceding every write of E1 set (some write of E1 took effect before
//     the first read, so a write of E0 after it would have to be one that
//     had not returned when a write of E1 began). The
//     rule that catches a read served from a state older than another
//     reader's while the write between them is in flight — a chain member
//     that serves a key dirty at it from its engine instead of sending the
//     read on, which the read-your-writes rule cannot see when the writer
//     is answered only after every member applied its write.
//
// Under cad and async (Op.Dur) an acknowledged write nobody read may be
// lost to a crash (docs/consistency.md), so the rules that expect a write's
// effect (present before expiry, and the last one) do not judge a read
// across a crash after a cad or async write began: they would blame the
// crash's legitimate loss on the read.
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
				if w != nil {
					if at := valueExpiry(k, w, r); at != 0 && r.Invoke > at+bound {
						v.add(Violation{Key: k.key, Reason: fmt.Sprintf("read returned a value %d after its expiry (bound %d)", r.Invoke-at, bound), Ops: []Op{*w, *r}})
					}
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
				if overwritten(k, w, r) || mayBeLost(&h, w, r) {
					continue
				}
				got := "nothing"
				if r.Found {
					got = fmt.Sprintf("%q", r.Result)
				}
				v.add(Violation{Key: k.key, Reason: fmt.Sprintf("linearizable read before the expiry of the only write it can see returned %s", got), Ops: []Op{*w, *r}})
			}
		}
		for _, r := range k.ttls {
			v.Checked++
			expiryRead(&v, &h, k, r, bound)
		}
		expiryReadsInOrder(&v, &h, k)
	}
	return v
}

// expiryReadsInOrder judges k's linearizable expiry reads against each
// other (Expiry's rule that they do not go back in time).
func expiryReadsInOrder(v *Verdict, h *History, k *keyIndex) {
	// setters are the writes that may have left the live key with r's
	// answered expiry, or without one: a Put of that expiry or none, an
	// Expire that set it, a Persist that removed one (an Expire or Persist
	// that answered 0 changed nothing).
	setters := func(r *Op) []*Op {
		var ws []*Op
		for _, x := range k.writes {
			acted := x.Outcome != OK || x.Found
			if x.Kind == Put && sameExpiry(x.ExpireAt, r.ExpireAt) ||
				x.Kind == Expire && acted && r.ExpireAt != 0 && sameExpiry(x.ExpireAt, r.ExpireAt) ||
				x.Kind == Persist && acted && r.ExpireAt == 0 {
				ws = append(ws, x)
			}
		}
		return ws
	}
	var reads []*Op
	for _, r := range k.ttls {
		if r.Found && (r.Cons.IsZero() || r.Cons.Kind == level.Linearizable) {
			reads = append(reads, r)
		}
	}
	for _, r2 := range reads {
		var last int64 // when the last write of r2's expiry returned
		for _, x := range setters(r2) {
			last = max(last, x.Return)
		}
		for _, r1 := range reads {
			if !r1.Precedes(r2) || sameExpiry(r1.ExpireAt, r2.ExpireAt) {
				continue
			}
			ws := setters(r1)
			ok := len(ws) == 0 // the other rules report an expiry nobody set
			for _, y := range ws {
				// An async write, or a cad one across a crash, may be taken
				// back after a read saw it (docs/consistency.md).
				if last >= y.Invoke || y.Dur == level.Async || mayBeLost(h, y, r2) {
					ok = true
					break
				}
			}
			if !ok {
				v.add(Violation{Key: k.key, Reason: fmt.Sprintf("linearizable expiry read went back in time: answered %s after a read that returned answered %s, which a write set after every write of the first had returned",
					ttlState(true, r2.ExpireAt, false), ttlState(true, r1.ExpireAt, false)), Ops: []Op{*r1, *r2}})
				break
			}
		}
	}
}

// expiryRead judges an expiry read r of k (Expiry's rules for them).
func expiryRead(v *Verdict, h *History, k *keyIndex, r *Op, bound int64) {
	if r.Found && r.ExpireAt != 0 {
		if r.Invoke > r.ExpireAt+bound {
			v.add(Violation{Key: k.key, Reason: fmt.Sprintf("expiry read found the key live %d after the expiry it answered (bound %d)", r.Invoke-r.ExpireAt, bound), Ops: []Op{*r}})
		}
		set := false
		for _, x := range k.writes {
			if (x.Kind == Put || x.Kind == Expire) && x.Invoke < r.Return && sameExpiry(x.ExpireAt, r.ExpireAt) {
				set = true
				break
			}
		}
		if !set {
			v.add(Violation{Key: k.key, Reason: "expiry read answered an expiry no write of the key set", Ops: []Op{*r}})
		}
	}
	if !r.Cons.IsZero() && r.Cons.Kind != level.Linearizable {
		return
	}
	for _, w := range k.writes {
		if w.Outcome != OK || !w.Precedes(r) || overwritten(k, w, r) || mayBeLost(h, w, r) {
			continue
		}
		// The state w left: absent, live with expiry at (0: none), or
		// (a Persist that removed nothing) absent or live without one.
		var live, either bool
		var at int64
		switch {
		case w.Kind == Put, w.Kind == Expire && w.Found:
			live, at = true, w.ExpireAt
		case w.Kind == Persist:
			live, either = w.Found, !w.Found
		case w.Kind == Delete, w.Kind == Expire:
		default:
			continue // CAS, Incr: not in the expiry workloads
		}
		if at != 0 && r.Return >= at-bound {
			continue // it may have expired since
		}
		ok := false
		switch {
		case either:
			ok = !r.Found || r.ExpireAt == 0
		case !live:
			ok = !r.Found
		default:
			ok = r.Found && sameExpiry(r.ExpireAt, at)
		}
		if ok {
			continue
		}
		whose := "another client's"
		if w.SessionID() == r.SessionID() {
			whose = "its own (read-your-writes)"
		}
		v.add(Violation{Key: k.key, Reason: fmt.Sprintf("linearizable expiry read after the only write it can see, %s, answered %s, want %s",
			whose, ttlState(r.Found, r.ExpireAt, false), ttlState(live, at, either)), Ops: []Op{*w, *r}})
	}
}

// ttlState describes a key's expiry state for a violation.
func ttlState(live bool, at int64, either bool) string {
	switch {
	case either:
		return "absent or no expiry"
	case !live:
		return "absent"
	case at == 0:
		return "live without expiry"
	}
	return "expiry " + expiryString("@", at)
}

// sameExpiry reports whether expiries a and b (recorder ns; 0: none) are
// the same at the server's resolution, the millisecond.
func sameExpiry(a, b int64) bool {
	if a == 0 || b == 0 {
		return a == b
	}
	return a-b < int64(time.Millisecond) && b-a < int64(time.Millisecond)
}

// valueExpiry is when the value w put, as read by r, expires: w's expiry,
// or the latest that an Expire or Persist which may have acted on it
// between w and r set (a Persist: never, 0).
func valueExpiry(k *keyIndex, w, r *Op) int64 {
	at := w.ExpireAt
	for _, x := range k.writes {
		if (x.Kind != Expire && x.Kind != Persist) || (x.Outcome == OK && !x.Found) || x.Invoke >= r.Return || x.Return <= w.Invoke {
			continue
		}
		if x.Kind == Persist {
			return 0
		}
		if laterExpiry(x.ExpireAt, at) {
			at = x.ExpireAt
		}
	}
	return at
}

// mayBeLost reports whether a crash may have taken w back before r: w is a
// cad or async write and some replica crashed after w began and before r
// ended (an acknowledged write of those levels nobody read yet is lost to
// crashes of a majority, docs/consistency.md).
func mayBeLost(h *History, w, r *Op) bool {
	if w.Dur != level.CAD && w.Dur != level.Async {
		return false
	}
	for _, c := range h.Crashes {
		if c.At > w.Invoke && c.At < r.Return {
			return true
		}
	}
	return false
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
