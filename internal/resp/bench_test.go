package resp

import (
	"bytes"
	"fmt"
	"io"
	"testing"
)

// Run: go test -run '^$' -bench . -benchmem ./internal/resp/

func BenchmarkReadCommand(b *testing.B) {
	for _, size := range []int{16, 1024} {
		b.Run(fmt.Sprintf("SET/value=%d", size), func(b *testing.B) {
			cmd := AppendCommand(nil, []byte("SET"), []byte("key:0000000001"), bytes.Repeat([]byte("v"), size))
			r := NewReader(&repeatReader{data: cmd}, 0)
			args := make([][]byte, 0, 8)
			b.SetBytes(int64(len(cmd)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if args, err = r.ReadCommand(args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("HSET", func(b *testing.B) { // a pipelined HSET's: four short arguments
		cmd := AppendCommand(nil, []byte("HSET"), []byte("myhash"), []byte("element:000000012345"), []byte("xxx"))
		r := NewReader(&repeatReader{data: bytes.Repeat(cmd, 16)}, 0)
		args := make([][]byte, 0, 8)
		b.SetBytes(int64(len(cmd)))
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if args, err = r.ReadCommand(args); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("inline/PING", func(b *testing.B) {
		r := NewReader(&repeatReader{data: []byte("PING\r\n")}, 0)
		var args [][]byte
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if args, err = r.ReadCommand(args); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkReadValue(b *testing.B) {
	for _, tc := range []struct{ name, reply string }{
		{"simple", "+OK\r\n"},
		{"bulk", "$16\r\n0123456789abcdef\r\n"},
		{"array10", "*10\r\n" + string(bytes.Repeat([]byte("$5\r\nvalue\r\n"), 10))},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := NewReader(&repeatReader{data: []byte(tc.reply)}, 0)
			b.SetBytes(int64(len(tc.reply)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.ReadValue(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkWriter(b *testing.B) {
	val := bytes.Repeat([]byte("v"), 64)
	w := NewWriter(io.Discard, 0)
	b.ReportAllocs()
	for b.Loop() {
		w.WriteBulk(val)
		w.WriteInt(42)
		w.WriteSimple("OK")
		if w.Buffered() > 8<<10 {
			w.Flush()
		}
	}
	w.Flush()
}

func BenchmarkAppendCommand(b *testing.B) {
	args := [][]byte{[]byte("SET"), []byte("key:0000000001"), bytes.Repeat([]byte("v"), 64)}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendCommand(buf[:0], args...)
	}
}
