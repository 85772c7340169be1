package chainmaster

import (
	"slices"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/mutation"
)

// wantMeta is fakeMeta whose cluster map wants a change of the chain
// (MetaWants).
type wantMeta struct {
	*fakeMeta
	joining, leaving []uint64
}

func (m *wantMeta) Wants(uint64) (joining, leaving []uint64, err error) {
	return m.joining, m.leaving, nil
}

// TestHostedMasterCarriesOutTheMapsWish drives a hosted master, on a clock
// of the test's own, through a replace the cluster map wants (node 2 of
// [1 2 3] by node 4): node 4, asking as a node that is not a replica, is
// joined before the tail, and its flush truncates no one (the chain is kept
// one longer while a wanted node is not a member); then node 2 is granted
// no more leases, and is failed only once the last one it was granted has
// run out, the repair recorded before it is announced; then, back as a
// node that is not a replica, it is never joined again — with the
// mutation joinLeaving it is (the e2e test shows what that costs).
func TestHostedMasterCarriesOutTheMapsWish(t *testing.T) {
	for _, joinLeaving := range []bool{false, true} {
		if joinLeaving && !mutation.On {
			t.Skip("-tags mutations")
		}
		t.Run(map[bool]string{false: "forgone", true: "joinLeaving"}[joinLeaving], func(t *testing.T) {
			wishRun(t, joinLeaving)
		})
	}
}

func wishRun(t *testing.T, joinLeaving bool) {
	const hb, lease = 50 * time.Millisecond, 500 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	now := t0
	meta := &wantMeta{fakeMeta: &fakeMeta{}, joining: []uint64{4}, leaving: []uint64{2}}
	var sent []chain.Msg
	cfg := Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: 2 * lease,
		Meta: meta, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}
	cfg.mut.joinLeaving = joinLeaving
	x, err := newMaster(cfg, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	at := func(d time.Duration) { now = t0.Add(d) }
	tick := func(d time.Duration) { at(d); x.tick(now) }
	seq := uint64(0)
	// beat has node id heartbeat at d (refused: not a replica) and returns
	// what the master sent.
	beat := func(d time.Duration, id chain.NodeID, refused bool) []chain.Msg {
		at(d)
		sent = sent[:0]
		seq++
		x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: seq, Refused: refused}})
		return slices.Clone(sent)
	}
	has := func(ms []chain.Msg, typ chain.MsgType, to chain.NodeID) bool {
		return slices.ContainsFunc(ms, func(m chain.Msg) bool { return m.Type == typ && m.To == to })
	}
	granted := func(ms []chain.Msg, id chain.NodeID) bool {
		return slices.ContainsFunc(ms, func(m chain.Msg) bool {
			return m.Type == chain.MsgHeartbeat && m.To == id && slices.Contains(m.Members, id)
		})
	}
	d := lease + 2*hb
	tick(0)
	tick(d) // acting from the first record
	for id := chain.NodeID(1); id <= 3; id++ {
		if !granted(beat(d, id, false), id) {
			t.Fatalf("member %d not granted a lease", id)
		}
	}
	// Node 4 asks: joined (pre-copy from the tail), and once pre-copied
	// the FLUSH links it in before the tail.
	if ms := beat(d, 4, true); !has(ms, chain.MsgPrecopy, 4) {
		t.Fatalf("the wanted node was not joined: %+v", ms)
	}
	sent = sent[:0]
	x.step([]chain.Msg{{Type: chain.MsgPrecopyDone, From: 4, To: 9}})
	if !has(sent, chain.MsgFlush, 4) || !slices.Equal(meta.rec.Members, []uint64{1, 2, 4, 3}) {
		t.Fatalf("no flush recorded: %+v, record %+v", sent, meta.rec)
	}
	sent = sent[:0]
	x.step([]chain.Msg{{Type: chain.MsgFlushAck, From: 4, To: 9}})
	if has(sent, chain.MsgTruncate, 2) || x.m.Busy() {
		t.Fatalf("the join truncated the chain or left the master busy: %+v", sent)
	}
	meta.joining = nil // the map follows the record
	// Node 2 is drained: no more leases, failed one lease (and a
	// heartbeat) after its last grant.
	d += hb
	tick(d)
	lastGrant := d - hb
	if granted(beat(d, 2, false), 2) {
		t.Fatal("a leaving member was granted a lease while it drains")
	}
	for _, id := range []chain.NodeID{1, 3, 4} {
		if !granted(beat(d, id, false), id) {
			t.Fatalf("member %d not granted while 2 drains", id)
		}
	}
	for ; d < lastGrant+lease+hb; d += hb {
		tick(d)
		beat(d, 2, false)
		for _, id := range []chain.NodeID{1, 3, 4} {
			beat(d, id, false)
		}
		if !slices.Contains(meta.rec.Members, 2) {
			t.Fatalf("node 2 failed at %v, %v after its last lease was granted (lease %v)", d, d-lastGrant, lease)
		}
	}
	sent = sent[:0]
	tick(d)
	if !slices.Equal(meta.rec.Members, []uint64{1, 4, 3}) || !has(sent, chain.MsgCRMid, 1) {
		t.Fatalf("node 2 not removed at %v: record %+v, sent %+v", d, meta.rec, sent)
	}
	x.step([]chain.Msg{{Type: chain.MsgCRMidDone, From: 1, To: 9, Epoch: meta.rec.Epoch}})
	// Node 2, told it is out, asks to join again.
	ms := beat(d, 2, true)
	if joinLeaving != has(ms, chain.MsgPrecopy, 2) {
		t.Fatalf("joinLeaving %v: node 2 asked to join again, the master sent %+v", joinLeaving, ms)
	}
	if joinLeaving {
		return
	}
	// Node 3 fails as the change completes: the chain's length stays 3
	// (its rejoin truncates no one), not the two members left.
	x.m.Fail(3)
	tick(d + hb)
	if x.m.Length() != 3 || x.wanting {
		t.Fatalf("after the change the chain's length is %d (wanting %v), want 3", x.m.Length(), x.wanting)
	}
}
