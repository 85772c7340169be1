package resp

import (
	"io"
	"math"
	"strings"
	"testing"
	"testing/iotest"
)

func readValues(t *testing.T, in string, oneByte bool) ([]string, error) {
	t.Helper()
	var src io.Reader = strings.NewReader(in)
	if oneByte {
		src = iotest.OneByteReader(src)
	}
	r := NewReader(src, 16)
	var out []string
	for {
		v, err := r.ReadValue()
		if err != nil {
			return out, err
		}
		out = append(out, v.String())
	}
}

func TestReadValueDecodesEveryReplyType(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"simple", "+OK\r\n", "OK"},
		{"error", "-ERR bad thing\r\n", "(error) ERR bad thing"},
		{"integer", ":-42\r\n", "-42"},
		{"bulk", "$5\r\nhe\r\no\r\n", `"he\r\no"`},
		{"empty bulk", "$0\r\n\r\n", `""`},
		{"resp2 null bulk", "$-1\r\n", "(nil)"},
		{"resp2 null array", "*-1\r\n", "(nil)"},
		{"resp3 null", "_\r\n", "(nil)"},
		{"array", "*3\r\n$1\r\na\r\n:1\r\n$-1\r\n", `["a", 1, (nil)]`},
		{"empty array", "*0\r\n", "[]"},
		{"nested", "*2\r\n*1\r\n+x\r\n*0\r\n", "[[x], []]"},
		{"map", "%2\r\n+a\r\n:1\r\n+b\r\n#f\r\n", "{a: 1, b: false}"},
		{"set", "~2\r\n+a\r\n+b\r\n", "~[a, b]"},
		{"double", ",3.25\r\n", "3.25"},
		{"double exponent", ",1e3\r\n", "1000"},
		{"double inf", ",-inf\r\n", "-Inf"},
		{"boolean", "#t\r\n", "true"},
		{"big number", "(-3492890328409238509324850943850943825024385\r\n", "-3492890328409238509324850943850943825024385"},
		{"verbatim", "=15\r\ntxt:Some string\r\n", `"Some string"`},
		{"blob error", "!9\r\nSYNTAX x\n\r\n", "(error) SYNTAX x\n"},
		{"push", ">2\r\n+message\r\n$2\r\nhi\r\n", `>[message, "hi"]`},
		{"attribute skipped", "|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n", `"v"`},
		{"attribute inside aggregate", "*2\r\n|1\r\n+a\r\n*1\r\n:1\r\n:7\r\n:8\r\n", "[7, 8]"},
	}
	for _, tc := range cases {
		for _, oneByte := range []bool{false, true} {
			got, err := readValues(t, tc.in, oneByte)
			if err != io.EOF {
				t.Errorf("%s (oneByte=%v): err = %v, want io.EOF after the reply", tc.name, oneByte, err)
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("%s (oneByte=%v): got %q, want [%q]", tc.name, oneByte, got, tc.want)
			}
		}
	}
}

func TestReadValueKeepsFieldsPerKind(t *testing.T) {
	r := NewReader(strings.NewReader("=8\r\nmkd:# hi\r\n,nan\r\n#t\r\n"), 0)
	v, err := r.ReadValue()
	if err != nil || v.Kind != Verbatim || string(v.Format[:]) != "mkd" || string(v.Str) != "# hi" {
		t.Fatalf("verbatim = %+v, %v", v, err)
	}
	v, err = r.ReadValue()
	if err != nil || v.Kind != Double || !math.IsNaN(v.Float) {
		t.Fatalf("nan = %+v, %v", v, err)
	}
	v, err = r.ReadValue()
	if err != nil || v.Kind != Bool || v.Int != 1 {
		t.Fatalf("bool = %+v, %v", v, err)
	}
}

func TestReadValueRejectsMalformedInput(t *testing.T) {
	cases := []struct{ in, wantMsg string }{
		{"?x\r\n", "unknown reply type '?'"},
		{":12a\r\n", "invalid integer"},
		{"$-2\r\n", "invalid bulk length"},
		{"=-1\r\n", "invalid bulk length"},
		{"$3\r\nabcd\r\n", "not terminated by CRLF"},
		{"=3\r\nabc\r\n", "invalid verbatim string"},
		{"~-1\r\n", "invalid aggregate length"},
		{"_x\r\n", "invalid null"},
		{",1.2.3x\r\n", "invalid double"},
		{",0x10\r\n", "invalid double"},
		{"#x\r\n", "invalid boolean"},
		{"(12a\r\n", "invalid big number"},
		{"+OK\n", "line not terminated by CRLF"},
		{strings.Repeat("*1\r\n", MaxDepth+1) + ":1\r\n", "nested deeper than 64"},
	}
	for _, tc := range cases {
		_, err := readValues(t, tc.in, false)
		if !IsProtocolError(err) || !strings.Contains(err.Error(), tc.wantMsg) {
			t.Errorf("%q: err = %v, want a protocol error containing %q", tc.in, err, tc.wantMsg)
		}
	}
}

func TestReadValueLimits(t *testing.T) {
	r := NewReader(strings.NewReader("$11\r\nhello world\r\n"), 0)
	r.SetMaxBulk(10)
	if _, err := r.ReadValue(); !IsProtocolError(err) || !strings.Contains(err.Error(), "exceeds limit 10") {
		t.Fatalf("oversized bulk: err = %v", err)
	}
	r = NewReader(strings.NewReader("%3\r\n"), 0)
	r.SetMaxArray(2)
	if _, err := r.ReadValue(); !IsProtocolError(err) || !strings.Contains(err.Error(), "aggregate length 3 exceeds limit 2") {
		t.Fatalf("oversized map: err = %v", err)
	}
}

func TestReadValueDoesNotAllocateFromDeclaredLength(t *testing.T) {
	r := NewReader(strings.NewReader("*1000000\r\n*1000000\r\n$400000000\r\nab"), 64)
	if _, err := r.ReadValue(); err != io.ErrUnexpectedEOF {
		t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
	}
	if len(r.buf) > 128 || cap(r.work) > 16 {
		t.Fatalf("buffer grew to %d, work stack to %d", len(r.buf), cap(r.work))
	}
}

func TestReadValueSteadyStateAllocatesNothing(t *testing.T) {
	reply := "*3\r\n$5\r\nvalue\r\n$-1\r\n*2\r\n:1\r\n+OK\r\n"
	r := NewReader(&repeatReader{data: []byte(reply)}, 0)
	if _, err := r.ReadValue(); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		v, err := r.ReadValue()
		if err != nil || len(v.Elems) != 3 {
			t.Fatalf("ReadValue = %v, %v", v, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ReadValue allocates %.1f times per reply in steady state, want 0", allocs)
	}
}

func TestCloneDetachesFromReader(t *testing.T) {
	r := NewReader(strings.NewReader("*1\r\n$3\r\nabc\r\n*1\r\n$3\r\nxyz\r\n"), 0)
	v, _ := r.ReadValue()
	kept := v.Clone()
	if _, err := r.ReadValue(); err != nil {
		t.Fatal(err)
	}
	if kept.String() != `["abc"]` {
		t.Fatalf("clone changed after the next read: %s", kept)
	}
}
