package vrshard

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vr"
)

// echoEngine is a test engine id (frame.EngineVR is 1).
const echoEngine frame.Engine = 9

// echoMsg is a peer message that is not VR's: a line of text.
type echoMsg struct {
	from, to uint64
	text     string
}

var _ peerMsg = (*echoMsg)(nil)

func (m *echoMsg) Kind() (frame.Engine, uint8)     { return echoEngine, 1 }
func (m *echoMsg) AppendBody(b []byte) []byte      { return append(b, m.text...) }
func (m *echoMsg) Dest() uint64                    { return m.to }
func (m *echoMsg) Size() int                       { return len(m.text) }
func (m *echoMsg) CarriesState() bool              { return false }
func (m *echoMsg) SnapshotAt() (uint64, int, bool) { return 0, 0, false }
func (m *echoMsg) Own() peerMsg                    { c := *m; return &c }

// echoBatch is a decoded batch of echoMsgs.
type echoBatch struct{ msgs []*echoMsg }

func (b *echoBatch) Label() string { return "echo" }

// echoCore is soloCore (a group of one, through the contract) with a peer
// message type and codec of its own: it answers every echoMsg it is
// stepped with by one to the sender ("re: " and the text). It is what a
// second engine brings the host: a core.Core[peerMsg] and a peerEngine.
type echoCore struct {
	*soloCore
	out []peerMsg // for the next Ready
}

var (
	_ hostCore   = (*echoCore)(nil)
	_ peerEngine = (*echoCore)(nil)
)

func (c *echoCore) Step(_ int64, m peerMsg) {
	e := m.(*echoMsg)
	c.out = append(c.out, &echoMsg{from: c.self, to: e.from, text: "re: " + e.text})
}

func (c *echoCore) Ready() core.Ready[peerMsg] {
	rd := c.soloCore.Ready()
	rd.Messages, c.out = c.out, nil
	return rd
}

func (c *echoCore) Engine() frame.Engine { return echoEngine }

func (c *echoCore) Decode(from, to uint64, in []frame.Message) (peerBatch, error) {
	b := &echoBatch{}
	for _, f := range in {
		if f.Engine != echoEngine {
			return nil, fmt.Errorf("echo: a %v message", f.Engine)
		}
		b.msgs = append(b.msgs, &echoMsg{from: from, to: to, text: string(f.Body)})
	}
	return b, nil
}

func (c *echoCore) StepBatch(now int64, b peerBatch, h stepHooks) {
	for _, m := range b.(*echoBatch).msgs {
		c.Step(now, m)
		h.stepped(viewCause{kind: 'm', role: roleOther, typ: "echo", from: m.from}, m)
	}
}

// sentNetwork records what the host sends, encoded as the transport would.
type sentNetwork struct {
	mu   sync.Mutex
	sent []string // "to engine/type body"
}

func (n *sentNetwork) Send(to uint64, p frame.Payload) error {
	e, typ := p.Kind()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sent = append(n.sent, fmt.Sprintf("%d %d/%d %s", to, e, typ, p.AppendBody(nil)))
	return nil
}
func (n *sentNetwork) SendLarge(to uint64, p frame.Payload) error { return n.Send(to, p) }
func (n *sentNetwork) got() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.sent...)
}

// TestAnEngineBringsItsOwnPeerMessages: the host carries a core's peer
// messages without knowing their type. Frames of the engine's own (engine
// 9, not VR's) that reach the host as the transport hands them (deliver)
// are decoded by the engine's codec, stepped into its core through the
// driver's inbox, and the core's answers in Ready.Messages leave through
// the host's send, encoded by the engine; the host keeps serving writes and
// reads meanwhile.
func TestAnEngineBringsItsOwnPeerMessages(t *testing.T) {
	net := &sentNetwork{}
	r, err := Open(Options{
		Dir: t.TempDir(), Bootstrap: true, Network: net, Logger: testLogger(t),
		VR: vr.Config{Cluster: 7, Epoch: 1, Members: []uint64{1}, Self: 1},
		newCore: func(cfg group, st core.Boot) (hostCore, error) {
			s, err := openSolo(cfg, st)
			if err != nil {
				return nil, err
			}
			return &echoCore{soloCore: s.(*soloCore)}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.eng.Engine() != echoEngine {
		t.Fatalf("the host's engine is %v, want the core's own (%v)", r.eng.Engine(), echoEngine)
	}
	// A wrong engine's frame fails the batch, as the transport's handler
	// must report (it closes the connection).
	if err := r.deliver(9, []frame.Message{{Engine: frame.EngineVR, Type: 1, Body: []byte("x")}}); err == nil {
		t.Fatal("a VR frame decoded by the echo engine's codec")
	}
	if err := r.deliver(9, []frame.Message{{Engine: echoEngine, Type: 1, Body: []byte("hello")}, {Engine: echoEngine, Type: 1, Body: []byte("again")}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Write(ctx, set("k", "v"), level.Sync, shard.ReqID{Client: 5, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	want := []string{"9 9/1 re: hello", "9 9/1 re: again"}
	testgroup.Until(5*time.Second, time.Millisecond, func() bool { return len(net.got()) >= len(want) })
	if got := net.got(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent %q, want %q", got, want)
	}
	res, err := r.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{})
	if err != nil || string(res.Bulk) != "v" {
		t.Fatalf("GET k: %q, %v", res.Bulk, err)
	}
}
