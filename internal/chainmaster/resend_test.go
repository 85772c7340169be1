package chainmaster

import (
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
)

// TestMasterResendsOrders drives a master's tick and step on the test's own
// clock, as TestHostedMasterLeaseOnAClock does, standalone and hosted by a
// (fake) metadata group, with the members played by the test: 1 and 2
// heartbeat, 3 is silent. The master fails 3 (CR_TAIL to 2); the test loses
// the first CR_TAIL, and the master must send it again, at the same epoch,
// ResendAfter later (not before) and until it is answered. Then a restarted
// node 4 asks to join: its PRECOPY and then its FLUSH are lost once each,
// and each comes again. On the old master, which sent an order once, the
// second CR_TAIL never came and the master stayed busy, refusing joins.
//
// "hosted, taking over a repair" starts from a record that already dropped
// 3 ([1 2] at epoch 1) while the members still hold [1 2 3] at epoch 0: the
// old master committed the repair and died before announcing it. The new
// master does not resume the old one's orders — it derives them again from
// what the members report ("A decision committed but never announced") —
// and re-sends those like any other.
func TestMasterResendsOrders(t *testing.T) {
	for _, c := range []struct {
		name string
		meta func() Meta
	}{
		{"standalone", func() Meta { return nil }},
		{"hosted", func() Meta { return &fakeMeta{} }},
		{"hosted, taking over a repair", func() Meta { return &fakeMeta{rec: &kv.ChainConfig{Epoch: 1, Members: []uint64{1, 2}}} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			const hb, lease, failAfter, resend = 50 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond, 4 * 50 * time.Millisecond
			t0 := time.Unix(1_000_000, 0)
			now := t0
			var sent []chain.Msg
			cfg := Config{Self: 9, Members: []uint64{1, 2, 3}, Heartbeat: hb, Lease: lease, FailAfter: failAfter, StartGrace: failAfter,
				ResendAfter: resend, Send: func(_ uint64, m *chain.Msg) { sent = append(sent, *m) }}
			cfg.Meta = c.meta()
			x, err := newMaster(cfg, func() time.Time { return now })
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Meta == nil {
				// 3 is never heard: a standalone master, which keeps no
				// record, learns without it only when told (Learner.Waiting).
				if _, err := x.RestartWithout([]uint64{3}); err != nil {
					t.Fatal(err)
				}
			}
			seq := uint64(0)
			epoch := map[chain.NodeID]uint64{}
			// step runs one heartbeat interval: a tick, the members'
			// heartbeats (4's says it is not a replica until it joined),
			// and returns the orders sent in it.
			joiner := false
			step := func() []chain.Msg {
				now = now.Add(hb)
				sent = sent[:0]
				x.tick(now)
				for _, id := range []chain.NodeID{1, 2, 4} {
					if id == 4 && !joiner {
						continue
					}
					seq++
					x.step([]chain.Msg{{Type: chain.MsgHeartbeat, From: id, To: 9, Seq: seq, Epoch: epoch[id], Refused: id == 4,
						Members: []chain.NodeID{1, 2, 3}}})
				}
				var orders []chain.Msg
				for _, m := range sent {
					if m.Type != chain.MsgHeartbeat {
						orders = append(orders, m)
					}
				}
				return orders
			}
			// await runs until an order of type typ comes and returns it and
			// the time it came.
			await := func(typ chain.MsgType, within time.Duration) (chain.Msg, time.Time) {
				t.Helper()
				for end := now.Add(within); now.Before(end); {
					for _, m := range step() {
						if m.Type == typ {
							return m, now
						}
					}
				}
				t.Fatalf("no %s within %v", typ, within)
				return chain.Msg{}, time.Time{}
			}
			busy := func() bool { return x.m != nil && x.m.Busy() }

			first, at := await(chain.MsgCRTail, 5*time.Second) // 3 failed; lost
			if first.To != 2 {
				t.Fatalf("first order %v, want cr-tail to 2", first)
			}
			again, at2 := await(chain.MsgCRTail, 2*resend)
			if again.To != 2 || again.Epoch != first.Epoch {
				t.Fatalf("re-sent %v, want cr-tail to 2 at epoch %d", again, first.Epoch)
			}
			if d := at2.Sub(at); d < resend {
				t.Fatalf("re-sent %v after the first, before ResendAfter %v", d, resend)
			}
			epoch[2] = again.Epoch
			x.step([]chain.Msg{{Type: chain.MsgCRTailDone, From: 2, To: 9, Epoch: again.Epoch}})
			if busy() {
				t.Fatalf("busy after the cr-tail's answer")
			}
			for range 2 * resend / hb {
				for _, m := range step() {
					if m.Type == chain.MsgCRTail {
						t.Fatalf("cr-tail sent again after its answer")
					}
				}
			}

			joiner = true // 4 restarted and asks to join
			pre, _ := await(chain.MsgPrecopy, 2*hb)
			if pre.To != 4 || pre.Target != 2 {
				t.Fatalf("join: %v, want precopy to 4 from 2", pre)
			}
			pre2, _ := await(chain.MsgPrecopy, 2*resend) // the first was lost
			if pre2.To != 4 || pre2.Target != 2 {
				t.Fatalf("re-sent %v, want precopy to 4 from 2", pre2)
			}
			x.step([]chain.Msg{{Type: chain.MsgPrecopyDone, From: 4, To: 9, Epoch: pre2.Epoch}})
			flush := lastOf(sent, chain.MsgFlush)
			if flush.To != 4 {
				t.Fatalf("no flush after precopy-done (sent %v)", sent)
			}
			flush2, _ := await(chain.MsgFlush, 2*resend) // lost
			if flush2.To != 4 || flush2.Epoch != flush.Epoch || len(flush2.Path) != len(flush.Path) {
				t.Fatalf("re-sent %v, want %v", flush2, flush)
			}
			x.step([]chain.Msg{{Type: chain.MsgFlushAck, From: 4, To: 9, Epoch: flush2.Epoch}})
			if busy() {
				t.Fatalf("busy after the join's flush-ack")
			}
			if got := x.Members(); len(got) != 3 || got[1] != 4 {
				t.Fatalf("members %v after the join, want [1 4 2]", got)
			}
		})
	}
}

// lastOf is the last message of type typ in ms (zero: none).
func lastOf(ms []chain.Msg, typ chain.MsgType) chain.Msg {
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Type == typ {
			return ms[i]
		}
	}
	return chain.Msg{}
}
