package vr

// Recovery (VR §4.3): a replica that may have lost state it promised asks
// the group for it before it takes part again.

func (r *Replica) sendRecovery() {
	r.lastRecovery = r.now
	r.broadcast(Message{Type: MsgRecovery, Nonce: r.nonce, Op: r.recHave}, false)
}

func (r *Replica) onRecovery(j int, m *Message) {
	if r.status != Normal {
		return
	}
	resp := Message{Type: MsgRecoveryResponse, View: r.view, Nonce: m.Nonce}
	if r.isLeader() {
		if m.Op+1 < r.first {
			r.wantSnapshot(j)
			return
		}
		resp.Op, resp.Commit, resp.First = r.lastOp(), r.commit, m.Op+1
		resp.Entries = r.copyLog(m.Op+1, 0)
		resp.DLog = r.DLog()
	}
	r.send(r.cfg.Members[j], resp)
}

func (r *Replica) onRecoveryResponse(j int, m *Message) {
	if r.status != Recovering || m.Nonce != r.nonce {
		return
	}
	if p := r.recResp[j]; p == nil || m.View >= p.View {
		r.recResp[j] = m
	}
	cnt := 0
	var top uint64
	for _, p := range r.recResp {
		if p != nil {
			cnt++
			top = max(top, p.View)
		}
	}
	l := r.recResp[r.leaderIdx(top)]
	if cnt < r.f+1 || l == nil || l.View != top || l.First > r.recHave+1 {
		return
	}
	r.setView(top)
	r.status, r.lnv = Normal, top
	r.vcAbandoned = 0
	// Recovered: what it promises from here on is on its disk (a promise
	// is sent once durable), so a later join in this life (a member of the
	// next epoch that learns it by start-epoch: reconfig.go, join) takes
	// part as a member restarted from its disk, without a second
	// recovery. Kept, the nonce sent such members into recovery again,
	// and a new epoch of two of them and a leader of view 0 that had to
	// join too (it moves on to view 1) stood still for good: recovery
	// needs a normal leader, the view change their votes (the move
	// simulation's groups of five shrinking to three, TestMoveSimShrink).
	r.nonce = 0
	r.nxAdopt(l.DLog)
	r.truncate(r.recHave)
	for _, e := range l.Entries {
		if e.Op > r.lastOp() {
			r.appendEntries([]Entry{e})
		}
	}
	if c := min(l.Commit, r.lastOp()); c > r.commit {
		r.setCommit(c)
	}
	r.hsDirty = true
	r.lastContact = r.now
	for i := range r.recResp {
		r.recResp[i] = nil
	}
}
