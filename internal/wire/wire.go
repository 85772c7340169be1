// Package wire is the binary encoding of peer messages (the VR core's
// vr.Message) and the framing that carries them over a byte stream.
//
// Encoding: hand-written, no reflection, no gob: a type byte, then the header
// fields as uvarints, then the entries, an optional snapshot, a reason
// string and the nilext durability log (Message.DLog), each length-prefixed.
//
// Besides the core's message types, two nilext types travel in the same
// frames (MsgNilext, MsgNilextAck): the nilext fast path's client request
// and its acknowledgement, which the core exchanges with clients rather than
// peers, but which a coordinating node sends over the peer transport. The
// driver handles them; they never reach the core's Step. Framing: every message travels in a frame
//
//	length (4 bytes, little endian) | CRC-32C of payload (4 bytes) | payload
//
// so a corrupted or truncated peer message is rejected (ErrCorrupt) instead of
// being decoded into something plausible. A message whose payload exceeds the
// frame limit (a snapshot of a large state) travels as fragments: consecutive
// frames whose payloads start with a fragment marker instead of the version
// byte (AppendFrames; a Joiner puts them back together). A Writer batches many
// frames into one write; a Reader reads them back.
//
// It imports only internal/vr and the standard library (no net, no os): the
// transport owns connections.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/kefirdb/kefir/internal/vr"
)

// Errors callers branch on.
var (
	// ErrCorrupt: the frame's checksum does not match, or its payload does
	// not decode. The connection should be dropped.
	ErrCorrupt = errors.New("wire: corrupt message")
	// ErrTooLarge: a frame's length exceeds the reader's limit.
	ErrTooLarge = errors.New("wire: frame too large")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// FrameHeader is the size of a frame's header.
const FrameHeader = 8

// version is the first payload byte; bump it when the layout changes.
// 2: the DLog section after the reason.
// 3: CAD header fields after HBSeq (Persisted, Applied, Readable, Grant,
// AckSeq); a prepare-ok's Op now means "received in memory", Persisted
// carries what Op meant before.
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

// AppendMessage appends the payload encoding of m to b.
func AppendMessage(b []byte, m *vr.Message) []byte {
	b = append(b, version, byte(m.Type))
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
		b = binary.AppendUvarint(b, uint64(len(s.Clients)))
		for _, c := range s.Clients {
			b = binary.AppendUvarint(b, c.Client)
			b = binary.AppendUvarint(b, c.ReqNum)
			b = binary.AppendUvarint(b, c.Op)
			b = binary.AppendUvarint(b, uint64(len(c.Result)))
			b = append(b, c.Result...)
		}
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

// AppendFrame appends m as one frame (header and payload) to b.
func AppendFrame(b []byte, m *vr.Message) []byte {
	start := len(b)
	b = append(b, make([]byte, FrameHeader)...)
	b = AppendMessage(b, m)
	payload := b[start+FrameHeader:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(payload, castagnoli))
	return b
}

// Fragment markers: the first payload byte of a fragment frame, where an
// ordinary frame has the version byte. The rest of the payload is the next
// piece of one message's payload; fragLast ends it.
const (
	fragMore byte = 0xF0
	fragLast byte = 0xF1
)

// AppendFrames appends m to b as one frame if its payload fits in max bytes,
// else as fragment frames of at most max payload bytes each, in order. Only
// an oversized message pays for the split (a copy of its payload).
func AppendFrames(b []byte, m *vr.Message, max int) []byte {
	if max < 2 {
		panic(fmt.Sprintf("wire: frame limit %d leaves no room for a fragment", max))
	}
	start := len(b)
	b = AppendFrame(b, m)
	if len(b)-start-FrameHeader <= max {
		return b
	}
	payload := append([]byte(nil), b[start+FrameHeader:]...)
	b = b[:start]
	for off := 0; off < len(payload); {
		end := min(off+max-1, len(payload))
		kind := fragMore
		if end == len(payload) {
			kind = fragLast
		}
		fs := len(b)
		b = append(b, make([]byte, FrameHeader)...)
		b = append(b, kind)
		b = append(b, payload[off:end]...)
		piece := b[fs+FrameHeader:]
		binary.LittleEndian.PutUint32(b[fs:], uint32(len(piece)))
		binary.LittleEndian.PutUint32(b[fs+4:], crc32.Checksum(piece, castagnoli))
		off = end
	}
	return b
}

// Joiner puts fragmented messages back together from a stream's frame
// payloads, in order. The zero value refuses nothing but an ordinary frame
// inside a fragmented message; Max bounds a joined message (0: no bound).
type Joiner struct {
	Max  int64
	buf  []byte
	open bool
}

// Add takes the next frame's payload. It returns a whole message payload
// and true for an ordinary frame (the payload itself) or a message's last
// fragment (the joined payload, which the caller then owns), and false for
// any other fragment. Errors (ErrCorrupt, ErrTooLarge) mean the stream's
// framing is lost.
func (j *Joiner) Add(payload []byte) ([]byte, bool, error) {
	kind := byte(0)
	if len(payload) > 0 {
		kind = payload[0]
	}
	if kind != fragMore && kind != fragLast {
		if j.open {
			return nil, false, fmt.Errorf("%w: an ordinary frame inside a fragmented message", ErrCorrupt)
		}
		return payload, true, nil
	}
	if j.Max > 0 && int64(len(j.buf))+int64(len(payload)-1) > j.Max {
		return nil, false, fmt.Errorf("%w: fragmented message over %d bytes", ErrTooLarge, j.Max)
	}
	j.buf = append(j.buf, payload[1:]...)
	j.open = true
	if kind == fragMore {
		return nil, false, nil
	}
	whole := j.buf
	j.buf, j.open = nil, false
	return whole, true, nil
}

// Pending is how many bytes of an unfinished fragmented message it holds.
func (j *Joiner) Pending() int { return len(j.buf) }

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
	d := decoder{b: p}
	if len(p) < 2 {
		return fmt.Errorf("%w: short payload (%d bytes)", ErrCorrupt, len(p))
	}
	if p[0] != version && p[0] != oldVersion {
		return fmt.Errorf("%w: payload version %d, want %d", ErrCorrupt, p[0], version)
	}
	*m = vr.Message{Type: vr.MsgType(p[1])}
	if !m.Type.Valid() && !IsNilext(m.Type) {
		return fmt.Errorf("%w: unknown message type %d", ErrCorrupt, p[1])
	}
	d.b = p[2:]
	for _, f := range [...]*uint64{&m.Cluster, &m.Epoch, &m.ConfigHash, &m.From, &m.To, &m.View,
		&m.LastNormalView, &m.Op, &m.Commit, &m.First, &m.Nonce, &m.HBSeq} {
		*f = d.uv("header")
	}
	if p[0] == version {
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
				if n := d.count("clients", 4); n > 0 {
					s.Clients = make([]vr.ClientRecord, n)
					for i := range s.Clients {
						c := &s.Clients[i]
						c.Client, c.ReqNum, c.Op = d.uv("client"), d.uv("client reqnum"), d.uv("client op")
						c.Result = d.bytes("client result")
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

// CheckFrame validates the frame at the start of b and returns its payload
// and total length. It returns (nil, 0, nil) if b holds less than a whole
// frame, ErrTooLarge if the frame exceeds max, ErrCorrupt on a bad checksum.
func CheckFrame(b []byte, max int) (payload []byte, n int, err error) {
	if len(b) < FrameHeader {
		return nil, 0, nil
	}
	size := binary.LittleEndian.Uint32(b)
	if uint64(size) > uint64(max) {
		return nil, 0, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, size, max)
	}
	if len(b)-FrameHeader < int(size) {
		return nil, 0, nil
	}
	payload = b[FrameHeader : FrameHeader+int(size)]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(b[4:]) {
		return nil, 0, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return payload, FrameHeader + int(size), nil
}
