package resp

import (
	"bytes"
	"io"
	"testing"
	"testing/iotest"
)

// Run: go test -run '^$' -fuzz FuzzReadCommand -fuzztime 30s ./internal/resp/
// Seeds live in testdata/fuzz/FuzzReadCommand; failures found are added there.
func FuzzReadCommand(f *testing.F) {
	f.Add([]byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\nPING\r\n"))
	f.Add([]byte(`SET "a\x41" 'b'` + "\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		whole, errWhole := fuzzCommands(t, bytes.NewReader(data), len(data))
		split, errSplit := fuzzCommands(t, iotest.OneByteReader(bytes.NewReader(data)), len(data))
		// How bytes arrive must not change what is parsed.
		if !equalCmds(whole, split) || IsProtocolError(errWhole) != IsProtocolError(errSplit) {
			t.Fatalf("chunking changed the result: %q/%v vs %q/%v", whole, errWhole, split, errSplit)
		}
		// What was parsed re-encodes and parses back to the same arguments.
		for _, cmd := range whole {
			var args [][]byte
			for _, a := range cmd {
				args = append(args, []byte(a))
			}
			again, err := NewReader(bytes.NewReader(AppendCommand(nil, args...)), 0).ReadCommand(nil)
			if err != nil || len(again) != len(args) {
				t.Fatalf("round trip of %q: %q, %v", cmd, again, err)
			}
			for i := range args {
				if !bytes.Equal(again[i], args[i]) {
					t.Fatalf("round trip of %q: arg %d = %q", cmd, i, again[i])
				}
			}
		}
	})
}

func fuzzCommands(t *testing.T, src io.Reader, inputLen int) ([][]string, error) {
	r := NewReader(src, 16)
	r.SetMaxBulk(1 << 16)
	r.SetMaxArray(1 << 10)
	r.SetMaxLine(256)
	var out [][]string
	var args [][]byte
	for {
		var err error
		args, err = r.ReadCommand(args)
		checkBounded(t, len(r.buf), inputLen)
		if err != nil {
			return out, err
		}
		cmd := make([]string, len(args))
		for i, a := range args {
			cmd[i] = string(a)
		}
		out = append(out, cmd)
	}
}

// checkBounded asserts the buffer grew only with bytes that arrived: doubling from
// 16 can at most reach twice the input (plus the initial size).
func checkBounded(t *testing.T, bufLen, inputLen int) {
	t.Helper()
	if bufLen > 2*inputLen+64 {
		t.Fatalf("buffer grew to %d bytes for %d bytes of input", bufLen, inputLen)
	}
}

// Run: go test -run '^$' -fuzz FuzzReadValue -fuzztime 30s ./internal/resp/
func FuzzReadValue(f *testing.F) {
	f.Add([]byte("*3\r\n$1\r\na\r\n:1\r\n_\r\n%1\r\n+k\r\n,1.5\r\n"))
	f.Add([]byte("|1\r\n+a\r\n:1\r\n=7\r\ntxt:abc\r\n>1\r\n#t\r\n(123\r\n!1\r\nx\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		whole, errWhole := fuzzValues(t, bytes.NewReader(data), len(data))
		split, errSplit := fuzzValues(t, iotest.OneByteReader(bytes.NewReader(data)), len(data))
		if len(whole) != len(split) || IsProtocolError(errWhole) != IsProtocolError(errSplit) {
			t.Fatalf("chunking changed the result: %q/%v vs %q/%v", whole, errWhole, split, errSplit)
		}
		for i := range whole {
			if whole[i] != split[i] {
				t.Fatalf("value %d: %q vs %q", i, whole[i], split[i])
			}
		}
	})
}

func fuzzValues(t *testing.T, src io.Reader, inputLen int) ([]string, error) {
	r := NewReader(src, 16)
	r.SetMaxBulk(1 << 16)
	r.SetMaxArray(1 << 10)
	r.SetMaxLine(256)
	var out []string
	for {
		v, err := r.ReadValue()
		checkBounded(t, len(r.buf), inputLen)
		if cap(r.work) > inputLen+16 {
			t.Fatalf("work stack grew to %d for %d bytes of input", cap(r.work), inputLen)
		}
		if err != nil {
			return out, err
		}
		out = append(out, v.String())
	}
}

// The header fast path agrees with the general one (line + parseInt) wherever it
// answers: same length, same next offset; and it answers for every plain short length.
func FuzzShortLen(f *testing.F) {
	for _, s := range []string{"$3\r\n", "*2\r\n", "$0\r\n", "$007\r\n", "$123456789\r\n", "$1234567890\r\n", "$-1\r\n", "$+5\r\n", "$3\n", "$3\r", "$\r\n", "$12a\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 || (b[0] != '$' && b[0] != '*') {
			return // the parser takes a header path only after seeing its type byte
		}
		r := NewReader(bytes.NewReader(nil), 0)
		n, next, ok := r.shortLen(b, 1)
		line, gnext, err := r.line(b, 0)
		var gn int64
		gok := len(line) > 0 && err == nil // line[0] stands for the type byte
		if gok {
			gn, gok = parseInt(line[1:])
		}
		if ok && (!gok || gn != n || gnext != next) {
			t.Fatalf("%q: fast path says %d (next %d), general path %d %v (next %d, err %v)", b, n, next, gn, gok, gnext, err)
		}
		if !ok && gok && gn >= 0 && len(line) <= shortLenMaxLine && line[1] != '+' && line[1] != '-' { // gok: len(line) > 1
			t.Fatalf("%q: fast path declined the plain length %d", b, gn)
		}
		r.SetMaxLine(4)
		if _, _, ok := r.shortLen(b, 1); ok {
			t.Fatalf("%q: fast path answered under a line limit below its longest header", b)
		}
	})
}
