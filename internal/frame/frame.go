// Package frame is the engine-neutral peer wire: the framing that carries
// messages over a byte stream and the envelope that addresses each message to
// a replica group and names its engine and type. What a message says is its
// engine's business (VR's codec is internal/wire); this package and the
// transport move opaque, group-addressed payloads.
//
// Framing: every frame is
//
//	length (4 bytes, little endian) | CRC-32C of payload (4 bytes) | payload
//
// so a corrupted or truncated peer message is rejected (ErrCorrupt) instead of
// being decoded into something plausible. A whole message's payload is
//
//	Version (1 byte) | engine (1 byte) | type (1 byte) | group (uvarint) | body
//
// where body is the engine codec's encoding. A message whose payload exceeds
// the frame limit (a snapshot of a large state) travels as fragments:
// consecutive frames whose payloads start with a fragment marker instead of
// the version byte (AppendFrames; a Joiner puts them back together). The
// envelope is in the joined payload, so fragments of one message are
// consecutive on a stream and carry no address of their own.
//
// Peer protocol 1 (before groups) had no envelope: its payloads started
// with VR's codec version (2 or 3). The handshake refuses such a peer
// (internal/transport/handshake.go), and Open refuses such a payload should
// one ever arrive, so nothing is misparsed; a rolling upgrade across this
// change is not possible.
//
// It imports only the standard library.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Errors callers branch on.
var (
	// ErrCorrupt: a frame's checksum does not match, or its payload does
	// not decode. The connection should be dropped.
	ErrCorrupt = errors.New("wire: corrupt message")
	// ErrTooLarge: a frame's length exceeds the reader's limit.
	ErrTooLarge = errors.New("wire: frame too large")
	// ErrSpoofed: a message does not carry the addresses of the
	// authenticated connection it came on (an engine's codec checks them).
	ErrSpoofed = errors.New("transport: message with a forged or misdirected address")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// FrameHeader is the size of a frame's header.
const FrameHeader = 8

// DefaultMaxFrame bounds one frame (a larger message travels as fragments:
// AppendFrames).
const DefaultMaxFrame = 256 << 20

// Version is the first byte of a whole message's payload: the envelope's
// layout. 2 and 3 were VR's codec versions when payloads had no envelope
// (peer protocol 1); 4 is the first envelope.
const Version byte = 4

// Engine names the replication engine whose codec encodes a message body.
type Engine uint8

// Engines. A group runs one engine; a message for a group in another
// engine's numbering is a protocol error.
const (
	EngineVR Engine = 1
	// EngineChain: chain replication (internal/chain; codec
	// internal/chainwire).
	EngineChain Engine = 2
)

func (e Engine) String() string {
	switch e {
	case EngineVR:
		return "vr"
	case EngineChain:
		return "chain"
	}
	return fmt.Sprintf("engine(%d)", uint8(e))
}

// Payload is one outbound message as its engine encodes it. Kind and
// AppendBody are called while the transport holds the peer's queue: they
// must be quick and must not call the transport.
type Payload interface {
	// Kind is the message's engine and type (the engine's numbering).
	Kind() (Engine, uint8)
	// AppendBody appends the engine codec's encoding of the message to b.
	AppendBody(b []byte) []byte
}

// Message is one inbound message: its envelope and its body, which the
// group's engine decodes. Body aliases the bytes the transport read; the
// receiver owns them.
type Message struct {
	Group  uint64
	Engine Engine
	Type   uint8
	Body   []byte
}

// Fragment markers: the first payload byte of a fragment frame, where an
// ordinary frame has the version byte. The rest of the payload is the next
// piece of one message's payload; fragLast ends it.
const (
	fragMore byte = 0xF0
	fragLast byte = 0xF1
)

// AppendFrame appends p, addressed to group, as one frame (header and
// payload) to b, whatever its size.
func AppendFrame(b []byte, group uint64, p Payload) []byte {
	start := len(b)
	b = append(b, make([]byte, FrameHeader)...)
	engine, typ := p.Kind()
	if group < 0x80 { // one uvarint byte: the common case, in one append
		b = append(b, Version, byte(engine), typ, byte(group))
	} else {
		b = append(b, Version, byte(engine), typ)
		b = binary.AppendUvarint(b, group)
	}
	b = p.AppendBody(b)
	payload := b[start+FrameHeader:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(payload, castagnoli))
	return b
}

// AppendFrames appends p to b as one frame if its payload fits in max bytes,
// else as fragment frames of at most max payload bytes each, in order. Only
// an oversized message pays for the split (a copy of its payload).
func AppendFrames(b []byte, group uint64, p Payload, max int) []byte {
	if max < 2 {
		panic(fmt.Sprintf("frame: frame limit %d leaves no room for a fragment", max))
	}
	start := len(b)
	b = AppendFrame(b, group, p)
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

// Open splits a whole message's payload (a frame's, or one a Joiner put
// together) into its envelope and body; Body aliases payload.
func Open(payload []byte) (Message, error) {
	if len(payload) < 4 {
		return Message{}, fmt.Errorf("%w: short payload (%d bytes)", ErrCorrupt, len(payload))
	}
	if payload[0] != Version {
		if payload[0] == 2 || payload[0] == 3 {
			return Message{}, fmt.Errorf("%w: a peer-protocol-1 payload (VR codec version %d, no group envelope) from a node of an older Kefir version", ErrCorrupt, payload[0])
		}
		return Message{}, fmt.Errorf("%w: envelope version %d, want %d", ErrCorrupt, payload[0], Version)
	}
	group, n := binary.Uvarint(payload[3:])
	if n <= 0 {
		return Message{}, fmt.Errorf("%w: bad group id", ErrCorrupt)
	}
	return Message{Group: group, Engine: Engine(payload[1]), Type: payload[2], Body: payload[3+n:]}, nil
}

// PeekGroup returns the group a message's payload, or its first fragment's,
// is addressed to, if the bytes at hand (possibly only the start of the
// payload) say so.
func PeekGroup(payloadStart []byte) (uint64, bool) {
	p := payloadStart
	if len(p) > 0 && (p[0] == fragMore || p[0] == fragLast) {
		p = p[1:]
	}
	if len(p) < 4 || p[0] != Version {
		return 0, false
	}
	group, n := binary.Uvarint(p[3:])
	return group, n > 0
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

// PendingGroup is the group of the unfinished fragmented message, if its
// first fragment said.
func (j *Joiner) PendingGroup() (uint64, bool) { return PeekGroup(j.buf) }

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
