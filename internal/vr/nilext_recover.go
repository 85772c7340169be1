package vr

import (
	"container/heap"
	"fmt"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Nilext view change: the new leader rebuilds the durability log from the
// do-view-changes (RecoverDurabilityLog) before its view starts.

// nxRecover rebuilds the d-log at a new leader from the do-view-changes at
// hand, once the chosen consensus log (ours before `first`, then es) is known.
// It returns false when the logs order pending updates in a cycle: the view
// must not start (see RecoverDurabilityLog).
func (r *Replica) nxRecover(first uint64, es []Entry) ([]NilextRequest, bool) {
	if !r.cfg.Nilext {
		return nil, true
	}
	inLog := map[dkey]bool{}
	for op := r.first; op < first && op <= r.lastOp(); op++ {
		if e := r.entry(op); e.Client != 0 {
			inLog[dkey{e.Client, e.ReqNum}] = true
		}
	}
	for _, e := range es {
		if e.Client != 0 {
			inLog[dkey{e.Client, e.ReqNum}] = true
		}
	}
	// Our own d-log first: it breaks ties among unordered updates.
	logs := make([][]NilextRequest, 0, r.n)
	all := make([][]NilextRequest, 0, r.n)
	order := append([]int{r.self}, func() []int {
		var o []int
		for i := range r.dvc {
			if i != r.self {
				o = append(o, i)
			}
		}
		return o
	}()...)
	for _, i := range order {
		d := r.dvc[i]
		if d == nil {
			continue
		}
		l := make([]NilextRequest, 0, len(d.DLog))
		for _, q := range d.DLog {
			// Executed or already in the chosen log: not pending any more.
			// Dropping an op from every log leaves the others' relations as
			// they were.
			if !inLog[dkey{q.Client, q.ReqNum}] && !r.nxApplied(q.Client, q.ReqNum) {
				l = append(l, q)
			}
		}
		all = append(all, l)
		if !d.DLogStale || (mutation.On && r.mut.nilextCountStale) {
			logs = append(logs, l)
		}
	}
	// Only fresh logs count (nxRestarted): with V of them, the threshold
	// V − (n − S) must exceed V/2, so V > 2(n − S) (1 of 3, 3 of 5).
	if need := 2*(r.n-NilextSupermajority(r.n)) + 1; len(logs) < need {
		stale := len(all) - len(logs)
		if len(all) < r.n {
			if r.nx.staleView != r.view || r.nx.staleLogs != len(logs) {
				r.nx.staleView, r.nx.staleLogs = r.view, len(logs)
				r.nx.staleWaits++
				r.out.Errors = append(r.out.Errors, fmt.Errorf("vr: replica %d waits for more do-view-changes to start view %d: %d of the %d d-logs at hand come from replicas that restarted and may have lost acknowledged updates, %d fresh ones needed: %w",
					r.cfg.Self, r.view, stale, len(all), need, ErrDLogStale))
			}
			return nil, false
		}
		// Every replica answered and too many of them restarted (a power
		// cut of several at once): no more logs will come, and waiting
		// would stop the group for good. What no log holds any more is
		// lost — the promise covers one replica's power cut, not this.
		if r.nx.staleView != r.view || r.nx.staleLogs != -1 {
			r.nx.staleView, r.nx.staleLogs = r.view, -1
			r.out.Errors = append(r.out.Errors, fmt.Errorf("vr: replica %d starts view %d from all %d d-logs, %d of them from replicas that restarted: cad/async nilext updates acknowledged only from their memory may be lost: %w",
				r.cfg.Self, r.view, len(all), stale, ErrDLogStale))
		}
		logs = all
	}
	out, err := recoverDLog(logs, r.n, mutation.On && r.mut.nilextBreakCycles)
	if err != nil {
		// Reported (and counted) once per view and number of logs: the
		// operator sees the group waiting for more replicas, or stuck.
		if r.nx.cycleView != r.view || r.nx.cycleLogs != len(logs) {
			r.nx.cycleView, r.nx.cycleLogs = r.view, len(logs)
			r.nx.cycles++
			what := "waiting for more replicas' do-view-changes"
			if len(all) == r.n {
				what = "refusing to serve: even every replica's d-log cycles"
			}
			r.out.Errors = append(r.out.Errors, fmt.Errorf("vr: replica %d cannot start view %d from %d of %d d-logs (%s): %w",
				r.cfg.Self, r.view, len(logs), r.n, what, err))
		}
		return nil, false
	}
	return out, true
}

// nxStartView appends the recovered d-log to the consensus log of the view
// this leader is starting, so the start-view carries it, and keeps it as the
// leader's d-log (already queued) until it is applied.
func (r *Replica) nxStartView(rec []NilextRequest) {
	r.nx.clear()
	if !r.cfg.Nilext {
		return
	}
	start := r.lastOp() + 1
	es := make([]Entry, 0, len(rec))
	for i, q := range rec {
		es = append(es, Entry{View: r.view, Op: start + uint64(i), Request: q.Request})
		r.nx.add(&dEntry{NilextRequest: q, view: r.view, queued: true})
		r.nx.quiet[dkey{q.Client, q.ReqNum}] = true
	}
	r.appendEntries(es)
	r.nx.lastOrder = r.now
}

// RecoverDurabilityLog computes the new leader's d-log from V durability
// logs (each in its replica's arrival order; logs[0] breaks ties) out of a
// group of n = 2f+1 replicas with supermajority S = NilextSupermajority(n).
//
// Rule (paper 004 Fig. 7, generalized to V >= f+1 logs): with threshold
// t = V − (n − S), keep the updates present in >= t logs; add the edge a→b
// when, in >= t logs, a precedes b or a is present without b; topologically
// sort. For V = f+1, t = ceil(f/2)+1 as in the paper.
//
// Why t is right for any V: a completed update was in S d-logs (one view,
// leader included) and stays there until applied or a new view starts, so at
// most n−S of the V logs lack it. If b was invoked after a completed, a was in
// those S logs before b arrived, so each of them shows "a before b, or a
// without b": >= t logs again. Every completed update is therefore kept and
// every real-time edge among kept updates is in the graph, and t > V/2
// (V >= f+1 > 2·floor(f/2) >= 2(n−S)) rules out opposite edges. If the graph
// is acyclic, any topological order respects real time: the result is safe.
//
// The cycle hazard (digest 004 §6.1): for f >= 2, pairwise majorities can form
// a cycle of length >= 3 (a Condorcet cycle), and there are executions, each
// producing the very same logs, in which each edge of the cycle is the real-
// time one: no order chosen from those logs is right in all of them. So a
// cycle is never broken: RecoverDurabilityLog returns ErrDLogCycle, and the
// new leader waits for more do-view-changes and recomputes with the larger V
// (the higher threshold removes edges that only a minority of replicas
// supports; the §6.1 cycle, with all five logs, is gone). If all n logs still
// form a cycle, the leader refuses to start the view (the group stays
// unavailable and reports it in Ready.Errors) rather than guess.
//
// What Kefir guarantees: for f = 1 (S = n = 3, t = V) the edge relation is
// an intersection of linear orders and cannot cycle, so recovery always
// succeeds with 2 logs. For f >= 2 every history stays linearizable and no
// completed update is lost; a view change that meets a cycle needs more
// replicas to answer, and one whose logs cycle even with all replicas refuses
// to serve.
func RecoverDurabilityLog(logs [][]NilextRequest, n int) ([]NilextRequest, error) {
	return recoverDLog(logs, n, false)
}

func recoverDLog(logs [][]NilextRequest, n int, breakCycles bool) ([]NilextRequest, error) {
	v := len(logs)
	t := v - (n - NilextSupermajority(n))
	if v == 0 {
		return nil, nil
	}
	if t < 1 || v > n {
		return nil, fmt.Errorf("vr: recover d-log from %d logs of %d replicas: need at least %d", v, n, n-NilextSupermajority(n)+1)
	}
	type node struct {
		req   NilextRequest
		count int
	}
	var nodes []*node // in order of first appearance, logs[0] first
	at := map[dkey]int{}
	pos := make([]map[dkey]int, v)
	for i, l := range logs {
		pos[i] = make(map[dkey]int, len(l))
		for p, q := range l {
			k := dkey{q.Client, q.ReqNum}
			if _, dup := pos[i][k]; dup {
				continue
			}
			pos[i][k] = p
			j, ok := at[k]
			if !ok {
				j = len(nodes)
				at[k] = j
				nodes = append(nodes, &node{req: q})
			}
			nodes[j].count++
		}
	}
	var keep []*node
	for _, nd := range nodes {
		if nd.count >= t {
			keep = append(keep, nd)
		}
	}
	m := len(keep)
	keys := make([]dkey, m)
	for i, nd := range keep {
		keys[i] = dkey{nd.req.Client, nd.req.ReqNum}
	}
	// at[i*m+a] is the position of kept update a in log i, -1 if absent: the
	// pair loop below is O(m²·V) array reads, no map lookups.
	at2 := make([]int32, v*m)
	for i := 0; i < v; i++ {
		for a, k := range keys {
			p, ok := pos[i][k]
			if !ok {
				p = -1
			}
			at2[i*m+a] = int32(p)
		}
	}
	// adj[a] lists b with a→b; indeg counts incoming edges.
	adj := make([][]int, m)
	indeg := make([]int, m)
	for a := 0; a < m; a++ {
		for b := a + 1; b < m; b++ {
			ab, ba := 0, 0
			for i := 0; i < v; i++ {
				pa, pb := at2[i*m+a], at2[i*m+b]
				switch {
				case pa >= 0 && (pb < 0 || pa < pb):
					ab++
				case pb >= 0 && (pa < 0 || pb < pa):
					ba++
				}
			}
			if ab >= t && ba >= t {
				panic(fmt.Sprintf("vr: recover d-log: edges both ways between %v and %v with threshold %d of %d", keys[a], keys[b], t, v))
			}
			if ab >= t {
				adj[a] = append(adj[a], b)
				indeg[b]++
			} else if ba >= t {
				adj[b] = append(adj[b], a)
				indeg[a]++
			}
		}
	}
	// Kahn's algorithm; among ready updates the earliest first appearance
	// goes first (a min-heap of indexes), which is the new leader's own
	// order where the logs have no opinion.
	out := make([]NilextRequest, 0, m)
	done := make([]bool, m)
	ready := &intHeap{}
	for i := 0; i < m; i++ {
		if indeg[i] == 0 {
			heap.Push(ready, i)
		}
	}
	for len(out) < m {
		pick := -1
		if ready.Len() > 0 {
			pick = heap.Pop(ready).(int)
		} else {
			var cyc []dkey
			for i := 0; i < m; i++ {
				if !done[i] {
					cyc = append(cyc, keys[i])
				}
			}
			if !breakCycles {
				return nil, fmt.Errorf("%w: %d of %d updates left unordered (%d logs, threshold %d): %v", ErrDLogCycle, len(cyc), m, v, t, cyc)
			}
			// Deliberately wrong (tests only): the paper-faithful "fixed
			// deterministic rule" — most logs first, then lowest (client, request).
			for i := 0; i < m; i++ {
				if done[i] {
					continue
				}
				if pick < 0 || keep[i].count > keep[pick].count ||
					(keep[i].count == keep[pick].count && (keys[i].client < keys[pick].client ||
						(keys[i].client == keys[pick].client && keys[i].req < keys[pick].req))) {
					pick = i
				}
			}
		}
		done[pick] = true
		out = append(out, keep[pick].req)
		for _, b := range adj[pick] {
			if indeg[b]--; indeg[b] == 0 && !done[b] {
				heap.Push(ready, b)
			}
		}
	}
	return out, nil
}

type intHeap []int

func (h intHeap) Len() int           { return len(h) }
func (h intHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h intHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *intHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *intHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
