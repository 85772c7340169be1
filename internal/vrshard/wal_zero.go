package vrshard

import (
	"time"

	"github.com/kefirdb/kefir/internal/seglog"
)

// Zero-filled segments (docs/design/zero-filled-logs.md): a filler
// (seglog.Filler) writes the next segment's file full of zeros and fsyncs it
// before it is needed, so the log's writes overwrite blocks that are already
// allocated and written, and an fdatasync has no file size or extent to
// commit (on this machine's disk about 83 µs p50 against 187 µs for an
// append). What is here is the replication log's sizing policy.

// walConfig configures a WAL. The zero-filled size of a segment is twice the
// logical size of the one before it (what one checkpoint interval wrote,
// with room for a burst), rounded up to a MiB, within [minSeg, maxSeg]. A
// segment that fills up goes on by appending.
//
// Why these sizes: a checkpoint rolls the segment every 20,000 ops or 64 MiB
// of log (Options.CheckpointOps, CheckpointBytes). With 16-byte keys and
// 128-byte values an op is ~170 bytes of log, so an interval writes ~3.4 MB;
// with 1 KB values ~21 MB. Zero-filling a fixed 64 MiB ahead would cost 20
// bytes of background writes per byte of log in the first case; twice the
// last interval costs two. minSeg keeps small intervals (and the first
// segment, sized before any history) in place; maxSeg bounds the space
// reserved ahead, and covers CheckpointBytes' interval, the largest.
type walConfig struct {
	fill           seglog.FillMode
	minSeg, maxSeg int64
	// onSync, if set, is told how long each fsync of a segment took
	// (Options.OnLogSync); it runs on the goroutine that synced.
	onSync func(time.Duration)
	mut    walMutations
}

// walMutations are deliberate bugs the WAL's tests switch on to show they
// catch them; read only under mutation.On (internal/mutation).
type walMutations struct {
	// skipZeroTail: recovery leaves the bytes after the log's end as they
	// are, so a stale record can be resurrected.
	skipZeroTail bool
	// ignorePos: a record is valid wherever it lies, not only at the offset
	// it claims.
	ignorePos bool
	// ignoreSynced: recovery takes the first bad record as the end even when
	// a record says the log was durable past it.
	ignoreSynced bool
}

func defaultWALConfig() walConfig {
	return walConfig{fill: seglog.FillAsync, minSeg: 4 << 20, maxSeg: 64 << 20}
}

// zeroName is the filler's file, renamed to wal-<n>.log by the roll that
// takes it. Recovery removes it (seglog.TmpSuffix): a roll may have written
// into it before a crash, and it is cheap to make again.
const zeroName = "wal-zero" + seglog.TmpSuffix

// segSizeAfter returns the zero-filled size of the segment to follow one
// whose log ended at end.
func (c walConfig) segSizeAfter(end int64) int64 {
	const mib = 1 << 20
	s := (2*end + mib - 1) / mib * mib
	return min(max(s, c.minSeg), max(c.maxSeg, c.minSeg))
}

// requestFill asks for the next segment's file, sized after a segment whose
// log ended at end.
func (w *wal) requestFill(end int64) {
	if w.writeAt < 0 {
		return // the file system cannot overwrite in place
	}
	w.fill.Request(w.dir, w.cfg.segSizeAfter(end))
}
