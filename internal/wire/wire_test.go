package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/vr"
)

func sample() []vr.Message {
	hdr := vr.Message{Cluster: 7, Epoch: 3, ConfigHash: 0xdeadbeefcafef00d, From: 1, To: 2, View: 9}
	with := func(f func(*vr.Message)) vr.Message { m := hdr; f(&m); return m }
	entries := []vr.Entry{
		{View: 9, Op: 41, Request: vr.Request{Client: 100, ReqNum: 5, Data: []byte("set k v")}},
		{View: 9, Op: 42, Request: vr.Request{Client: 0, ReqNum: 0, Data: nil}},
		{View: 8, Op: 43, Request: vr.Request{Client: 1 << 63, ReqNum: 1<<64 - 1, Data: bytes.Repeat([]byte{0xff}, 300)}},
	}
	dlog := []vr.NilextRequest{
		{Request: vr.Request{Client: 100, ReqNum: 6, Data: []byte("set a 1")}, Keys: [][]byte{[]byte("a")}, Sync: true},
		{Request: vr.Request{Client: 1 << 62, ReqNum: 1, Data: []byte("mset b 2 c 3")}, Keys: [][]byte{[]byte("b"), []byte("c")}},
	}
	return []vr.Message{
		with(func(m *vr.Message) { m.Type, m.Op, m.Commit, m.First, m.Entries = vr.MsgPrepare, 43, 40, 41, entries }),
		with(func(m *vr.Message) {
			m.Type, m.LastNormalView, m.Op, m.Commit, m.First, m.Entries, m.DLog = vr.MsgDoViewChange, 8, 43, 40, 41, entries, dlog
		}),
		with(func(m *vr.Message) {
			m.Type, m.LastNormalView, m.Op, m.DLog, m.DLogStale = vr.MsgDoViewChange, 8, 43, dlog, true
		}),
		with(func(m *vr.Message) { m.Type, m.LastNormalView, m.DLogStale = vr.MsgDoViewChange, 8, true }),
		with(func(m *vr.Message) { m.Type, m.Nonce, m.DLog = vr.MsgRecoveryResponse, 0x1234567890, dlog }),
		with(func(m *vr.Message) { m.Type, m.DLog = MsgNilext, dlog[:1] }),
		with(func(m *vr.Message) {
			*m = NilextAcksMessage([]vr.NilextAck{{Client: 100, ReqNum: 6, From: 1, View: 9, Leader: true}, {Client: 7, ReqNum: 1, From: 1, View: 9, Leader: true}})
			m.Cluster, m.Epoch, m.ConfigHash, m.To = hdr.Cluster, hdr.Epoch, hdr.ConfigHash, hdr.To
		}),
		with(func(m *vr.Message) {
			m.Type, m.Op, m.HBSeq, m.Persisted, m.Applied, m.AckSeq = vr.MsgPrepareOK, 43, 17, 41, 40, 1<<62+5
		}),
		with(func(m *vr.Message) {
			m.Type, m.Op, m.Commit, m.HBSeq, m.Readable, m.Grant, m.AckSeq = vr.MsgCommit, 43, 43, 18, 40, 100_000_000, 1<<62+5
		}),
		with(func(m *vr.Message) { m.Type = vr.MsgStartViewChange }),
		with(func(m *vr.Message) {
			m.Type, m.LastNormalView, m.Op, m.Commit, m.First, m.Entries = vr.MsgDoViewChange, 8, 43, 40, 41, entries
		}),
		with(func(m *vr.Message) { m.Type, m.Op, m.Commit, m.First, m.Entries = vr.MsgStartView, 43, 40, 41, entries }),
		with(func(m *vr.Message) { m.Type, m.Nonce, m.Op = vr.MsgRecovery, 0x1234567890, 12 }),
		with(func(m *vr.Message) { m.Type, m.Nonce = vr.MsgRecoveryResponse, 0x1234567890 }),
		with(func(m *vr.Message) { m.Type, m.Op = vr.MsgGetState, 12 }),
		with(func(m *vr.Message) {
			m.Type, m.Op, m.Commit, m.First, m.Entries = vr.MsgNewState, 43, 43, 41, entries
			m.Snapshot = &vr.Snapshot{Op: 40, Data: []byte("state"), Clients: []vr.ClientRecord{
				{Client: 100, ReqNum: 4, Op: 39, Result: []byte("OK")}, {Client: 101, ReqNum: 1, Op: 2}}}
		}),
		with(func(m *vr.Message) { m.Type, m.Reason = vr.MsgRefuse, "config epoch 2, ours is 3" }),
		// Reconfiguration (vr/reconfig.go): a joining member's pull is a
		// get-state with Nonce 1; a start-epoch carries the configuration
		// in Entries[0].
		with(func(m *vr.Message) { m.Type, m.Op, m.Nonce = vr.MsgGetState, 12, 1 }),
		with(func(m *vr.Message) {
			m.Type, m.Op = vr.MsgStartEpoch, 41
			m.Entries = []vr.Entry{{Request: vr.Request{Client: 1<<64 - 1, ReqNum: 3, Data: []byte("vr-reconfig\x03\x01\x02\x04\x03\x01\x02\x03")}}}
		}),
		with(func(m *vr.Message) { m.Type, m.Op = vr.MsgEpochStarted, 41 }),
	}
}

// TestRoundTrip: every message type survives encode → frame → decode intact.
func TestRoundTrip(t *testing.T) {
	for _, m := range sample() {
		t.Run(m.Type.String(), func(t *testing.T) {
			fr := AppendFrame(nil, &m)
			payload, n, err := frame.CheckFrame(fr, frame.DefaultMaxFrame)
			if err != nil || n != len(fr) {
				t.Fatalf("CheckFrame: n=%d of %d, err=%v", n, len(fr), err)
			}
			var got vr.Message
			if err := DecodeFrame(payload, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip changed the message:\n got %+v\nwant %+v", got, m)
			}
		})
	}
}

// TestStreamBatches: a Writer's frames come back in order through a Reader,
// across arbitrary read boundaries.
func TestStreamBatches(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	msgs := sample()
	for i := range msgs {
		w.Append(&msgs[i])
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&oneByteReader{r: &buf})
	for i := range msgs {
		var got vr.Message
		if err := r.Read(&got); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, msgs[i]) {
			t.Fatalf("message %d differs", i)
		}
	}
	var m vr.Message
	if err := r.Read(&m); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

type oneByteReader struct{ r io.Reader }

func (o *oneByteReader) Read(p []byte) (int, error) { return o.r.Read(p[:min(1, len(p))]) }

// TestCorruptionRejected: flipping any single bit of a frame (header or
// payload) never yields a message: the checksum or the length check refuses it.
func TestCorruptionRejected(t *testing.T) {
	m := sample()[0]
	fr := AppendFrame(nil, &m)
	for i := 0; i < len(fr)*8; i++ {
		bad := append([]byte(nil), fr...)
		bad[i/8] ^= 1 << (i % 8)
		payload, n, err := frame.CheckFrame(bad, frame.DefaultMaxFrame)
		if err == nil && n > 0 {
			var got vr.Message
			if DecodeFrame(payload, &got) == nil {
				t.Fatalf("bit %d flipped: frame still accepted as %v", i, got)
			}
		}
	}
}

// TestTruncatedStream: a stream that ends inside a frame is an error, not a
// silently shorter message.
func TestTruncatedStream(t *testing.T) {
	m := sample()[0]
	fr := AppendFrame(nil, &m)
	r := NewReader(bytes.NewReader(fr[:len(fr)-3]))
	var got vr.Message
	if err := r.Read(&got); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v, want unexpected EOF", err)
	}
}

// TestTooLarge: a length beyond the limit is refused before any allocation.
func TestTooLarge(t *testing.T) {
	m := sample()[0]
	fr := AppendFrame(nil, &m)
	r := NewReader(bytes.NewReader(fr))
	r.Max = 10
	var got vr.Message
	if err := r.Read(&got); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if err := r.Read(&got); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a sick reader must stay sick, got %v", err)
	}
}

// TestDecodeRejectsGarbage: bad version, unknown type, huge counts, trailing
// bytes.
func TestDecodeRejectsGarbage(t *testing.T) {
	m := sample()[0]
	good := AppendMessage(nil, &m)
	cases := map[string][]byte{
		"empty":       {},
		"version":     append([]byte{9}, good[1:]...),
		"type":        append([]byte{version, 200}, good[2:]...),
		"trailing":    append(append([]byte(nil), good...), 0),
		"truncated":   good[:len(good)-1],
		"huge count":  append(append([]byte{version, byte(vr.MsgPrepare)}, bytes.Repeat([]byte{0}, 17)...), 0xff, 0xff, 0xff, 0xff, 0x0f),
		"bad varint":  append([]byte{version, byte(vr.MsgPrepare)}, bytes.Repeat([]byte{0xff}, 16)...),
		"no snapflag": append(append([]byte{version, byte(vr.MsgCommit)}, bytes.Repeat([]byte{0}, 17)...), 0),
		"old huge":    append(append([]byte{oldVersion, byte(vr.MsgPrepare)}, bytes.Repeat([]byte{0}, 12)...), 0xff, 0xff, 0xff, 0xff, 0x0f),
		"version 1":   append([]byte{1}, good[1:]...),
	}
	for name, p := range cases {
		var got vr.Message
		if err := DecodeMessage(p, &got); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
}

// TestNilextAcksPack: acks survive packing into a message and the wire.
func TestNilextAcksPack(t *testing.T) {
	acks := []vr.NilextAck{{Client: 5, ReqNum: 9, From: 3, View: 4}, {Client: 6, ReqNum: 1, From: 3, View: 4}}
	m := NilextAcksMessage(acks)
	var got vr.Message
	if err := DecodeMessage(AppendMessage(nil, &m), &got); err != nil {
		t.Fatal(err)
	}
	if back := NilextAcks(&got); !reflect.DeepEqual(back, acks) {
		t.Fatalf("acks changed: got %+v want %+v", back, acks)
	}
	acks[1].Leader = true
	defer func() {
		if recover() == nil {
			t.Fatal("acks with different leader flags packed into one message")
		}
	}()
	NilextAcksMessage(acks)
}

// TestDecodeRejectsBadDLog: a d-log sync flag other than 0/1 and a missing
// one are corrupt, not silently accepted.
func TestDecodeRejectsBadDLog(t *testing.T) {
	m := sample()[1]
	good := AppendMessage(nil, &m)
	bad := append([]byte(nil), good...)
	bad[len(bad)-1] = 2
	for name, p := range map[string][]byte{"flag": bad, "missing": good[:len(good)-1]} {
		var got vr.Message
		if err := DecodeMessage(p, &got); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: got %v, want ErrCorrupt", name, err)
		}
	}
}

func randomMessage(rng *rand.Rand) vr.Message {
	u := func() uint64 {
		switch rng.IntN(3) {
		case 0:
			return rng.Uint64N(128)
		case 1:
			return rng.Uint64N(1 << 20)
		}
		return rng.Uint64()
	}
	bs := func() []byte {
		if rng.IntN(3) == 0 {
			return nil
		}
		b := make([]byte, 1+rng.IntN(40))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	typ := vr.MsgType(1 + rng.IntN(11))
	if rng.IntN(6) == 0 {
		typ = MsgNilext + vr.MsgType(rng.IntN(2))
	}
	m := vr.Message{Type: typ, Cluster: u(), Epoch: u(), ConfigHash: u(), From: u(), To: u(),
		View: u(), LastNormalView: u(), Op: u(), Commit: u(), First: u(), Nonce: u(), HBSeq: u(),
		Persisted: u(), Applied: u(), Readable: u(), Grant: int64(u()), AckSeq: u()}
	for i := rng.IntN(5); i > 0; i-- {
		m.Entries = append(m.Entries, vr.Entry{View: u(), Op: u(), Request: vr.Request{Client: u(), ReqNum: u(), Data: bs()}})
	}
	if rng.IntN(3) == 0 {
		s := &vr.Snapshot{Op: u(), Data: bs()}
		for i := rng.IntN(3); i > 0; i-- {
			s.Clients = append(s.Clients, vr.ClientRecord{Client: u(), ReqNum: u(), Op: u(), Result: bs()})
		}
		m.Snapshot = s
	}
	if rng.IntN(4) == 0 {
		m.Reason = fmt.Sprintf("reason %d", rng.IntN(1000))
	}
	for i := rng.IntN(4); i > 0 && rng.IntN(2) == 0; i-- {
		q := vr.NilextRequest{Request: vr.Request{Client: u(), ReqNum: u(), Data: bs()}, Sync: rng.IntN(2) == 0}
		for k := rng.IntN(3); k > 0; k-- {
			q.Keys = append(q.Keys, append(bs(), 'k'))
		}
		m.DLog = append(m.DLog, q)
	}
	return m
}

// TestRandomRoundTrip: 5000 random messages round-trip exactly.
func TestRandomRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 5000; i++ {
		m := randomMessage(rng)
		var got vr.Message
		if err := DecodeMessage(AppendMessage(nil, &m), &got); err != nil {
			t.Fatalf("#%d: %v", i, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Fatalf("#%d differs:\n got %+v\nwant %+v", i, got, m)
		}
	}
}

// FuzzDecode: arbitrary payloads never panic, and whatever decodes
// re-encodes to a payload that decodes to the same message.
func FuzzDecode(f *testing.F) {
	for _, m := range sample() {
		f.Add(AppendMessage(nil, &m))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		var m vr.Message
		if err := DecodeMessage(p, &m); err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error not ErrCorrupt: %v", err)
			}
			return
		}
		var again vr.Message
		if err := DecodeMessage(AppendMessage(nil, &m), &again); err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !reflect.DeepEqual(m, again) {
			t.Fatalf("re-encoding changed the message")
		}
	})
}

// FuzzFrames: arbitrary byte streams through a Reader never panic and only
// yield messages from intact frames.
func FuzzFrames(f *testing.F) {
	var seed []byte
	for _, m := range sample() {
		seed = AppendFrame(seed, &m)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Fuzz(func(t *testing.T, p []byte) {
		r := NewReader(bytes.NewReader(p))
		r.Max = 1 << 16
		for i := 0; i < 100; i++ {
			var m vr.Message
			if err := r.Read(&m); err != nil {
				return
			}
		}
	})
}

func benchPrepare(n, size int) vr.Message {
	m := vr.Message{Type: vr.MsgPrepare, Cluster: 7, Epoch: 1, ConfigHash: 0xabcdef0123456789, From: 1, To: 2,
		View: 3, Op: 1000 + uint64(n), Commit: 990, First: 1001}
	for i := 0; i < n; i++ {
		m.Entries = append(m.Entries, vr.Entry{View: 3, Op: 1001 + uint64(i),
			Request: vr.Request{Client: 12345678, ReqNum: uint64(i), Data: make([]byte, size)}})
	}
	return m
}

// Benchmarks: go test -run - -bench . -benchmem ./internal/wire/
// A prepare of 64 entries of 160 bytes (a 16-byte key and 128-byte value plus
// framing) is the batch a busy leader sends.
func BenchmarkEncodePrepare64(b *testing.B) {
	m := benchPrepare(64, 160)
	buf := AppendFrame(nil, &m)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendFrame(buf[:0], &m)
	}
}

func BenchmarkDecodePrepare64(b *testing.B) {
	m := benchPrepare(64, 160)
	fr := AppendFrame(nil, &m)
	b.SetBytes(int64(len(fr)))
	b.ReportAllocs()
	var got vr.Message
	for b.Loop() {
		payload, _, err := frame.CheckFrame(fr, frame.DefaultMaxFrame)
		if err != nil {
			b.Fatal(err)
		}
		if err := DecodeFrame(payload, &got); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHeartbeatRoundTrip(b *testing.B) {
	m := vr.Message{Type: vr.MsgCommit, Cluster: 7, Epoch: 1, ConfigHash: 0xabcdef0123456789, From: 1, To: 2, View: 3, Op: 100000, Commit: 99990, HBSeq: 5000}
	var buf []byte
	var got vr.Message
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendFrame(buf[:0], &m)
		payload, _, _ := frame.CheckFrame(buf, frame.DefaultMaxFrame)
		if err := DecodeFrame(payload, &got); err != nil {
			b.Fatal(err)
		}
	}
}

// TestDecodesVersion2: payloads written by the version-2 encoder (golden
// bytes from commit 5b37bdc's AppendMessage) still decode, and a version-2
// prepare-ok's Op, which then meant "persisted", lands in Persisted too, so
// the commit point never counts an old follower's unsynced entries.
func TestDecodesVersion2(t *testing.T) {
	hdr := vr.Message{Cluster: 7, Epoch: 3, ConfigHash: 0xdeadbeefcafef00d, View: 9}
	cases := []struct {
		hex  string
		want vr.Message
	}{
		{"020207038de0fbd7fcddefd6de01020109002b0000001100000000", func() vr.Message {
			m := hdr
			m.Type, m.From, m.To, m.Op, m.Persisted, m.HBSeq = vr.MsgPrepareOK, 2, 1, 43, 43, 17
			return m
		}()},
		{"020307038de0fbd7fcddefd6de01010209002b2800001200000000", func() vr.Message {
			m := hdr
			m.Type, m.From, m.To, m.Op, m.Commit, m.HBSeq = vr.MsgCommit, 1, 2, 43, 40, 18
			return m
		}()},
		{"020107038de0fbd7fcddefd6de01010209002928290000010929640507736574206b2076000000", func() vr.Message {
			m := hdr
			m.Type, m.From, m.To, m.Op, m.Commit, m.First = vr.MsgPrepare, 1, 2, 41, 40, 41
			m.Entries = []vr.Entry{{View: 9, Op: 41, Request: vr.Request{Client: 100, ReqNum: 5, Data: []byte("set k v")}}}
			return m
		}()},
	}
	for _, tc := range cases {
		p, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatal(err)
		}
		var got vr.Message
		if err := DecodeMessage(p, &got); err != nil {
			t.Fatalf("%s: %v", tc.want.Type, err)
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Fatalf("%s:\n got %+v\nwant %+v", tc.want.Type, got, tc.want)
		}
		if again := AppendMessage(nil, &got); again[0] != version {
			t.Fatalf("re-encoded as version %d, want %d", again[0], version)
		}
	}
}

// bigSnapshot is a new-state message whose snapshot is size bytes.
func bigSnapshot(size int) vr.Message {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	return vr.Message{Type: vr.MsgNewState, Cluster: 9, From: 1, To: 2, View: 3, Op: 40, First: 31,
		Snapshot: &vr.Snapshot{Op: 30, Clients: []vr.ClientRecord{{Client: 5, ReqNum: 6, Op: 7, Result: []byte("r")}}, Data: data}}
}

// TestAMessageOverTheFrameLimitTravelsAsFragments: AppendFrames keeps a
// message that fits as the very frame AppendFrame writes, and cuts a larger
// one into frames none of which exceeds the limit; a Reader with that limit
// gets the message back whole, between ordinary ones.
func TestAMessageOverTheFrameLimitTravelsAsFragments(t *testing.T) {
	const max = 1000
	small := sample()[0]
	if got, want := AppendFrames(nil, &small, max), AppendFrame(nil, &small); !bytes.Equal(got, want) {
		t.Fatal("a message that fits must be one ordinary frame")
	}
	big := bigSnapshot(10_000)
	var stream []byte
	stream = AppendFrames(stream, &small, max)
	stream = AppendFrames(stream, &big, max)
	stream = AppendFrames(stream, &small, max)
	frames := 0
	for rest := stream; len(rest) > 0; frames++ {
		_, n, err := frame.CheckFrame(rest, max)
		if err != nil || n == 0 {
			t.Fatalf("frame %d: %v (n %d): every frame must fit the limit", frames, err, n)
		}
		rest = rest[n:]
	}
	if frames < 2+10_000/max {
		t.Fatalf("%d frames: the snapshot was not split", frames)
	}
	r := NewReader(&oneByteReader{bytes.NewReader(stream)})
	r.Max = max
	for i, want := range []vr.Message{small, big, small} {
		var got vr.Message
		if err := r.Read(&got); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if got.String() != want.String() || (want.Snapshot != nil && !bytes.Equal(got.Snapshot.Data, want.Snapshot.Data)) {
			t.Fatalf("message %d: got %v, want %v", i, got, want)
		}
	}
}

// TestJoinerRefusesABrokenFragmentStream: an ordinary frame inside a
// fragmented message, and a joined message over the bound, lose the framing.
func TestJoinerRefusesABrokenFragmentStream(t *testing.T) {
	big := bigSnapshot(5000)
	frames := AppendFrames(nil, &big, 1000)
	first, n, err := frame.CheckFrame(frames, 1000)
	if err != nil || n == 0 {
		t.Fatal(err)
	}
	small := sample()[0]
	ordinary := AppendMessage(nil, &small)

	j := frame.Joiner{}
	if _, ok, err := j.Add(first); ok || err != nil {
		t.Fatalf("a first fragment is not a message: ok %v, err %v", ok, err)
	}
	if _, _, err := j.Add(ordinary); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("an ordinary frame inside a fragmented message: got %v, want ErrCorrupt", err)
	}

	j = frame.Joiner{Max: 3000}
	var got error
	for rest := frames; len(rest) > 0 && got == nil; {
		p, n, _ := frame.CheckFrame(rest, 1000)
		rest = rest[n:]
		_, _, got = j.Add(p)
	}
	if !errors.Is(got, ErrTooLarge) {
		t.Fatalf("a joined message over Max: got %v, want ErrTooLarge", got)
	}
}

// BenchmarkAppendFramesSnapshot: what encoding a snapshot costs its sender
// (vrshard encodes large state messages off its driver goroutine for this:
// snapshot.go largeMessage). One frame, and cut into 16 MiB fragments.
func BenchmarkAppendFramesSnapshot(b *testing.B) {
	m := bigSnapshot(64 << 20)
	for _, tc := range []struct {
		name string
		max  int
	}{{"one-frame", frame.DefaultMaxFrame}, {"fragments-16MiB", 16 << 20}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(m.Snapshot.Data)))
			for b.Loop() {
				_ = AppendFrames(nil, &m, tc.max)
			}
		})
	}
}

// TestDecodeChecksEnvelopeAndAddresses: a group's batch decodes only if
// every message is VR's, of a known type, and it comes
// from the connection's peer to us; a peer-protocol-1 payload (no envelope)
// is refused, never misparsed.
func TestDecodeChecksEnvelopeAndAddresses(t *testing.T) {
	open := func(b []byte) frame.Message {
		t.Helper()
		p, _, err := frame.CheckFrame(b, frame.DefaultMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		m, err := frame.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	msgs := sample()
	var in []frame.Message
	for i := range msgs {
		in = append(in, open(frame.AppendFrame(nil, 7, Payload(&msgs[i]))))
		if in[i].Group != 7 || in[i].Engine != frame.EngineVR || in[i].Type != uint8(msgs[i].Type) {
			t.Fatalf("envelope %+v for %v", in[i], msgs[i])
		}
	}
	got, err := Decode(1, 2, in)
	if err != nil || !reflect.DeepEqual(got, msgs) {
		t.Fatalf("Decode: %v", err)
	}
	if _, err := Decode(3, 2, in); !errors.Is(err, frame.ErrSpoofed) {
		t.Errorf("from another peer: %v, want ErrSpoofed", err)
	}
	if _, err := Decode(1, 3, in); !errors.Is(err, frame.ErrSpoofed) {
		t.Errorf("to another node: %v, want ErrSpoofed", err)
	}
	bad := in[0]
	bad.Type = 200
	if _, err := Decode(1, 2, []frame.Message{bad}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("an unknown type in the envelope: %v, want ErrCorrupt", err)
	}
	bad = in[0]
	bad.Engine = 9
	if _, err := Decode(1, 2, []frame.Message{bad}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("another engine's message: %v, want ErrCorrupt", err)
	}
	if _, err := frame.Open(AppendMessage(nil, &msgs[0])); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "peer-protocol-1") {
		t.Errorf("a payload without envelope: %v, want ErrCorrupt naming peer protocol 1", err)
	}
}
