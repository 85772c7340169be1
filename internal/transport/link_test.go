package transport

import (
	"bufio"
	"bytes"
	"fmt"
	"github.com/kefirdb/kefir/internal/testgroup"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/wire"
)

// One connection per node pair (docs/design/one-house.md, "A group-addressed
// peer protocol and a node-owned transport"): these tests count connections
// with the transport's own stats (LinkStats.Open), check that both ends hold
// the same one (the local address at one end is the remote address at the
// other) and, where /proc/net/tcp exists, count the established sockets as
// `ss` would.

// linkAddrs returns the local and remote address of a's link to peer id
// ("" if none).
func linkAddrs(a *Transport, id uint64) (string, string) {
	l := a.peers()[id].current()
	if l == nil {
		return "", ""
	}
	return l.nc.LocalAddr().String(), l.nc.RemoteAddr().String()
}

// sameLink reports whether a and b hold one connection between them, open
// at both ends and no other.
func sameLink(a, b *Transport) bool {
	al, ar := linkAddrs(a, b.Self())
	bl, br := linkAddrs(b, a.Self())
	return al != "" && al == br && ar == bl &&
		a.Stats().Link(b.Self()).Open == 1 && b.Stats().Link(a.Self()).Open == 1
}

// waitOneLink waits until every pair of trs shares exactly one connection.
func waitOneLink(t testing.TB, trs ...*Transport) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool {
		for i := range trs {
			for j := i + 1; j < len(trs); j++ {
				if !sameLink(trs[i], trs[j]) {
					return false
				}
			}
		}
		return true
	}, "one shared connection per pair; stats %s", statsOf(trs))
}

func statsOf(trs []*Transport) string {
	var b strings.Builder
	for _, tr := range trs {
		for _, l := range tr.Stats().Links {
			loc, rem := linkAddrs(tr, l.Peer)
			fmt.Fprintf(&b, "\n  %d→%d open %d duplicates %d replaced %d inbound %d reconnects %d link %s→%s",
				tr.Self(), l.Peer, l.Open, l.Duplicates, l.Replaced, l.InboundConns, l.Reconnects, loc, rem)
		}
	}
	return b.String()
}

// established counts the ESTABLISHED TCP sockets on 127.0.0.1 with a local or
// remote port in ports (what `ss -tn state established` lists), or -1 if
// /proc/net/tcp cannot be read.
func established(ports ...int) int {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return -1
	}
	defer f.Close()
	want := map[uint64]bool{}
	for _, p := range ports {
		want[uint64(p)] = true
	}
	port := func(hexAddr string) uint64 {
		_, p, _ := strings.Cut(hexAddr, ":")
		v, _ := strconv.ParseUint(p, 16, 16)
		return v
	}
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != "01" { // 01: ESTABLISHED
			continue
		}
		if want[port(f[1])] || want[port(f[2])] {
			n++
		}
	}
	return n
}

func portOf(t testing.TB, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A dial race: two nodes that have never talked send to each other at the
// same moment, so each dials the other. They must end with one connection
// (the one the lower id dialed, or whichever won at both ends), carry every
// later message both ways in order, and never deliver a message twice. What
// the race may cost is the first messages: one written on the connection
// that lost is dropped with it (the engines retransmit).
func TestADialRaceEndsWithOneConnection(t *testing.T) {
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	for round := range rounds {
		nodes := cluster(t, 2, func(c *vrConfig) { c.Logger = slog.New(slog.DiscardHandler) })
		a, b := nodes[0], nodes[1]
		var start sync.WaitGroup
		start.Add(1)
		var sent sync.WaitGroup
		for _, nd := range nodes {
			sent.Add(1)
			go func(from, to uint64, tr *Transport) {
				defer sent.Done()
				start.Wait()
				_ = tr.sendVR(to, msg(from, to, 1))
			}(nd.id, 3-nd.id, nd.tr)
		}
		start.Done()
		sent.Wait()
		waitOneLink(t, a.tr, b.tr)
		// Every message from here on arrives, in order, once.
		const n = 50
		before := [2]int{a.in.count(), b.in.count()}
		for op := uint64(2); op < 2+n; op++ {
			mustSend(t, a.tr, 2, msg(1, 2, op))
			mustSend(t, b.tr, 1, msg(2, 1, op))
		}
		for i, nd := range nodes {
			got := nd.in.wait(t, before[i]+n, 5*time.Second)
			seen := map[uint64]bool{}
			last := uint64(0)
			for _, g := range got {
				if seen[g.m.Op] || g.m.Op <= last {
					t.Fatalf("round %d: node %d got op %d after op %d (duplicate or out of order): %v", round, nd.id, g.m.Op, last, got)
				}
				seen[g.m.Op], last = true, g.m.Op
			}
		}
		if !sameLink(a.tr, b.tr) {
			t.Fatalf("round %d: the pair no longer shares one connection:%s", round, statsOf([]*Transport{a.tr, b.tr}))
		}
		// The losing dial of the race is closed asynchronously: its sockets
		// may still show as established for a moment (3 seen under -race).
		pa, pb := portOf(t, a.ln.Addr().String()), portOf(t, b.ln.Addr().String())
		e := 0
		testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool {
			e = established(pa, pb)
			return e == -1 || e == 2
		})
		if e != -1 && e != 2 {
			t.Fatalf("round %d: %d established sockets on the pair's ports, want 2 (one connection, both ends):%s", round, e, statsOf([]*Transport{a.tr, b.tr}))
		}
		if round == 0 || round == rounds-1 {
			t.Logf("round %d:%s", round, statsOf([]*Transport{a.tr, b.tr}))
		}
		a.tr.Close()
		b.tr.Close()
	}
}

// Three nodes, two groups: every node sends to every other in both groups,
// and each pair carries it all, both ways, on one connection (three
// connections in all, six sockets).
func TestOneConnectionPerPairCarriesBothDirectionsAndEveryGroup(t *testing.T) {
	const second = 5
	nodes := cluster(t, 3, nil)
	inboxes := make([]*inbox, len(nodes))
	for i, nd := range nodes {
		in := newInbox()
		inboxes[i] = in
		self := nd.id
		if _, err := nd.tr.Register(second, frame.EngineVR, func(from uint64, msgs []frame.Message) error {
			ms, err := wire.Decode(from, self, msgs)
			if err != nil {
				return err
			}
			in.handle(from, ms)
			return nil
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	const n = 30
	for op := uint64(1); op <= n; op++ {
		for _, from := range nodes {
			for _, to := range nodes {
				if from == to {
					continue
				}
				mustSend(t, from.tr, to.id, msg(from.id, to.id, op))
				e := from.tr.endpoint(second)
				if err := e.Send(to.id, wire.Payload(msg(from.id, to.id, op))); err != nil {
					t.Fatal(err)
				}
			}
		}
		if op == 1 {
			// The first round may race dials (all six directions at once)
			// and lose messages with the connection that lost; resend it.
			waitOneLink(t, nodes[0].tr, nodes[1].tr, nodes[2].tr)
		}
	}
	for i, nd := range nodes {
		// Each node hears 2 peers × n messages per group; the first round
		// may have lost some.
		eventually(t, 5*time.Second, func() bool { return nd.in.count() >= 2*(n-1) && inboxes[i].count() >= 2*(n-1) }, "node %d: %d and %d messages", nd.id, nd.in.count(), inboxes[i].count())
	}
	waitOneLink(t, nodes[0].tr, nodes[1].tr, nodes[2].tr)
	var ports []int
	for _, nd := range nodes {
		ports = append(ports, portOf(t, nd.ln.Addr().String()))
		s := nd.tr.Stats()
		if s.Total.Open != 2 {
			t.Fatalf("node %d: %d open connections, want 2 (one per peer):%s", nd.id, s.Total.Open, statsOf([]*Transport{nd.tr}))
		}
		for _, l := range s.Links {
			if l.Sent == 0 || l.Received == 0 {
				t.Fatalf("node %d: link %+v does not carry both directions", nd.id, l)
			}
		}
	}
	e := 0
	testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool { // a losing dial closes asynchronously
		e = established(ports...)
		return e == -1 || e == 6
	})
	if e != -1 && e != 6 {
		t.Fatalf("%d established sockets among the three nodes, want 6 (three connections, both ends)", e)
	}
	t.Logf("stats:%s", statsOf([]*Transport{nodes[0].tr, nodes[1].tr, nodes[2].tr}))
}

// A peer that restarts (a new transport, a new incarnation, on the same
// address) makes the connection the old one held dead, whichever node dialed
// it: the new node's dial replaces it at once, even when it is the higher id
// (its dial would lose a dial race).
func TestARestartedPeerReplacesTheConnectionWhoeverDialedIt(t *testing.T) {
	for _, restart := range []int{0, 1} { // restart node 1 (the lower id) or node 2
		t.Run(fmt.Sprintf("node%d", restart+1), func(t *testing.T) {
			nodes := cluster(t, 2, nil)
			a, b := nodes[0], nodes[1]
			// Node 1 dials: the connection is of the preferred direction.
			mustSend(t, a.tr, 2, msg(1, 2, 1))
			b.in.wait(t, 1, 5*time.Second)
			waitOneLink(t, a.tr, b.tr)
			gone, stay := nodes[restart], nodes[1-restart]
			addr := gone.ln.Addr().String()
			// Close without a FIN reaching the peer first would be a
			// half-open connection (next test); here the old process just
			// goes away and the new one dials before the peer has noticed
			// (or after; either way its dial must be taken).
			gone.tr.Close()
			ln := relisten(t, addr)
			in := newInbox()
			peers := map[uint64]string{1: a.ln.Addr().String(), 2: b.ln.Addr().String()}
			fresh, err := newVR(vrConfig{Config: Config{Self: gone.id, Peers: peers, ClusterSecret: testSecret, Cluster: 7, DialBackoff: 5 * time.Millisecond}, Handler: in.handle})
			if err != nil {
				t.Fatal(err)
			}
			defer fresh.Close()
			go fresh.Serve(ln)
			start := time.Now()
			eventually(t, 5*time.Second, func() bool {
				_ = fresh.sendVR(stay.id, msg(gone.id, stay.id, 100))
				time.Sleep(2 * time.Millisecond)
				return stay.in.count() > 1
			}, "the restarted node's messages arrive")
			mustSend(t, stay.tr, gone.id, msg(stay.id, gone.id, 101))
			in.wait(t, 1, 5*time.Second)
			waitOneLink(t, stay.tr, fresh)
			t.Logf("restarted node %d heard after %v:%s", gone.id, time.Since(start), statsOf([]*Transport{stay.tr, fresh}))
		})
	}
}

// proxy forwards TCP connections to target; cut makes the connections it
// carries half-open: it closes their target side (the target sees the
// connection end) and keeps reading and discarding the client side, so the
// client sees nothing, as when a peer's FIN is lost in a partition.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	pairs  [][2]net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &proxy{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		px.mu.Lock()
		defer px.mu.Unlock()
		for _, p := range px.pairs {
			p[0].Close()
			p[1].Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			px.mu.Lock()
			px.pairs = append(px.pairs, [2]net.Conn{c, s})
			px.mu.Unlock()
			go func() { _, _ = io.Copy(s, c) }()
			go func() { _, _ = io.Copy(c, s) }()
		}
	}()
	return px
}

func (px *proxy) cut() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, p := range px.pairs {
		p[1].Close() // the target side ends; c→s copying then discards into an error
	}
	px.pairs = nil
}

// A half-open connection: node 2 has lost the pair's connection (node 1
// dialed it) without node 1 noticing. When node 2 next has something to
// send it dials node 1; node 1 still holds a connection that beats that
// dial (node 1's own, of the preferred direction).
//
// Same process: node 1 refuses the dial, but the dial tells it the peer has
// most likely lost that connection, so node 1 replaces it with a fresh dial,
// which node 2 takes. Without that, node 2 would stay unable to reach node 1
// until node 1 happened to write on the dead connection.
//
// Restarted (node 2 crashed and came back, no FIN ever reached node 1): the
// dial carries a new incarnation, so node 1 takes it at once in place of the
// dead connection, no refusal and no redial.
func TestAHalfOpenConnectionIsReplaced(t *testing.T) {
	for _, restarted := range []bool{false, true} {
		t.Run(map[bool]string{false: "same process", true: "restarted"}[restarted], func(t *testing.T) {
			halfOpen(t, restarted)
		})
	}
}

func halfOpen(t *testing.T, restarted bool) {
	lns, _ := listeners(t, 2)
	lnA, lnB := lns[0], lns[1]
	px := newProxy(t, lnB.Addr().String()) // node 1 reaches node 2 through it
	inA, inB := newInbox(), newInbox()
	logA := &logBuf{}
	timing := Config{ClusterSecret: testSecret, Cluster: 7, DialBackoff: 5 * time.Millisecond,
		DialTimeout: 100 * time.Millisecond, HandshakeTimeout: 200 * time.Millisecond}
	ca := timing
	ca.Self, ca.Peers, ca.Logger = 1, map[uint64]string{2: px.ln.Addr().String()}, slogTo(logA)
	a, err := newVR(vrConfig{Config: ca, Handler: inA.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	go a.Serve(lnA)
	cb := timing
	cb.Self, cb.Peers = 2, map[uint64]string{1: lnA.Addr().String()}
	b, err := newVR(vrConfig{Config: cb, Handler: inB.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	go b.Serve(lnB)

	mustSend(t, a, 2, msg(1, 2, 1))
	inB.wait(t, 1, 5*time.Second)
	mustSend(t, b, 1, msg(2, 1, 1))
	inA.wait(t, 1, 5*time.Second)
	if a.Stats().Link(2).Open != 1 || b.Stats().Link(1).Open != 1 || b.Stats().Link(1).InboundConns != 1 {
		t.Fatalf("before the cut:%s", statsOf([]*Transport{a, b}))
	}
	// Old enough that node 2's dial cannot be a dial race with it.
	time.Sleep(timing.DialTimeout + timing.HandshakeTimeout + 50*time.Millisecond)
	px.cut()
	eventually(t, 5*time.Second, func() bool { return b.Stats().Link(1).Open == 0 }, "node 2 sees the connection end")
	if restarted {
		b.Close()
		lnB = relisten(t, lnB.Addr().String())
		inB = newInbox()
		if b, err = newVR(vrConfig{Config: cb, Handler: inB.handle}); err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		go b.Serve(lnB)
	}
	if a.Stats().Link(2).Open != 1 {
		t.Fatalf("node 1 noticed the cut; the test needs a half-open connection:%s", statsOf([]*Transport{a, b}))
	}
	dupsBefore := a.Stats().Link(2).Duplicates

	start := time.Now()
	for op := uint64(2); inA.count() < 2 && time.Since(start) < 5*time.Second; op++ {
		mustSend(t, b, 1, msg(2, 1, op))
		time.Sleep(5 * time.Millisecond)
	}
	if inA.count() < 2 {
		t.Fatalf("node 2 could not reach node 1 for %v after the cut:%s\nnode 1's log:\n%s", time.Since(start), statsOf([]*Transport{a, b}), logA)
	}
	took := time.Since(start)
	mustSend(t, a, 2, msg(1, 2, 50))
	eventually(t, 5*time.Second, func() bool { return inB.count() >= 1 }, "node 1's message after the replacement")
	// Through the proxy the two ends' addresses differ: count instead.
	eventually(t, 5*time.Second, func() bool { return a.Stats().Link(2).Open == 1 && b.Stats().Link(1).Open == 1 }, "one connection at each end:%s", statsOf([]*Transport{a, b}))
	if restarted {
		if s := a.Stats().Link(2); s.Duplicates != dupsBefore || s.Replaced != 1 || strings.Contains(logA.String(), "replaced the link") {
			t.Fatalf("the restarted peer's dial was not taken at once in place of the dead connection:%s\nnode 1's log:\n%s", statsOf([]*Transport{a, b}), logA)
		}
	} else {
		logA.waitLog(t, "replaced the link", time.Second)
	}
	t.Logf("node 2 reached node 1 %v after the cut:%s", took, statsOf([]*Transport{a, b}))
}

// Both directions of one connection at once: each node sends the other a
// message larger than a frame (fragments of the two interleave on nothing:
// each direction is its own byte stream) between small ones, and each gets
// all three whole and in order.
func TestLargeMessagesCrossOnOneConnection(t *testing.T) {
	nodes := cluster(t, 2, func(c *vrConfig) { c.MaxFrame = 64 << 10 })
	mustSend(t, nodes[0].tr, 2, msg(1, 2, 1))
	nodes[1].in.wait(t, 1, 5*time.Second)
	waitOneLink(t, nodes[0].tr, nodes[1].tr)
	bigs := make([]*vr.Message, 2)
	for i, nd := range nodes {
		from, to := nd.id, 3-nd.id
		big := msg(from, to, 2)
		big.Entries[0].Data = make([]byte, 8<<20)
		for j := range big.Entries[0].Data {
			big.Entries[0].Data[j] = byte(int(from) + j%251)
		}
		bigs[i] = big
	}
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from, to := nd.id, 3-nd.id
			if i == 1 {
				_ = nd.tr.sendVR(to, msg(from, to, 1))
			}
			_ = nd.tr.sendLargeVR(to, bigs[i])
			_ = nd.tr.sendVR(to, msg(from, to, 3))
		}()
	}
	wg.Wait()
	for i, nd := range nodes {
		got := nd.in.wait(t, 3, 20*time.Second)
		for k, g := range got {
			if g.m.Op != uint64(k+1) {
				t.Fatalf("node %d: message %d has op %d: order lost", nd.id, k, g.m.Op)
			}
		}
		if !bytes.Equal(got[1].m.Entries[0].Data, bigs[1-i].Entries[0].Data) {
			t.Fatalf("node %d: the large message arrived with %d bytes, not its %d", nd.id, len(got[1].m.Entries[0].Data), len(bigs[1-i].Entries[0].Data))
		}
	}
	if !sameLink(nodes[0].tr, nodes[1].tr) {
		t.Fatalf("the large messages did not share the one connection:%s", statsOf([]*Transport{nodes[0].tr, nodes[1].tr}))
	}
}

// Back-pressure is per direction: node 2's Handler stalls, so node 2 stops
// reading and node 1's messages back up (its queue drops beyond QueueLen);
// node 2's own messages to node 1 still flow on the same connection, since
// node 1 reads them.
func TestBackPressureIsPerDirection(t *testing.T) {
	release := make(chan struct{})
	var stalled sync.Once
	stalling := make(chan struct{})
	nodes := cluster(t, 2, func(c *vrConfig) {
		c.QueueLen = 64
		if c.Self == 2 {
			c.Handler = func(uint64, []vr.Message) {
				stalled.Do(func() { close(stalling) })
				<-release
			}
		}
	})
	defer close(release)
	a, b := nodes[0], nodes[1]
	mustSend(t, a.tr, 2, msg(1, 2, 1))
	<-stalling // node 2's reader is now stuck in its Handler
	// Fill node 1 → node 2: the socket buffers, then node 1's queue.
	filler := msg(1, 2, 2)
	filler.Entries[0].Data = make([]byte, 64<<10)
	eventually(t, 10*time.Second, func() bool {
		_ = a.tr.sendVR(2, filler)
		return a.tr.Stats().Link(2).Dropped > 0
	}, "node 1's queue to the stalled node 2 full (stats %+v)", a.tr.Stats().Link(2))
	// The other direction is not held up by it.
	before := a.in.count()
	for op := uint64(1); op <= 20; op++ {
		mustSend(t, b.tr, 1, msg(2, 1, op))
	}
	a.in.wait(t, before+20, 5*time.Second)
	if !sameLink(a.tr, b.tr) {
		t.Fatalf("not one connection:%s", statsOf([]*Transport{a.tr, b.tr}))
	}
}
