package vr

import "fmt"

// The replica's disk side: the log and snapshot it keeps in memory, the
// write batches it hands the driver in Ready, and the Persisted report that
// releases what waited for an fsync.

func (r *Replica) nextSeq() uint64 { return r.seq + 1 }

// appendEntries appends es to the log and to this Ready's disk writes. es is
// not modified afterwards by anyone (entries are immutable once created), so
// the write list may share it.
func (r *Replica) appendEntries(es []Entry) {
	if len(es) == 0 {
		return
	}
	for i, e := range es {
		if e.Op != r.lastOp()+1+uint64(i) {
			panic(fmt.Sprintf("vr: replica %d: append op %d after %d", r.cfg.Self, e.Op, r.lastOp()+uint64(i)))
		}
	}
	r.log = append(r.log, es...)
	r.noteAppended(es)
	if len(r.out.Entries) == 0 {
		r.out.Entries = es[:len(es):len(es)]
	} else {
		r.out.Entries = append(r.out.Entries, es...)
	}
}

// truncate discards entries after op. Committed entries are never discarded.
func (r *Replica) truncate(op uint64) {
	if op >= r.lastOp() {
		return
	}
	if op < r.commit {
		panic(fmt.Sprintf("vr: replica %d (view %d, %s): truncating to %d below commit %d", r.cfg.Self, r.view, r.status, op, r.commit))
	}
	r.log = r.log[: op+1-r.first : op+1-r.first]
	if r.ep.pending > op {
		r.ep.pending = 0 // the reconfiguration was not committed: ops are taken again
	}
	var kept []Entry // a new slice: the old one may be shared with messages
	for _, e := range r.out.Entries {
		if e.Op <= op {
			kept = append(kept, e)
		}
	}
	r.out.Entries = kept
	if !r.out.HasTruncate || op < r.out.Truncate {
		r.out.HasTruncate, r.out.Truncate = true, op
	}
	r.durable = min(r.durable, op)
	for i := range r.batches {
		r.batches[i].last = min(r.batches[i].last, op)
	}
}

func (r *Replica) installSnapshot(s *Snapshot) {
	if r.handed != r.applied {
		panic(fmt.Sprintf("vr: replica %d: snapshot while %d entries are being applied", r.cfg.Self, r.handed-r.applied))
	}
	// Outside normal status the entries after the snapshot stay: they may be
	// this replica's copy of ops that are committed (see follow).
	var keep []Entry
	if r.status == ViewChange && r.lastOp() > s.Op {
		keep = append(keep, r.log[s.Op+1-r.first:]...)
	}
	cp := *s
	r.out.Snapshot = &cp
	r.out.Entries, r.out.HasTruncate, r.out.Truncate = nil, false, 0
	r.log = nil
	// A reconfiguration in the dropped log was not committed: a snapshot of
	// this epoch never covers the epoch's last op (whoever applies it moves
	// on). appendEntries notes one in the entries kept.
	r.ep.pending = 0
	r.first = s.Op + 1
	r.commit, r.handed, r.applied = s.Op, s.Op, s.Op
	r.durable = min(r.durable, s.Op)
	for i := range r.batches {
		r.batches[i].last = min(r.batches[i].last, s.Op)
	}
	r.clients.Load(s.Clients)
	r.hsDirty = true
	r.appendEntries(keep)
}

// Persisted reports that every disk write of batches up to seq is durable.
func (r *Replica) Persisted(seq uint64) {
	if seq > r.seq {
		panic(fmt.Sprintf("vr: replica %d: persisted %d, only %d issued", r.cfg.Self, seq, r.seq))
	}
	if seq <= r.synced {
		return
	}
	r.synced = seq
	i := 0
	for ; i < len(r.batches) && r.batches[i].seq <= seq; i++ {
		r.durable = max(r.durable, min(r.batches[i].last, r.lastOp()))
	}
	r.batches = r.batches[i:]
	r.releaseDeferred()
	if r.status == Normal && r.isLeader() {
		r.advanceCommit()
	} else {
		r.maybeAck(0, false)
	}
}

func (r *Replica) releaseDeferred() {
	n := 0
	for _, d := range r.defers {
		if d.seq <= r.synced {
			r.out.Messages = append(r.out.Messages, d.m)
		} else {
			r.defers[n] = d
			n++
		}
	}
	r.defers = r.defers[:n]
	r.nxRelease()
}
