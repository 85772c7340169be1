package resp

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

var rewrite = flag.Bool("rewrite", false, "rewrite testdata/*.txt with the current output")

// The files in testdata are the codec's readable specification: each case is a
// comment, an `in` line holding the raw bytes as a Go string literal, "----", and
// what the reader produces, one command or reply per line, then how the stream
// ended. Every case is read twice, all at once and one byte at a time, and both must
// give the expected output. After a deliberate change, run
//
//	go test ./internal/resp -run TestSpec -rewrite
//
// and review the diff before committing it.
func TestSpecCommands(t *testing.T) { runSpec(t, "testdata/commands.txt", specCommands) }
func TestSpecValues(t *testing.T)   { runSpec(t, "testdata/values.txt", specValues) }

func specCommands(src io.Reader) string {
	r := NewReader(src, 16)
	var sb strings.Builder
	var args [][]byte
	for {
		var err error
		if args, err = r.ReadCommand(args); err != nil {
			sb.WriteString(describeEnd(err))
			return sb.String()
		}
		words := make([]string, len(args))
		for i, a := range args {
			words[i] = strconv.Quote(string(a))
		}
		sb.WriteString("[" + strings.Join(words, " ") + "]\n")
	}
}

func specValues(src io.Reader) string {
	r := NewReader(src, 16)
	var sb strings.Builder
	for {
		v, err := r.ReadValue()
		if err != nil {
			sb.WriteString(describeEnd(err))
			return sb.String()
		}
		sb.WriteString(v.Kind.String() + " " + v.String() + "\n")
	}
}

func describeEnd(err error) string {
	switch {
	case err == io.EOF:
		return "EOF\n"
	case err == io.ErrUnexpectedEOF:
		return "unexpected EOF\n"
	case IsProtocolError(err):
		// The exact text the server sends before closing the connection.
		return "-ERR " + err.Error() + "\n"
	}
	return "error " + err.Error() + "\n"
}

type specCase struct {
	comment, in, want string
}

func runSpec(t *testing.T, path string, run func(io.Reader) string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := parseSpec(string(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(cases) == 0 {
		t.Fatalf("%s: no cases", path)
	}
	var out strings.Builder
	for i, c := range cases {
		got := run(strings.NewReader(c.in))
		if split := run(iotest.OneByteReader(strings.NewReader(c.in))); split != got {
			t.Errorf("%s case %d: byte-at-a-time output differs:\n%s\nvs\n%s", path, i+1, split, got)
		}
		if !*rewrite && got != c.want {
			t.Errorf("%s case %d (%s):\nin %q\ngot:\n%swant:\n%s", path, i+1, strings.TrimSpace(c.comment), c.in, got, c.want)
		}
		fmt.Fprintf(&out, "%sin %s\n----\n%s\n", c.comment, strconv.Quote(c.in), got)
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimSuffix(out.String(), "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func parseSpec(s string) ([]specCase, error) {
	var cases []specCase
	blocks := strings.Split(strings.TrimSpace(s)+"\n", "\n\n")
	for _, b := range blocks {
		if strings.TrimSpace(b) == "" {
			continue
		}
		head, want, ok := strings.Cut(b+"\n", "\n----\n")
		if !ok {
			return nil, fmt.Errorf("case without ----: %q", b)
		}
		var c specCase
		for _, line := range strings.SplitAfter(head, "\n") {
			switch {
			case strings.HasPrefix(line, "#"):
				c.comment += line
			case strings.HasPrefix(line, "in "):
				in, err := strconv.Unquote(strings.TrimSpace(strings.TrimPrefix(line, "in ")))
				if err != nil {
					return nil, fmt.Errorf("bad in line %q: %w", line, err)
				}
				c.in = in
			case strings.TrimSpace(line) == "":
			default:
				return nil, errors.New("unexpected line " + strconv.Quote(line))
			}
		}
		c.want = strings.TrimSpace(want) + "\n"
		cases = append(cases, c)
	}
	return cases, nil
}
