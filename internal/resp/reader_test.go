package resp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// readAll reads every command from in, through a reader that hands out one byte at
// a time when oneByte is set, so every resumption point of the parser is exercised.
func readAllCommands(t *testing.T, in string, oneByte bool) ([][]string, error) {
	t.Helper()
	var src io.Reader = strings.NewReader(in)
	if oneByte {
		src = iotest.OneByteReader(src)
	}
	r := NewReader(src, 16) // tiny buffer: forces compaction and growth
	var out [][]string
	var args [][]byte
	for {
		var err error
		args, err = r.ReadCommand(args)
		if err != nil {
			return out, err
		}
		var cmd []string
		for _, a := range args {
			cmd = append(cmd, string(a))
		}
		out = append(out, cmd)
	}
}

func TestReadCommandParsesMultibulkAndInline(t *testing.T) {
	big := strings.Repeat("x", 100)
	cases := []struct {
		name, in string
		want     [][]string
	}{
		{"multibulk", "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", [][]string{{"GET", "k"}}},
		{"empty bulk arg", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n", [][]string{{"SET", "k", ""}}},
		{"binary arg keeps CRLF inside", "*2\r\n$4\r\nECHO\r\n$4\r\na\r\nb\r\n", [][]string{{"ECHO", "a\r\nb"}}},
		{"pipelined", "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nPING\r\n",
			[][]string{{"PING"}, {"ECHO", "hi"}, {"PING"}}},
		{"arg larger than buffer", "*2\r\n$4\r\nECHO\r\n$100\r\n" + big + "\r\n", [][]string{{"ECHO", big}}},
		{"empty multibulk skipped", "*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n", [][]string{{"PING"}}},
		{"inline", "SET k v\r\n", [][]string{{"SET", "k", "v"}}},
		{"inline bare LF and extra spaces", "  GET \t k  \n", [][]string{{"GET", "k"}}},
		{"inline empty lines skipped", "\r\n\nPING\r\n", [][]string{{"PING"}}},
		{"inline double quotes and escapes", `SET "a key" "x\ny\x41\"z"` + "\r\n", [][]string{{"SET", "a key", "x\nyA\"z"}}},
		{"inline single quotes", `SET k 'it\'s \n'` + "\r\n", [][]string{{"SET", "k", `it's \n`}}},
		{"inline empty quoted arg", `SET k ""` + "\r\n", [][]string{{"SET", "k", ""}}},
	}
	for _, tc := range cases {
		for _, oneByte := range []bool{false, true} {
			got, err := readAllCommands(t, tc.in, oneByte)
			if err != io.EOF {
				t.Errorf("%s (oneByte=%v): err = %v, want io.EOF after the last command", tc.name, oneByte, err)
			}
			if !equalCmds(got, tc.want) {
				t.Errorf("%s (oneByte=%v): got %q, want %q", tc.name, oneByte, got, tc.want)
			}
		}
	}
}

func equalCmds(a, b [][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.Join(a[i], "\x00") != strings.Join(b[i], "\x00") || len(a[i]) != len(b[i]) {
			return false
		}
	}
	return true
}

func TestReadCommandRejectsMalformedInput(t *testing.T) {
	cases := []struct{ in, wantMsg string }{
		{"*x\r\n", "invalid multibulk length"},
		{"*2\r\n$3\r\nGET\r\n:1\r\n", "expected '$', got ':'"},
		{"*1\r\n$-1\r\n", "invalid bulk length"},
		{"*1\r\n$abc\r\n", "invalid bulk length"},
		{"*1\r\n$3\r\nGETXX", "bulk string not terminated by CRLF"},
		{"*1\n", "line not terminated by CRLF"},
		{`SET "abc` + "\r\n", "unbalanced quotes"},
		{`SET "abc"d` + "\r\n", "unbalanced quotes"},
		{"*1\r\n$99999999999999999999999\r\n", "invalid bulk length"},
	}
	for _, tc := range cases {
		_, err := readAllCommands(t, tc.in, false)
		var pe *ProtocolError
		if !errors.As(err, &pe) {
			t.Errorf("%q: err = %v, want *ProtocolError", tc.in, err)
			continue
		}
		if !strings.Contains(pe.Error(), tc.wantMsg) || !strings.HasPrefix(pe.Error(), "Protocol error: ") {
			t.Errorf("%q: err = %q, want it to contain %q", tc.in, pe.Error(), tc.wantMsg)
		}
	}
}

func TestReadCommandLimitsNameTheLimit(t *testing.T) {
	r := NewReader(strings.NewReader("*1\r\n$11\r\nhello world\r\n"), 0)
	r.SetMaxBulk(10)
	_, err := r.ReadCommand(nil)
	if !IsTooLarge(err) || !strings.Contains(err.Error(), "value of 11 bytes exceeds the limit of 10 bytes") {
		t.Fatalf("oversized bulk: err = %v", err)
	}

	r = NewReader(strings.NewReader("*4\r\n"), 0)
	r.SetMaxArray(3)
	_, err = r.ReadCommand(nil)
	if !IsProtocolError(err) || !strings.Contains(err.Error(), "multibulk length 4 exceeds limit 3") {
		t.Fatalf("oversized multibulk: err = %v", err)
	}

	r = NewReader(strings.NewReader(strings.Repeat("a", 100)), 8)
	r.SetMaxLine(64)
	_, err = r.ReadCommand(nil)
	if !IsProtocolError(err) || !strings.Contains(err.Error(), "too big inline request (limit 64)") {
		t.Fatalf("oversized inline: err = %v", err)
	}
}

// The command limit counts the whole command, so many arguments each under the
// bulk limit cannot add up to an unbounded buffer; a command exactly at the limit
// is accepted, and the verdict comes from the header, before the bytes it announces.
func TestReadCommandBoundsTheWholeCommand(t *testing.T) {
	cmd := AppendCommand(nil, []byte("MSET"), []byte("k1"), bytes.Repeat([]byte("v"), 40), []byte("k2"), bytes.Repeat([]byte("v"), 40))
	r := NewReader(bytes.NewReader(cmd), 0)
	r.SetMaxCommand(len(cmd))
	if args, err := r.ReadCommand(nil); err != nil || len(args) != 5 {
		t.Fatalf("command at the limit: args %d, err %v", len(args), err)
	}

	r = NewReader(bytes.NewReader(cmd), 0)
	r.SetMaxCommand(len(cmd) - 1)
	_, err := r.ReadCommand(nil)
	if !IsTooLarge(err) || !strings.Contains(err.Error(), fmt.Sprintf("command larger than the limit of %d bytes", len(cmd)-1)) {
		t.Fatalf("command over the limit: err = %v", err)
	}

	// A million 1000-byte arguments, refused after the first kilobytes arrive.
	var in bytes.Buffer
	in.WriteString("*1000000\r\n$4\r\nMSET\r\n")
	for in.Len() < 64<<10 {
		in.WriteString("$1000\r\n" + strings.Repeat("x", 1000) + "\r\n")
	}
	r = NewReader(&in, 0)
	r.SetMaxBulk(1024)
	r.SetMaxCommand(16 << 10)
	r.SetMaxDiscard(32 << 10) // past this, skipping it is not worth it: the connection closes
	_, err = r.ReadCommand(nil)
	if !IsProtocolError(err) || !strings.Contains(err.Error(), "larger than 32768 bytes, the most this node reads to skip it") {
		t.Fatalf("many small arguments: err = %v", err)
	}
	if len(r.buf) > 64<<10 {
		t.Fatalf("buffer grew to %d bytes before the verdict", len(r.buf))
	}
}

// A declared length is a promise, not bytes: the buffer must only grow with data
// that actually arrived.
func TestReadCommandDoesNotAllocateFromDeclaredLength(t *testing.T) {
	in := "*1000000\r\n$500000000\r\nabc"
	r := NewReader(strings.NewReader(in), 64)
	_, err := r.ReadCommand(nil)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
	}
	if len(r.buf) > 128 || cap(r.offs) > 16 {
		t.Fatalf("buffer grew to %d bytes and offsets to %d for %d bytes of input", len(r.buf), cap(r.offs), len(in))
	}
}

func TestReadCommandDistinguishesIOErrors(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("*1\r\n$4\r\nPI"), iotest.ErrReader(boom)), 0)
	_, err := r.ReadCommand(nil)
	if !errors.Is(err, boom) || IsProtocolError(err) {
		t.Fatalf("err = %v, want the I/O error, not a protocol error", err)
	}
	_, err = NewReader(strings.NewReader("*1\r\n$4\r\nPI"), 0).ReadCommand(nil)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("EOF mid-command: err = %v, want io.ErrUnexpectedEOF", err)
	}
	_, err = NewReader(strings.NewReader(""), 0).ReadCommand(nil)
	if err != io.EOF {
		t.Fatalf("EOF between commands: err = %v, want io.EOF", err)
	}
}

// A read deadline that fires mid-command must not lose the bytes already parsed:
// the next call resumes.
func TestReadCommandResumesAfterTransientError(t *testing.T) {
	transient := errors.New("timeout")
	src := &scriptReader{steps: []step{{data: "*2\r\n$3\r\nGET"}, {err: transient}, {data: "\r\n$1\r\nk\r\n"}}}
	r := NewReader(src, 0)
	if _, err := r.ReadCommand(nil); err != transient {
		t.Fatalf("first call err = %v, want the transient error", err)
	}
	args, err := r.ReadCommand(nil)
	if err != nil || len(args) != 2 || string(args[0]) != "GET" || string(args[1]) != "k" {
		t.Fatalf("resumed call = %q, %v", args, err)
	}
}

type step struct {
	data string
	err  error
}

type scriptReader struct{ steps []step }

func (s *scriptReader) Read(p []byte) (int, error) {
	if len(s.steps) == 0 {
		return 0, io.EOF
	}
	st := s.steps[0]
	s.steps = s.steps[1:]
	return copy(p, st.data), st.err
}

func TestBufferedReportsPipelinedBytes(t *testing.T) {
	in := "*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nPING\r\n"
	r := NewReader(strings.NewReader(in), 0)
	if _, err := r.ReadCommand(nil); err != nil {
		t.Fatal(err)
	}
	if got := r.Buffered(); got != len(in)/2 {
		t.Fatalf("Buffered after first of two pipelined commands = %d, want %d", got, len(in)/2)
	}
	if _, err := r.ReadCommand(nil); err != nil {
		t.Fatal(err)
	}
	if got := r.Buffered(); got != 0 {
		t.Fatalf("Buffered after the last command = %d, want 0", got)
	}
}

func TestReadCommandShrinksAfterHugeCommand(t *testing.T) {
	big := strings.Repeat("v", 1<<20)
	in := string(AppendCommand(nil, []byte("SET"), []byte("k"), []byte(big))) + "PING\r\n"
	r := NewReader(strings.NewReader(in), 1024)
	args, err := r.ReadCommand(nil)
	if err != nil || string(args[2]) != big {
		t.Fatalf("huge SET: %v", err)
	}
	if _, err := r.ReadCommand(args); err != nil {
		t.Fatal(err)
	}
	if len(r.buf) != 1024 {
		t.Fatalf("buffer is %d bytes after the huge command was consumed, want it back at 1024", len(r.buf))
	}
}

func TestReadCommandSteadyStateAllocatesNothing(t *testing.T) {
	cmd := AppendCommand(nil, []byte("SET"), []byte("key:000001"), bytes.Repeat([]byte("v"), 100))
	src := &repeatReader{data: cmd}
	r := NewReader(src, 0)
	args := make([][]byte, 0, 8)
	args, _ = r.ReadCommand(args) // warm up
	allocs := testing.AllocsPerRun(1000, func() {
		var err error
		args, err = r.ReadCommand(args)
		if err != nil || len(args) != 3 {
			t.Fatalf("ReadCommand = %q, %v", args, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("ReadCommand allocates %.1f times per command in steady state, want 0", allocs)
	}
}

// repeatReader returns data over and over, in reads that split it at varying points.
type repeatReader struct {
	data []byte
	off  int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.data[r.off:])
		n += c
		r.off = (r.off + c) % len(r.data)
	}
	return n, nil
}

func TestAppendCommandRoundTrips(t *testing.T) {
	args := [][]byte{[]byte("SET"), []byte("k\r\n"), {}, {0, 255}}
	r := NewReader(bytes.NewReader(AppendCommand(nil, args...)), 0)
	got, err := r.ReadCommand(nil)
	if err != nil || len(got) != len(args) {
		t.Fatalf("got %q, %v", got, err)
	}
	for i := range args {
		if !bytes.Equal(got[i], args[i]) {
			t.Errorf("arg %d = %q, want %q", i, got[i], args[i])
		}
	}
}

// A reader built on a recycled buffer starts empty whatever the buffer held,
// and gives back only a buffer still of its initial size.
func TestRecycledBufferStartsEmpty(t *testing.T) {
	buf := make([]byte, 64)
	copy(buf, "*1\r\n$4\r\nPING\r\n") // what a previous connection left behind
	r := NewReaderBuf(strings.NewReader("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"), buf)
	args, err := r.ReadCommand(nil)
	if err != nil || len(args) != 2 || string(args[0]) != "GET" || string(args[1]) != "k" {
		t.Fatalf("first command on a recycled buffer: %q, %v", args, err)
	}
	if b := r.TakeBuffer(); len(b) != 64 {
		t.Fatalf("TakeBuffer gave %d bytes, want the 64-byte initial buffer", len(b))
	}
	big := NewReaderBuf(strings.NewReader("*1\r\n$200\r\n"+strings.Repeat("x", 200)+"\r\n"), make([]byte, 16))
	if _, err := big.ReadCommand(nil); err != nil {
		t.Fatal(err)
	}
	if b := big.TakeBuffer(); b != nil {
		t.Fatalf("TakeBuffer gave back a grown buffer (%d bytes)", len(b))
	}
}

// A command over the bulk limit is read and thrown away without buffering it,
// and the commands pipelined behind it are read as usual (issue 25 item 10:
// before, the limit was a protocol error that closed the connection and lost
// them). Bytes arrive a few at a time, as from a socket, and the buffer never
// grows past its initial size. A header announcing more than the discard cap
// is still a protocol error, before its bytes arrive.
func TestOverLimitCommandIsSkippedAndThePipelineKept(t *testing.T) {
	big := bytes.Repeat([]byte("v"), 1<<20)
	var in []byte
	in = AppendCommand(in, []byte("SET"), []byte("a"), []byte("1"))
	in = AppendCommand(in, []byte("SET"), []byte("big"), big)
	in = AppendCommand(in, []byte("MSET"), []byte("k"), []byte("v"), []byte("big"), big, []byte("k2"), []byte("v2"))
	in = AppendCommand(in, []byte("SET"), []byte("b"), []byte("2"))
	r := NewReader(iotest.HalfReader(bytes.NewReader(in)), 4096)
	r.SetMaxBulk(64 << 10)
	want := []string{"SET a 1", "too large", "too large", "SET b 2"}
	for i, w := range want {
		args, err := r.ReadCommand(nil)
		got := string(bytes.Join(args, []byte(" ")))
		if IsTooLarge(err) {
			got = "too large"
			if !strings.Contains(err.Error(), "value of 1048576 bytes exceeds the limit of 65536 bytes") {
				t.Errorf("command %d: %v", i, err)
			}
		} else if err != nil {
			t.Fatalf("command %d: %v", i, err)
		}
		if got != w {
			t.Fatalf("command %d = %q, want %q", i, got, w)
		}
		if len(r.buf) > 4096 {
			t.Fatalf("command %d: the buffer grew to %d bytes", i, len(r.buf))
		}
	}
	if _, err := r.ReadCommand(nil); err != io.EOF {
		t.Fatalf("after the pipeline: %v, want EOF", err)
	}

	// The stream ends inside the discarded value: that is not a clean close.
	cut := len(AppendCommand(nil, []byte("SET"), []byte("a"), []byte("1"))) + 1000
	r = NewReader(bytes.NewReader(in[:cut]), 0)
	r.SetMaxBulk(64 << 10)
	r.ReadCommand(nil)
	if _, err := r.ReadCommand(nil); err != io.ErrUnexpectedEOF {
		t.Fatalf("cut inside a discarded value: %v, want ErrUnexpectedEOF", err)
	}

	r = NewReader(strings.NewReader("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5000000000\r\n"), 0)
	_, err := r.ReadCommand(nil)
	if !IsProtocolError(err) || !strings.Contains(err.Error(), "the most this node reads to skip it") {
		t.Fatalf("a value over the discard cap: %v", err)
	}
}

// ReadCommand's one-pass parse of a wholly buffered command (wholeCommand)
// answers exactly as the resumable parse does, which a reader fed one byte at
// a time always takes: the same arguments and the same errors, over random
// pipelines of well-formed, malformed, over-limit and inline commands, with
// limits small enough to be crossed.
func TestWholeCommandAgreesWithTheResumableParse(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 5))
	pieces := []func() string{
		func() string { // a well-formed command, maybe over a limit
			n := 1 + rng.IntN(4)
			s := fmt.Sprintf("*%d\r\n", n)
			for range n {
				a := strings.Repeat("x", rng.IntN(12))
				s += fmt.Sprintf("$%d\r\n%s\r\n", len(a), a)
			}
			return s
		},
		func() string { return "*0\r\n" },
		func() string { return "*-1\r\n" },
		func() string { return "*1\r\n$-1\r\n" },
		func() string { return "*1\r\n$3\r\nabcd\r\n" },     // not CRLF-terminated
		func() string { return "*2\r\n:1\r\n" },             // not a bulk
		func() string { return "*01\r\n$01\r\na\r\n" },      // leading zeros
		func() string { return "*1\r\n$1234567890\r\n" },    // a long header
		func() string { return "*12345678901\r\n" },         // a long count
		func() string { return "PING\r\n" },                 // inline
		func() string { return "*1\r\n$3\r\nGET" },          // cut short
		func() string { return "*x\r\n" },                   // not a number
		func() string { return "*3\r\n$1\r\na\r\n$1\r\nb" }, // cut short
		// Headers of one or two digits, wholeCommand's fast path, malformed.
		func() string { return "*1\r\n$0\r\n\r\n" },
		func() string { return "*1\r\n$1x\r\nab\r\n" },
		func() string { return "*1\r\n$1\rx\r\na\r\n" },
		func() string { return "*1\r\n$12\rx" },
		func() string { return "*1\r\n$2\n\r\nab\r\n" },
		func() string { return "*1\r\n$\r\n\r\n" },
		func() string { return "*1\r\n$09\r\n123456789\r\n" },
		func() string { return "*1\r\n$1" },
		func() string { return "*1\r\n$12\r\n" + strings.Repeat("y", 12) + "\r\n" }, // over the bulk limit
	}
	small := true // the limits above, or the defaults
	read := func(in string, oneByte bool) (out []string) {
		var src io.Reader = strings.NewReader(in)
		if oneByte {
			src = iotest.OneByteReader(src)
		}
		size := 64
		if !small {
			size = 4096 // the cases below wholly buffered: a wrong acceptance must be reachable
		}
		r := NewReader(src, size)
		if small {
			r.SetMaxBulk(8)
			r.SetMaxArray(3)
			r.SetMaxCommand(40)
		}
		var args [][]byte
		for {
			var err error
			args, err = r.ReadCommand(args)
			if err != nil {
				out = append(out, "error: "+err.Error())
				if IsTooLarge(err) {
					continue
				}
				return out
			}
			out = append(out, fmt.Sprintf("%q", args))
		}
	}
	for i := range 3000 {
		var in string
		for range 1 + rng.IntN(6) {
			in += pieces[rng.IntN(len(pieces))]()
		}
		whole, split := read(in, false), read(in, true)
		if !slices.Equal(whole, split) {
			t.Fatalf("case %d, %q:\nwhole %q\nsplit %q", i, in, whole, split)
		}
	}
	// Headers that wholeCommand's one-load path must refuse (a CR without
	// its LF, a second byte not a digit), each followed by bytes that a
	// wrong acceptance would take as a whole argument, at the default limits;
	// between two commands (ReadCommand parses the first of a fill with
	// the resumable parse and tries wholeCommand on what is buffered; the
	// one-load path reads eight bytes).
	small = false
	for _, in := range []string{
		"*1\r\n$1\rxZ\r\n",
		"*1\r\n$1\nxZ\r\n",
		"*1\r\n$1:\r\n" + strings.Repeat("z", 20) + "\r\n",
		"*1\r\n$:1\r\n" + strings.Repeat("z", 101) + "\r\n",
		"*1\r\n$:\r\n" + strings.Repeat("z", 10) + "\r\n", // ':' is '0'+10
		"*1\r\n$;\r\n" + strings.Repeat("z", 11) + "\r\n",
		"*2\r\n$2\r\nab\rx$1\r\nc\r\n", // an argument's CR without its LF
		"*2\r\n$2\r\nabx\n$1\r\nc\r\n", // an LF without its CR
		"*1\r\n$12\rx" + strings.Repeat("z", 12) + "\r\n",
		"*2\r\n$12\r\n" + strings.Repeat("z", 12) + "\r\n$1\r\nab\r\n",
		"*2\r\n$99\r\n" + strings.Repeat("z", 99) + "\r\n$0\r\n\r\n",
		// The array's header in one load (session 36), malformed: a CR
		// without its LF, a count that is not one digit.
		"*1\rx$1\r\na\r\n",
		"*1\n\r$1\r\na\r\n",
		"*:\r\n" + strings.Repeat("$1\r\nz\r\n", 10),
		"*/\r\n$1\r\na\r\n",
		"*0\r\n$1\r\na\r\n",
		"+1\r\n$1\r\na\r\n",
		// An argument's CRLF read with the next header: broken, with the
		// next header well-formed behind it; a CR or LF alone.
		"*2\r\n$1\r\naxx$1\r\nc\r\n",
		"*2\r\n$1\r\na\rx$1\r\nc\r\n",
		"*2\r\n$1\r\na\n\r$1\r\nc\r\n",
		"*3\r\n$1\r\na\r\n$2\r\nbc\r\r$1\r\nd\r\n",
		"*3\r\n$1\r\na\r\n$12\r\n" + strings.Repeat("z", 12) + "\n\n$1\r\nd\r\n",
		// A header of two digits first, after the array's: its five bytes
		// are past what the array header's load holds.
		"*2\r\n$10\r\n" + strings.Repeat("z", 10) + "\r\n$1\r\nd\r\n",
		"*2\r\n$10\rx" + strings.Repeat("z", 10) + "\r\n$1\r\nd\r\n",
	} {
		in = "*1\r\n$1\r\na\r\n" + in + "*1\r\n$1\r\nb\r\n"
		whole, split := read(in, false), read(in, true)
		if !slices.Equal(whole, split) {
			t.Fatalf("%q:\nwhole %q\nsplit %q", in, whole, split)
		}
	}
	// Commands that end the buffered bytes, fewer than eight after their
	// last argument (its CRLF read in a load of two), well-formed or not.
	for _, in := range []string{
		"*2\r\n$1\r\na\r\n$1\r\nb\r\n",
		"*2\r\n$1\r\na\r\n$1\r\nbx\n",
		"*2\r\n$1\r\na\r\n$1\r\nb\rx",
		"*2\r\n$1\r\na\r\n$1\r\nb\r",
		"*1\r\n$3\r\nabc\r\n*1\r\n",
	} {
		in = "*1\r\n$1\r\na\r\n" + in
		whole, split := read(in, false), read(in, true)
		if !slices.Equal(whole, split) {
			t.Fatalf("%q:\nwhole %q\nsplit %q", in, whole, split)
		}
	}
}
