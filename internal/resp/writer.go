package resp

import (
	"io"
	"math"
	"strconv"
)

// Writer writes RESP replies through a buffer. Its protocol version (2 by default,
// 3 after HELLO 3) decides how nulls, maps, booleans and doubles are spelled. Write
// methods never fail on their own: the first I/O error is kept and returned by every
// later call and by Flush, so a server can write a whole pipeline of replies and
// check once. A Writer is not safe for concurrent use.
type Writer struct {
	w     io.Writer
	buf   []byte
	size  int
	proto int
	err   error
}

// NewWriter returns a Writer that flushes to w whenever size bytes (DefaultBufferSize
// if size <= 0) are buffered. It starts at protocol version 2.
func NewWriter(w io.Writer, size int) *Writer {
	if size <= 0 {
		size = DefaultBufferSize
	}
	return &Writer{w: w, buf: make([]byte, 0, size), size: size, proto: 2}
}

// Reset discards buffered output and any error and writes to w, at protocol 2.
func (w *Writer) Reset(dst io.Writer) {
	w.w, w.buf, w.err, w.proto = dst, w.buf[:0], nil, 2
}

// SetProtocol sets the protocol version, 2 or 3.
func (w *Writer) SetProtocol(v int) {
	if v != 2 && v != 3 {
		panic("resp: protocol version must be 2 or 3, got " + strconv.Itoa(v))
	}
	w.proto = v
}

// Protocol returns the protocol version, 2 or 3.
func (w *Writer) Protocol() int { return w.proto }

// Buffered returns the number of bytes written but not yet flushed.
func (w *Writer) Buffered() int { return len(w.buf) }

// Flush writes the buffered bytes to the underlying writer.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if len(w.buf) == 0 {
		return nil
	}
	n, err := w.w.Write(w.buf)
	if err == nil && n < len(w.buf) {
		err = io.ErrShortWrite
	}
	w.buf = w.buf[:0]
	w.err = err
	return err
}

// reserve flushes first if n more bytes would overflow the buffer.
func (w *Writer) reserve(n int) {
	if len(w.buf)+n > w.size && len(w.buf) > 0 {
		_ = w.Flush()
	}
}

// WriteSimple writes a simple string ("+OK"). CR and LF, which would break the
// framing, are replaced by spaces.
func (w *Writer) WriteSimple(s string) error {
	w.reserve(len(s) + 3)
	w.buf = append(w.buf, '+')
	w.buf = appendLine(w.buf, s)
	return w.err
}

// WriteError writes an error reply; msg starts with its prefix ("ERR unknown
// command"). CR and LF are replaced by spaces.
func (w *Writer) WriteError(msg string) error {
	w.reserve(len(msg) + 3)
	w.buf = append(w.buf, '-')
	w.buf = appendLine(w.buf, msg)
	return w.err
}

func appendLine(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, '\r', '\n')
}

// WriteInt writes an integer reply.
func (w *Writer) WriteInt(n int64) error {
	w.reserve(24)
	w.buf = appendPrefixed(w.buf, ':', n)
	return w.err
}

// WriteBulk writes a bulk string. Values larger than the buffer go straight to the
// underlying writer instead of growing the buffer.
func (w *Writer) WriteBulk(b []byte) error {
	if len(b) > w.size/2 {
		w.reserve(w.size)
		w.buf = appendPrefixed(w.buf, '$', int64(len(b)))
		if w.Flush() == nil {
			if _, err := w.w.Write(b); err != nil {
				w.err = err
			}
		}
		w.buf = append(w.buf, '\r', '\n')
		return w.err
	}
	w.reserve(len(b) + 24)
	w.buf = AppendBulk(w.buf, b)
	return w.err
}

// WriteRaw writes b, one or more complete replies already encoded in the
// Writer's protocol, as they are (a script's or a transaction's RESP2 reply
// on a RESP2 connection: parsing it only to write it again cost an EXEC a
// tenth of its CPU).
func (w *Writer) WriteRaw(b []byte) error {
	w.reserve(len(b))
	w.buf = append(w.buf, b...)
	return w.err
}

// WriteBulkString writes a bulk string.
func (w *Writer) WriteBulkString(s string) error {
	if len(s) > w.size/2 {
		return w.WriteBulk([]byte(s))
	}
	w.reserve(len(s) + 24)
	w.buf = AppendBulkString(w.buf, s)
	return w.err
}

// WriteNull writes a null: "$-1" in RESP2, "_" in RESP3.
func (w *Writer) WriteNull() error {
	w.reserve(5)
	if w.proto == 3 {
		w.buf = append(w.buf, "_\r\n"...)
	} else {
		w.buf = append(w.buf, "$-1\r\n"...)
	}
	return w.err
}

// WriteNullArray writes a null array: "*-1" in RESP2, "_" in RESP3.
func (w *Writer) WriteNullArray() error {
	w.reserve(5)
	if w.proto == 3 {
		w.buf = append(w.buf, "_\r\n"...)
	} else {
		w.buf = append(w.buf, "*-1\r\n"...)
	}
	return w.err
}

// WriteArrayHeader starts an array of n elements; the caller writes them next.
func (w *Writer) WriteArrayHeader(n int) error {
	w.reserve(24)
	w.buf = AppendArrayHeader(w.buf, n)
	return w.err
}

// WriteMapHeader starts a map of n key/value pairs; the caller writes 2n values
// next, alternating keys and values. In RESP2 it is an array of 2n elements.
func (w *Writer) WriteMapHeader(n int) error {
	w.reserve(24)
	if w.proto == 3 {
		w.buf = appendPrefixed(w.buf, '%', int64(n))
	} else {
		w.buf = appendPrefixed(w.buf, '*', int64(2*n))
	}
	return w.err
}

// WriteSetHeader starts a set of n elements: "~" in RESP3, an array in RESP2.
func (w *Writer) WriteSetHeader(n int) error {
	w.reserve(24)
	if w.proto == 3 {
		w.buf = appendPrefixed(w.buf, '~', int64(n))
	} else {
		w.buf = appendPrefixed(w.buf, '*', int64(n))
	}
	return w.err
}

// WriteBool writes a boolean: "#t"/"#f" in RESP3, ":1"/":0" in RESP2.
func (w *Writer) WriteBool(v bool) error {
	w.reserve(4)
	switch {
	case w.proto == 3 && v:
		w.buf = append(w.buf, "#t\r\n"...)
	case w.proto == 3:
		w.buf = append(w.buf, "#f\r\n"...)
	case v:
		w.buf = append(w.buf, ":1\r\n"...)
	default:
		w.buf = append(w.buf, ":0\r\n"...)
	}
	return w.err
}

// WriteDouble writes a double: ",1.5" in RESP3, a bulk string "1.5" in RESP2.
// Infinities are spelled "inf" and "-inf", NaN "nan", as Redis does.
func (w *Writer) WriteDouble(f float64) error {
	var tmp [32]byte
	var s []byte
	switch {
	case math.IsInf(f, 1):
		s = append(tmp[:0], "inf"...)
	case math.IsInf(f, -1):
		s = append(tmp[:0], "-inf"...)
	case math.IsNaN(f):
		s = append(tmp[:0], "nan"...)
	default:
		s = strconv.AppendFloat(tmp[:0], f, 'g', -1, 64)
	}
	w.reserve(len(s) + 24)
	if w.proto == 3 {
		w.buf = append(w.buf, ',')
		w.buf = append(w.buf, s...)
		w.buf = append(w.buf, '\r', '\n')
	} else {
		w.buf = AppendBulk(w.buf, s)
	}
	return w.err
}

// WriteValue writes v in the Writer's protocol (RESP3 kinds are downgraded in
// RESP2 as the typed methods do). Useful for proxies and test servers.
func (w *Writer) WriteValue(v Value) error {
	switch v.Kind {
	case Simple:
		return w.WriteSimple(string(v.Str))
	case Error:
		return w.WriteError(string(v.Str))
	case Int:
		return w.WriteInt(v.Int)
	case Bulk, Verbatim, BigNumber:
		return w.WriteBulk(v.Str)
	case Null:
		return w.WriteNull()
	case Double:
		return w.WriteDouble(v.Float)
	case Bool:
		return w.WriteBool(v.Int != 0)
	case Array, Set, Push, Map:
		switch v.Kind {
		case Map:
			if len(v.Elems)%2 != 0 {
				panic("resp: map value with an odd number of elements")
			}
			w.WriteMapHeader(len(v.Elems) / 2)
		case Set:
			w.WriteSetHeader(len(v.Elems))
		default:
			w.WriteArrayHeader(len(v.Elems))
		}
		for _, e := range v.Elems {
			w.WriteValue(e)
		}
		return w.err
	}
	panic("resp: WriteValue of invalid kind " + v.Kind.String())
}

// AppendCommand appends args as a RESP multibulk command to buf, the way clients
// send commands.
func AppendCommand(buf []byte, args ...[]byte) []byte {
	buf = AppendArrayHeader(buf, len(args))
	for _, a := range args {
		buf = AppendBulk(buf, a)
	}
	return buf
}

// AppendArrayHeader appends "*n\r\n".
func AppendArrayHeader(buf []byte, n int) []byte {
	return appendPrefixed(buf, '*', int64(n))
}

// AppendBulk appends b as a bulk string.
func AppendBulk(buf, b []byte) []byte {
	buf = appendPrefixed(buf, '$', int64(len(b)))
	buf = append(buf, b...)
	return append(buf, '\r', '\n')
}

// AppendBulkString appends s as a bulk string.
func AppendBulkString(buf []byte, s string) []byte {
	buf = appendPrefixed(buf, '$', int64(len(s)))
	buf = append(buf, s...)
	return append(buf, '\r', '\n')
}

func appendPrefixed(buf []byte, prefix byte, n int64) []byte {
	if uint64(n) < 10 { // HSET's and DEL's usual 0 or 1: strconv's path cost ~50 instructions
		return append(buf, prefix, byte('0'+n), '\r', '\n')
	}
	buf = append(buf, prefix)
	buf = strconv.AppendInt(buf, n, 10)
	return append(buf, '\r', '\n')
}
