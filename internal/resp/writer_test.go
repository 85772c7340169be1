package resp

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestWriterSpellsEachReplyPerProtocol(t *testing.T) {
	cases := []struct {
		name        string
		write       func(w *Writer)
		resp2, res3 string
	}{
		{"simple", func(w *Writer) { w.WriteSimple("OK") }, "+OK\r\n", "+OK\r\n"},
		{"simple strips CRLF", func(w *Writer) { w.WriteSimple("a\r\nb") }, "+a  b\r\n", "+a  b\r\n"},
		{"error", func(w *Writer) { w.WriteError("ERR no\nway") }, "-ERR no way\r\n", "-ERR no way\r\n"},
		{"int", func(w *Writer) { w.WriteInt(-7) }, ":-7\r\n", ":-7\r\n"},
		{"small ints", func(w *Writer) { w.WriteInt(0); w.WriteInt(9); w.WriteInt(10); w.WriteInt(-1) }, ":0\r\n:9\r\n:10\r\n:-1\r\n", ":0\r\n:9\r\n:10\r\n:-1\r\n"},
		{"extreme ints", func(w *Writer) { w.WriteInt(math.MinInt64); w.WriteInt(math.MaxInt64) }, ":-9223372036854775808\r\n:9223372036854775807\r\n", ":-9223372036854775808\r\n:9223372036854775807\r\n"},
		{"bulk", func(w *Writer) { w.WriteBulk([]byte("a\r\n")) }, "$3\r\na\r\n\r\n", "$3\r\na\r\n\r\n"},
		{"bulk string", func(w *Writer) { w.WriteBulkString("") }, "$0\r\n\r\n", "$0\r\n\r\n"},
		{"null", func(w *Writer) { w.WriteNull() }, "$-1\r\n", "_\r\n"},
		{"null array", func(w *Writer) { w.WriteNullArray() }, "*-1\r\n", "_\r\n"},
		{"array", func(w *Writer) { w.WriteArrayHeader(2); w.WriteInt(1); w.WriteInt(2) }, "*2\r\n:1\r\n:2\r\n", "*2\r\n:1\r\n:2\r\n"},
		{"map", func(w *Writer) { w.WriteMapHeader(1); w.WriteSimple("k"); w.WriteInt(1) }, "*2\r\n+k\r\n:1\r\n", "%1\r\n+k\r\n:1\r\n"},
		{"set", func(w *Writer) { w.WriteSetHeader(1); w.WriteInt(1) }, "*1\r\n:1\r\n", "~1\r\n:1\r\n"},
		{"bool", func(w *Writer) { w.WriteBool(true); w.WriteBool(false) }, ":1\r\n:0\r\n", "#t\r\n#f\r\n"},
		{"double", func(w *Writer) { w.WriteDouble(1.5) }, "$3\r\n1.5\r\n", ",1.5\r\n"},
		{"double inf", func(w *Writer) { w.WriteDouble(math.Inf(-1)) }, "$4\r\n-inf\r\n", ",-inf\r\n"},
	}
	for _, tc := range cases {
		for _, proto := range []int{2, 3} {
			var out bytes.Buffer
			w := NewWriter(&out, 0)
			w.SetProtocol(proto)
			tc.write(w)
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			want := tc.resp2
			if proto == 3 {
				want = tc.res3
			}
			if out.String() != want {
				t.Errorf("%s RESP%d: wrote %q, want %q", tc.name, proto, out.String(), want)
			}
		}
	}
}

func TestWriterOutputReadsBackAsValues(t *testing.T) {
	var out bytes.Buffer
	w := NewWriter(&out, 8) // smaller than most replies: exercises flushing mid-stream
	w.SetProtocol(3)
	big := strings.Repeat("z", 100)
	w.WriteMapHeader(2)
	w.WriteBulkString("key")
	w.WriteBulkString(big)
	w.WriteBulkString("n")
	w.WriteDouble(2.5)
	w.WriteValue(Value{Kind: Set, Elems: []Value{{Kind: Bool, Int: 1}, {Kind: Null}}})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	got, _ := readValues(t, out.String(), false)
	want := []string{`{"key": "` + big + `", "n": 2.5}`, "~[true, (nil)]"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("read back %q, want %q", got, want)
	}
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("disk on fire")
}

func TestWriterErrorIsSticky(t *testing.T) {
	fw := &failWriter{}
	w := NewWriter(fw, 0)
	w.WriteSimple("OK")
	if err := w.Flush(); err == nil {
		t.Fatal("Flush succeeded on a failing writer")
	}
	if err := w.WriteInt(1); err == nil {
		t.Fatal("write after a failed flush reported no error")
	}
	if err := w.Flush(); err == nil || fw.n != 1 {
		t.Fatalf("second Flush: err = %v after %d writes; want the first error and no new write", err, fw.n)
	}
}

func TestWriterSteadyStateAllocatesNothing(t *testing.T) {
	var out bytes.Buffer
	w := NewWriter(&out, 0)
	val := []byte("some value")
	allocs := testing.AllocsPerRun(1000, func() {
		out.Reset()
		w.WriteArrayHeader(3)
		w.WriteBulk(val)
		w.WriteInt(12345)
		w.WriteNull()
		w.WriteDouble(1.25)
		w.Flush()
	})
	if allocs != 0 {
		t.Fatalf("Writer allocates %.1f times per reply batch, want 0", allocs)
	}
}
