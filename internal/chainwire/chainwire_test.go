package chainwire

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/frame"
)

// samples covers every field of every type that travels: each message
// round-trips through a whole frame (envelope and body) unchanged.
func samples() []chain.Msg {
	full := chain.Msg{From: 3, To: 7, Epoch: 5, Seq: 5<<40 | 9, LA: 1 << 41, LU: 1<<41 + 3, ID: 1<<63 + 1,
		Token: 12, Joiner: 4, Target: 2, Done: true, Refused: true, Query: true, Any: true, Exhausted: true,
		Weak: true, Lost: true, Op: []byte("set k v"), Result: []byte{0, 1, 2},
		Members: []chain.NodeID{1, 2, 300}, Path: []chain.NodeID{9, 1, 2, 300, 9},
		Entries: []chain.Entry{{Seq: 1, ID: 2, Op: []byte("a")}, {Seq: 2, ID: 0, Op: nil, Result: []byte("r")}},
		Snap:    &chain.Snap{N: 40, Seq: 5<<40 | 3, Sum: 1<<64 - 1, Data: []byte("state")},
		LinkInc: 1<<64 - 7, LinkSeq: 1 << 33, Pos: 1<<40 + 5}
	var out []chain.Msg
	for t := chain.MsgType(1); t < 64; t++ {
		if !Travels(t) {
			continue
		}
		m := full
		m.Type = t
		if t != chain.MsgUpdate {
			m.Pos = 0 // an update's only
		}
		if t == chain.MsgUpdate || t == chain.MsgFlush {
			m.Weak, m.HadLog = false, true // Weak carries an update's and a FLUSH's HadLog
		}
		if durReport(t) {
			// Query, Any and Weak carry Down, NoLog and HadLog on these
			// types, each on its own too.
			m.Query, m.Any, m.Weak, m.Down, m.NoLog, m.HadLog = false, false, false, true, true, true
			out = append(out, chain.Msg{Type: t, From: 1, To: 2, LA: 7, Done: true, NoLog: true}, chain.Msg{Type: t, From: 1, To: 2, LA: 7, Down: true},
				chain.Msg{Type: t, From: 1, To: 2, LA: 7, Done: true, NoLog: true, HadLog: true})
		}
		// A page of a paged snapshot, with and without the link numbering.
		page := m
		page.Snap = &chain.Snap{N: 40, Seq: 3, Data: []byte("page"), From: []byte("k1"), Next: []byte("k9"), More: true}
		last := page
		last.Snap = &chain.Snap{N: 40, From: []byte("k9")}
		last.LinkInc, last.LinkSeq, last.Pos = 0, 0, 0 // a position travels on a numbered link only
		out = append(out, m, page, last, chain.Msg{Type: t, From: 1, To: 2}, chain.Msg{Type: t, From: 1, To: 2, LinkInc: 9, LinkSeq: 1})
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	for _, m := range samples() {
		b := frame.AppendFrame(nil, 11, Payload(&m))
		payload, n, err := frame.CheckFrame(b, frame.DefaultMaxFrame)
		if err != nil || n != len(b) {
			t.Fatalf("%v: frame: %v (%d of %d bytes)", m, err, n, len(b))
		}
		fm, err := frame.Open(payload)
		if err != nil {
			t.Fatalf("%v: open: %v", m, err)
		}
		if fm.Group != 11 || fm.Engine != frame.EngineChain {
			t.Fatalf("%v: envelope %+v", m, fm)
		}
		got, err := Decode(uint64(m.From), uint64(m.To), []frame.Message{fm})
		if err != nil {
			t.Fatalf("%v: decode: %v", m, err)
		}
		if !reflect.DeepEqual(got[0], m) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got[0], m)
		}
	}
}

// TestDecodeRefuses: another engine's frame, a spoofed sender or
// addressee, a type that never travels (a forged MsgPersisted would make a
// member believe its log durable), a truncated body and trailing bytes.
func TestDecodeRefuses(t *testing.T) {
	m := chain.Msg{Type: chain.MsgAck, From: 1, To: 2, Seq: 3}
	body := AppendBody(nil, &m)
	u := chain.Msg{Type: chain.MsgUpdate, From: 1, To: 2, Seq: 3}
	upd := AppendBody(nil, &u)
	cases := []struct {
		name string
		fm   frame.Message
		want error
	}{
		{"vr frame", frame.Message{Engine: frame.EngineVR, Type: uint8(chain.MsgAck), Body: body}, ErrCorrupt},
		{"persisted", frame.Message{Engine: frame.EngineChain, Type: uint8(chain.MsgPersisted), Body: body}, ErrCorrupt},
		{"type 0", frame.Message{Engine: frame.EngineChain, Type: 0, Body: body}, ErrCorrupt},
		{"truncated", frame.Message{Engine: frame.EngineChain, Type: uint8(chain.MsgAck), Body: body[:len(body)-1]}, ErrCorrupt},
		{"trailing", frame.Message{Engine: frame.EngineChain, Type: uint8(chain.MsgAck), Body: append(body[:len(body):len(body)], 0)}, ErrCorrupt},
		{"link seq 0", frame.Message{Engine: frame.EngineChain, Type: uint8(chain.MsgAck), Body: append(body[:len(body):len(body)], 5, 0)}, ErrCorrupt},
		{"position 0", frame.Message{Engine: frame.EngineChain, Type: uint8(chain.MsgUpdate), Body: append(upd[:len(upd):len(upd)], 5, 1, 0)}, ErrCorrupt},
		{"trailing after the position", frame.Message{Engine: frame.EngineChain, Type: uint8(chain.MsgUpdate), Body: append(upd[:len(upd):len(upd)], 5, 1, 7, 0)}, ErrCorrupt},
		{"position on an ack", frame.Message{Engine: frame.EngineChain, Type: uint8(chain.MsgAck), Body: append(body[:len(body):len(body)], 5, 1, 7)}, ErrCorrupt},
	}
	for _, c := range cases {
		if _, err := Decode(1, 2, []frame.Message{c.fm}); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	fm := frame.Message{Engine: frame.EngineChain, Type: uint8(chain.MsgAck), Body: body}
	if _, err := Decode(5, 2, []frame.Message{fm}); !errors.Is(err, frame.ErrSpoofed) {
		t.Errorf("from another node: %v, want ErrSpoofed", err)
	}
	if _, err := Decode(1, 5, []frame.Message{fm}); !errors.Is(err, frame.ErrSpoofed) {
		t.Errorf("to another node: %v, want ErrSpoofed", err)
	}
	if _, err := Decode(1, 2, []frame.Message{fm}); err != nil {
		t.Errorf("the good one: %v", err)
	}
}

// FuzzDecodeBody: any body decodes to a message or to ErrCorrupt, never a
// panic or a huge allocation; whatever decodes encodes back to a body that
// decodes to the same message.
func FuzzDecodeBody(f *testing.F) {
	for _, m := range samples() {
		f.Add(uint8(m.Type), AppendBody(nil, &m))
	}
	f.Add(uint8(0), []byte{})
	f.Add(uint8(chain.MsgFlush), []byte{1, 2, 3, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, typ uint8, body []byte) {
		var m chain.Msg
		if err := DecodeBody(typ, body, &m); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		var again chain.Msg
		if err := DecodeBody(typ, AppendBody(nil, &m), &again); err != nil {
			t.Fatalf("re-encoding of %v does not decode: %v", m, err)
		}
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("re-encoding changed the message:\n got %#v\nwant %#v", again, m)
		}
	})
}
