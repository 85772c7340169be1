// Package chainwire is the chain engine's codec: the binary encoding of the
// chain core's messages (chain.Msg) as bodies of the engine-neutral peer
// frames (internal/frame, engine frame.EngineChain), as internal/wire is
// VR's.
//
// Encoding: hand-written, no reflection. The frame's envelope carries the
// message type; the body is the header fields as uvarints (From, To, Epoch,
// Seq, LA, LU, ID, Token, Joiner, Target), one flags byte, the operation and
// result (length-prefixed), the member list and the forwarding path (a count,
// then uvarints) and the entries (a count, then each entry's Seq, ID, Op and
// Result), then, if the flags say so, a snapshot (N, Seq, Sum, Data), then,
// on a numbered link (a member's message to another member), LinkInc and
// LinkSeq, and an update's Pos if set. Byte slices in a decoded message alias the input.
//
// MsgPersist and MsgPersisted never travel: they are between a member and
// its own host. A peer sending one is a protocol error (ErrCorrupt), so a
// peer cannot make a member believe its own log is durable.
//
// Pure (internal/purity): it imports internal/chain, internal/frame,
// internal/kv (its field decoder) and the standard library only.
package chainwire

import (
	"encoding/binary"
	"fmt"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
)

// ErrCorrupt is the frame layer's: a body that does not decode. The
// connection should be dropped.
var ErrCorrupt = frame.ErrCorrupt

// Flag bits of the flags byte.
const (
	flagDone = 1 << iota
	flagRefused
	flagQuery
	flagAny
	flagExhausted
	flagWeak
	flagLost
	flagSnap // a snapshot follows the entries (Msg.Snap)
	flagAll  = 1<<iota - 1
)

// Travels reports whether messages of type t go between nodes (every type
// but the member↔own-host persistence pair).
func Travels(t chain.MsgType) bool {
	return t >= chain.MsgUpdate && t <= chain.MsgCRTailDone || t == chain.MsgHeartbeat || t == chain.MsgRestart || t == chain.MsgRestartDone
}

// durReport reports whether messages of type t carry a durable point, whose
// NoLog, HadLog and Down (chain.Msg) travel as the Any, Weak and Query flags, unused on
// those types (an update's and a FLUSH's HadLog as Weak too): a flag of its own would be an unknown bit to an older
// receiver, which refuses the body, while these it ignores (an older
// predecessor takes a NoLog report's LA as durable, as it did before; an
// older successor drops a Down notice, which is not from its successor).
func durReport(t chain.MsgType) bool { return t == chain.MsgAck || t == chain.MsgRepairInfo }

// Payload adapts m to the transport (frame.Payload). m must not change until
// the transport encoded it.
func Payload(m *chain.Msg) frame.Payload { return (*payload)(m) }

type payload chain.Msg

func (p *payload) Kind() (frame.Engine, uint8) { return frame.EngineChain, uint8(p.Type) }
func (p *payload) AppendBody(b []byte) []byte  { return AppendBody(b, (*chain.Msg)(p)) }

// AppendBody appends m's fields (a frame body) to b.
func AppendBody(b []byte, m *chain.Msg) []byte {
	for _, v := range [...]uint64{uint64(m.From), uint64(m.To), m.Epoch, m.Seq, m.LA, m.LU, m.ID, m.Token,
		uint64(m.Joiner), uint64(m.Target)} {
		b = binary.AppendUvarint(b, v)
	}
	var f byte
	query, anyFlag, weak := m.Query, m.Any, m.Weak
	if durReport(m.Type) {
		query, anyFlag = query || m.Down, anyFlag || m.NoLog
	}
	if durReport(m.Type) || m.Type == chain.MsgUpdate || m.Type == chain.MsgFlush {
		weak = weak || m.HadLog
	}
	for i, set := range [...]bool{m.Done, m.Refused, query, anyFlag, m.Exhausted, weak, m.Lost, m.Snap != nil} {
		if set {
			f |= 1 << i
		}
	}
	b = append(b, f)
	b = appendBytes(b, m.Op)
	b = appendBytes(b, m.Result)
	for _, ids := range [...][]chain.NodeID{m.Members, m.Path} {
		b = binary.AppendUvarint(b, uint64(len(ids)))
		for _, id := range ids {
			b = binary.AppendUvarint(b, uint64(id))
		}
	}
	b = binary.AppendUvarint(b, uint64(len(m.Entries)))
	for i := range m.Entries {
		e := &m.Entries[i]
		b = binary.AppendUvarint(b, e.Seq)
		b = binary.AppendUvarint(b, e.ID)
		b = appendBytes(b, e.Op)
		b = appendBytes(b, e.Result)
	}
	if s := m.Snap; s != nil {
		// Versions are the core's simulator's (a Keyed state machine); the
		// host has none, and they do not travel.
		b = binary.AppendUvarint(b, uint64(s.N))
		b = binary.AppendUvarint(b, s.Seq)
		b = binary.AppendUvarint(b, s.Sum)
		b = appendBytes(b, s.Data)
		if s.More || s.From != nil || s.Next != nil {
			// A page of a paged snapshot (or a request for one): a 0
			// (never a link incarnation, below), More, then the cursors.
			b = append(b, 0)
			more := uint64(0)
			if s.More {
				more = 1
			}
			b = binary.AppendUvarint(b, more)
			b = appendBytes(b, s.From)
			b = appendBytes(b, s.Next)
		}
	}
	if m.LinkSeq != 0 {
		// The link numbering, last: a body without it (an older sender,
		// the master's messages) decodes as unnumbered.
		b = binary.AppendUvarint(b, m.LinkInc)
		b = binary.AppendUvarint(b, m.LinkSeq)
		if m.Pos != 0 && m.Type == chain.MsgUpdate {
			// An update's position, after the link numbering (a
			// numbered update only: the host sets both).
			b = binary.AppendUvarint(b, m.Pos)
		}
	}
	return b
}

func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// DecodeBody decodes a body of message type typ into m (overwriting it).
// It reads with kv's field decoder (kv.Decoder), the one the kv and VR
// codecs share.
func DecodeBody(typ uint8, body []byte, m *chain.Msg) error {
	*m = chain.Msg{Type: chain.MsgType(typ)}
	if !Travels(m.Type) {
		return fmt.Errorf("%w: chain message type %d does not travel between nodes", ErrCorrupt, typ)
	}
	d := kv.Decoder{B: body}
	var from, to, joiner, target uint64
	for _, f := range [...]*uint64{&from, &to, &m.Epoch, &m.Seq, &m.LA, &m.LU, &m.ID, &m.Token, &joiner, &target} {
		*f = d.Uvarint()
	}
	m.From, m.To, m.Joiner, m.Target = chain.NodeID(from), chain.NodeID(to), chain.NodeID(joiner), chain.NodeID(target)
	f := d.Byte()
	if d.Err == nil && f&^flagAll != 0 {
		return fmt.Errorf("%w: chain %v: unknown flags %#x", ErrCorrupt, m.Type, f)
	}
	for i, set := range [...]*bool{&m.Done, &m.Refused, &m.Query, &m.Any, &m.Exhausted, &m.Weak, &m.Lost} {
		*set = f&(1<<i) != 0
	}
	if durReport(m.Type) {
		m.Down, m.NoLog, m.HadLog = m.Query, m.Any, m.Weak
		m.Query, m.Any, m.Weak = false, false, false
	}
	if m.Type == chain.MsgUpdate || m.Type == chain.MsgFlush {
		m.HadLog, m.Weak = m.Weak, false
	}
	snap := f&flagSnap != 0
	m.Op = bytesOrNil(&d)
	m.Result = bytesOrNil(&d)
	for _, ids := range [...]*[]chain.NodeID{&m.Members, &m.Path} {
		if n := count(&d, 1); n > 0 {
			*ids = make([]chain.NodeID, n)
			for i := range *ids {
				(*ids)[i] = chain.NodeID(d.Uvarint())
			}
		}
	}
	if n := count(&d, 4); n > 0 {
		m.Entries = make([]chain.Entry, n)
		for i := range m.Entries {
			e := &m.Entries[i]
			e.Seq = d.Uvarint()
			e.ID = d.Uvarint()
			e.Op = bytesOrNil(&d)
			e.Result = bytesOrNil(&d)
		}
	}
	if snap {
		n := d.Uvarint()
		m.Snap = &chain.Snap{Seq: d.Uvarint(), Sum: d.Uvarint(), Data: bytesOrNil(&d)}
		if n > 1<<62 {
			d.Err = ErrCorrupt
		}
		m.Snap.N = int(n)
		if d.Err == nil && len(d.B) > 0 && d.B[0] == 0 {
			d.B = d.B[1:]
			switch d.Uvarint() {
			case 0:
			case 1:
				m.Snap.More = true
			default:
				d.Err = ErrCorrupt
			}
			m.Snap.From, m.Snap.Next = bytesOrNil(&d), bytesOrNil(&d)
		}
	}
	if d.Err == nil && len(d.B) > 0 {
		m.LinkInc, m.LinkSeq = d.Uvarint(), d.Uvarint()
		if d.Err == nil && (m.LinkInc == 0 || m.LinkSeq == 0) {
			d.Err = ErrCorrupt
		}
		if d.Err == nil && len(d.B) > 0 && m.Type == chain.MsgUpdate {
			// Only an update has one: on any other message the bytes
			// stay trailing (a corrupt body), as before positions.
			if m.Pos = d.Uvarint(); d.Err == nil && m.Pos == 0 {
				d.Err = ErrCorrupt
			}
		}
	}
	if d.Err != nil {
		return fmt.Errorf("%w: chain %v: truncated or malformed body (%v)", ErrCorrupt, m.Type, d.Err)
	}
	if len(d.B) != 0 {
		return fmt.Errorf("%w: chain %v: %d trailing bytes", ErrCorrupt, m.Type, len(d.B))
	}
	return nil
}

// bytesOrNil reads a byte string, nil when empty (as the core builds them).
func bytesOrNil(d *kv.Decoder) []byte {
	if p := d.Bytes(); len(p) > 0 {
		return p
	}
	return nil
}

// count reads a count of items that each take at least min bytes, so a
// corrupt count cannot make the decoder allocate more than the input
// justifies.
func count(d *kv.Decoder, min int) int {
	n := d.Uvarint()
	if d.Err == nil && n > uint64(len(d.B)/min) {
		d.Err = ErrCorrupt
		return 0
	}
	return int(n)
}

// Decode turns one batch of a chain group's inbound frames, which came on
// the connection authenticated as node from to node self, into messages. A
// message that does not decode (or is another engine's) is ErrCorrupt; one
// whose From or To is not the connection's is frame.ErrSpoofed. Either means
// the connection's stream can no longer be trusted. The messages alias the
// frames' bodies.
func Decode(from, self uint64, in []frame.Message) ([]chain.Msg, error) {
	msgs := make([]chain.Msg, len(in))
	for i := range in {
		m := &msgs[i]
		if err := DecodeFrame(&in[i], m); err != nil {
			return nil, err
		}
		if uint64(m.From) != from || uint64(m.To) != self {
			return nil, Spoofed(m, from, self)
		}
	}
	return msgs, nil
}

// DecodeFrame decodes one inbound frame of a chain group into m (ErrCorrupt
// if it does not decode or is another engine's), for a receiver that checks
// From and To itself (Decode's check, or a host's own: Spoofed).
func DecodeFrame(fm *frame.Message, m *chain.Msg) error {
	if fm.Engine != frame.EngineChain {
		return fmt.Errorf("%w: a %v message for chain group %d", ErrCorrupt, fm.Engine, fm.Group)
	}
	return DecodeBody(fm.Type, fm.Body, m)
}

// Spoofed is the error of message m, whose From or To is not the
// connection's (authenticated as node from, to node self).
func Spoofed(m *chain.Msg, from, self uint64) error {
	return fmt.Errorf("%w: %s on the connection authenticated as node %d to node %d", frame.ErrSpoofed, m, from, self)
}
