package vr

import (
	"fmt"

	"github.com/kefirdb/kefir/internal/core"

	"github.com/kefirdb/kefir/internal/mutation"
)

// Ready is the batch of actions the core produced since the last Ready: the
// engine-neutral batch of the host contract (core.Ready: disk writes,
// messages, committed entries, replies, read states, snapshots needed,
// errors, early acks) and VR's nilext output. The driver performs them in
// field order; doc.go states the obligations.
type Ready struct {
	core.Ready[Message]

	// DLog are nilext d-log entries to append to the disk in the same batch
	// (before the fsync that PersistSeq reports): a restart passes them back
	// in State.DLog. Entries that later show up in the client table may be
	// dropped from the disk at a checkpoint (Replica.DLog is the live set).
	DLog []NilextRequest
	// NilextAcks answer nilext updates: send each to its client.
	NilextAcks []NilextAck
	// Membership, if set, is the replica's new configuration (a
	// reconfiguration committed, or it learned of a later epoch;
	// reconfig.go). The host writes it in the same atomic record as this
	// batch's HardState (which is always set with it) and passes it back in
	// State.Membership on restart. If Self is not in Members the replica is
	// leaving: it still answers state transfer until Info.Retired.
	Membership *Membership
}

// Committed is an entry ready to apply (core.Committed). Duplicate entries
// (a client's request that was already executed: a retry ordered twice
// across a view change) must not be executed; their result is the client
// table's.
type Committed = core.Committed

// Empty reports whether rd holds nothing to do.
func (rd *Ready) Empty() bool {
	return rd.Ready.Empty() && len(rd.DLog) == 0 && len(rd.NilextAcks) == 0 && rd.Membership == nil
}

// HasWrite reports whether rd carries disk writes.
func (rd *Ready) HasWrite() bool {
	return rd.Ready.HasWrite() || len(rd.DLog) > 0 || rd.Membership != nil
}

// Ready returns the actions accumulated since the last call and clears them.
// The driver must perform them (doc.go) and, if Committed is non-empty, call
// Advance before the next Step.
func (r *Replica) Ready() Ready {
	if len(r.lastHanded) > 0 {
		panic(fmt.Sprintf("vr: replica %d: Ready before Advance of %d committed entries", r.cfg.Self, len(r.lastHanded)))
	}
	r.flush()
	if r.hbNow && r.status == Normal && r.isLeader() {
		r.heartbeat()
	}
	r.flushAck()
	if r.commit > r.handed {
		r.out.Committed = make([]Committed, 0, r.commit-r.handed)
		var next *Entry // a reconfiguration to a later epoch, handed out last
		for op := r.handed + 1; op <= r.commit; op++ {
			e := r.entry(op)
			if isReconfig(e) {
				// The host sees an empty request, which it skips; the
				// configuration comes in Ready.Membership.
				r.out.Committed = append(r.out.Committed, Committed{Entry: Entry{View: e.View, Op: e.Op}})
				if e.ReqNum > r.cfg.Epoch {
					next = e
					break
				}
				continue
			}
			c := Committed{Entry: *e}
			if e.Client != 0 && !(mutation.On && r.mut.skipClientTable) {
				if r.clients.Executed(e.Client, e.ReqNum) {
					c.Duplicate = true
				} else {
					r.clients.Put(ClientRecord{Client: e.Client, ReqNum: e.ReqNum, Op: op})
				}
			}
			r.out.Committed = append(r.out.Committed, c)
		}
		r.handed = r.out.Committed[len(r.out.Committed)-1].Op
		r.lastHanded = r.out.Committed
		if next != nil {
			r.enterEpoch(next)
		}
	}
	hs := HardState{View: r.view, LastNormalView: r.lnv, Commit: r.commit}
	if r.hsDirty || (len(r.out.Entries) > 0 && hs != r.lastHS) {
		if hs.View != r.lastHS.View || hs.LastNormalView != r.lastHS.LastNormalView {
			r.viewSeq = r.nextSeq()
		}
		r.out.HardState = &hs
		r.lastHS = hs
		r.hsDirty = false
	}
	if r.out.HasWrite() {
		r.seq++
		r.out.PersistSeq = r.seq
		r.batches = append(r.batches, batch{seq: r.seq, last: r.lastOp()})
	} else {
		// No batch this time: deferred messages wait only for what was issued.
		for i := range r.defers {
			r.defers[i].seq = min(r.defers[i].seq, r.seq)
		}
		r.nxClamp()
		r.releaseDeferred()
	}
	if r.ep.hold > r.synced && len(r.out.Messages) > 0 {
		// The new configuration is not durable yet: nothing leaves
		// (reconfig.go, epochState.hold).
		for _, m := range r.out.Messages {
			r.defers = append(r.defers, deferred{seq: r.ep.hold, m: m})
		}
		r.out.Messages = nil
	}
	r.syncWanted = false // this Ready's prepares and heartbeats carried it
	rd := r.out
	r.out = Ready{}
	return rd
}

// Advance reports the results of the last Ready's Committed entries, in the
// same order (nil for duplicates). It updates the client table and queues the
// leader's replies.
func (r *Replica) Advance(results [][]byte) {
	if len(results) != len(r.lastHanded) {
		panic(fmt.Sprintf("vr: replica %d: %d results for %d committed entries", r.cfg.Self, len(results), len(r.lastHanded)))
	}
	leader := (r.status == Normal && r.isLeader()) || r.ep.replyOld
	r.ep.replyOld = false
	for i, c := range r.lastHanded {
		if c.Op != r.applied+1 {
			panic(fmt.Sprintf("vr: replica %d: applied %d after %d", r.cfg.Self, c.Op, r.applied))
		}
		r.applied = c.Op
		if c.Client == 0 {
			continue
		}
		res := results[i]
		rec := r.clients.Get(c.Client)
		if !c.Duplicate && rec != nil && rec.Op == c.Op {
			rec.Result = res
		}
		if r.inflight[c.Client] <= c.ReqNum {
			delete(r.inflight, c.Client)
		}
		r.nxExecuted(c.Client, c.ReqNum)
		if !leader || r.nxQuietReply(c.Client, c.ReqNum) {
			continue
		}
		if c.Duplicate {
			if rec == nil || rec.ReqNum != c.ReqNum {
				continue
			}
			res = rec.Result
		}
		r.out.Replies = append(r.out.Replies, Reply{Client: c.Client, ReqNum: c.ReqNum, Op: c.Op, Result: res})
	}
	r.lastHanded = nil
	if leader && r.cfg.FollowerReads {
		r.advanceReadable() // the leader's own applied op bounds R
	}
}

// ClientTable returns the client table as of the applied op, for a snapshot.
func (r *Replica) ClientTable() []ClientRecord { return r.clients.Entries() }

// ClientTableMinOp returns the lowest op among the client table's records
// (ok false if it is empty), without copying the table.
func (r *Replica) ClientTableMinOp() (op uint64, ok bool) { return r.clients.MinOp() }
