package wire

import (
	"errors"
	"fmt"
	"io"

	"github.com/kefirdb/kefir/internal/frame"
	"github.com/kefirdb/kefir/internal/vr"
)

// Writer batches frames and writes them with one Write per Flush (tools and
// tests; the transport keeps its own per-peer queue).
type Writer struct {
	w     io.Writer
	buf   []byte
	Max   int    // frame size limit (frame.DefaultMaxFrame if 0); larger messages are fragmented
	Group uint64 // the group the frames are addressed to
}

// NewWriter returns a Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Append queues m.
func (w *Writer) Append(m *vr.Message) {
	max := w.Max
	if max == 0 {
		max = frame.DefaultMaxFrame
	}
	w.buf = frame.AppendFrames(w.buf, w.Group, Payload(m), max)
}

// Buffered is the number of bytes waiting for Flush.
func (w *Writer) Buffered() int { return len(w.buf) }

// Flush writes every queued frame in one Write.
func (w *Writer) Flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.w.Write(w.buf)
	if cap(w.buf) > 1<<20 {
		w.buf = nil // do not pin a snapshot-sized buffer
	} else {
		w.buf = w.buf[:0]
	}
	if err != nil {
		return fmt.Errorf("wire: write: %w", err)
	}
	return nil
}

// Reader reads frames from a byte stream.
type Reader struct {
	r    io.Reader
	buf  []byte
	lo   int
	hi   int
	Max  int // frame size limit (frame.DefaultMaxFrame if 0)
	sick error
	join frame.Joiner
}

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader { return &Reader{r: r, buf: make([]byte, 64<<10)} }

// Read decodes the next message into m, whatever its group. The message
// owns its byte slices.
// After ErrCorrupt or ErrTooLarge the stream is unusable (framing is lost)
// and every later call returns the same error.
func (r *Reader) Read(m *vr.Message) error {
	if r.sick != nil {
		return r.sick
	}
	max := r.Max
	if max == 0 {
		max = frame.DefaultMaxFrame
	}
	for {
		payload, n, err := frame.CheckFrame(r.buf[r.lo:r.hi], max)
		if err != nil {
			r.sick = err
			return err
		}
		if n > 0 {
			r.lo += n
			whole, ok, err := r.join.Add(payload)
			if err != nil {
				r.sick = err
				return err
			}
			if !ok {
				continue
			}
			own := append([]byte(nil), whole...)
			if err := DecodeFrame(own, m); err != nil {
				r.sick = err
				return err
			}
			return nil
		}
		if err := r.fill(max); err != nil {
			return err
		}
	}
}

func (r *Reader) fill(max int) error {
	if r.lo > 0 {
		copy(r.buf, r.buf[r.lo:r.hi])
		r.hi -= r.lo
		r.lo = 0
	}
	if r.hi == len(r.buf) {
		if len(r.buf) >= max+frame.FrameHeader {
			return fmt.Errorf("%w: buffer full", ErrTooLarge)
		}
		nb := make([]byte, min(2*len(r.buf), max+frame.FrameHeader))
		copy(nb, r.buf[:r.hi])
		r.buf = nb
	}
	n, err := r.r.Read(r.buf[r.hi:])
	r.hi += n
	if err != nil {
		if errors.Is(err, io.EOF) && r.hi > 0 && n == 0 {
			return fmt.Errorf("%w: stream ended inside a frame", io.ErrUnexpectedEOF)
		}
		if n > 0 && errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	return nil
}
