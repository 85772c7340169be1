//go:build cadtrace

package vrshard

// Diagnostic timeline of ops from append to R (docs/design/cad.md §9), built
// only with -tags cadtrace (bench/cadbench/run.sh builds it so when
// KEFIR_CADTRACE is set); the default build compiles cadtrace_off.go's no-op
// hooks instead, so production carries none of this. With the tag and
// KEFIR_CADTRACE=1, each replica prints p10/p50/p90/p99 of every stage to its
// log on SIGUSR1 (cadbench sends one after the load and after each cell) and
// starts over.

import (
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// cadtraceOn guards the hook sites that would cost something even with
// empty hooks (clock reads, closures, formatted names): false in the
// default build, so the compiler drops those blocks.
const cadtraceOn = true

// traceStamp and traceDur time an fsync for the tracer (zero-size in the
// default build, cadtrace_off.go).
type (
	traceStamp struct{ t time.Time }
	traceDur   = time.Duration
)

func traceNow() traceStamp           { return traceStamp{time.Now()} }
func (s traceStamp) since() traceDur { return time.Since(s.t) }
func (s traceStamp) ago() int64      { return int64(time.Since(s.t)) }

const trRing = 1 << 18

// trOp is one op's timeline at one replica, in ns since trEpoch (shared by
// the replicas of one process, so traceTimeline can join a leader's and a
// follower's stamps of the same op). Leader: prop (Apply took it), rdy (in
// the core's Ready: its prepares leave next), app/wr (written to the log),
// lsync (own fsync done), fpers (first prepare-ok covering it), commit,
// applied, reply (its waiter finished), rpub (R published). Follower: recv
// (prepare stepped), app, lsync, okSent (a prepare-ok covering it sent).
type trOp struct {
	op                                           uint64
	app, wr, lsync, fpers, commit, applied, rpub int64
	prop, rdy, recv, okSent, reply               int64
}

// trEpoch is the common origin of every tracer's stamps in this process.
var trEpoch = time.Now()

type tracer struct {
	mu      sync.Mutex
	on      bool
	ops     [trRing]trOp
	h       map[string][]int64
	seqLast [][2]uint64 // (persist seq, last op) written, not yet synced
	fmax    uint64
	lastR   uint64
	lastApp uint64
	lastCmt uint64
	lastOK  uint64
	node    string
}

func newTracer(node string) *tracer {
	t := &tracer{h: map[string][]int64{}, on: os.Getenv("KEFIR_CADTRACE") != "", node: node}
	if t.on {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGUSR1)
		go func() {
			for range ch {
				t.dump()
			}
		}()
	}
	return t
}

func (t *tracer) now() int64 { return int64(time.Since(trEpoch)) }

// readyAt (leader): entries first..last are in the core's Ready, their
// prepares about to be sent; props are their proposals' Apply stamps
// (zero: proposed elsewhere).
func (t *tracer) readyAt(first, last uint64, props func(op uint64) (traceStamp, bool)) {
	t.stampRange(first, last, func(s *trOp, now int64) {
		s.rdy = now
		if st, ok := props(s.op); ok {
			s.prop = int64(st.t.Sub(trEpoch))
		}
	})
}

// received (follower): a prepare carrying first..last was stepped.
func (t *tracer) received(first, last uint64) {
	t.stampRange(first, last, func(s *trOp, now int64) {
		if s.recv == 0 {
			s.recv = now
		}
	})
}

// stampRange stamps, under the lock, ops first..last (their slots taken
// over for them) with each.
func (t *tracer) stampRange(first, last uint64, each func(s *trOp, now int64)) {
	if !t.on || last == 0 {
		return
	}
	t.mu.Lock()
	now := t.now()
	for op := first; op <= last; op++ {
		each(t.slot(op), now)
	}
	t.mu.Unlock()
}

// okSent (follower): a prepare-ok saying persisted p was handed to the
// transport.
func (t *tracer) okSent(p uint64) {
	t.advance(&t.lastOK, p, func(s *trOp, now int64) {
		if s.okSent == 0 {
			s.okSent = now
		}
	})
}

// replied (leader): op's waiter finished.
func (t *tracer) replied(op uint64) {
	if !t.on {
		return
	}
	t.mu.Lock()
	if s := &t.ops[op%trRing]; s.op == op && s.reply == 0 {
		s.reply = t.now()
	}
	t.mu.Unlock()
}

func (t *tracer) slot(op uint64) *trOp {
	s := &t.ops[op%trRing]
	if s.op != op {
		*s = trOp{op: op}
	}
	return s
}

func (t *tracer) add(name string, d int64) {
	if len(t.h[name]) < 400000 {
		t.h[name] = append(t.h[name], d)
	}
}

// appended: entries first..last written at persist seq.
func (t *tracer) appended(first, last, seq uint64, leader bool) {
	t.stampRange(first, last, func(s *trOp, now int64) {
		s.app, s.wr = now, now
		if s.op == last && seq != 0 {
			t.seqLast = append(t.seqLast, [2]uint64{seq, last})
		}
	})
}

func (t *tracer) synced(seq uint64, d time.Duration) {
	if !t.on {
		return
	}
	t.mu.Lock()
	now := t.now()
	t.add("fsync.dur(syscall)", int64(d))
	i := 0
	for ; i < len(t.seqLast) && t.seqLast[i][0] <= seq; i++ {
	}
	if i > 0 {
		last := t.seqLast[i-1][1]
		for op := last; op > 0; op-- {
			s := &t.ops[op%trRing]
			if s.op != op || s.lsync != 0 {
				break
			}
			s.lsync = now
			t.add("append->ownsync", now-s.app)
		}
		t.seqLast = t.seqLast[i:]
	}
	t.mu.Unlock()
}

func (t *tracer) followerPersisted(p uint64) {
	if !t.on {
		return
	}
	t.mu.Lock()
	if p > t.fmax {
		now := t.now()
		for op := t.fmax + 1; op <= p; op++ {
			s := &t.ops[op%trRing]
			if s.op == op && s.fpers == 0 {
				s.fpers = now
				t.add("append->followerPersistedArrives", now-s.app)
			}
		}
		t.fmax = p
	}
	t.mu.Unlock()
}

// advance stamps, under the lock, the ops after *last up to to (the newest
// 100000 at most) that are still in the ring, with each, and moves *last.
func (t *tracer) advance(last *uint64, to uint64, each func(s *trOp, now int64)) {
	if !t.on {
		return
	}
	t.mu.Lock()
	if to > *last {
		now := t.now()
		for op := max(*last+1, to-min(to, 100000)); op <= to; op++ {
			if s := &t.ops[op%trRing]; s.op == op {
				each(s, now)
			}
		}
		*last = to
	}
	t.mu.Unlock()
}

func (t *tracer) committed(c uint64) {
	t.advance(&t.lastCmt, c, func(s *trOp, now int64) {
		if s.commit != 0 || s.app == 0 {
			return
		}
		s.commit = now
		t.add("append->commitReady", now-s.app)
		if s.lsync != 0 && s.fpers != 0 {
			t.add("max(ownsync,fpers)->commitReady", now-max(s.lsync, s.fpers))
			if s.lsync > s.fpers {
				t.add("ownsync-last", 1)
			} else {
				t.add("fpers-last", 1)
			}
		}
	})
}

func (t *tracer) appliedTo(a uint64) {
	t.advance(&t.lastApp, a, func(s *trOp, now int64) {
		if s.applied == 0 && s.commit != 0 {
			s.applied = now
			t.add("commitReady->applied", now-s.commit)
		}
	})
}

func (t *tracer) readable(R uint64) {
	t.advance(&t.lastR, R, func(s *trOp, now int64) {
		if s.rpub != 0 || s.app == 0 {
			return
		}
		s.rpub = now
		t.add("append->Rpublished", now-s.app)
		if s.applied != 0 {
			t.add("applied->Rpublished", now-s.applied)
		}
	})
}

func (t *tracer) sample(name string, d int64) {
	if !t.on {
		return
	}
	t.mu.Lock()
	t.add(name, d)
	t.mu.Unlock()
}

func (t *tracer) dump() {
	t.mu.Lock()
	h := t.h
	t.h = map[string][]int64{}
	t.mu.Unlock()
	fmt.Fprint(os.Stderr, fmt.Sprintf("CADTRACE %s %s\n", t.node, time.Now().UTC().Format("15:04:05"))+formatHist(h))
}

// formatHist prints p10/p50/p90/p99 of every named sample set, sorted by name.
func formatHist(h map[string][]int64) string {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	out := ""
	for _, k := range names {
		v := h[k]
		slices.Sort(v)
		p := func(q float64) float64 { return float64(v[int(q*float64(len(v)-1))]) / 1e3 }
		var sum int64
		for _, x := range v {
			sum += x
		}
		out += fmt.Sprintf("  %-40s n=%7d mean=%8.0f p10=%7.0f p50=%7.0f p90=%7.0f p99=%7.0f µs\n", k, len(v), float64(sum)/float64(len(v))/1e3, p(0.1), p(0.5), p(0.9), p(0.99))
	}
	return out
}

// traceTimeline joins, op by op, the leader's timeline with its followers'
// (replicas of this process: one clock) and returns the percentiles of every
// hand-off of a write's critical path, from Apply to the reply
// (docs/design/write-path.md). Only ops every stage of which was stamped
// count.
func traceTimeline(leader *Replica, followers ...*Replica) string {
	l := leader.ctr
	if l == nil || !l.on {
		return ""
	}
	h := map[string][]int64{}
	add := func(name string, a, b int64) {
		if a != 0 && b != 0 {
			h[name] = append(h[name], b-a)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range followers {
		f.ctr.mu.Lock()
		defer f.ctr.mu.Unlock()
	}
	for i := range l.ops {
		s := &l.ops[i]
		if s.op == 0 || s.prop == 0 || s.reply == 0 || s.commit == 0 {
			continue
		}
		add("L0 apply->ready(prepare built)", s.prop, s.rdy)
		add("L1 ready->written(own log)", s.rdy, s.app)
		add("L2 written->own fsync done", s.app, s.lsync)
		// The first follower to answer: its stamps are the critical path.
		var first *trOp
		for _, f := range followers {
			if fs := &f.ctr.ops[i]; fs.op == s.op && fs.okSent != 0 && (first == nil || fs.okSent < first.okSent) {
				first = fs
			}
		}
		if first != nil {
			add("F1 ready->follower received prepare", s.rdy, first.recv)
			add("F2 received->written(follower log)", first.recv, first.app)
			add("F3 written->follower fsync done", first.app, first.lsync)
			add("F4 fsync done->prepare-ok sent", first.lsync, first.okSent)
			add("F5 prepare-ok sent->leader stepped it", first.okSent, s.fpers)
		}
		if s.lsync != 0 && s.fpers != 0 {
			add("L3 max(own fsync,prepare-ok)->commit", max(s.lsync, s.fpers), s.commit)
			if s.lsync > s.fpers {
				h["L3x own fsync last (count)"] = append(h["L3x own fsync last (count)"], 1)
			} else {
				h["L3x prepare-ok last (count)"] = append(h["L3x prepare-ok last (count)"], 1)
			}
		}
		add("L4 commit->applied", s.commit, s.applied)
		add("L5 applied->reply", s.applied, s.reply)
		add("T  apply->reply", s.prop, s.reply)
	}
	// The replicas' own samples (fsync syscall, inbox waits), by node.
	for i, r := range append([]*Replica{leader}, followers...) {
		role := "leader"
		if i > 0 {
			role = fmt.Sprintf("follower%d", i)
		}
		for k, v := range r.ctr.h {
			if k == "fsync.dur(syscall)" || strings.HasPrefix(k, "inbox wait") || strings.HasPrefix(k, "fsync hand-off") {
				h[role+": "+k] = v
			}
		}
	}
	return formatHist(h)
}
