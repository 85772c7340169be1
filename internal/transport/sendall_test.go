package transport

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/wire"
)

func TestSendAllRoutesEachMessageAndWritesInlineWhenTheWriterIsIdle(t *testing.T) {
	nodes := cluster(t, 3, nil)
	a := nodes[0].tr
	// Warm up: both links dialed, writers parked.
	mustSend(t, a, 2, msg(1, 2, 1))
	mustSend(t, a, 3, msg(1, 3, 1))
	nodes[1].in.wait(t, 1, 5*time.Second)
	nodes[2].in.wait(t, 1, 5*time.Second)

	op := uint64(2)
	eventually(t, 5*time.Second, func() bool {
		batch := []vr.Message{*msg(1, 2, op), *msg(1, 3, op), *msg(1, 2, op+1), *msg(1, 3, op+1)}
		if err := a.sendAllVR(batch); err != nil {
			t.Fatal(err)
		}
		op += 2
		time.Sleep(2 * time.Millisecond) // let the writers park again
		s := a.Stats()
		return s.Link(2).InlineWrites > 0 && s.Link(3).InlineWrites > 0
	}, "SendAll to write on the caller's goroutine")
	for _, nd := range nodes[1:] {
		for i, g := range nd.in.wait(t, int(op-1), 5*time.Second) {
			if g.m.Op != uint64(i+1) || g.m.To != nd.id {
				t.Fatalf("node %d message %d: %v", nd.id, i, g.m)
			}
		}
	}
	if err := a.sendAllVR([]vr.Message{*msg(1, 9, 1), *msg(1, 2, op)}); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("SendAll with an unknown peer: %v", err)
	}
	if g := nodes[1].in.wait(t, int(op), 5*time.Second)[op-1]; g.m.Op != op {
		t.Fatalf("the message after an unknown peer's was not sent: %v", g.m)
	}
}

// A message SendAll could only partly write (the peer stopped reading) must
// not leave half a frame for the next connection: the peer restarts, and
// the first frame on the new connection must be whole.
func TestAPartlyWrittenMessageNeverCorruptsTheNextConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	in := newInbox()
	a, err := newVR(vrConfig{Config: Config{Self: 1, Peers: map[uint64]string{2: ln.Addr().String()}, ClusterSecret: testSecret, Cluster: 7, DialBackoff: time.Millisecond, WriteTimeout: 300 * time.Millisecond}, Handler: in.handle})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	self := Identity{Node: 2, Cluster: 7, ConfigHash: a.cfg.ConfigHash}
	accept := func() net.Conn { t.Helper(); return acceptAs(t, ln, self) }

	mustSend(t, a, 2, msg(1, 2, 1))
	stalled := accept() // authenticates, then never reads
	time.Sleep(20 * time.Millisecond)
	big := msg(1, 2, 2)
	big.Entries[0].Data = make([]byte, 64<<20) // far beyond the socket buffers
	if err := a.sendAllVR([]vr.Message{*big}); err != nil {
		t.Fatal(err)
	}
	t.Logf("after SendAll: %+v", a.Stats().Link(2))
	eventually(t, 5*time.Second, func() bool { return a.Stats().Link(2).InlineWrites > 0 }, "part of the big message written by SendAll")
	stalled.Close()
	t.Logf("after close: %+v", a.Stats().Link(2))
	// The writer gives up on the stalled connection and drops the message.
	eventually(t, 5*time.Second, func() bool { return a.Stats().Link(2).Dropped >= 1 }, "the partly written message dropped")

	mustSend(t, a, 2, msg(1, 2, 3))
	fresh := accept()
	defer fresh.Close()
	_ = fresh.SetReadDeadline(time.Now().Add(5 * time.Second))
	var m vr.Message
	if err := wire.NewReader(fresh).Read(&m); err != nil {
		t.Fatalf("first frame on the new connection: %v", err)
	}
	if m.Op != 3 {
		t.Fatalf("first message on the new connection is %v, want op 3", m)
	}
	t.Logf("stats: %+v", a.Stats().Link(2))
}

// Races a peer's reset against the writer picking up a partly written
// message, many times: whichever notices first (the writer's write fails, or
// the watcher reports the connection dead before the writer writes), the
// next connection must start with a whole frame.
func TestACutMidFrameNeverLeaksIntoTheNextConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := newVR(vrConfig{Config: Config{Self: 1, Peers: map[uint64]string{2: ln.Addr().String()}, ClusterSecret: testSecret, Cluster: 7, DialBackoff: time.Millisecond, MaxDialBackoff: 2 * time.Millisecond}, Handler: func(uint64, []vr.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	self := Identity{Node: 2, Cluster: 7, ConfigHash: a.cfg.ConfigHash}
	accept := func() *net.TCPConn {
		t.Helper()
		nc := acceptAs(t, ln, self)
		// A deadline, so a writer that never writes fails the test instead of hanging it.
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		return nc.(*net.TCPConn)
	}
	big := msg(1, 2, 0)
	big.Entries[0].Data = make([]byte, 8<<20)
	mustSend(t, a, 2, msg(1, 2, 1))
	nc := accept()
	const rounds = 100
	for i := range rounds {
		// Read the marker that says the writer is on this connection.
		var m vr.Message
		if err := wire.NewReader(nc).Read(&m); err != nil {
			t.Fatalf("round %d: first frame on a fresh connection: %v", i, err)
		}
		time.Sleep(time.Millisecond) // let the writer park
		if err := a.sendAllVR([]vr.Message{*big}); err != nil {
			t.Fatal(err)
		}
		_ = nc.SetLinger(0) // reset, so the writer learns at once
		nc.Close()
		// Markers until the writer redials (a marker can be dropped with
		// the big message's batch).
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
					_ = a.sendVR(2, msg(1, 2, uint64(i+2)))
				}
			}
		}()
		nc = accept()
		close(stop)
	}
	nc.Close()
	p := a.peers()[2]
	t.Logf("%d rounds: %d partly written messages dropped by the watcher path, stats %+v", rounds, p.c.midFrameDrops.Load(), a.Stats().Link(2))
}
