package transport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/wire"
)

func TestMessagesArriveInOrderWithTheirContent(t *testing.T) {
	nodes := cluster(t, 3, nil)
	const n = 2000
	for op := uint64(1); op <= n; op++ {
		for _, to := range []uint64{2, 3} {
			mustSend(t, nodes[0].tr, to, msg(1, to, op))
		}
	}
	for _, nd := range nodes[1:] {
		msgs := nd.in.wait(t, n, 10*time.Second)
		for i, g := range msgs {
			op := uint64(i + 1)
			want := msg(1, nd.id, op)
			if g.from != 1 || g.m.String() != want.String() || string(g.m.Entries[0].Data) != string(want.Entries[0].Data) {
				t.Fatalf("node %d message %d: got from %d %v %q, want %v %q", nd.id, i, g.from, g.m, g.m.Entries[0].Data, want, want.Entries[0].Data)
			}
		}
	}
	s := nodes[0].tr.Stats()
	if s.Total.Sent != 2*n || s.Total.Dropped != 0 || s.Total.Queued != 0 {
		t.Fatalf("sender stats %+v: want %d sent, none dropped or queued", s.Total, 2*n)
	}
	// The reader counts a batch after handing it over: the count may trail.
	eventually(t, 5*time.Second, func() bool { return nodes[1].tr.Stats().Link(1).Received >= n }, "%d messages counted", n)
	if r := nodes[1].tr.Stats().Link(1); r.Received != n || r.BytesIn != s.Link(2).BytesOut {
		t.Fatalf("receiver stats %+v, sender link %+v", r, s.Link(2))
	}
}

func TestSendIsSafeToReuseTheMessageAfterward(t *testing.T) {
	nodes := cluster(t, 2, nil)
	m := msg(1, 2, 1)
	mustSend(t, nodes[0].tr, 2, m)
	m.Op, m.Entries[0].Data[0] = 99, 'X' // the caller reuses its message at once
	got := nodes[1].in.wait(t, 1, 5*time.Second)[0].m
	if got.Op != 1 || got.Entries[0].Data[0] != 'p' {
		t.Fatalf("received %v %q: Send must copy the message before returning", got, got.Entries[0].Data)
	}
}

func TestManySendsBecomeFewWrites(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) { c.QueueLen = 1 << 20 })
	const n = 20000
	for op := uint64(1); op <= n; op++ {
		mustSend(t, nodes[0].tr, 2, msg(1, 2, op))
	}
	nodes[1].in.wait(t, n, 10*time.Second)
	s := nodes[0].tr.Stats().Link(2)
	r := nodes[1].tr.Stats().Link(1)
	t.Logf("%d messages in %d writes; received in %d handler calls", s.Sent, s.Batches, r.ReadBatches)
	// Send (an encode and an append) is far cheaper than a write syscall, so
	// the writer finds many messages per wake-up; one write per message
	// would mean the batching is broken.
	if s.Sent != n || s.Batches > n/4 {
		t.Fatalf("%d messages took %d writes; want at most %d", s.Sent, s.Batches, n/4)
	}
	if r.ReadBatches > n/4 {
		t.Fatalf("%d messages took %d handler calls; want at most %d", r.Received, r.ReadBatches, n/4)
	}
}

func TestReconnectsAfterThePeerRestarts(t *testing.T) {
	nodes := cluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	mustSend(t, a.tr, 2, msg(1, 2, 1))
	b.in.wait(t, 1, 5*time.Second)
	addr := b.ln.Addr().String()
	b.tr.Close()

	// The same node comes back on the same address with a fresh process state.
	ln := relisten(t, addr)
	in := newInbox()
	b2, err := newVR(vrConfig{Config: Config{Self: 2, Peers: map[uint64]string{1: a.ln.Addr().String(), 2: addr},
		ClusterSecret: testSecret, Cluster: 7}, Handler: in.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	go b2.Serve(ln)

	// Messages sent while the peer is away are lost (and counted); the
	// transport redials on its own and later messages arrive.
	op := uint64(2)
	eventually(t, 10*time.Second, func() bool {
		mustSend(t, a.tr, 2, msg(1, 2, op))
		op++
		time.Sleep(5 * time.Millisecond)
		return in.count() > 0
	}, "delivery to the restarted peer")
	s := a.tr.Stats().Link(2)
	if s.Reconnects < 1 {
		t.Fatalf("stats %+v: want a reconnect counted", s)
	}
	t.Logf("after restart: %+v", s)
}

func TestAPeerWithTheWrongSecretIsRefused(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) {
		if c.Self == 1 {
			c.ClusterSecret = "not-the-secret"
		}
	})
	a, b := nodes[0], nodes[1]
	for op := uint64(1); op <= 5; op++ {
		mustSend(t, a.tr, 2, msg(1, 2, op))
		time.Sleep(10 * time.Millisecond)
	}
	b.log.waitLog(t, "peer refused: authentication failed", 5*time.Second)
	a.log.waitLog(t, "peer refused the connection", 5*time.Second)
	if n := b.in.count(); n != 0 {
		t.Fatalf("node 2 delivered %d messages from a node without the secret", n)
	}
	if s := b.tr.Stats(); s.AuthFailures == 0 {
		t.Fatalf("stats %+v: want an auth failure counted", s)
	}
	if s := a.tr.Stats().Link(2); s.DialFailures == 0 || s.Sent != 0 {
		t.Fatalf("dialer stats %+v: want failed dials and nothing sent", s)
	}
}

func TestANodeWithADifferentConfigurationIsRefused(t *testing.T) {
	cases := []struct {
		name    string
		adjust  func(c *vrConfig) // applied to node 1 only
		wantLog string            // in node 2's log
	}{
		{"other cluster", func(c *vrConfig) { c.Cluster = 8 }, "cluster 0000000000000008 differs"},
		{"other peer list", func(c *vrConfig) { c.Peers = withPeer(c.Peers, 3, "127.0.0.1:1") }, "configuration"},
		{"explicit config hash", func(c *vrConfig) { c.ConfigHash = 0xdead }, "configuration 000000000000dead differs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := cluster(t, 2, func(c *vrConfig) {
				if c.Self == 1 {
					tc.adjust(c)
				}
			})
			a, b := nodes[0], nodes[1]
			eventually(t, 5*time.Second, func() bool {
				mustSend(t, a.tr, 2, msg(1, 2, 1))
				time.Sleep(5 * time.Millisecond)
				return b.tr.Stats().IdentityRefusals > 0
			}, "node 2 to refuse node 1")
			b.log.waitLog(t, "different cluster or configuration", time.Second)
			b.log.waitLog(t, tc.wantLog, time.Second)
			a.log.waitLog(t, "fix the cluster configuration", 5*time.Second)
			if n := b.in.count(); n != 0 {
				t.Fatalf("delivered %d messages across a configuration mismatch", n)
			}
		})
	}
}

func withPeer(m map[uint64]string, id uint64, addr string) map[uint64]string {
	out := map[uint64]string{id: addr}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestADialerThatMeantAnotherNodeIsRefused(t *testing.T) {
	// Node 1 believes node 3 lives at node 2's address.
	nodes := cluster(t, 2, nil)
	in := newInbox()
	peers := map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:1", 3: nodes[1].ln.Addr().String()}
	lb := &logBuf{}
	confused, err := newVR(vrConfig{Config: Config{Self: 1, Peers: peers, ClusterSecret: testSecret, Cluster: 7,
		ConfigHash: nodes[1].tr.cfg.ConfigHash, Logger: slogTo(lb)}, Handler: in.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer confused.Close()
	mustSend(t, confused, 3, msg(1, 3, 1))
	nodes[1].log.waitLog(t, "dialed this address as node 3, but this is node 2", 5*time.Second)
	lb.waitLog(t, "this is node 2", 5*time.Second)
}

// dialRaw authenticates to nd as node `as` and returns the raw connection,
// for tests that write frames the transport would never send.
func dialRaw(t *testing.T, nd *node, as uint64) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", nd.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := dialHandshake(nc, testSecret, Identity{Node: as, Cluster: 7, ConfigHash: nd.tr.cfg.ConfigHash}, as, nd.id); err != nil {
		t.Fatal(err)
	}
	return nc
}

// expectClosed fails unless the other side closes nc.
func expectClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := nc.Read(b[:]); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Fatalf("connection not closed by the receiver: %v", err)
	}
}

func isReset(err error) bool { return err != nil && strings.Contains(err.Error(), "connection reset") }

func TestACorruptFrameClosesTheConnectionAndIsCounted(t *testing.T) {
	nodes := cluster(t, 2, nil)
	b := nodes[1]
	nc := dialRaw(t, b, 1)
	good := wire.AppendFrame(nil, msg(1, 2, 1))
	bad := wire.AppendFrame(nil, msg(1, 2, 2))
	bad[len(bad)-1] ^= 0x40 // one flipped bit in the payload: the CRC no longer matches
	after := wire.AppendFrame(nil, msg(1, 2, 3))
	if _, err := nc.Write(append(append(good, bad...), after...)); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, nc)
	b.log.waitLog(t, "corrupt frame", 5*time.Second)
	if s := b.tr.Stats().Link(1); s.Corrupt != 1 {
		t.Fatalf("stats %+v: want one corrupt connection", s)
	}
	time.Sleep(20 * time.Millisecond)
	if got := b.in.count(); got > 1 {
		t.Fatalf("delivered %d messages: nothing at or after the corrupt frame may be", got)
	}
}

func TestAnOversizedFrameIsRefused(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) { c.MaxFrame = 1 << 10 })
	b := nodes[1]
	nc := dialRaw(t, b, 1)
	big := msg(1, 2, 1)
	big.Entries[0].Data = make([]byte, 4<<10)
	if _, err := nc.Write(wire.AppendFrame(nil, big)); err != nil && !isReset(err) {
		t.Fatal(err)
	}
	expectClosed(t, nc)
	eventually(t, 5*time.Second, func() bool { return b.tr.Stats().Link(1).Corrupt == 1 }, "oversized frame counted")
	if b.in.count() != 0 {
		t.Fatal("an oversized frame was delivered")
	}
}

func TestAMessageNotFromTheAuthenticatedPeerIsRefused(t *testing.T) {
	cases := []struct {
		name string
		m    *vr.Message
	}{
		{"forged From", msg(3, 2, 1)},    // node 1 pretends to be node 3
		{"misdirected To", msg(1, 3, 1)}, // meant for node 3
		{"From is the receiver", msg(2, 2, 1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nodes := cluster(t, 3, nil)
			b := nodes[1]
			nc := dialRaw(t, b, 1)
			if _, err := nc.Write(wire.AppendFrame(nil, tc.m)); err != nil {
				t.Fatal(err)
			}
			expectClosed(t, nc)
			b.log.waitLog(t, "message not from the authenticated peer", 5*time.Second)
			if s := b.tr.Stats().Link(1); s.Spoofed != 1 || s.Received != 0 {
				t.Fatalf("stats %+v: want one spoofing connection and nothing delivered", s)
			}
			if b.in.count() != 0 {
				t.Fatal("a spoofed message was delivered")
			}
		})
	}
}

func TestANewConnectionFromAPeerReplacesItsOldOne(t *testing.T) {
	// A peer keeps one outbound connection; a second one means it restarted
	// and the first is half-open, so the receiver closes the first.
	nodes := cluster(t, 2, nil)
	b := nodes[1]
	old := dialRaw(t, b, 1)
	eventually(t, 5*time.Second, func() bool { return b.tr.Stats().Link(1).InboundConns == 1 }, "first connection admitted")
	fresh := dialRaw(t, b, 1)
	expectClosed(t, old)
	if _, err := fresh.Write(wire.AppendFrame(nil, msg(1, 2, 1))); err != nil {
		t.Fatal(err)
	}
	if g := b.in.wait(t, 1, 5*time.Second)[0]; g.m.Op != 1 {
		t.Fatalf("got %v over the new connection", g.m)
	}
}

func TestInjectedDelayDelaysEveryMessageAndKeepsOrder(t *testing.T) {
	nodes := cluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	// Warm the connection up so dialing is not part of the measurement.
	mustSend(t, a.tr, 2, msg(1, 2, 1))
	b.in.wait(t, 1, 5*time.Second)

	const delay, jitter = 60 * time.Millisecond, 30 * time.Millisecond
	if err := a.tr.SetLinkFault(2, Fault{Delay: delay, Jitter: jitter}); err != nil {
		t.Fatal(err)
	}
	const n = 200
	sent := make([]time.Time, n+2)
	for op := uint64(2); op < n+2; op++ {
		sent[op] = time.Now()
		mustSend(t, a.tr, 2, msg(1, 2, op))
	}
	msgs := b.in.wait(t, n+1, 10*time.Second)
	for i, g := range msgs[1:] {
		op := uint64(i + 2)
		if g.m.Op != op {
			t.Fatalf("message %d has op %d: the delay line reordered", op, g.m.Op)
		}
		// Never early; a loaded machine may make it late, so the upper
		// bound is generous.
		if d := g.at.Sub(sent[op]); d < delay || d > delay+jitter+2*time.Second {
			t.Fatalf("message %d took %v; want ≥ %v", op, d, delay)
		}
	}
	// Healing the link removes the delay for new messages.
	if err := a.tr.SetLinkFault(2, Fault{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(delay + jitter) // let the delayed backlog drain
	start := time.Now()
	mustSend(t, a.tr, 2, msg(1, 2, n+2))
	g := b.in.wait(t, n+2, 5*time.Second)[n+1]
	t.Logf("after heal: %v one way", g.at.Sub(start))
	if g.m.Op != n+2 || g.at.Sub(start) >= delay {
		t.Fatalf("after heal message %v took %v; want < %v", g.m, g.at.Sub(start), delay)
	}
}

func TestAPartitionDropsBothWaysUntilHealed(t *testing.T) {
	nodes := cluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	mustSend(t, a.tr, 2, msg(1, 2, 1))
	mustSend(t, b.tr, 1, msg(2, 1, 1))
	b.in.wait(t, 1, 5*time.Second)
	a.in.wait(t, 1, 5*time.Second)

	if err := a.tr.SetLinkFault(2, Fault{Partition: true}); err != nil { // at node 1 only
		t.Fatal(err)
	}
	for op := uint64(2); op <= 50; op++ {
		mustSend(t, a.tr, 2, msg(1, 2, op))
		mustSend(t, b.tr, 1, msg(2, 1, op))
	}
	eventually(t, 5*time.Second, func() bool { return a.tr.Stats().Link(2).FaultDroppedIn == 49 }, "node 1 discards node 2's messages")
	if s := a.tr.Stats().Link(2); s.FaultDropped != 49 {
		t.Fatalf("stats %+v: want 49 outbound messages dropped by the partition", s)
	}
	if a.in.count() != 1 || b.in.count() != 1 {
		t.Fatalf("messages crossed the partition: node 1 has %d, node 2 has %d", a.in.count(), b.in.count())
	}

	if err := a.tr.SetLinkFault(2, Fault{}); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a.tr, 2, msg(1, 2, 100))
	mustSend(t, b.tr, 1, msg(2, 1, 100))
	if g := b.in.wait(t, 2, 5*time.Second)[1]; g.m.Op != 100 {
		t.Fatalf("after heal node 2 got %v", g.m)
	}
	if g := a.in.wait(t, 2, 5*time.Second)[1]; g.m.Op != 100 {
		t.Fatalf("after heal node 1 got %v", g.m)
	}
}

func TestDropRateDropsAboutThatShare(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) { c.Seed = 42 })
	a, b := nodes[0], nodes[1]
	if err := a.tr.SetLinkFault(2, Fault{DropRate: 0.5}); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	for op := uint64(1); op <= n; op++ {
		mustSend(t, a.tr, 2, msg(1, 2, op))
	}
	s := a.tr.Stats().Link(2)
	b.in.wait(t, int(n-s.FaultDropped), 10*time.Second)
	if s.FaultDropped < n*4/10 || s.FaultDropped > n*6/10 {
		t.Fatalf("dropped %d of %d at rate 0.5", s.FaultDropped, n)
	}
	msgs := b.in.wait(t, int(n-s.FaultDropped), time.Second)
	for i := 1; i < len(msgs); i++ {
		if msgs[i].m.Op <= msgs[i-1].m.Op {
			t.Fatalf("survivors out of order: %d after %d", msgs[i].m.Op, msgs[i-1].m.Op)
		}
	}
	if err := a.tr.SetLinkFault(2, Fault{DropRate: 1.5}); err == nil {
		t.Fatal("a drop rate above 1 was accepted")
	}
}

func TestSendNeverBlocksAndDropsWhenTheQueueIsFull(t *testing.T) {
	// A peer that accepts TCP but never answers the handshake: the writer
	// is stuck in the handshake while Send keeps being called.
	peer := testgroup.SilentListener(t)
	in := newInbox()
	tr, err := newVR(vrConfig{Config: Config{Self: 1, Peers: map[uint64]string{2: peer}, ClusterSecret: testSecret, QueueLen: 100, HandshakeTimeout: 10 * time.Second}, Handler: in.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	const n = 10000
	for op := uint64(1); op <= n; op++ {
		mustSend(t, tr, 2, msg(1, 2, op))
	}
	s := tr.Stats().Link(2)
	if s.Queued > 100 || s.Dropped < n-100 || s.Queued+int64(s.Dropped) != n {
		t.Fatalf("stats %+v: want at most 100 queued and the rest of %d dropped", s, n)
	}
	if err := tr.sendVR(9, msg(1, 9, 1)); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("Send to an unknown peer: %v", err)
	}
}

func TestUnreachablePeerIsRetriedWithBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: dials are refused at once
	in := newInbox()
	tr, err := newVR(vrConfig{Config: Config{Self: 1, Peers: map[uint64]string{2: addr}, ClusterSecret: testSecret, DialBackoff: 20 * time.Millisecond, MaxDialBackoff: 40 * time.Millisecond}, Handler: in.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond {
		mustSend(t, tr, 2, msg(1, 2, 1))
		time.Sleep(time.Millisecond)
	}
	// Without backoff a refused dial repeats every millisecond (~300 here);
	// with 10–40 ms waits it is at most ~300/10 + 1.
	if f := tr.Stats().Link(2).DialFailures; f < 3 || f > 35 {
		t.Fatalf("%d failed dials in 300ms with 20–40ms backoff", f)
	}
	for f := 1; f < 10; f++ {
		d := backoff(20*time.Millisecond, 40*time.Millisecond, f)
		cap := min(20*time.Millisecond<<(f-1), 40*time.Millisecond)
		if d < cap/2 || d > cap {
			t.Fatalf("backoff after %d failures = %v, want in [%v, %v]", f, d, cap/2, cap)
		}
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		lns := make([]net.Listener, 3)
		peers := map[uint64]string{}
		for i := range lns {
			lns[i], _ = net.Listen("tcp", "127.0.0.1:0")
			peers[uint64(i+1)] = lns[i].Addr().String()
		}
		trs := make([]*Transport, 3)
		ins := make([]*inbox, 3)
		for i := range trs {
			ins[i] = newInbox()
			var err error
			trs[i], err = newVR(vrConfig{Config: Config{Self: uint64(i + 1), Peers: peers, ClusterSecret: testSecret}, Handler: ins[i].handle})
			if err != nil {
				t.Fatal(err)
			}
			if i < 2 {
				go trs[i].Serve(lns[i])
			} else {
				lns[i].Close() // node 3 is down: node 1 and 2 keep redialing it
			}
		}
		for op := uint64(1); op <= 100; op++ {
			for i, tr := range trs[:2] {
				for to := uint64(1); to <= 3; to++ {
					if to != uint64(i+1) {
						mustSend(t, tr, to, msg(uint64(i+1), to, op))
					}
				}
			}
		}
		ins[0].wait(t, 100, 5*time.Second)
		ins[1].wait(t, 100, 5*time.Second)
		if err := trs[0].SetLinkFault(2, Fault{Delay: time.Hour}); err != nil { // a held message at Close
			t.Fatal(err)
		}
		mustSend(t, trs[0], 2, msg(1, 2, 1000))
		for _, tr := range trs {
			closeWithin(t, tr, 5*time.Second)
			tr.Close() // idempotent
			if q := tr.Stats().Total.Queued; q != 0 {
				t.Fatalf("%d messages still counted as queued after Close", q)
			}
		}
		if err := trs[0].sendVR(2, msg(1, 2, 1)); !errors.Is(err, ErrClosed) {
			t.Fatalf("Send after Close: %v", err)
		}
	}()
	checkNoLeak(t, before)
}

// closeWithin fails the test if Close does not return in time (a goroutine
// the transport waits for is stuck), with every goroutine's stack.
func closeWithin(t *testing.T, tr *Transport, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { tr.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		t.Fatalf("Close did not return within %v:\n%s", d, buf[:runtime.Stack(buf, true)])
	}
}

func TestConfigIsValidated(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Self: 1}, "cluster secret"},
		{Config{Self: 1, ClusterSecret: "x", Peers: map[uint64]string{2: ""}}, "peer 2 has no address"},
		{Config{Self: 1, ClusterSecret: "x", DialBackoff: time.Second, MaxDialBackoff: time.Millisecond}, "MaxDialBackoff"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error mentioning %q", tc.cfg, err, tc.want)
		}
	}
	// A group needs a Handler, and a group has one endpoint.
	tr, err := New(Config{Self: 1, ClusterSecret: "x"})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := tr.Register(1, frame.EngineVR, nil, nil); err == nil || !strings.Contains(err.Error(), "Handler") {
		t.Errorf("Register without a Handler: %v", err)
	}
	h := func(uint64, []frame.Message) error { return nil }
	if _, err := tr.Register(1, frame.EngineVR, h, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Register(1, frame.EngineVR, h, nil); !errors.Is(err, ErrGroupTaken) {
		t.Errorf("a second Register of group 1: %v, want ErrGroupTaken", err)
	}
}

func TestDerivedConfigHashDependsOnClusterAndMembers(t *testing.T) {
	base := derivedHash(7, 1, map[uint64]string{2: "a", 3: "b"})
	if derivedHash(7, 2, map[uint64]string{1: "x", 3: "y"}) != base {
		t.Fatal("the same membership seen from another node must hash the same")
	}
	for name, h := range map[string]uint64{
		"cluster": derivedHash(8, 1, map[uint64]string{2: "a", 3: "b"}),
		"members": derivedHash(7, 1, map[uint64]string{2: "a", 4: "b"}),
		"size":    derivedHash(7, 1, map[uint64]string{2: "a"}),
	} {
		if h == base {
			t.Errorf("a different %s gives the same hash", name)
		}
	}
}

func ExampleEndpoint_Send() {
	// Two nodes on loopback, each hosting a replica of VR group 5: node 1's
	// replica sends a heartbeat to node 2's. VR's codec (internal/wire)
	// encodes and decodes; the transport only moves group 5's frames.
	ln1, _ := net.Listen("tcp", "127.0.0.1:0")
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	peers := map[uint64]string{1: ln1.Addr().String(), 2: ln2.Addr().String()}
	got := make(chan vr.Message, 1)
	n1, _ := New(Config{Self: 1, Peers: peers, ClusterSecret: "s"})
	n2, _ := New(Config{Self: 2, Peers: peers, ClusterSecret: "s"})
	defer n1.Close()
	defer n2.Close()
	g1, _ := n1.Register(5, frame.EngineVR, func(uint64, []frame.Message) error { return nil }, nil)
	_, _ = n2.Register(5, frame.EngineVR, func(from uint64, in []frame.Message) error {
		msgs, err := wire.Decode(from, 2, in)
		for _, m := range msgs {
			got <- m
		}
		return err
	}, nil)
	go n1.Serve(ln1)
	go n2.Serve(ln2)
	_ = g1.Send(2, wire.Payload(&vr.Message{Type: vr.MsgCommit, From: 1, To: 2, View: 3, Commit: 41}))
	m := <-got
	fmt.Println(m.Type, m.From, m.View, m.Commit)
	// Output: commit 1 3 41
}

// A message larger than the frame limit (a snapshot of a large state) goes
// as fragments and arrives whole, in order with the messages around it.
// Before fragments the receiver refused its one oversized frame and closed
// the connection, so a replica could never again be sent such a state.
func TestAMessageLargerThanAFrameArrivesWhole(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) { c.MaxFrame = 4 << 10 })
	big := msg(1, 2, 2)
	big.Entries[0].Data = make([]byte, 100<<10)
	for i := range big.Entries[0].Data {
		big.Entries[0].Data[i] = byte(i % 251)
	}
	mustSend(t, nodes[0].tr, 2, msg(1, 2, 1))
	mustSend(t, nodes[0].tr, 2, big)
	mustSend(t, nodes[0].tr, 2, msg(1, 2, 3))
	got := nodes[1].in.wait(t, 3, 10*time.Second)
	for i, g := range got {
		if g.m.Op != uint64(i+1) {
			t.Fatalf("message %d has op %d: order lost", i, g.m.Op)
		}
	}
	if d := got[1].m.Entries[0].Data; !bytes.Equal(d, big.Entries[0].Data) {
		t.Fatalf("the large message arrived with %d bytes, not its %d", len(d), len(big.Entries[0].Data))
	}
	// The reader counts a batch after handing it to the group's handler,
	// so the count may trail the delivery a moment (under -race it did).
	eventually(t, 5*time.Second, func() bool { return nodes[1].tr.Stats().Link(1).Received >= 3 }, "3 messages counted")
	if s := nodes[1].tr.Stats().Link(1); s.Corrupt != 0 || s.Received != 3 {
		t.Fatalf("receiver stats %+v: want 3 received, no corrupt connection", s)
	}
}

// A message joined from fragments is bounded by MaxMessage: beyond it the
// connection is closed and counted, and nothing of it is delivered.
func TestAJoinedMessageOverMaxMessageIsRefused(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) { c.MaxFrame, c.MaxMessage = 1<<10, 8<<10 })
	big := msg(1, 2, 1)
	big.Entries[0].Data = make([]byte, 20<<10)
	mustSend(t, nodes[0].tr, 2, big)
	eventually(t, 5*time.Second, func() bool { return nodes[1].tr.Stats().Link(1).Corrupt >= 1 }, "over-long message counted")
	if n := nodes[1].in.count(); n != 0 {
		t.Fatalf("delivered %d messages", n)
	}
}

// The write timeout bounds each piece's progress, not a whole batch: a peer
// that reads slowly but steadily still takes a batch that needs longer than
// the timeout in all (a snapshot of gigabytes), where one write under one
// deadline fails.
func TestWriteTimeoutBoundsProgressNotTheWholeBatch(t *testing.T) {
	const piece, timeout = 64 << 10, 150 * time.Millisecond
	b := make([]byte, 32*piece) // about 320 ms at the reader's pace
	for _, tc := range []struct {
		name    string
		piece   int
		wantErr bool
	}{{"in pieces", piece, false}, {"one write", len(b), true}} {
		t.Run(tc.name, func(t *testing.T) {
			w, r := net.Pipe()
			defer w.Close()
			defer r.Close()
			go func() {
				buf := make([]byte, piece)
				for {
					time.Sleep(10 * time.Millisecond)
					if _, err := io.ReadFull(r, buf); err != nil {
						return
					}
				}
			}()
			err := writePieces(w, b, timeout, tc.piece)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error: %v", err, tc.wantErr)
			}
		})
	}
}

// While a large message is arriving, OnProgress tells the receiver which peer
// it is coming from, before the message is whole (a follower must not take
// the leader for dead while its snapshot streams in).
func TestProgressIsReportedWhileALargeMessageArrives(t *testing.T) {
	var mu sync.Mutex
	var from []uint64
	nodes := cluster(t, 2, func(c *vrConfig) {
		c.MaxFrame = 4 << 10
		c.OnProgress = func(id uint64) { mu.Lock(); from = append(from, id); mu.Unlock() }
	})
	// A group that is not the one whose message arrives hears nothing of it.
	var other atomic.Int64
	if _, err := nodes[1].tr.Register(testGroup+1, frame.EngineVR, func(uint64, []frame.Message) error { return nil },
		func(uint64) { other.Add(1) }); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if n := other.Load(); n != 0 {
			t.Errorf("group %d was told %d times of group %d's large message", testGroup+1, n, testGroup)
		}
	}()
	b := nodes[1]
	nc := dialRaw(t, b, 1)
	big := msg(1, 2, 1)
	big.Entries[0].Data = make([]byte, 64<<10)
	frames := wire.AppendFrames(nil, big, 4<<10)
	half := len(frames) / 2
	if _, err := nc.Write(frames[:half]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(from) > 0 }, "progress reported")
	mu.Lock()
	if from[0] != 1 {
		t.Fatalf("progress reported for %v, want node 1", from)
	}
	mu.Unlock()
	if n := b.in.count(); n != 0 {
		t.Fatalf("%d messages delivered from half a message", n)
	}
	if _, err := nc.Write(frames[half:]); err != nil {
		t.Fatal(err)
	}
	if got := b.in.wait(t, 1, 5*time.Second)[0].m; len(got.Entries[0].Data) != 64<<10 {
		t.Fatalf("the message arrived with %d bytes", len(got.Entries[0].Data))
	}
}

// SendLarge does not queue a second large message behind one the link is
// still carrying (a snapshot asked for again before the first was written):
// the second is dropped and counted; the first arrives.
func TestASecondLargeMessageIsNotQueuedBehindTheFirst(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) { c.MaxFrame, c.MaxQueueBytes = 16<<10, 64<<10 })
	a := nodes[0]
	if err := a.tr.SetLinkFault(2, Fault{Delay: 300 * time.Millisecond}); err != nil {
		t.Fatal(err) // the writer holds the first message for the delay
	}
	big := func(op uint64) *vr.Message {
		m := msg(1, 2, op)
		m.Entries[0].Data = make([]byte, 100<<10)
		return m
	}
	if err := a.tr.sendLargeVR(2, big(1)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() bool { return a.tr.Stats().Link(2).Queued == 1 }, "first large message queued")
	time.Sleep(50 * time.Millisecond) // the writer has taken it
	if err := a.tr.sendLargeVR(2, big(2)); err != nil {
		t.Fatal(err)
	}
	got := nodes[1].in.wait(t, 1, 5*time.Second)
	if got[0].m.Op != 1 {
		t.Fatalf("got op %d first", got[0].m.Op)
	}
	time.Sleep(400 * time.Millisecond)
	if n := nodes[1].in.count(); n != 1 {
		t.Fatalf("%d large messages arrived, want the first only", n)
	}
	if d := a.tr.Stats().Link(2).Dropped; d != 1 {
		t.Fatalf("dropped %d, want the second large message", d)
	}
}
