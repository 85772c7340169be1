package vr

import (
	"fmt"
	"slices"
)

// State transfer: get-state/new-state catch-up, snapshots sent to lagging
// followers, and log compaction.

func (r *Replica) onGetState(j int, m *Message) {
	leaderServing := r.status == Normal && r.isLeader() && m.View == r.view
	pulled := r.status == ViewChange && m.View == r.view && r.dvcSent != nil && j == r.leaderIdx(r.view)
	if !leaderServing && !pulled {
		return
	}
	if m.Op+1 < r.first {
		r.wantSnapshot(j)
		return
	}
	r.send(r.cfg.Members[j], Message{Type: MsgNewState, View: r.view, Op: r.lastOp(), Commit: r.commit,
		First: m.Op + 1, Entries: r.copyLog(m.Op+1, 4*r.cfg.MaxBatch)})
}

// snapshotRate is the transfer rate a snapshot's resend interval assumes.
const snapshotRate = 64 << 20 // bytes per second

// wantSnapshot asks the driver for a snapshot for peer j, unless one is
// asked for already or the last one may still be on its way.
func (r *Replica) wantSnapshot(j int) {
	if r.snapWanted[j] || r.now < r.snapNext[j] {
		return
	}
	r.snapWanted[j] = true
	r.out.SnapshotNeeded = append(r.out.SnapshotNeeded, r.cfg.Members[j])
}

// SendSnapshot answers a SnapshotNeeded for peer `to` with s, the state
// machine at s.Op (at most the applied op, at least the log's first op - 1).
func (r *Replica) SendSnapshot(to uint64, s Snapshot) error {
	j := slices.Index(r.cfg.Members, to)
	if j < 0 {
		return fmt.Errorf("vr: snapshot for unknown replica %d", to)
	}
	if !r.snapWanted[j] {
		// Not asked for, or no longer: a view change since (stepDown)
		// ended the request. A capture that finished late must not hold
		// the peer's link with a state it will ignore.
		return fmt.Errorf("vr: no snapshot wanted for replica %d", to)
	}
	if s.Op+1 < r.first || s.Op > r.applied {
		r.snapWanted[j] = false // asked for again on the peer's next request
		return fmt.Errorf("vr: snapshot at op %d outside [%d, %d]", s.Op, r.first-1, r.applied)
	}
	r.snapWanted[j] = false
	// Another one only after the view-change timeout, or the time this one
	// takes at snapshotRate if longer: a state of gigabytes must not be
	// scanned and queued again every heartbeat while the first is in flight.
	size := int64(len(s.Data))
	for _, c := range s.Clients {
		size += int64(len(c.Result)) + 24
	}
	transfer := size / (snapshotRate / 1000) * 1e6 // ns, in whole milliseconds (no overflow)
	r.snapNext[j] = r.now + max(int64(r.cfg.ViewChangeTimeout), transfer)
	r.send(to, Message{Type: MsgNewState, View: r.view, Op: r.lastOp(), Commit: r.commit, First: s.Op + 1,
		Entries: r.copyLog(s.Op+1, 4*r.cfg.MaxBatch), Snapshot: &s})
	return nil
}

func (r *Replica) onNewState(j int, m *Message) {
	switch {
	case r.status == Recovering:
		// Only a snapshot is trustworthy before recovery ends: it is
		// committed state, whatever view sent it.
		if s := m.Snapshot; s != nil && s.Op > r.recHave {
			r.installSnapshot(s)
			r.recHave = s.Op
		}
	case r.status == ViewChange && m.View == r.view && j == r.pulling:
		if s := m.Snapshot; s != nil && s.Op > r.commit {
			r.installSnapshot(s)
		}
		r.pulling = -1
		if r.isLeader() {
			r.tryStartView()
		} else {
			r.sendDVC() // ask the leader for the start-view again
		}
	case r.status == Normal && m.View == r.view && j == r.leaderIdx(r.view) && !r.isLeader():
		r.lastContact = r.now
		if s := m.Snapshot; s != nil && s.Op > r.lastOp() {
			r.installSnapshot(s)
		}
		r.appendFrom(j, m)
		r.maybeAck(0, false)
	}
}

// CompactPoint is where Compact should cut to keep at most keepEntries
// entries up to op and, of those, only as many as hold keepBytes of request
// data (at least one): 0 if nothing is to be dropped. A tail counted in
// entries alone held 1,024 entries whatever their size (16 GiB of 16 MiB
// values in memory, carried whole by every view change and recovery).
func (r *Replica) CompactPoint(op, keepEntries uint64, keepBytes int) uint64 {
	if op < r.first || op > r.lastOp() {
		return 0
	}
	cut := uint64(0)
	if op > keepEntries {
		cut = op - keepEntries
	}
	size := 0
	for k := op; k > cut && k >= r.first; k-- {
		size += len(r.log[k-r.first].Data)
		if size > keepBytes && k < op {
			cut = k
			break
		}
	}
	if cut < r.first {
		return 0
	}
	return cut
}

// Compact drops log entries up to op, which the driver has captured in a
// durable snapshot (op <= applied). Lagging replicas then need that snapshot.
func (r *Replica) Compact(op uint64) error {
	if op > r.applied {
		return fmt.Errorf("vr: compact to %d beyond applied %d", op, r.applied)
	}
	if op < r.first {
		return nil
	}
	r.log = append([]Entry(nil), r.log[op+1-r.first:]...)
	r.first = op + 1
	return nil
}
