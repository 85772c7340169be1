package vrshard

import (
	"fmt"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"sync"
	"sync/atomic"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/vr"
)

// View events: what an operator needs to see of the protocol — this replica
// started (or joined) a view change, entered a new view under a leader,
// stopped leading, or refused writes because no leader is known. The host
// derives them from the pure core: after each event it hands the core (a
// message, a tick, a Ready round) it compares the core's view and status with
// the last ones it saw, and names the event that changed them as the reason.
// Each is logged once at the default level, counted (Stats, /metrics) and kept
// in a short history (ViewEvents, /status).

// ViewEventsKept is how many view events a replica keeps for ViewEvents.
const ViewEventsKept = 10

// Kinds of view events.
const (
	EventViewChange = "view-change" // this replica started or joined a view change
	EventNewView    = "new-view"    // it entered a normal view under Leader
	EventDeposed    = "deposed"     // it stopped leading
	EventRecovering = "recovering"  // it lost its state and recovers from the group
	EventRemoved    = "removed"     // a chain member its master's configuration left out
)

// ViewEvent is one view event. Leader is the view's leader (0 while a view
// change runs: none is known).
type ViewEvent = kcluster.ViewEvent

// viewCause is the input that may have changed the core's view or status.
// A message's is given by the engine that stepped it (peerEngine
// StepBatch): what the message is to the view events (role) and the
// engine's name for its type (typ, for the reasons of the others).
type viewCause struct {
	kind byte // 't': tick, 'm': message, 'r': a Ready round, 'o': open
	role msgRole
	typ  string
	from uint64
}

// msgRole is what a peer message is to the view events, in the host's
// words; an engine maps its message types onto these (VR's: vrcore.go
// vrRole).
type msgRole uint8

const (
	roleOther         msgRole = iota
	roleViewChange            // the sender started a view change (VR: start-view-change)
	roleVote                  // a vote for this replica to lead the new view (do-view-change)
	roleNewView               // the new view's leader started it (start-view)
	roleRecovered             // an answer to this replica's recovery (recovery-response)
	roleStateTransfer         // state from a peer (new-state)
)

// viewTrack is the driver's record of the view (fields without atomics are
// the driver's alone).
type viewTrack struct {
	view   uint64
	status vr.Status
	leader uint64 // leader of the last normal view seen (0: none yet)
	leads  bool   // this replica led at the view and status last seen

	viewChanges, leaderChanges, depositions, refused atomic.Uint64
	refusedView                                      atomic.Uint64 // 1 + the view whose refusals were logged

	mu     sync.Mutex
	events []ViewEvent // oldest first, at most ViewEventsKept
	reason string      // of the last event
}

func (t *viewTrack) add(e ViewEvent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.events) == ViewEventsKept {
		copy(t.events, t.events[1:])
		t.events = t.events[:ViewEventsKept-1]
	}
	t.events = append(t.events, e)
	t.reason = e.Reason
}

// ViewEvents returns the replica's last view events, oldest first.
func (r *Replica) ViewEvents() []ViewEvent {
	r.vt.mu.Lock()
	defer r.vt.mu.Unlock()
	return append([]ViewEvent(nil), r.vt.events...)
}

// openView records the view and status the replica starts in, given the
// hard state it recovered (hs): a start outside a normal view is reported as
// an event with its reason, as a change from the view it last knew.
func (r *Replica) openView(hs vr.HardState) {
	r.vt.leader = r.leaderOf(hs.LastNormalView)
	r.vt.view, r.vt.status = hs.View, vr.Normal
	r.vt.leads = r.leaderOf(hs.View) == r.cfg.Self
	r.noteView(viewCause{kind: 'o'})
}

// noteView compares the core's view and status with the last ones seen and
// reports the change c caused, if any.
func (r *Replica) noteView(c viewCause) {
	view, st := r.vs.ViewStatus()
	if view == r.vt.view && st == r.vt.status {
		return
	}
	prevView, prevSt := r.vt.view, r.vt.status
	r.vt.view, r.vt.status = view, st
	self := r.cfg.Self
	leads := st == vr.Normal && r.leaderOf(view) == self
	led := r.vt.leads && c.kind != 'o'
	r.vt.leads = leads
	reason := r.viewReason(c, prevView, prevSt, view, st)
	now := r.clock.Now()
	if led && !leads {
		r.vt.depositions.Add(1)
		pending := len(r.waitID) + len(r.waitLocal) + len(r.backlog)
		var next uint64 // the new leader, when known now (else the new-view event names it)
		if st == vr.Normal {
			next = r.leaderOf(view)
		}
		r.vt.add(ViewEvent{Time: now, Kind: EventDeposed, View: view, Leader: next, Reason: reason})
		r.log.Warn("deposed: this node no longer leads", "view", view, "led_view", prevView,
			"new_leader", next, "reason", reason, "writes_in_flight", pending)
	}
	switch st {
	case vr.ViewChange:
		r.vt.viewChanges.Add(1)
		r.vt.add(ViewEvent{Time: now, Kind: EventViewChange, View: view, Reason: reason})
		r.log.Info("view change started", "view", view, "from_view", prevView,
			"next_leader", r.leaderOf(view), "reason", reason)
	case vr.Normal:
		leader := r.leaderOf(view)
		prev := r.vt.leader
		if leader != prev {
			r.vt.leaderChanges.Add(1)
			r.vt.leader = leader
		}
		r.vt.add(ViewEvent{Time: now, Kind: EventNewView, View: view, Leader: leader, Reason: reason})
		r.log.Info("new view", "view", view, "leader", leader, "previous_leader", prev,
			"this_node_leads", leads, "reason", reason)
	case vr.Recovering:
		r.vt.add(ViewEvent{Time: now, Kind: EventRecovering, View: view, Reason: reason})
		r.log.Warn("recovering from the group", "view", view, "reason", reason)
	case core.Removed:
		r.vt.add(ViewEvent{Time: now, Kind: EventRemoved, View: view, Reason: "the chain's master left it out of the configuration"})
		r.log.Warn("out of the chain: the master repaired the chain around this member (it was silent past the failure timeout, or a truncated old tail); it serves nothing until restarted", "epoch", view)
	}
}

// viewReason names what moved the replica from (pv, ps) to (v, s).
func (r *Replica) viewReason(c viewCause, pv uint64, ps vr.Status, v uint64, s vr.Status) string {
	switch c.kind {
	case 'o':
		switch s {
		case vr.Recovering:
			if r.opts.Chain != nil {
				// A chain member always restarts as a joiner: holding the
				// committed prefix of its log, or nothing if its disk lost it.
				return "a chain member restarted: waiting for the master to join it (or, if every member restarted, to restart the chain)"
			}
			return "started without its state (lost or wiped data directory): recovering it from the group"
		case vr.ViewChange:
			if v == pv+1 && r.leaderOf(pv) == r.cfg.Self {
				return fmt.Sprintf("restarted as the leader of view %d: a restarted leader moves to the next view", pv)
			}
			return fmt.Sprintf("restarted during the view change to view %d", v)
		}
	case 't':
		switch {
		case ps == vr.Normal && s == vr.ViewChange && v == pv+1:
			return fmt.Sprintf("no word from leader n%d within the view-change timeout (%v)", r.leaderOf(pv), r.cfg.ViewChangeTimeout)
		case ps == vr.ViewChange && s == vr.ViewChange && v == pv+1:
			return fmt.Sprintf("the view change to view %d did not complete in time", pv)
		case s == vr.ViewChange:
			return fmt.Sprintf("joined the view change to view %d it had heard of while it could not vote", v)
		}
		return "timer"
	case 'm':
		switch c.role {
		case roleViewChange:
			return fmt.Sprintf("n%d started a view change to view %d", c.from, v)
		case roleVote:
			if s == vr.Normal {
				return fmt.Sprintf("a majority sent %s for view %d (last: n%d)", c.typ, v, c.from)
			}
			return fmt.Sprintf("n%d sent a %s for view %d", c.from, c.typ, v)
		case roleNewView:
			return fmt.Sprintf("n%d started view %d", c.from, v)
		case roleRecovered:
			return fmt.Sprintf("recovered from the group's replies (last: n%d)", c.from)
		case roleStateTransfer:
			return fmt.Sprintf("state transfer from n%d", c.from)
		}
		if v > pv {
			return fmt.Sprintf("a %s of the newer view %d from n%d", c.typ, v, c.from)
		}
		return fmt.Sprintf("%s from n%d", c.typ, c.from)
	case 'r':
		if s == vr.Normal {
			return fmt.Sprintf("its do-view-change for view %d was durable and completed a majority", v)
		}
	}
	return "driver round"
}

// refuseNoLeader counts n writes refused because no leader is known, and
// logs it once per view with the reason of the view change that runs.
func (r *Replica) refuseNoLeader(n int) {
	r.vt.refused.Add(uint64(n))
	v := r.view.Load()
	if r.vt.refusedView.Swap(v+1) == v+1 {
		return
	}
	r.vt.mu.Lock()
	reason := r.vt.reason
	r.vt.mu.Unlock()
	r.log.Warn("refusing writes: no leader known", "view", v, "status", vr.Status(r.status.Load()).String(),
		"reason", reason)
}
