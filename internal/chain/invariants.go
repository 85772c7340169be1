package chain

import "fmt"

// Check verifies the chain invariants of digest 002 §3.9 against the master's
// configuration and the members' states; the tests and the simulator call it
// after every event. members holds every member (a failed or fenced one with
// its state when it stopped); up says which are running.
//
// The replica chain is the configuration in order, counting only Active
// members and ending at the first one without a successor (Def. 3.5/3.6:
// π(head); a TRUNCATE cuts the old tail off before the master hears of it).
// Over it:
//   - LA ≤ LU at every member (Invariant 3.12);
//   - history containment (Invariant 3.14): each member's history is a
//     prefix of its predecessor's;
//   - acknowledgements never run ahead of the chain: every member's LA is at
//     most the last member's LU ("last-ack ≤ last-update down the chain");
//   - the member the master takes answers from is a valid tail: Active,
//     without a successor, holding nothing unacknowledged (3.8, 3.9, 3.13)
//     but what its host has yet to persist (a log datastore under SU).
func Check(ms *Master, members map[NodeID]*Member, up func(NodeID) bool) error {
	var chain []*Member
	for _, id := range ms.members {
		m := members[id]
		if m == nil || m.state != Active {
			continue
		}
		if !up(id) {
			// A failed member the master has not heard of yet: its history
			// is frozen, so it is compared with nobody, but a TRUNCATE or
			// CR_TAIL it carried out before failing still ends the chain
			// (the members after it may never hear of it).
			if m.succ == 0 {
				break
			}
			continue
		}
		chain = append(chain, m)
		if m.succ == 0 {
			break
		}
	}
	for i, m := range chain {
		if m.la > m.lu {
			return fmt.Errorf("chain: member %d: LA %s > LU %s", m.cfg.ID, FormatSeq(m.la), FormatSeq(m.lu))
		}
		if m.da > m.la {
			// Durable below means acknowledged below: a host answers a
			// write at the durable point only once it is committed too.
			return fmt.Errorf("chain: member %d: DA %s > LA %s", m.cfg.ID, FormatSeq(m.da), FormatSeq(m.la))
		}
		if i == 0 {
			continue
		}
		x := chain[i-1]
		n := m.total()
		if n < x.base.n {
			// The predecessor dropped entries its successor lacks: a repair
			// or a join could no longer send them.
			return fmt.Errorf("chain: member %d compacted its history to %d entries, past its successor %d's %d",
				x.cfg.ID, x.base.n, m.cfg.ID, n)
		}
		if n > x.total() || x.sumAtN(n) != m.sumAtN(n) {
			return fmt.Errorf("chain: history of %d (%d entries, last %s) is not a prefix of its predecessor %d's (%d entries, last %s)",
				m.cfg.ID, n, FormatSeq(m.lastSeq()), x.cfg.ID, x.total(), FormatSeq(x.lastSeq()))
		}
	}
	if n := len(chain); n > 0 {
		last := chain[n-1]
		for _, m := range chain {
			if m.la > last.lu {
				return fmt.Errorf("chain: member %d acknowledged up to %s but the chain's last member %d holds only up to %s",
					m.cfg.ID, FormatSeq(m.la), last.cfg.ID, FormatSeq(last.lu))
			}
		}
	}
	if t := members[ms.tail]; t != nil && up(ms.tail) && t.state != Removed {
		// A log datastore's tail acknowledges only what it persisted (SU).
		// The bound is the rule's, not the member's ackBound: a check that
		// asked the code under test would pass whatever that code does.
		bound := t.lu
		if t.cfg.Store == Log && t.cfg.Mode == SU {
			bound = min(bound, t.persisted)
		}
		if t.state != Active || t.succ != 0 || t.la != bound {
			return fmt.Errorf("chain: the master's tail %d is not a valid tail: %s succ=%d LA=%s LU=%s",
				t.cfg.ID, t.state, t.succ, FormatSeq(t.la), FormatSeq(t.lu))
		}
	}
	return nil
}
