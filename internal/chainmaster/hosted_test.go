package chainmaster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/chainwire"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/transport"
)

// fakeMeta is a metadata group of one that always leads: the record in
// memory, each commit taking commitDelay (a slow majority) before it lands.
// With stallFirst the first read takes that long and fails (a node that
// does not lead yet, its read stuck until its timeout), which stalls the
// master's goroutine past a tick or more.
type fakeMeta struct {
	mu          sync.Mutex
	rec         *kv.ChainConfig
	firstRead   time.Time // when the first successful read started
	commitDelay time.Duration
	stallFirst  time.Duration
	stalled     bool
	// log, if set, is the master's logger in hostedRunFrom.
	log *slog.Logger
}

func (f *fakeMeta) Read(context.Context, uint64) (*kv.ChainConfig, error) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stallFirst > 0 && !f.stalled {
		f.stalled = true
		time.Sleep(f.stallFirst)
		return nil, errors.New("not the leader")
	}
	if f.firstRead.IsZero() {
		f.firstRead = now
	}
	return f.rec, nil
}

func (f *fakeMeta) Commit(_ context.Context, op kv.Op) (kv.Result, error) {
	time.Sleep(f.commitDelay)
	c, err := kv.DecodeChainConfig(op.Key)
	if err != nil {
		return kv.Result{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case op.Kind == kv.KindMapChainInit && f.rec == nil:
		f.rec = c
	case op.Kind == kv.KindMapChainSet && f.rec != nil && f.rec.Epoch == uint64(op.Delta) && c.Epoch >= f.rec.Epoch &&
		(len(op.Expected) == 0 || bytes.Equal(op.Expected, kv.AppendChainConfig(nil, f.rec))):
		f.rec = c
	case op.Kind == kv.KindMapChainSet:
		return kv.Result{}, errors.New("stale")
	}
	return kv.Result{}, nil
}

func (f *fakeMeta) epoch() (uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rec == nil {
		return 0, false
	}
	return f.rec.Epoch, true
}

// hostedRun runs a hosted master (node 9) of the chain [1 2 3] where only
// member 1 exists (a recorder on node 1's transport that sends heartbeats
// every 20 ms): 2 and 3 are never heard, so once acting the master fails
// them and sends 1 the repair. It returns the violations seen: a message
// at an epoch above the record's when it arrived (announced before
// committed), and a heartbeat answer (a lease) granted before the master
// waited out the lease after its first leadership read.
func hostedRun(t *testing.T, mut mutations) []string {
	bad, _ := hostedRunFrom(t, mut, &fakeMeta{}, 0)
	return bad
}

// hostedRunFrom is hostedRun on the metadata group meta (its record
// preset, or nil: none) while member 1 reports the chain [1 2 3] at epoch
// reported; it also returns the first repair order member 1 got.
func hostedRunFrom(t *testing.T, mut mutations, meta *fakeMeta, reported uint64) ([]string, chain.Msg) {
	t.Helper()
	lns := map[uint64]net.Listener{}
	peers := map[uint64]string{2: "127.0.0.1:1", 3: "127.0.0.1:1"} // never reached
	for _, id := range []uint64{1, 9} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[id], peers[id] = ln, ln.Addr().String()
	}
	trs := map[uint64]*transport.Transport{}
	for id, ln := range lns {
		tr, err := transport.New(transport.Config{Self: id, Peers: peers, ClusterSecret: "s", Cluster: 1, DialBackoff: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		go tr.Serve(ln)
		trs[id] = tr
		t.Cleanup(func() { tr.Close() })
	}
	const lease, hb = 400 * time.Millisecond, 20 * time.Millisecond
	meta.commitDelay = 100 * time.Millisecond
	var (
		mu      sync.Mutex
		bad     []string
		epoch   uint64
		repairs int
		order   chain.Msg
	)
	ep, err := trs[1].Register(0, frame.EngineChain, func(from uint64, in []frame.Message) error {
		msgs, err := chainwire.Decode(from, 1, in)
		if err != nil {
			return err
		}
		now := time.Now()
		rec, ok := meta.epoch()
		meta.mu.Lock()
		first := meta.firstRead
		meta.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			if !ok || m.Epoch > rec {
				bad = append(bad, fmt.Sprintf("%s at epoch %d arrived before it was recorded (record: %d, %v)", m.Type, m.Epoch, rec, ok))
			}
			// The wait is lease + 2×heartbeat from the first successful
			// read's start, which the fake notes a moment after the
			// master does (the 2 ms).
			if m.Type == chain.MsgHeartbeat && (first.IsZero() || now.Sub(first) < lease+2*hb-2*time.Millisecond) {
				bad = append(bad, fmt.Sprintf("a lease granted %v after the master started leading", now.Sub(first)))
			}
			if m.Type == chain.MsgCRTail || m.Type == chain.MsgCRMid {
				if repairs == 0 {
					order = m
				}
				repairs++
			}
			epoch = max(epoch, m.Epoch)
		}
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// No start grace: 2 and 3 are down from the start, and their repair is
	// what the run watches.
	m, err := Start(Config{Self: 9, Members: []uint64{1, 2, 3}, Transport: trs[9], Heartbeat: hb, FailAfter: 500 * time.Millisecond,
		StartGrace: 500 * time.Millisecond, Lease: lease, Meta: meta, mut: mut, Logger: meta.log})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	deadline := time.Now().Add(5 * time.Second)
	for seq := uint64(1); ; seq++ {
		mu.Lock()
		e, r := epoch, repairs
		mu.Unlock()
		if r > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no repair within 5 s (epoch %d)", e)
		}
		msg := chain.Msg{Type: chain.MsgHeartbeat, From: 1, To: 9, Seq: seq, Epoch: max(e, reported), Members: []chain.NodeID{1, 2, 3}}
		if err := ep.Send(9, chainwire.Payload(&msg)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(hb)
	}
	mu.Lock()
	defer mu.Unlock()
	return bad, order
}

// TestHostedMasterCommitsBeforeAnnouncing: a hosted master grants no lease
// until it has waited out the lease after it started leading, and every
// message a member gets carries an epoch the metadata group has recorded —
// the repair of the two silent members is committed (slowly: 100 ms)
// before it is sent.
func TestHostedMasterCommitsBeforeAnnouncing(t *testing.T) {
	if bad := hostedRun(t, mutations{}); len(bad) > 0 {
		t.Fatalf("violations: %v", bad)
	}
}

// TestHostedMasterMutationsAreCaught: the check of the test above catches
// each broken master —
//   - announceFirst: the repair sent before it is committed, so the member
//     gets an epoch the record does not have yet;
//   - grantAtOnce: leases granted as soon as the master leads, with no wait
//     after taking over, while the old master's grants could still run.
func TestHostedMasterMutationsAreCaught(t *testing.T) {
	mutation.Require(t)
	for name, mut := range map[string]mutations{
		"announceFirst": {announceFirst: true},
		"grantAtOnce":   {grantAtOnce: true},
	} {
		t.Run(name, func(t *testing.T) {
			bad := hostedRun(t, mut)
			if len(bad) == 0 {
				t.Fatalf("%s went unnoticed", name)
			}
			t.Logf("caught: %v", bad)
		})
	}
}

// TestHostedMasterRewiresADecisionNeverAnnounced: the old master recorded
// [1 3] at epoch 1 (2 failed) and died before telling anyone, so member 1
// still holds [1 2 3] at epoch 0 and forwards to 2. The new master sees
// the record ahead of the member and repairs from the member's
// configuration: 1's first order is CR_MID towards 3, at once — not, after
// the failure timeout, a CR_TAIL for the never-heard 3. With the fix off
// (mutation recordOnly) 1 would wait for ever for 2, were 3 alive.
func TestHostedMasterRewiresADecisionNeverAnnounced(t *testing.T) {
	rec := &kv.ChainConfig{Epoch: 1, Members: []uint64{1, 3}}
	bad, first := hostedRunFrom(t, mutations{}, &fakeMeta{rec: rec}, 0)
	if len(bad) > 0 {
		t.Fatalf("violations: %v", bad)
	}
	if first.Type != chain.MsgCRMid || first.Target != 3 || first.Epoch <= 1 {
		t.Fatalf("member 1's first order: %v, want cr-mid towards 3 above epoch 1", first)
	}
	if mutation.On {
		_, first := hostedRunFrom(t, mutations{recordOnly: true}, &fakeMeta{rec: &kv.ChainConfig{Epoch: 1, Members: []uint64{1, 3}}}, 0)
		if first.Type == chain.MsgCRMid {
			t.Fatalf("with recordOnly, member 1 still got %v: the test cannot tell the fix", first)
		}
	}
}

// TestHostedMasterWaitsFromTheRead: the master's goroutine stalls for
// 300 ms in a failed leadership read, so the next tick it takes is about
// 280 ms old (a Go ticker hands back when it fired). The takeover wait must
// still run from the start of the first successful read, not from that
// tick: no lease before lease + 2×heartbeat after it.
func TestHostedMasterWaitsFromTheRead(t *testing.T) {
	if bad, _ := hostedRunFrom(t, mutations{}, &fakeMeta{stallFirst: 300 * time.Millisecond}, 0); len(bad) > 0 {
		t.Fatalf("violations: %v", bad)
	}
}

// TestDeliverKeepsOrderAnswers: while the master is busy (here: its lock
// held), more heartbeats arrive than its queue keeps, then member 2's
// answer to the CR_TAIL order the master sent it. Heartbeats may be
// dropped — they come again — but the answer must not be: it would come
// again only when the master re-sends the order, a re-send interval later
// (for ever, before the master re-sent orders), and the master is Busy, no
// joins, until then.
func TestDeliverKeepsOrderAnswers(t *testing.T) {
	m, err := Start(Config{Self: 9, Members: []uint64{1, 2, 3}, Send: func(uint64, *chain.Msg) {},
		Heartbeat: time.Hour, FailAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.mu.Lock()
	m.m.Fail(3) // CR_TAIL to 2
	epoch := m.m.Epoch()
	for i := range 3000 { // above maxQueuedBeats
		m.Deliver([]chain.Msg{{Type: chain.MsgHeartbeat, From: 1, To: 9, Seq: uint64(i + 1), Members: []chain.NodeID{1, 2, 3}}})
	}
	m.Deliver([]chain.Msg{{Type: chain.MsgCRTailDone, From: 2, To: 9, Epoch: epoch}})
	m.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		busy := m.m.Busy()
		m.mu.Unlock()
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CR_TAIL_DONE was lost: the master is still busy (%d heartbeats dropped)", m.dropped.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHostedMasterAdoptsTheMembersEpoch: no record (the metadata group's
// directories wiped, or the chain ran with a standalone master) while
// member 1 reports the chain [1 2 3] at epoch 5. A master that started at
// epoch 0 would be refused by every member (an answer or order below its
// epoch): it records the members' configuration at epoch 5 first, and its
// repair comes above it.
func TestHostedMasterAdoptsTheMembersEpoch(t *testing.T) {
	meta := &fakeMeta{}
	bad, first := hostedRunFrom(t, mutations{}, meta, 5)
	if len(bad) > 0 {
		t.Fatalf("violations: %v", bad)
	}
	if first.Epoch <= 5 {
		t.Fatalf("member 1's first order: %v, want one above its epoch 5", first)
	}
}

// TestStartRefusesFailingWithinTheLease: a failure timeout no longer than
// the members' lease would repair around a member whose last lease still
// runs (it could serve reads the chain has moved past).
func TestStartRefusesFailingWithinTheLease(t *testing.T) {
	for _, fail := range []time.Duration{300 * time.Millisecond, 500 * time.Millisecond} {
		m, err := Start(Config{Self: 9, Members: []uint64{1, 2, 3}, Send: func(uint64, *chain.Msg) {}, FailAfter: fail, Lease: 500 * time.Millisecond})
		if err == nil {
			m.Close()
			t.Fatalf("FailAfter %v with a 500 ms lease was accepted", fail)
		}
	}
}

// TestHostedMasterTrustsARecordTheMembersHold: the record is [1 2 3] at
// epoch 1 (a repair that ordered only member 2, say) and member 1 reports
// [1 2 3] at epoch 0 — it heard the configuration in a heartbeat answer,
// needing no order. That is no decision left unannounced: the new master
// starts from the record without rewiring from a member's view.
func TestHostedMasterTrustsARecordTheMembersHold(t *testing.T) {
	var buf bytes.Buffer
	meta := &fakeMeta{rec: &kv.ChainConfig{Epoch: 1, Members: []uint64{1, 2, 3}}, log: slog.New(slog.NewTextHandler(&buf, nil))}
	if bad, _ := hostedRunFrom(t, mutations{}, meta, 0); len(bad) > 0 {
		t.Fatalf("violations: %v", bad)
	}
	if strings.Contains(buf.String(), "the record is ahead of the members") {
		t.Fatalf("the master took a member's lower epoch for an unannounced decision:\n%s", buf.String())
	}
}
