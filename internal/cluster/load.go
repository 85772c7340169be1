package cluster

import "sync/atomic"

// readLoad counts the reads a node served, per slot: what `kefir cluster
// rebalance --by load` adds to the keys each slot had written (a read leaves
// no trace in a group's log, so a read-heavy hot slot was invisible to it).
// A read is counted where it is served — at the node whose replica answered
// it, not at one that forwarded it — once, whichever read path served it
// (Read, ReadKey, ReadDeferred, TryRead; keyspace scans are not counted).
// One counter per slot: 16384 × 8 bytes a node, an atomic add a read: 4–7 ns
// on this 2-core box whether both cores hit one slot or many
// (BenchmarkReadLoadAdd), against ~5 µs of server CPU a replicated read.
type readLoad struct{ n [Slots]atomic.Uint64 }

func (l *readLoad) add(slot uint16) { l.n[slot%Slots].Add(1) }

// SlotReads returns the reads this node has served per slot since it
// started (counters only grow): the slots with any, in order, and their
// counts. The rebalancer samples every node twice and weighs a slot by the
// difference (Mover.SlotWeights).
func (m *Multi) SlotReads() (slots []uint16, counts []uint64) {
	for s := range m.reads.n {
		if n := m.reads.n[s].Load(); n > 0 {
			slots = append(slots, uint16(s))
			counts = append(counts, n)
		}
	}
	return slots, counts
}
