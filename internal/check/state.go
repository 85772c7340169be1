package check

import (
	"fmt"
	"sort"
)

// MonotonicState is the state-level form of cross-client monotonic reads
// (digest 003 §5.4, check 2): a read returns a *state*, and a state that
// contains a client's write contains everything that client wrote before it
// (sequential consistency keeps program order). So once a read (at
// cross-client-monotonic or linearizable level) has returned client c's write
// w1, no such read that begins after it completed may return, for any key b,
// a version definitely older than the last write c completed on b before
// invoking w1.
//
// With a single sequential writer this is the digest's "observing k_j implies
// k_1..k_{j-1}" check; with many writers it checks each writer's prefix. Reads
// whose source write is ambiguous (duplicate values) are not used as
// witnesses.
func MonotonicState(h History) Verdict {
	v := Verdict{Checker: "monotonic-state", OK: true}
	keys := indexKeys(&h)
	byKey := make(map[string]*keyIndex, len(keys))
	for _, k := range keys {
		byKey[k.key] = k
	}
	// Each client's acknowledged writes per key, in program order.
	type cw struct {
		client int
		key    string
	}
	progs := map[cw][]*Op{}
	for i := range h.Ops {
		w := &h.Ops[i]
		if w.Outcome == OK && tookEffect(w) {
			progs[cw{w.Client, w.Key}] = append(progs[cw{w.Client, w.Key}], w)
		}
	}
	clientKeys := map[int][]string{}
	for p, ws := range progs {
		sort.Slice(ws, func(i, j int) bool { return ws[i].Invoke < ws[j].Invoke })
		clientKeys[p.client] = append(clientKeys[p.client], p.key)
	}
	for _, ks := range clientKeys {
		sort.Strings(ks)
	}

	// A requirement: from time at on, strong reads of key must not be older
	// than w0, because read r1 saw w1.
	type req struct {
		at         int64
		s          span
		w0, w1, r1 *Op
	}
	reqs := map[string][]req{}
	for _, k := range keys {
		for _, r1 := range k.reads {
			if !strongRead(r1) {
				continue
			}
			w1 := k.readSource(r1)
			if w1 == nil {
				continue
			}
			for _, key := range clientKeys[w1.Client] {
				ws := progs[cw{w1.Client, key}]
				// The last of c's writes on key that completed before w1 began.
				i := sort.Search(len(ws), func(i int) bool { return ws[i].Invoke >= w1.Invoke })
				for i > 0 && ws[i-1].Return >= w1.Invoke {
					i--
				}
				if i == 0 {
					continue
				}
				w0 := ws[i-1]
				bk := byKey[key]
				reqs[key] = append(reqs[key], req{at: r1.Return, s: bk.writeSpan(w0), w0: w0, w1: w1, r1: r1})
			}
		}
	}
	for _, k := range keys {
		rs := reqs[k.key]
		reads := readSpans(k, strongRead)
		v.Checked += len(reads)
		if len(rs) == 0 {
			continue
		}
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].at < rs[j].at })
		sort.SliceStable(reads, func(i, j int) bool { return reads[i].op.Invoke < reads[j].op.Invoke })
		best, j := -1, 0
		for _, r2 := range reads {
			for j < len(rs) && rs[j].at < r2.op.Invoke {
				if best < 0 || rs[j].s.lo > rs[best].s.lo {
					best = j
				}
				j++
			}
			if best >= 0 && r2.s.olderThan(rs[best].s) {
				q := rs[best]
				v.add(Violation{Key: k.key, Reason: fmt.Sprintf(
					"read returned state older than client %d's write on %q, which an earlier read implied by returning its later write on %q",
					q.w1.Client, k.key, q.w1.Key), Ops: []Op{*q.w0, *q.w1, *q.r1, *r2.op}})
			}
		}
	}
	return v
}
