package transport

import (
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/wire"
)

const testSecret = "s3cret"

// The tests carry VR messages (VR's codec, internal/wire, is the payload
// production sends, and it checks addresses) in group testGroup, the group
// wire.AppendFrame addresses raw frames to. The production package imports
// neither (TestNoEngineImports).
const testGroup = 0

// vrConfig is a transport's Config plus the VR handler of its one group.
type vrConfig struct {
	Config
	Handler    func(from uint64, msgs []vr.Message)
	OnProgress func(from uint64)
}

// newVR starts a transport with group testGroup registered for VR.
func newVR(c vrConfig) (*Transport, error) {
	tr, err := New(c.Config)
	if err != nil {
		return nil, err
	}
	self := tr.Self()
	h := c.Handler
	if h == nil {
		h = func(uint64, []vr.Message) {}
	}
	_, err = tr.Register(testGroup, frame.EngineVR, func(from uint64, in []frame.Message) error {
		msgs, err := wire.Decode(from, self, in)
		if err != nil {
			return err
		}
		h(from, msgs)
		return nil
	}, c.OnProgress)
	if err != nil {
		tr.Close()
		return nil, err
	}
	return tr, nil
}

func (t *Transport) ep() *Endpoint {
	if e := t.endpoint(testGroup); e != nil {
		return e
	}
	// Closed transports have no endpoints left to look up; an unregistered
	// endpoint answers ErrClosed like the transport would.
	e := &Endpoint{t: t, group: testGroup}
	e.closed.Store(true)
	return e
}

func (t *Transport) sendVR(to uint64, m *vr.Message) error { return t.ep().Send(to, wire.Payload(m)) }
func (t *Transport) sendLargeVR(to uint64, m *vr.Message) error {
	return t.ep().SendLarge(to, wire.Payload(m))
}
func (t *Transport) sendAllVR(msgs []vr.Message) error {
	out := make([]Outbound, len(msgs))
	for i := range msgs {
		out[i] = Outbound{To: msgs[i].To, Msg: wire.Payload(&msgs[i])}
	}
	return t.ep().SendAll(out)
}

// inbox records what a node's Handler received.
type inbox struct {
	mu      sync.Mutex
	cond    *sync.Cond
	msgs    []got
	batches int
}

type got struct {
	from uint64
	m    vr.Message
	at   time.Time
}

func newInbox() *inbox {
	b := &inbox{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *inbox) handle(from uint64, msgs []vr.Message) {
	now := time.Now()
	b.mu.Lock()
	for _, m := range msgs {
		b.msgs = append(b.msgs, got{from, m, now})
	}
	b.batches++
	b.mu.Unlock()
	b.cond.Broadcast()
}

// wait returns the first n messages, or fails the test after timeout.
func (b *inbox) wait(t testing.TB, n int, timeout time.Duration) []got {
	t.Helper()
	deadline := time.Now().Add(timeout)
	stop := time.AfterFunc(timeout, b.cond.Broadcast)
	defer stop.Stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.msgs) < n {
		if time.Now().After(deadline) {
			t.Fatalf("received %d messages, want %d within %v", len(b.msgs), n, timeout)
		}
		b.cond.Wait()
	}
	return append([]got(nil), b.msgs[:n]...)
}

func (b *inbox) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.msgs)
}

// logBuf is a concurrency-safe log sink whose text tests read.
type logBuf struct{ testgroup.Buffer }

// waitLog waits until the log contains s.
func (l *logBuf) waitLog(t testing.TB, s string, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() bool { return strings.Contains(l.String(), s) }, "log line containing %q; log:\n%s", s, l)
}

func eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !testgroup.Until(timeout, 2*time.Millisecond, cond) {
		t.Fatalf("not within %v: "+format, append([]any{timeout}, args...)...)
	}
}

// node is one transport under test with its listener, inbox and log.
type node struct {
	id  uint64
	tr  *Transport
	ln  net.Listener
	in  *inbox
	log *logBuf
}

// listeners opens n loopback listeners, for nodes 1..n, on ports reserved
// by testgroup.FreePorts (outside the kernel's ephemeral range, so a test
// that closes one and listens on its address again, a restarted node, gets
// it back), and returns them with the peer map.
func listeners(t testing.TB, n int) ([]net.Listener, map[uint64]string) {
	t.Helper()
	lns := make([]net.Listener, n)
	peers := map[uint64]string{}
	for i := range lns {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(testgroup.FreePorts(t))))
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		peers[uint64(i+1)] = ln.Addr().String()
	}
	return lns, peers
}

// relisten listens on addr again, for a node restarted on its address
// (retrying while the old listener's port is still being released).
func relisten(t testing.TB, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	eventually(t, 5*time.Second, func() bool {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err == nil
	}, "relisten on %s", addr)
	return ln
}

// acceptAs accepts one connection on ln and runs the acceptor's handshake
// as self, for a dialer of node 1; a deadline on ln makes a writer that never
// (re)dials fail the test instead of hanging it.
func acceptAs(t testing.TB, ln net.Listener, self Identity) net.Conn {
	t.Helper()
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, _, _, err := acceptHandshake(nc, testSecret, self, 2, func(id uint64) bool { return id == 1 }, nil); err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Time{})
	return nc
}

// cluster starts n transports (ids 1..n) on 127.0.0.1, each serving its own
// listener. adjust may change a node's Config before New.
func cluster(t testing.TB, n int, adjust func(c *vrConfig)) []*node {
	t.Helper()
	lns, peers := listeners(t, n)
	nodes := make([]*node, n)
	for i := range nodes {
		nd := &node{id: uint64(i + 1), ln: lns[i], in: newInbox(), log: &logBuf{}}
		cfg := vrConfig{Config: Config{
			Self:          nd.id,
			Peers:         peers,
			ClusterSecret: testSecret,
			Cluster:       7,
			Logger:        slog.New(slog.NewTextHandler(nd.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
			DialBackoff:   5 * time.Millisecond,
		}, Handler: nd.in.handle}
		if adjust != nil {
			adjust(&cfg)
		}
		tr, err := newVR(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nd.tr = tr
		go tr.Serve(lns[i])
		t.Cleanup(func() { tr.Close() })
		nodes[i] = nd
	}
	return nodes
}

// msg is a message from→to with op number op and a payload naming it.
func msg(from, to, op uint64) *vr.Message {
	return &vr.Message{
		Type: vr.MsgPrepare, Cluster: 7, From: from, To: to, View: 1, Op: op, Commit: op - 1,
		First:   op,
		Entries: []vr.Entry{{View: 1, Op: op, Request: vr.Request{Client: 9, ReqNum: op, Data: fmt.Appendf(nil, "payload-%d", op)}}},
	}
}

func mustSend(t testing.TB, tr *Transport, to uint64, m *vr.Message) {
	t.Helper()
	if err := tr.sendVR(to, m); err != nil {
		t.Fatal(err)
	}
}

// checkNoLeak fails if goroutines started after `before` are still running.
func checkNoLeak(t *testing.T, before int) {
	t.Helper()
	if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { return runtime.NumGoroutine() <= before }) {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
	}
}

func slogTo(l *logBuf) *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
