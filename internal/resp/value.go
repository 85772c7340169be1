package resp

import (
	"bytes"
	"math"
	"strconv"
	"strings"
)

// Kind is the type of a reply value.
type Kind uint8

// Reply kinds. RESP2 has Simple, Error, Int, Bulk, Array and their nulls; the rest
// are RESP3. Null covers RESP2's "$-1" and "*-1" and RESP3's "_".
const (
	Simple Kind = iota + 1
	Error
	Int
	Bulk
	Null
	Array
	Map
	Set
	Double
	Bool
	BigNumber
	Verbatim
	Push
)

var kindNames = [...]string{"invalid", "simple", "error", "integer", "bulk", "null", "array",
	"map", "set", "double", "boolean", "big-number", "verbatim", "push"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is one reply. Which fields are meaningful depends on Kind.
type Value struct {
	Kind Kind
	// Str holds Simple, Error, Bulk and Verbatim text (without its format prefix)
	// and the digits of a BigNumber.
	Str []byte
	// Int holds Int; for Bool it is 1 or 0.
	Int int64
	// Float holds Double.
	Float float64
	// Elems holds the elements of Array, Set and Push, and the keys and values of
	// Map interleaved: k0, v0, k1, v1, ...
	Elems []Value
	// Format is the three-letter format of a Verbatim string ("txt", "mkd").
	Format [3]byte
}

// IsNull reports whether v is a null reply.
func (v Value) IsNull() bool { return v.Kind == Null }

// Clone returns a deep copy of v that does not alias the Reader's buffers.
func (v Value) Clone() Value {
	c := v
	if v.Str != nil {
		c.Str = append([]byte(nil), v.Str...)
	}
	if v.Elems != nil {
		c.Elems = make([]Value, len(v.Elems))
		for i := range v.Elems {
			c.Elems[i] = v.Elems[i].Clone()
		}
	}
	return c
}

// String renders v for humans and tests, e.g. `["a", 1, (nil)]`.
func (v Value) String() string {
	var sb strings.Builder
	v.format(&sb)
	return sb.String()
}

func (v Value) format(sb *strings.Builder) {
	switch v.Kind {
	case Simple, BigNumber:
		sb.Write(v.Str)
	case Error:
		sb.WriteString("(error) ")
		sb.Write(v.Str)
	case Int:
		sb.WriteString(strconv.FormatInt(v.Int, 10))
	case Bulk, Verbatim:
		sb.WriteString(strconv.Quote(string(v.Str)))
	case Null:
		sb.WriteString("(nil)")
	case Double:
		sb.WriteString(strconv.FormatFloat(v.Float, 'g', -1, 64))
	case Bool:
		sb.WriteString(strconv.FormatBool(v.Int != 0))
	case Array, Set, Push, Map:
		open, sep, closing := "[", ", ", "]"
		switch v.Kind {
		case Set:
			open, closing = "~[", "]"
		case Push:
			open, closing = ">[", "]"
		case Map:
			open, closing = "{", "}"
		}
		sb.WriteString(open)
		for i, e := range v.Elems {
			if i > 0 {
				if v.Kind == Map && i%2 == 1 {
					sb.WriteString(": ")
				} else {
					sb.WriteString(sep)
				}
			}
			e.format(sb)
		}
		sb.WriteString(closing)
	default:
		sb.WriteString(v.Kind.String())
	}
}

// arena hands out []Value runs for aggregate elements. Chunks are reused after
// reset, so a steady stream of replies allocates nothing for their elements.
type arena struct {
	chunks [][]Value
	cur    int // index of the chunk being filled
	off    int // first free slot in chunks[cur]
}

const arenaChunk = 256

func (a *arena) reset() { a.cur, a.off = 0, 0 }

func (a *arena) alloc(n int) []Value {
	if n == 0 {
		return nil
	}
	for a.cur < len(a.chunks) {
		c := a.chunks[a.cur]
		if a.off+n <= len(c) {
			s := c[a.off : a.off+n : a.off+n]
			a.off += n
			return s
		}
		a.cur++
		a.off = 0
	}
	c := make([]Value, max(n, arenaChunk))
	a.chunks = append(a.chunks, c)
	a.off = n
	return c[:n:n]
}

// ReadValue reads one reply of any RESP2/RESP3 type. Attributes ("|") are skipped.
// The returned Value aliases the Reader's buffers and is valid until the next call
// on r; use Value.Clone to keep it. Server errors ("-ERR ...") are returned as a
// Value of Kind Error, not as a Go error: the Go error is reserved for I/O errors and
// *ProtocolError.
func (r *Reader) ReadValue() (Value, error) {
	r.shrink()
	for {
		done, err := r.scanValue()
		if err != nil {
			r.resetValue()
			return Value{}, err
		}
		if done {
			end := r.vpos
			r.resetValue()
			r.arena.reset()
			b := r.buf[r.r : r.r+end]
			v, next := r.build(b, 0)
			if next != end {
				panic("resp: build and scan disagree on reply length")
			}
			r.r += end
			// Drop the references the work stack holds into this reply.
			clear(r.work[:cap(r.work)])
			r.work = r.work[:0]
			return v, nil
		}
		mid := r.w > r.r
		if err := r.fill(); err != nil {
			return Value{}, eofErr(err, mid)
		}
	}
}

// scanValue checks that one complete, well-formed reply is buffered at r.r, resuming
// where the previous call stopped. It only validates; build decodes afterwards, so
// no decoded value ever aliases bytes that a later fill could move.
func (r *Reader) scanValue() (bool, error) {
	b := r.buf[r.r:r.w]
	if len(r.pending) == 0 && r.vpos == 0 {
		r.pending = append(r.pending, 1)
	}
	for len(r.pending) > 0 {
		top := len(r.pending) - 1
		if r.pending[top] == 0 {
			r.pending = r.pending[:top]
			continue
		}
		p := r.vpos
		if p >= len(b) {
			return false, nil
		}
		line, next, err := r.line(b, p)
		if line == nil || err != nil {
			return false, err
		}
		if len(line) == 0 {
			return false, protoErr("empty reply line")
		}
		typ, arg := line[0], line[1:]
		count := -1 // elements this value contains, if aggregate
		switch typ {
		case '+', '-':
		case ':':
			if _, ok := parseInt(arg); !ok {
				return false, protoErr("invalid integer %q", arg)
			}
		case '$', '=', '!':
			n, ok := parseInt(arg)
			if !ok || n < -1 || (n == -1 && typ != '$') {
				return false, protoErr("invalid bulk length")
			}
			if n > int64(r.maxBulk) {
				return false, protoErr("bulk length %d exceeds limit %d", n, r.maxBulk)
			}
			if n >= 0 {
				end := next + int(n)
				if end+2 > len(b) {
					return false, nil
				}
				if b[end] != '\r' || b[end+1] != '\n' {
					return false, protoErr("bulk string not terminated by CRLF")
				}
				if typ == '=' && (n < 4 || b[next+3] != ':') {
					return false, protoErr("invalid verbatim string")
				}
				next = end + 2
			}
		case '*', '~', '>', '%', '|':
			n, ok := parseInt(arg)
			if !ok || n < -1 || (n == -1 && typ != '*') {
				return false, protoErr("invalid aggregate length")
			}
			if n > int64(r.maxArray) {
				return false, protoErr("aggregate length %d exceeds limit %d", n, r.maxArray)
			}
			count = int(n)
			if typ == '%' || typ == '|' {
				count *= 2
			}
		case '_':
			if len(arg) != 0 {
				return false, protoErr("invalid null")
			}
		case ',':
			if _, ok := parseDouble(arg); !ok {
				return false, protoErr("invalid double %q", arg)
			}
		case '#':
			if len(arg) != 1 || (arg[0] != 't' && arg[0] != 'f') {
				return false, protoErr("invalid boolean")
			}
		case '(':
			if !isBigNumber(arg) {
				return false, protoErr("invalid big number")
			}
		default:
			return false, protoErr("unknown reply type '%c'", typ)
		}
		r.vpos = next
		if typ != '|' {
			// An attribute precedes the value it annotates, which is still expected.
			r.pending[top]--
		}
		if count > 0 {
			if len(r.pending) >= MaxDepth {
				return false, protoErr("replies nested deeper than %d", MaxDepth)
			}
			r.pending = append(r.pending, count)
		}
	}
	return true, nil
}

// build decodes the complete, validated reply at b[p:], returning it and the offset
// after it.
func (r *Reader) build(b []byte, p int) (Value, int) {
	for {
		i := p + bytesIndexCRLF(b[p:])
		typ, arg := b[p], b[p+1:i]
		next := i + 2
		var v Value
		switch typ {
		case '+':
			v = Value{Kind: Simple, Str: arg}
		case '-':
			v = Value{Kind: Error, Str: arg}
		case ':':
			n, _ := parseInt(arg)
			v = Value{Kind: Int, Int: n}
		case '$', '=', '!':
			n, _ := parseInt(arg)
			if n < 0 {
				return Value{Kind: Null}, next
			}
			s := b[next : next+int(n) : next+int(n)]
			next += int(n) + 2
			switch typ {
			case '$':
				v = Value{Kind: Bulk, Str: s}
			case '!':
				v = Value{Kind: Error, Str: s}
			default:
				v = Value{Kind: Verbatim, Str: s[4:]}
				copy(v.Format[:], s[:3])
			}
		case '*', '~', '>', '%', '|':
			n, _ := parseInt(arg)
			if n < 0 {
				return Value{Kind: Null}, next
			}
			if typ == '%' || typ == '|' {
				n *= 2
			}
			mark := len(r.work)
			for range n {
				var e Value
				e, next = r.build(b, next)
				r.work = append(r.work, e)
			}
			if typ == '|' {
				// Attributes are metadata about the next value; drop them.
				r.work = r.work[:mark]
				p = next
				continue
			}
			elems := r.arena.alloc(int(n))
			copy(elems, r.work[mark:])
			r.work = r.work[:mark]
			v = Value{Elems: elems}
			switch typ {
			case '*':
				v.Kind = Array
			case '~':
				v.Kind = Set
			case '>':
				v.Kind = Push
			default:
				v.Kind = Map
			}
		case '_':
			v = Value{Kind: Null}
		case ',':
			f, _ := parseDouble(arg)
			v = Value{Kind: Double, Float: f}
		case '#':
			v = Value{Kind: Bool}
			if arg[0] == 't' {
				v.Int = 1
			}
		case '(':
			v = Value{Kind: BigNumber, Str: arg}
		default:
			panic("resp: build found a reply type scan rejected")
		}
		return v, next
	}
}

// bytesIndexCRLF returns the index of the CR ending the line at b's start. scan
// has checked that the first LF is preceded by CR, so searching for the LF (faster
// than for the two-byte CRLF) finds the same place.
func bytesIndexCRLF(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		panic("resp: build found no CRLF in a scanned reply")
	}
	return i - 1
}

func parseDouble(b []byte) (float64, bool) {
	switch string(b) {
	case "inf", "+inf":
		return math.Inf(1), true
	case "-inf":
		return math.Inf(-1), true
	case "nan", "-nan":
		return math.NaN(), true
	}
	if len(b) == 0 || len(b) > 64 {
		return 0, false
	}
	// Reject what Go accepts but RESP does not spell a double as.
	for _, c := range b {
		if !(('0' <= c && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E') {
			return 0, false
		}
	}
	f, err := strconv.ParseFloat(string(b), 64)
	return f, err == nil
}

func isBigNumber(b []byte) bool {
	if len(b) > 0 && (b[0] == '-' || b[0] == '+') {
		b = b[1:]
	}
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
