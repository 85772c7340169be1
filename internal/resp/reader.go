package resp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Default limits. They match Redis's (proto-max-bulk-len 512 MiB, inline requests
// and header lines at most 64 KiB).
const (
	DefaultBufferSize = 16 << 10
	DefaultMaxBulk    = 512 << 20
	DefaultMaxArray   = 1 << 20
	DefaultMaxLine    = 64 << 10
	// DefaultMaxCommand bounds one command's total size, headers included, like
	// Redis's client-query-buffer-limit (1 GiB): the per-argument and argument-count
	// limits alone would let one command of a million 512 MiB arguments buffer
	// without end.
	DefaultMaxCommand = 1 << 30
	// DefaultMaxDiscard bounds how many bytes of one command over the bulk or
	// command limit the reader reads and throws away (TooLargeError) before
	// it gives up on the connection with a protocol error: skipping costs
	// bandwidth, not memory, but a client must not keep a node reading forever.
	DefaultMaxDiscard = 4 << 30
	// MaxDepth bounds the nesting of aggregate replies so that a hostile peer cannot
	// make the reader recurse without limit.
	MaxDepth = 64
)

// ProtocolError reports malformed RESP input. After one, the stream is out of sync:
// the server answers "-ERR " + Error() and closes the connection.
type ProtocolError struct {
	Msg string
}

func (e *ProtocolError) Error() string { return "Protocol error: " + e.Msg }

func protoErr(format string, args ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, args...)}
}

// TooLargeError reports a command with an argument longer than the bulk limit,
// or larger in total than the command limit. Unlike a ProtocolError the stream
// is still in sync: the reader has read and discarded the whole command, so
// the server answers "-" + Error() and reads the next one (Redis closes the
// connection, and a client loses the writes it pipelined behind the value).
type TooLargeError struct {
	Msg string
}

func (e *TooLargeError) Error() string { return "ERR " + e.Msg }

// IsTooLarge reports whether err is (or wraps) a *TooLargeError.
func IsTooLarge(err error) bool {
	if err == nil {
		return false // without the errors.As below, whose target escapes: every command read asks
	}
	var te *TooLargeError
	return errors.As(err, &te)
}

// IsProtocolError reports whether err is (or wraps) a *ProtocolError.
func IsProtocolError(err error) bool {
	if err == nil {
		return false
	}
	var pe *ProtocolError
	return errors.As(err, &pe)
}

// Reader reads RESP commands (server side) or replies (client side) from a stream.
// A Reader is not safe for concurrent use.
type Reader struct {
	rd   io.Reader
	buf  []byte
	r, w int // unread bytes are buf[r:w]
	err  error

	initSize int
	maxBulk  int
	maxArray int
	maxLine  int
	maxCmd   int
	maxSkip  int64

	// Discarding a command over a limit (TooLargeError): skip is how many
	// bytes of the current argument (its CRLF included) are still to be
	// thrown away, skipped how many were in all, tooLarge the error to
	// return once the command's last argument is gone. cleft counts the
	// arguments still to come, as in a normal parse.
	skip, skipped int64
	tooLarge      *TooLargeError

	// ReadCommand's resumable parse state: cleft is the number of arguments still to
	// parse (-1: header not parsed yet), cpos the offset from r where parsing resumes,
	// offs the [start,end) offsets (relative to r) of the arguments parsed so far.
	// Offsets relative to r survive compaction and growth of buf.
	cleft int
	cpos  int
	offs  []int

	// ReadValue's resumable scan state: vpos is the offset from r where scanning
	// resumes, pending the number of values still expected at each nesting level.
	vpos    int
	pending []int
	arena   arena
	work    []Value
}

// NewReader returns a Reader with an initial buffer of size bytes (DefaultBufferSize
// if size <= 0) and the default limits.
func NewReader(rd io.Reader, size int) *Reader {
	if size <= 0 {
		size = DefaultBufferSize
	}
	return newReader(rd, make([]byte, size))
}

func newReader(rd io.Reader, buf []byte) *Reader {
	return &Reader{
		rd:       rd,
		buf:      buf,
		initSize: len(buf),
		maxBulk:  DefaultMaxBulk,
		maxArray: DefaultMaxArray,
		maxLine:  DefaultMaxLine,
		maxCmd:   DefaultMaxCommand,
		maxSkip:  DefaultMaxDiscard,
		cleft:    -1,
	}
}

// NewReaderBuf is NewReader with buf (its full length) as the initial buffer,
// for callers that recycle buffers across readers (TakeBuffer).
func NewReaderBuf(rd io.Reader, buf []byte) *Reader {
	if len(buf) == 0 {
		return NewReader(rd, 0)
	}
	return newReader(rd, buf[:cap(buf)])
}

// TakeBuffer detaches the reader's buffer for reuse by another reader, if it
// is still its initial size (a buffer grown for a large command is left to
// the collector), and returns it; nil otherwise. The reader must not be used
// afterwards, and nothing it returned may be read any more: the buffer's next
// owner overwrites it.
func (r *Reader) TakeBuffer() []byte {
	b := r.buf
	r.buf, r.rd = nil, nil
	r.r, r.w = 0, 0
	if cap(b) != r.initSize {
		return nil
	}
	return b[:cap(b)]
}

// SetMaxBulk sets the largest accepted bulk string length. ReadCommand reads
// and discards a command with a longer argument and returns a TooLargeError
// naming the limit (a reply value longer than it is a protocol error). n <= 0
// restores DefaultMaxBulk.
func (r *Reader) SetMaxBulk(n int) { r.maxBulk = orDefault(n, DefaultMaxBulk) }

// SetMaxCommand sets the largest accepted size of one command (a multibulk
// array: its headers and arguments); a command that would exceed it is
// discarded, as soon as a length header shows it and without buffering it,
// and ReadCommand returns a TooLargeError naming the limit. Inline commands
// are bounded by the line limit. n <= 0 restores DefaultMaxCommand.
func (r *Reader) SetMaxCommand(n int) { r.maxCmd = orDefault(n, DefaultMaxCommand) }

// SetMaxDiscard sets how many bytes of one over-limit command the reader
// discards before it gives up with a protocol error (the connection closes).
// n <= 0 restores DefaultMaxDiscard.
func (r *Reader) SetMaxDiscard(n int64) {
	if n <= 0 {
		n = DefaultMaxDiscard
	}
	r.maxSkip = n
}

// SetMaxArray sets the largest accepted element count of a command or aggregate.
// n <= 0 restores DefaultMaxArray.
func (r *Reader) SetMaxArray(n int) { r.maxArray = orDefault(n, DefaultMaxArray) }

// SetMaxLine sets the longest accepted inline command, header or simple-string
// line. n <= 0 restores DefaultMaxLine.
func (r *Reader) SetMaxLine(n int) { r.maxLine = orDefault(n, DefaultMaxLine) }

func orDefault(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// Reset discards all state and reads from rd, keeping the buffer and limits.
func (r *Reader) Reset(rd io.Reader) {
	r.rd = rd
	r.r, r.w, r.err = 0, 0, nil
	r.resetCommand()
	r.resetValue()
}

// Buffered returns the number of bytes read from the stream but not yet consumed.
// A server flushes its replies when this is zero: no pipelined command is waiting.
func (r *Reader) Buffered() int { return r.w - r.r }

func (r *Reader) resetCommand() {
	r.cleft, r.cpos, r.offs = -1, 0, r.offs[:0]
	r.skip, r.skipped, r.tooLarge = 0, 0, nil
}

func (r *Reader) resetValue() {
	r.vpos, r.pending = 0, r.pending[:0]
}

// fill reads more bytes into the buffer, first moving unread bytes to its front and
// doubling it if it is full. Growth is driven by bytes that arrived, never by a
// declared length.
func (r *Reader) fill() error {
	if r.r > 0 {
		n := copy(r.buf, r.buf[r.r:r.w])
		r.w, r.r = n, 0
	}
	if r.w == len(r.buf) {
		nb := make([]byte, 2*len(r.buf))
		copy(nb, r.buf[:r.w])
		r.buf = nb
	}
	if r.err != nil {
		err := r.err
		r.err = nil
		return err
	}
	for range 100 {
		n, err := r.rd.Read(r.buf[r.w:])
		if n < 0 || n > len(r.buf)-r.w {
			panic("resp: reader returned invalid count")
		}
		r.w += n
		if err != nil {
			if n > 0 {
				// Hand over the bytes now and the error on the next fill.
				r.err = err
				return nil
			}
			return err
		}
		if n > 0 {
			return nil
		}
	}
	return io.ErrNoProgress
}

// shrink returns an oversized buffer (grown for one huge command or reply) to its
// initial size once it holds nothing the caller can still see.
func (r *Reader) shrink() {
	if len(r.buf) > 4*r.initSize && r.w-r.r <= r.initSize {
		nb := make([]byte, r.initSize)
		r.w = copy(nb, r.buf[r.r:r.w])
		r.r = 0
		r.buf = nb
	}
}

// eofErr turns EOF inside a message into ErrUnexpectedEOF; EOF between messages is
// a clean close.
func eofErr(err error, midMessage bool) error {
	if midMessage && err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ReadCommand reads one client command, a multibulk array of bulk strings or an
// inline command, appending its arguments to dst[:0]. The returned slices alias the
// Reader's buffer and are valid until the next call on r. Empty commands (an empty
// inline line, "*0") are skipped. Malformed input returns a *ProtocolError; a clean
// close between commands returns io.EOF, one inside a command io.ErrUnexpectedEOF.
func (r *Reader) ReadCommand(dst [][]byte) ([][]byte, error) {
	r.shrink()
	if r.cleft < 0 && r.tooLarge == nil {
		if args, n := r.wholeCommand(dst[:0]); n > 0 {
			r.r += n
			return args, nil
		}
	}
	for {
		var done bool
		var err error
		if r.tooLarge != nil {
			done, err = r.discardCommand()
		} else {
			done, err = r.parseCommand() // may start discarding (startDiscard)
		}
		if err == nil && done && r.tooLarge != nil {
			err = r.tooLarge // the over-limit command is gone: the stream is in sync
		}
		if err != nil {
			r.resetCommand()
			return dst[:0], err
		}
		if done {
			base := r.buf[r.r:]
			dst = dst[:0]
			for i := 0; i < len(r.offs); i += 2 {
				dst = append(dst, base[r.offs[i]:r.offs[i+1]:r.offs[i+1]])
			}
			r.r += r.cpos
			r.resetCommand()
			if len(dst) == 0 {
				continue
			}
			return dst, nil
		}
		mid := r.w > r.r || r.tooLarge != nil
		if err := r.fill(); err != nil {
			return dst[:0], eofErr(err, mid)
		}
	}
}

// wholeCommand parses, in one pass, a command that is wholly buffered and
// plain: a multibulk header and bulk headers that shortLen reads, every
// length within the limits. It returns the arguments (appended to dst) and
// the command's length, or 0 with nothing consumed for anything else — a
// command still arriving, an inline one, a long or malformed header, one
// over a limit — which parseCommand then takes, as the reference: this path
// accepts nothing it would not, and yields the same arguments. A pipelined
// GET spent a fifth of its instructions in the resumable parse (its offsets,
// its state kept in the Reader at every argument; docs/design/hashes.md,
// "Pipelined, session 21").
func (r *Reader) wholeCommand(dst [][]byte) ([][]byte, int) {
	if r.maxLine < shortLenMaxLine {
		return dst, 0
	}
	// The command's bytes must end within the limit: b ends there, so a
	// command that does not is one not wholly buffered.
	b := r.buf[r.r:r.w]
	b = b[:min(len(b), r.maxCmd)]
	// The bytes at a header, eight of them loaded at once: a header of one or
	// two digits, every short argument's, is read from them by two masked
	// compares, where digitsCRLF's checks per byte took ~40 instructions a
	// header (docs/design/hashes.md, "Session 35"). An argument's CRLF is
	// checked in the load that reads the next header from the six bytes
	// after it, a load and its bounds check less an argument (session 36).
	// x is 0 where fewer bytes are left: digitsCRLF reads the header, and
	// accepts the same (TestWholeCommandAgreesWithTheResumableParse).
	var x uint64
	if len(b) >= 8 {
		x = binary.LittleEndian.Uint64(b)
	}
	var n int64
	p := 0
	if d := byte(x>>8) - '0'; x&0xffff00ff == 0x0a0d002a && d <= 9 { // "*d\r\n"
		n, p, x = int64(d), 4, x>>32
	} else {
		if len(b) == 0 || b[0] != '*' {
			return dst, 0
		}
		var ok bool
		if n, p, ok = digitsCRLF(b, 1); !ok {
			return dst, 0
		}
		x = 0
	}
	if n <= 0 || n > int64(r.maxArray) {
		return dst, 0
	}
	for {
		// x: the bytes at p, if at least four of them were loaded.
		var l int64
		q := 0
		d0, d1 := byte(x>>8)-'0', byte(x>>16)-'0'
		switch {
		case x&0xffff00ff == 0x0a0d0024 && d0 <= 9: // "$d\r\n"
			l, q = int64(d0), p+4
		case x&0xffff0000ff == 0x0a0d000024 && d0 <= 9 && d1 <= 9: // "$dd\r\n"
			l, q = int64(d0)*10+int64(d1), p+5
		default:
			if p >= len(b) || b[p] != '$' {
				return dst, 0
			}
			var ok bool
			if l, q, ok = digitsCRLF(b, p+1); !ok {
				return dst, 0
			}
		}
		if l > int64(r.maxBulk) {
			return dst, 0
		}
		end := q + int(l)
		if end <= len(b)-8 {
			x = binary.LittleEndian.Uint64(b[end:])
			if uint16(x) != 0x0a0d { // "\r\n"
				return dst, 0
			}
			x >>= 16 // the next header's bytes (or the next command's)
		} else {
			if end > len(b)-2 || binary.LittleEndian.Uint16(b[end:]) != 0x0a0d {
				return dst, 0
			}
			x = 0
		}
		dst = append(dst, b[q:end:end])
		p = end + 2
		if n--; n == 0 {
			return dst, p
		}
	}
}

// parseCommand advances the parse of the command starting at r.r as far as the
// buffered bytes allow. It reports whether the command is complete.
func (r *Reader) parseCommand() (bool, error) {
	b := r.buf[r.r:r.w]
	if r.cleft < 0 {
		if len(b) == 0 {
			return false, nil
		}
		if b[0] != '*' {
			return r.parseInline(b)
		}
		n, next, ok := r.shortLen(b, 1)
		if !ok {
			line, nx, err := r.line(b, 0)
			if line == nil || err != nil {
				return false, err
			}
			if n, ok = parseInt(line[1:]); !ok {
				return false, protoErr("invalid multibulk length")
			}
			next = nx
		}
		if n > int64(r.maxArray) {
			return false, protoErr("multibulk length %d exceeds limit %d", n, r.maxArray)
		}
		r.cpos = next
		if n <= 0 {
			r.cleft = 0
			return true, nil
		}
		r.cleft = int(n)
	}
	for r.cleft > 0 {
		p := r.cpos
		if p >= len(b) {
			return false, nil
		}
		if b[p] != '$' {
			return false, protoErr("expected '$', got '%c'", b[p])
		}
		n, next, ok := r.shortLen(b, p+1)
		if !ok {
			line, nx, err := r.line(b, p)
			if line == nil || err != nil {
				return false, err
			}
			if n, ok = parseInt(line[1:]); !ok || n < 0 {
				return false, protoErr("invalid bulk length")
			}
			next = nx
		}
		if n > int64(r.maxBulk) {
			return r.startDiscard(next, n, fmt.Sprintf("value of %d bytes exceeds the limit of %d bytes (--max-bulk)", n, r.maxBulk), "the command was not run")
		}
		end := next + int(n)
		if end+2 > r.maxCmd {
			return r.startDiscard(next, n, fmt.Sprintf("command larger than the limit of %d bytes (--max-request)", r.maxCmd), "it was not run")
		}
		if end+2 > len(b) {
			return false, nil
		}
		if b[end] != '\r' || b[end+1] != '\n' {
			return false, protoErr("bulk string not terminated by CRLF")
		}
		r.offs = append(r.offs, next, end)
		r.cpos = end + 2
		r.cleft--
	}
	return true, nil
}

// startDiscard switches the parse of the current command to discarding it: the
// argument whose header ends at next (relative to r.r) is n bytes long and
// over a limit, so it and every argument after it are read and thrown away
// (discardCommand), and ReadCommand then returns a TooLargeError saying what
// (which limit) and notRun. One too large to skip is a protocol error saying what.
// Nothing of the command is buffered from here on: memory stays bounded.
func (r *Reader) startDiscard(next int, n int64, what, notRun string) (bool, error) {
	r.skipped = int64(next) + n + 2
	if r.skipped > r.maxSkip {
		return false, protoErr("%s, and larger than %d bytes, the most this node reads to skip it", what, r.maxSkip)
	}
	r.tooLarge = &TooLargeError{Msg: what + "; " + notRun}
	r.r += next // the header and the arguments before it are done with
	r.cpos, r.offs = 0, r.offs[:0]
	r.skip = n + 2
	r.cleft--
	return r.discardCommand()
}

// discardCommand throws away the buffered bytes of an over-limit command and
// parses the headers of its remaining arguments, as far as the buffer goes; it
// reports whether the whole command is gone. The bytes skipped are not checked
// (a bulk's CRLF included): the declared lengths say where the command ends.
func (r *Reader) discardCommand() (bool, error) {
	for {
		if r.skip > 0 {
			k := min(int64(r.w-r.r), r.skip)
			r.r += int(k)
			r.skip -= k
			if r.skip > 0 {
				return false, nil
			}
		}
		if r.cleft == 0 {
			return true, nil
		}
		b := r.buf[r.r:r.w]
		if len(b) == 0 {
			return false, nil
		}
		if b[0] != '$' {
			return false, protoErr("expected '$', got '%c'", b[0])
		}
		line, next, err := r.line(b, 0)
		if line == nil || err != nil {
			return false, err
		}
		n, ok := parseInt(line[1:])
		if !ok || n < 0 {
			return false, protoErr("invalid bulk length")
		}
		r.skipped += int64(next) + n + 2
		if r.skipped > r.maxSkip {
			return false, protoErr("command over the limit and larger than %d bytes, the most this node reads to skip it", r.maxSkip)
		}
		r.r += next
		r.skip = n + 2
		r.cleft--
	}
}

// shortLen is the fast path for a command's length headers, which are almost always
// a few plain digits: it parses "<1-9 digits>\r\n" at b[p:] without the generic line
// search (a bytes.IndexByte call per header was a third of the parse). It accepts a
// strict subset of what line+parseInt accept, with the same value; ok is false for
// anything else (signs, long or malformed numbers, a header not fully buffered yet),
// and the caller then takes the general path, which gives the verdict.
// It declines when the line limit is set below the longest header it accepts, so that
// the limit's verdict stays the general path's.
func (r *Reader) shortLen(b []byte, p int) (n int64, next int, ok bool) {
	if r.maxLine < shortLenMaxLine {
		return 0, 0, false
	}
	return digitsCRLF(b, p)
}

// digitsCRLF is shortLen past its line-limit check: at most nine digits at
// b[p:] and a CRLF after them.
func digitsCRLF(b []byte, p int) (n int64, next int, ok bool) {
	for i := p; i < len(b) && i <= p+9; i++ {
		c := b[i]
		if c-'0' <= 9 {
			n = n*10 + int64(c-'0')
			continue
		}
		if c == '\r' && i > p && i+1 < len(b) && b[i+1] == '\n' {
			return n, i + 2, true
		}
		return 0, 0, false
	}
	return 0, 0, false
}

// shortLenMaxLine is the longest header line shortLen accepts: a type byte and nine digits.
const shortLenMaxLine = 10

// line finds the CRLF-terminated line starting at b[p]. It returns the line without
// CRLF and the offset after it, or a nil line if more bytes are needed.
func (r *Reader) line(b []byte, p int) ([]byte, int, error) {
	i := bytes.IndexByte(b[p:], '\n')
	if i < 0 {
		if len(b)-p > r.maxLine {
			return nil, 0, protoErr("line longer than limit %d", r.maxLine)
		}
		return nil, 0, nil
	}
	if i > r.maxLine {
		// Same verdict whether or not the newline has arrived yet.
		return nil, 0, protoErr("line longer than limit %d", r.maxLine)
	}
	if i == 0 || b[p+i-1] != '\r' {
		return nil, 0, protoErr("line not terminated by CRLF")
	}
	return b[p : p+i-1 : p+i-1], p + i + 1, nil
}

// parseInline parses a telnet-style command: one line of arguments separated by
// spaces or tabs, with Redis's double-quoted ("\n", "\xff" escapes) and single-quoted
// strings. Escapes are decoded in place: the decoded argument is never longer than
// its quoted form.
func (r *Reader) parseInline(b []byte) (bool, error) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		if len(b) > r.maxLine {
			return false, protoErr("too big inline request (limit %d)", r.maxLine)
		}
		return false, nil
	}
	if i > r.maxLine {
		return false, protoErr("too big inline request (limit %d)", r.maxLine)
	}
	line := b[:i]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	r.offs = r.offs[:0]
	p := 0
	for {
		for p < len(line) && isSpace(line[p]) {
			p++
		}
		if p == len(line) {
			break
		}
		if len(r.offs)/2 >= r.maxArray {
			return false, protoErr("inline command has more than %d arguments", r.maxArray)
		}
		start := p
		switch line[p] {
		case '"', '\'':
			q := line[p]
			p++
			out := start
			closed := false
			for p < len(line) {
				c := line[p]
				if c == q {
					closed = true
					p++
					break
				}
				if c == '\\' && p+1 < len(line) {
					p++
					c = line[p]
					if q == '"' {
						switch c {
						case 'n':
							c = '\n'
						case 'r':
							c = '\r'
						case 't':
							c = '\t'
						case 'b':
							c = '\b'
						case 'a':
							c = '\a'
						case 'x':
							if p+2 < len(line) && isHex(line[p+1]) && isHex(line[p+2]) {
								c = unhex(line[p+1])<<4 | unhex(line[p+2])
								p += 2
							}
						}
					} else if c != '\'' {
						// Single quotes only escape the quote itself.
						line[out] = '\\'
						out++
					}
				}
				line[out] = c
				out++
				p++
			}
			if !closed || (p < len(line) && !isSpace(line[p])) {
				return false, protoErr("unbalanced quotes in request")
			}
			r.offs = append(r.offs, start, out)
		default:
			for p < len(line) && !isSpace(line[p]) {
				p++
			}
			r.offs = append(r.offs, start, p)
		}
	}
	r.cpos = i + 1
	r.cleft = 0
	return true, nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' }

func isHex(c byte) bool {
	return ('0' <= c && c <= '9') || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// parseInt parses a decimal int64 with an optional sign, rejecting empty input,
// stray bytes and overflow.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	neg := false
	if b[0] == '-' || b[0] == '+' {
		neg = b[0] == '-'
		b = b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		if n > 1<<63 {
			return 0, false
		}
	}
	if neg {
		return -int64(n), true // -(1<<63) wraps to itself, which is MinInt64
	}
	if n > 1<<63-1 {
		return 0, false
	}
	return int64(n), true
}
