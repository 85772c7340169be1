// Package wire is VR's codec: the binary encoding of the VR core's
// messages (vr.Message) as bodies of the engine-neutral peer frames
// (internal/frame), which address each message to a replica group.
//
// Encoding: hand-written, no reflection, no gob: a version byte and the type
// byte, then the header fields as uvarints, then the entries, an optional
// snapshot, a reason string and the nilext durability log (Message.DLog),
// each length-prefixed (AppendMessage). In a peer frame the envelope
// (internal/frame) carries the type, and its version stands for this
// codec's current version, so a frame's body is the fields alone
// (Payload, Decode).
//
// Besides the core's message types, two nilext types travel in VR's
// numbering (MsgNilext, MsgNilextAck): the nilext fast path's client request
// and its acknowledgement, which the core exchanges with clients rather than
// peers, but which a coordinating node sends over the peer transport. The
// driver handles them; they never reach the core's Step.
//
// Payload adapts a message to the transport (frame.Payload); Decode turns a
// group's inbound frames back into messages and checks their addresses. A
// Writer batches many frames into one write; a Reader reads them back (tools
// and tests; the transport does its own).
//
// It imports only internal/vr, internal/frame and the standard library (no
// net, no os): the transport owns connections.
package wire

import (
	"encoding/binary"
	"fmt"

	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/vr"
)

// Errors callers branch on: the frame layer's, so a connection's reader
// classifies a codec failure and a framing failure alike.
var (
	// ErrCorrupt: a frame's checksum does not match, or its payload does
	// not decode. The connection should be dropped.
	ErrCorrupt = frame.ErrCorrupt
	// ErrTooLarge: a frame's length exceeds the reader's limit.
	ErrTooLarge = frame.ErrTooLarge
)

// version is the first payload byte; bump it when the layout changes.
// 2: the DLog section after the reason.
// 3: CAD header fields after HBSeq (Persisted, Applied, Readable, Grant,
// AckSeq); a prepare-ok's Op now means "received in memory", Persisted
// carries what Op meant before.
//
// A frame body (frame.Version 4) has version 3's fields without the two
// leading bytes.
const version = 3

// oldVersion is still decoded: a version-2 prepare-ok's Op was the sender's
// persisted prefix, so it decodes as Op = Persisted (the received prefix is
// at least that). Version-2 peers refuse version-3 payloads (ErrCorrupt),
// so a mixed group fails loudly rather than misreading acks.
const oldVersion = 2

// Nilext message types, outside the core's numbering (vr.MsgType values are
// the core's; these start far above them so the core can grow).
const (
	// MsgNilext carries one nilext update (DLog[0]) from its coordinator to
	// a replica; From is the coordinator, whom the ack goes back to.
	MsgNilext vr.MsgType = 64
	// MsgNilextAck carries acks of one replica (From) in one view (View),
	// Op = 1 if From leads that view; DLog holds the acked (Client, ReqNum)
	// pairs without data.
	MsgNilextAck vr.MsgType = 65
)

// IsNilext reports whether t is one of the nilext types (handled by the
// driver, not the core).
func IsNilext(t vr.MsgType) bool { return t == MsgNilext || t == MsgNilextAck }

// NilextAcksMessage packs acks that share sender, view and leader flag into
// one MsgNilextAck (the caller sets the identity fields and To).
func NilextAcksMessage(acks []vr.NilextAck) vr.Message {
	if len(acks) == 0 {
		panic("wire: NilextAcksMessage with no acks")
	}
	a0 := acks[0]
	m := vr.Message{Type: MsgNilextAck, From: a0.From, View: a0.View, DLog: make([]vr.NilextRequest, len(acks))}
	if a0.Leader {
		m.Op = 1
	}
	for i, a := range acks {
		if a.From != a0.From || a.View != a0.View || a.Leader != a0.Leader {
			panic(fmt.Sprintf("wire: NilextAcksMessage mixes acks %+v and %+v", a0, a))
		}
		m.DLog[i].Client, m.DLog[i].ReqNum = a.Client, a.ReqNum
	}
	return m
}

// NilextAcks unpacks a MsgNilextAck.
func NilextAcks(m *vr.Message) []vr.NilextAck {
	out := make([]vr.NilextAck, len(m.DLog))
	for i, q := range m.DLog {
		out[i] = vr.NilextAck{Client: q.Client, ReqNum: q.ReqNum, From: m.From, View: m.View, Leader: m.Op == 1}
	}
	return out
}

// AppendMessage appends the payload encoding of m to b: the version and
// type bytes, then the fields (appendFields).
func AppendMessage(b []byte, m *vr.Message) []byte {
	return appendFields(append(b, version, byte(m.Type)), m)
}

// appendFields appends m's fields in the current version's layout: the body
// of a frame, whose envelope carries the type (and whose envelope version
// implies this layout), or the rest of AppendMessage's payload.
func appendFields(b []byte, m *vr.Message) []byte {
	for _, v := range [...]uint64{m.Cluster, m.Epoch, m.ConfigHash, m.From, m.To, m.View,
		m.LastNormalView, m.Op, m.Commit, m.First, m.Nonce, m.HBSeq,
		m.Persisted, m.Applied, m.Readable, uint64(m.Grant), m.AckSeq} {
		b = binary.AppendUvarint(b, v)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Entries)))
	for i := range m.Entries {
		e := &m.Entries[i]
		b = binary.AppendUvarint(b, e.View)
		b = binary.AppendUvarint(b, e.Op)
		b = binary.AppendUvarint(b, e.Client)
		b = binary.AppendUvarint(b, e.ReqNum)
		b = binary.AppendUvarint(b, uint64(len(e.Data)))
		b = append(b, e.Data...)
	}
	if s := m.Snapshot; s == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.AppendUvarint(b, s.Op)
		b = kv.AppendClientEntries(b, s.Clients)
		b = binary.AppendUvarint(b, uint64(len(s.Data)))
		b = append(b, s.Data...)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Reason)))
	b = append(b, m.Reason...)
	b = binary.AppendUvarint(b, uint64(len(m.DLog)))
	for i := range m.DLog {
		q := &m.DLog[i]
		b = binary.AppendUvarint(b, q.Client)
		b = binary.AppendUvarint(b, q.ReqNum)
		b = binary.AppendUvarint(b, uint64(len(q.Data)))
		b = append(b, q.Data...)
		b = binary.AppendUvarint(b, uint64(len(q.Keys)))
		for _, k := range q.Keys {
			b = binary.AppendUvarint(b, uint64(len(k)))
			b = append(b, k...)
		}
		if q.Sync {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
	}
	if m.DLogStale {
		// An optional flags byte after the d-log, present only when set:
		// every other message keeps version 3's layout, and a peer too old
		// to know the flag refuses the message (trailing bytes) rather than
		// count a stale d-log as fresh.
		b = append(b, flagDLogStale)
	}
	return b
}

// flagDLogStale is the optional last byte of a do-view-change whose sender's
// d-log may lack updates it acknowledged (vr.Message.DLogStale).
const flagDLogStale = 1

// Payload adapts m to the transport: its frames carry VR's engine id and
// m's type in the envelope and m's fields (appendFields: AppendMessage's
// payload without the version and type bytes, which the envelope's version
// and type stand for) as the body. The conversion allocates nothing; the
// transport encodes before Send returns.
func Payload(m *vr.Message) frame.Payload { return (*payload)(m) }

type payload vr.Message

func (p *payload) Kind() (frame.Engine, uint8) { return frame.EngineVR, uint8(p.Type) }
func (p *payload) AppendBody(b []byte) []byte  { return appendFields(b, (*vr.Message)(p)) }

// AppendFrame appends m as one frame of group 0 (a node's only group) to b.
func AppendFrame(b []byte, m *vr.Message) []byte { return frame.AppendFrame(b, 0, Payload(m)) }

// AppendFrames appends m as frames of group 0 of at most max payload bytes
// (frame.AppendFrames).
func AppendFrames(b []byte, m *vr.Message, max int) []byte {
	return frame.AppendFrames(b, 0, Payload(m), max)
}

// DecodeFrame decodes a whole message's frame payload (envelope and body)
// into m; it must be VR's. The group is not checked.
func DecodeFrame(p []byte, m *vr.Message) error {
	fm, err := frame.Open(p)
	if err != nil {
		return err
	}
	return decodeBody(&fm, m)
}

func decodeBody(fm *frame.Message, m *vr.Message) error {
	if fm.Engine != frame.EngineVR {
		return fmt.Errorf("%w: a %v message for VR group %d", ErrCorrupt, fm.Engine, fm.Group)
	}
	return decodeFields(version, vr.MsgType(fm.Type), fm.Body, m)
}

// Decode turns one batch of a group's inbound frames, which came on the
// connection authenticated as node from to node self, into VR messages. A
// message that does not decode is ErrCorrupt; one whose From or To is not
// the connection's is frame.ErrSpoofed. Either means the connection's
// stream can no longer be trusted. The messages alias the frames' bodies.
func Decode(from, self uint64, in []frame.Message) ([]vr.Message, error) {
	msgs := make([]vr.Message, len(in))
	if err := DecodeTo(msgs, from, self, in); err != nil {
		return nil, err
	}
	return msgs, nil
}

// DecodeTo is Decode into msgs (len(msgs) == len(in)), which the caller
// owns: a host that reuses its batches decodes without an allocation for
// the messages themselves.
func DecodeTo(msgs []vr.Message, from, self uint64, in []frame.Message) error {
	if len(msgs) != len(in) {
		return fmt.Errorf("wire: %d frames decoded into %d messages", len(in), len(msgs))
	}
	for i := range in {
		m := &msgs[i]
		if err := decodeBody(&in[i], m); err != nil {
			return err
		}
		if m.From != from || m.To != self {
			return fmt.Errorf("%w: %s on the connection authenticated as node %d to node %d", frame.ErrSpoofed, m, from, self)
		}
	}
	return nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrCorrupt, what)
	}
}

func (d *decoder) uv(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// bytes returns the next length-prefixed field, aliasing the input.
func (d *decoder) bytes(what string) []byte {
	n := d.uv(what)
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail(what + " length")
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	if n == 0 {
		return nil
	}
	return p
}

// count reads a count of items that each take at least min bytes, so a
// corrupt count cannot make the decoder allocate more than the input justifies.
func (d *decoder) count(what string, min int) int {
	n := d.uv(what)
	if d.err == nil && n > uint64(len(d.b)/min) {
		d.fail(what + " count")
		return 0
	}
	return int(n)
}

// DecodeMessage decodes payload p into m (overwriting it). The byte slices
// in m (entry data, snapshot data, results) alias p: the caller must not
// reuse p while m is in use.
func DecodeMessage(p []byte, m *vr.Message) error {
	if len(p) < 2 {
		return fmt.Errorf("%w: short payload (%d bytes)", ErrCorrupt, len(p))
	}
	if p[0] != version && p[0] != oldVersion {
		return fmt.Errorf("%w: payload version %d, want %d", ErrCorrupt, p[0], version)
	}
	return decodeFields(p[0], vr.MsgType(p[1]), p[2:], m)
}

// decodeFields decodes the fields of a message of type typ laid out as in
// payload version ver.
func decodeFields(ver byte, typ vr.MsgType, body []byte, m *vr.Message) error {
	d := decoder{b: body}
	*m = vr.Message{Type: typ}
	if !m.Type.Valid() && !IsNilext(m.Type) {
		return fmt.Errorf("%w: unknown message type %d", ErrCorrupt, typ)
	}
	for _, f := range [...]*uint64{&m.Cluster, &m.Epoch, &m.ConfigHash, &m.From, &m.To, &m.View,
		&m.LastNormalView, &m.Op, &m.Commit, &m.First, &m.Nonce, &m.HBSeq} {
		*f = d.uv("header")
	}
	if ver == version {
		var grant uint64
		for _, f := range [...]*uint64{&m.Persisted, &m.Applied, &m.Readable, &grant, &m.AckSeq} {
			*f = d.uv("cad header")
		}
		m.Grant = int64(grant)
	} else if m.Type == vr.MsgPrepareOK {
		m.Persisted = m.Op
	}
	if n := d.count("entries", 5); n > 0 {
		m.Entries = make([]vr.Entry, n)
		for i := range m.Entries {
			e := &m.Entries[i]
			e.View, e.Op, e.Client, e.ReqNum = d.uv("entry view"), d.uv("entry op"), d.uv("entry client"), d.uv("entry reqnum")
			e.Data = d.bytes("entry data")
		}
	}
	if d.err == nil {
		if len(d.b) == 0 {
			d.fail("missing snapshot flag")
		} else {
			flag := d.b[0]
			d.b = d.b[1:]
			switch flag {
			case 0:
			case 1:
				s := &vr.Snapshot{Op: d.uv("snapshot op")}
				if d.err == nil {
					kd := kv.Decoder{B: d.b}
					s.Clients = kv.DecodeClientEntries(&kd)
					d.b = kd.B
					if kd.Err != nil {
						d.fail("snapshot clients")
					}
				}
				s.Data = d.bytes("snapshot data")
				m.Snapshot = s
			default:
				d.fail("snapshot flag")
			}
		}
	}
	m.Reason = string(d.bytes("reason"))
	if n := d.count("d-log", 5); n > 0 {
		m.DLog = make([]vr.NilextRequest, n)
		for i := range m.DLog {
			q := &m.DLog[i]
			q.Client, q.ReqNum = d.uv("d-log client"), d.uv("d-log reqnum")
			q.Data = d.bytes("d-log data")
			if k := d.count("d-log keys", 1); k > 0 {
				q.Keys = make([][]byte, k)
				for j := range q.Keys {
					q.Keys[j] = d.bytes("d-log key")
				}
			}
			switch {
			case d.err != nil:
			case len(d.b) == 0:
				d.fail("missing d-log sync flag")
			case d.b[0] > 1:
				d.fail("d-log sync flag")
			default:
				q.Sync = d.b[0] == 1
				d.b = d.b[1:]
			}
		}
	}
	if d.err == nil && len(d.b) == 1 && d.b[0] == flagDLogStale {
		m.DLogStale = true
		d.b = d.b[1:]
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		*m = vr.Message{}
		return d.err
	}
	return nil
}
