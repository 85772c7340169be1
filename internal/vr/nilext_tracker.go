package vr

import "slices"

// The client side of the nilext fast path: when an update is complete.

// NilextTracker is the client-side completion rule of one nilext update: it
// completes on NilextSupermajority(n) acks from distinct replicas in the same
// view, one of them the leader of that view. Pure: the Go client and the
// RESP coordinator feed it the acks they receive.
type NilextTracker struct {
	members []uint64
	need    int
	views   map[uint64]*viewAcks
}

type viewAcks struct {
	from   []bool
	count  int
	leader bool
}

// NewNilextTracker returns a tracker for a group with these members (in
// leader order, as Config.Members).
func NewNilextTracker(members []uint64) *NilextTracker {
	return &NilextTracker{members: members, need: NilextSupermajority(len(members)), views: map[uint64]*viewAcks{}}
}

// Need is how many acks complete an update.
func (t *NilextTracker) Need() int { return t.need }

// Add records an ack and reports whether the update is complete.
func (t *NilextTracker) Add(a NilextAck) bool {
	j := slices.Index(t.members, a.From)
	if j < 0 {
		return t.Done()
	}
	va := t.views[a.View]
	if va == nil {
		va = &viewAcks{from: make([]bool, len(t.members))}
		t.views[a.View] = va
	}
	if !va.from[j] {
		va.from[j] = true
		va.count++
	}
	// The leader of a view is fixed by the view; an ack's own claim is only
	// believed when it matches.
	if a.Leader && t.members[a.View%uint64(len(t.members))] == a.From {
		va.leader = true
	}
	return t.Done()
}

// Done reports whether some view has enough acks including its leader's.
func (t *NilextTracker) Done() bool {
	for _, va := range t.views {
		if va.leader && va.count >= t.need {
			return true
		}
	}
	return false
}

// Reset forgets every ack (a new update).
func (t *NilextTracker) Reset() { clear(t.views) }
