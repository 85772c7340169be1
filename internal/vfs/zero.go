package vfs

import (
	"bytes"
	"errors"
)

// Helpers for zero-filled log segments (docs/design/zero-filled-logs.md): a log writes
// in place over blocks zero-filled and synced in advance, so its fdatasync commits no
// file size or extent.

// ErrStopped is returned by ZeroFill when its stop function reports true.
var ErrStopped = errors.New("vfs: zero fill stopped")

// ZeroFill appends size zero bytes to f in 1 MiB writes and fsyncs it every 4 MiB and at
// the end, so the disk never sees one large burst of dirty pages. It checks stop (if not
// nil) before each write and returns ErrStopped when it reports true.
func ZeroFill(f File, size int64, stop func() bool) error {
	const step = 4 << 20
	zeros := make([]byte, min(size, 1<<20))
	for off := int64(0); off < size; {
		if stop != nil && stop() {
			return ErrStopped
		}
		n := min(int64(len(zeros)), size-off)
		if _, err := f.Write(zeros[:n]); err != nil {
			return err
		}
		off += n
		if off%step == 0 || off == size {
			if err := f.Sync(); err != nil {
				return err
			}
		}
	}
	return nil
}

// ZeroNonZero overwrites with zeros every 4 KiB block of the file range [off, off+len(b))
// (blocks aligned to file offsets, the first and last clipped to the range) whose
// contents, b, hold a non-zero byte, and returns how many bytes it wrote. A range that
// is already zero costs no write.
func ZeroNonZero(wa WriterAt, b []byte, off int64) (int64, error) {
	const blk = 4096
	var zeros [blk]byte
	var written int64
	for lo := int64(0); lo < int64(len(b)); {
		hi := min(((off+lo)/blk+1)*blk-off, int64(len(b)))
		if !bytes.Equal(b[lo:hi], zeros[:hi-lo]) {
			if _, err := wa.WriteAt(zeros[:hi-lo], off+lo); err != nil {
				return written, err
			}
			written += hi - lo
		}
		lo = hi
	}
	return written, nil
}
