package cluster

import (
	"math"
	"slices"

	"github.com/kefirdb/kefir/internal/kv"
)

// Slot ranks: how far along its history of moves a replica's table shows a
// slot (docs/design/cluster.md §8, "The scan merge"). A slot moves at
// increasing epochs (a move's epoch is above every entry of its source and
// destination, so above the one that brought the slot to the source), and
// within a move of epoch E its source goes owned (below E) → migrating(E) →
// none(E) and its destination none → importing(E) → owned(E) (an abort:
// the source back to owned(E), the destination to none(E) — also one
// between the first two steps, where Mover.rollBack takes the source
// through migrating(E) first, else its owned entry below E would rank
// below the destination's none(E) for good). The rank of an
// entry is 2·Epoch, plus 1 if it is owned or none: a table whose entry
// ranks above another group's table's serving entry shows the slot past
// that group's state, so that group's replica was read behind a step it
// took (a follower that has not applied the hand-over: its engine holds the
// slot's state before the move). Within one epoch migrating and importing
// rank below owned and none: the source's migrating is behind its
// destination's take-over, its own hand-over and the destination's abort,
// which all came after it, and is not behind the destination's importing,
// which came before. An importing entry ranks above any serving entry of
// an older epoch — a follower of the source that has not applied its
// migrating step, a brief lag, is taken as behind — and a group without a
// table ranks every slot 1 (owned or none at epoch 0).
//
// A keyspace scan keeps a part's keys of a slot only if no other part's
// table ranks the slot higher (scanPage): at level session the group the
// session last wrote a slot at is read at or after that write, so its
// table ranks the slot at least as high as its entry then, which is above
// any older serving state of any other group — a key the session deleted
// or overwrote there after a move does not come back from a source's
// follower behind the hand-over.

// entryRank is e's rank (above).
func entryRank(e kv.SlotEntry) uint64 {
	r := 2 * e.Epoch
	if e.State == kv.SlotOwned || e.State == kv.SlotNone {
		r++
	}
	return r
}

// rankRun is a run of slots of equal ranks: from the previous run's End+1
// (0 for the first) to End. Of the tables a part's reads loaded, Lo is the
// lowest rank among those that serve the slot (noServe if none does: the
// part holds none of its keys, and cannot be behind on it) and Hi the
// highest of all.
type rankRun struct {
	End    uint16
	Lo, Hi uint64
}

// noServe is Lo where no table serves the slot (an int64, as it travels in
// KEFIR.GROUPSCAN's reply).
const noServe = math.MaxInt64

// slotRanks are runs covering every slot in order.
type slotRanks []rankRun

// ranksOf returns t's ranks (nil: a group without a table, which serves
// owned, its spec's slots, at rank 1, as every other slot).
func ranksOf(t *kv.SlotTable, owned *slotSet) slotRanks {
	var out slotRanks
	for slot := range uint16(Slots) {
		x := rankRun{End: slot, Lo: noServe, Hi: 1}
		if t != nil {
			e := t.Entry(slot)
			x.Hi = entryRank(e)
			if e.State.Serves() {
				x.Lo = x.Hi
			}
		} else if owned.has(slot) {
			x.Lo = 1
		}
		if n := len(out); n > 0 && out[n-1].Lo == x.Lo && out[n-1].Hi == x.Hi {
			out[n-1].End = slot
		} else {
			out = append(out, x)
		}
	}
	return out
}

// at returns slot's run.
func (r slotRanks) at(slot uint16) rankRun {
	i, _ := slices.BinarySearchFunc(r, slot, func(x rankRun, s uint16) int { return int(x.End) - int(s) })
	return r[i]
}

// combineRanks returns the runs of f over a's and b's runs slot by slot.
func combineRanks(a, b slotRanks, f func(x, y rankRun) rankRun) slotRanks {
	out := make(slotRanks, 0, len(a)+len(b))
	for i, j := 0, 0; i < len(a) && j < len(b); {
		x := f(a[i], b[j])
		x.End = min(a[i].End, b[j].End)
		if n := len(out); n > 0 && out[n-1].Lo == x.Lo && out[n-1].Hi == x.Hi {
			out[n-1].End = x.End
		} else {
			out = append(out, x)
		}
		if a[i].End == x.End {
			i++
		}
		if b[j].End == x.End {
			j++
		}
	}
	return out
}

// spanRanks widens r (nil: none yet) by o: the lowest and highest ranks of
// either.
func spanRanks(r, o slotRanks) slotRanks {
	if r == nil || (len(r) == len(o) && len(r) > 0 && &r[0] == &o[0]) {
		return o // none yet, or the same table's
	}
	return combineRanks(r, o, func(x, y rankRun) rankRun { return rankRun{Lo: min(x.Lo, y.Lo), Hi: max(x.Hi, y.Hi)} })
}

// highest returns the highest rank of r (nil: none yet) and o, slot by slot.
func highest(r, o slotRanks) slotRanks {
	if r == nil {
		return o
	}
	return combineRanks(r, o, func(x, y rankRun) rankRun { return rankRun{Lo: max(x.Hi, y.Hi), Hi: max(x.Hi, y.Hi)} })
}

// below reports whether some slot's lowest rank in r is below its highest
// in best.
func below(r, best slotRanks) bool {
	for i, j := 0, 0; i < len(r) && j < len(best); {
		if r[i].Lo < best[j].Hi {
			return true
		}
		switch e := min(r[i].End, best[j].End); {
		case r[i].End == e && best[j].End == e:
			i, j = i+1, j+1
		case r[i].End == e:
			i++
		default:
			j++
		}
	}
	return false
}

// validRanks reports whether r covers every slot in order (a reply's).
func validRanks(r slotRanks) bool {
	for i, x := range r {
		if (i > 0 && x.End <= r[i-1].End) || (x.Lo > x.Hi && x.Lo != noServe) {
			return false
		}
	}
	return len(r) > 0 && r[len(r)-1].End == Slots-1
}
