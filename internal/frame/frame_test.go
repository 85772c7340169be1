package frame

import (
	"bytes"
	"errors"
	"testing"
)

// raw is a payload of any engine: its body is the bytes themselves.
type raw struct {
	engine Engine
	typ    uint8
	body   []byte
}

func (r raw) Kind() (Engine, uint8)      { return r.engine, r.typ }
func (r raw) AppendBody(b []byte) []byte { return append(b, r.body...) }

// TestEnvelopeAddressesEveryFrameAndFragment: a message comes back with its
// group, engine, type and body, whole or joined from fragments, and the
// group of a message still arriving can be read from its first bytes.
func TestEnvelopeAddressesEveryFrameAndFragment(t *testing.T) {
	for _, size := range []int{0, 10, 5000} {
		p := raw{engine: 7, typ: 3, body: bytes.Repeat([]byte{0xF0}, size)} // a body full of fragment markers
		const group = 1 << 40
		stream := AppendFrames(nil, group, p, 1000)
		if _, n, _ := CheckFrame(stream, 1000); size > 1000 && n == len(stream) {
			t.Fatal("a 5000-byte body in one frame of at most 1000")
		}
		var j Joiner
		var got []Message
		for rest := stream; len(rest) > 0; {
			payload, n, err := CheckFrame(rest, 1000)
			if err != nil || n == 0 {
				t.Fatalf("frame: n %d, %v", n, err)
			}
			if g, ok := PeekGroup(payload); j.Pending() == 0 && (!ok || g != group) {
				t.Fatalf("size %d: the first frame's group reads as %d, %v", size, g, ok)
			}
			rest = rest[n:]
			whole, ok, err := j.Add(payload)
			if err != nil {
				t.Fatal(err)
			}
			if g, ok := j.PendingGroup(); j.Pending() > 0 && (!ok || g != group) {
				t.Fatalf("size %d: the pending message's group reads as %d, %v", size, g, ok)
			}
			if ok {
				m, err := Open(whole)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, m)
			}
		}
		if len(got) != 1 || got[0].Group != group || got[0].Engine != 7 || got[0].Type != 3 || !bytes.Equal(got[0].Body, p.body) {
			t.Fatalf("size %d: got %+v", size, got)
		}
	}
	for _, bad := range [][]byte{nil, {Version, 1, 2}, {Version, 1, 2, 0x80}, {3, 1, 2, 0}, {9, 1, 2, 0}} {
		if _, err := Open(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Open(%x): %v, want ErrCorrupt", bad, err)
		}
	}
}
