package server

import (
	"bytes"
	"testing"
)

// TestOutBufBigBatch: output past bigOut (a pipelined batch of scan replies) arrives
// whole and in order through the pooled buffer, and release leaves the connection no
// big buffer while it keeps a small one.
func TestOutBufBigBatch(t *testing.T) {
	var o outBuf
	var want []byte
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 1<<8) // 4 KiB
	for round := 0; round < 3; round++ {
		want = want[:0]
		for i := 0; len(want) <= 3*bigOut; i++ {
			chunk[0] = byte(i)
			if _, err := o.Write(chunk); err != nil {
				t.Fatal(err)
			}
			want = append(want, chunk...)
		}
		if !bytes.Equal(o.b, want) {
			t.Fatalf("round %d: %d bytes out, not the %d written", round, len(o.b), len(want))
		}
		o.release()
		if o.b != nil {
			t.Fatalf("round %d: a %d-byte buffer stays on the connection", round, cap(o.b))
		}
	}
	if _, err := o.Write(chunk); err != nil {
		t.Fatal(err)
	}
	o.release()
	if o.b == nil || cap(o.b) > bigOut {
		t.Fatalf("small output: buffer of capacity %d kept (nil: %v)", cap(o.b), o.b == nil)
	}
}
