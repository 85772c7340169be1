package server

import (
	"bytes"
	"testing"
)

// TestOutBufBigBatch: output past smallOut (a pipelined batch of scan replies) arrives
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
		if cap(o.b) > smallOut || o.big != nil {
			t.Fatalf("round %d: a %d-byte buffer stays on the connection", round, cap(o.b))
		}
	}
	if _, err := o.Write(chunk); err != nil {
		t.Fatal(err)
	}
	o.release()
	if o.b == nil || cap(o.b) > smallOut {
		t.Fatalf("small output: buffer of capacity %d kept (nil: %v)", cap(o.b), o.b == nil)
	}
}

// TestOutBufScanBatchAllocates: pipelined batches of scan replies (50 KB each:
// YCSB-E's ranges of 1 KB values), some past bigOut and some not, take their buffers
// from the pool and allocate nothing once it has one. The old outBuf dropped the
// pooled buffer after a batch past bigOut and grew the next one from nothing by
// doubling (4, 8, … 128 KiB: six allocations for a 100 KB batch), half the bytes a
// server allocated under YCSB-E.
func TestOutBufScanBatchAllocates(t *testing.T) {
	if raceOn {
		t.Skip("the race detector makes sync.Pool drop pooled buffers at random")
	}
	var o outBuf
	reply := bytes.Repeat([]byte{'v'}, 1024+16) // a key and a 1 KB value, as RESP
	batch := func(scans int) {
		for i := 0; i < 50*scans; i++ {
			if _, err := o.Write(reply); err != nil {
				t.Fatal(err)
			}
		}
		o.release()
	}
	pair := func() { batch(6); batch(2) } // 312 KB, then 104 KB
	pair()
	if got := testing.AllocsPerRun(50, pair); got > 0.5 {
		t.Fatalf("a 312 KB and a 104 KB batch: %.1f allocations, want none (pooled buffers)", got)
	}
}
