package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Compaction (FAWN-DS "compact", Gecko head cleaning): a sealed, synced segment whose live
// fraction is below the threshold has its live versions appended again at the tail (as
// copies, same version and timestamp), the copies are synced, and the segment is removed.
// Reads and appends continue throughout; readers that already found a record in the
// segment keep it open until they are done.
//
// Crash safety, step by step:
//  1. copies appended and synced — a crash now leaves both the original and the copy;
//     recovery keeps one (same version, the later position wins);
//  2. every hint file removed — hints may point into the segment;
//  3. a non-head segment is replaced by a gap file ("%016x.gap": the range it covered),
//     written to a temporary name, synced and renamed, so recovery can tell a reclaimed
//     range from a lost one; a head segment needs no gap;
//  4. the segment file removed and the directory synced.
//
// A tombstone is dropped (not copied) only when it is its key's sole version and sits in
// the head segment: every older record of the key is then either in that segment or a
// copy carrying a floor that tells recovery the key was deleted.

func gapName(id uint64) string { return fmt.Sprintf("%016x.gap", id) }

// Compact compacts every sealed, synced segment whose live fraction is below
// Options.CompactionThreshold, oldest first.
func (db *DB) Compact() error {
	db.maint.Lock()
	defer db.maint.Unlock()
	for {
		seg := db.pickVictim()
		if seg == nil {
			return nil
		}
		if err := db.compactSegment(seg); err != nil {
			return err
		}
	}
}

// pickVictim returns the oldest segment worth compacting, or nil.
func (db *DB) pickVictim() *segment {
	db.mu.RLock()
	defer db.mu.RUnlock()
	if db.closed || db.failed != nil {
		return nil
	}
	for _, s := range db.segs[:len(db.segs)-1] {
		if s.f == nil || s.end() > uint64(db.dur) {
			continue
		}
		if s.size == 0 || float64(s.live) < db.opts.CompactionThreshold*float64(s.size) {
			return s
		}
	}
	return nil
}

func (db *DB) compactSegment(s *segment) error {
	data := make([]byte, s.size)
	if _, err := s.f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("storage: compact: read %s: %w", s.path, err)
	}
	db.throttle(len(data))
	copied := 0
	for p := 0; p < len(data); {
		batch := 0
		// Work in batches so appends and reads interleave with a long compaction.
		db.mu.Lock()
		if err := db.writableLocked(); err != nil {
			db.mu.Unlock()
			return err
		}
		now := db.now()
		head := db.segs[0] == s
		batchEnd := min(p+64<<10, len(data))
		for p < batchEnd {
			h, key, val, ok := decodeRecord(data[p:], s.id+uint64(p))
			if !ok {
				db.mu.Unlock()
				return &CorruptionError{File: s.path, Offset: int64(p), Reason: "bad record found by compaction"}
			}
			meta, _ := splitPayload(payload(data[p:], h), h.flags&flagMeta != 0)
			n, err := db.moveLocked(key, val, meta, h, s.id+uint64(p), head, now)
			if err != nil {
				db.mu.Unlock()
				return fmt.Errorf("storage: compact %s: %w", s.path, err)
			}
			batch += n
			p += h.size()
		}
		db.mu.Unlock()
		copied += batch
		db.throttle(batch)
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		return fmt.Errorf("storage: compact: sync copies: %w", err)
	}
	if err := db.removeHints(); err != nil {
		return err
	}

	db.mu.Lock()
	i := 0
	for db.segs[i] != s {
		i++
	}
	if s.live != 0 {
		db.mu.Unlock()
		panic(fmt.Sprintf("storage: compacted segment %s still holds %d live bytes", s.path, s.live))
	}
	head := i == 0
	db.mu.Unlock()

	dir := db.devs[s.dev].dir
	if !head {
		if err := db.writeGap(s); err != nil {
			return err
		}
	}
	db.mu.Lock()
	if head {
		db.segs = db.segs[1:]
	} else {
		db.segs[i] = &segment{id: s.id, dev: s.dev, size: s.size, path: vfs.Join(dir, gapName(s.id))}
	}
	db.mu.Unlock()
	// Wait for readers that pinned the segment before it left the list.
	for s.refs.Load() > 1 {
		time.Sleep(50 * time.Microsecond)
	}
	closeSegment(s)
	if err := db.fs.Remove(s.path); err != nil {
		return fmt.Errorf("storage: compact: %w", err)
	}
	if err := db.fs.SyncDir(dir); err != nil {
		db.mu.Lock()
		db.failLocked(fmt.Errorf("sync dir %s: %w", dir, err))
		db.mu.Unlock()
		return db.Stats().Failed
	}
	db.st.compactions.Add(1)
	db.st.compacted.Add(int64(copied))
	return db.dropHeadGaps()
}

// moveLocked copies the record at pos (version h of key) to the tail if the index still
// needs it there, and returns the bytes copied.
func (db *DB) moveLocked(key, val, meta []byte, h recHdr, pos uint64, head bool, now int64) (int, error) {
	it, ok := db.idx.Get(keyString(key))
	if !ok {
		return 0, nil
	}
	// Re-apply retention first: time-based versions may have expired since.
	vs := db.idx.vers(&it)
	it = db.retainLocked(it, vs.appendTo(nil), now)
	db.idx.Set(it)
	vs = db.idx.vers(&it)
	j := -1
	for i := 0; i < vs.n(); i++ {
		if v := vs.at(i); v.version == h.version && v.pos == pos {
			j = i
			break
		}
	}
	if j < 0 {
		return 0, nil // garbage
	}
	v := vs.at(j)
	if v.tombstone() && vs.n() == 1 && head {
		db.idx.Delete(keyString(key))
		db.dropLocked(v)
		return 0, nil
	}
	r := Record{Key: key, Value: val, Meta: meta, Version: h.version, Timestamp: h.ts, Tombstone: h.flags&flagTombstone != 0}
	size := recSize(&r)
	if db.rollDueLocked(size) {
		if err := db.rollLocked(); err != nil {
			return 0, err
		}
	}
	if len(db.buf) >= db.opts.WriteBufferSize && !db.sealing {
		if err := db.flushLocked(); err != nil {
			return 0, err
		}
	}
	start := uint64(db.next)
	db.buf = appendRecord(db.buf, &r, flagCopy, it.v.version, start, uint64(db.dur))
	db.next += Pos(size)
	db.liveAdd(v.pos, -int64(v.size)) // moved, not dropped
	v.pos, v.size = start, uint32(size)
	db.liveAdd(start, int64(size))
	all := vs.appendTo(nil)
	all[j] = v
	db.idx.Set(db.idx.makeItem(it, all))
	return size, nil
}

// writeGap durably records that segment s's range was reclaimed.
func (db *DB) writeGap(s *segment) error {
	dir := db.devs[s.dev].dir
	final := vfs.Join(dir, gapName(s.id))
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:], s.end())
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b[:8], seglog.CRCTable))
	if err := db.writeDurably(dir, final, b[:]); err != nil {
		return fmt.Errorf("storage: compact: gap file %s: %w", final, err)
	}
	return nil
}

// writeDurably writes b as the whole file final in dir, durably and
// atomically (vfs.WriteFileDurably on the engine's file system).
func (db *DB) writeDurably(dir, final string, b []byte) error {
	return vfs.WriteFileDurably(db.fs, dir, final, b)
}

// publish ends the atomic write of a streamed file (vfs.Publish).
func (db *DB) publish(f vfs.File, err error, dir, tmp, final string) error {
	return vfs.Publish(db.fs, f, err, dir, tmp, final)
}

// readGap returns the end position recorded in a gap file.
func (db *DB) readGap(path string) (uint64, error) {
	f, err := db.fs.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var b [12]byte
	if _, err := f.ReadAt(b[:], 0); err != nil {
		return 0, fmt.Errorf("storage: read gap %s: %w", path, err)
	}
	if crc32.Checksum(b[:8], seglog.CRCTable) != binary.LittleEndian.Uint32(b[8:]) {
		return 0, &CorruptionError{File: path, Reason: "gap file checksum mismatch"}
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// dropHeadGaps removes gap files at the head of the log: nothing before them remains, so
// the range they vouch for no longer needs vouching.
func (db *DB) dropHeadGaps() error {
	for {
		db.mu.Lock()
		if len(db.segs) < 2 || db.segs[0].f != nil {
			db.mu.Unlock()
			return nil
		}
		g := db.segs[0]
		db.segs = db.segs[1:]
		db.mu.Unlock()
		if err := db.fs.Remove(g.path); err != nil {
			return fmt.Errorf("storage: remove gap: %w", err)
		}
		if err := db.fs.SyncDir(db.devs[g.dev].dir); err != nil {
			return fmt.Errorf("storage: remove gap: %w", err)
		}
	}
}

// throttle sleeps long enough to keep compaction I/O within CompactionRate.
func (db *DB) throttle(n int) {
	if r := db.opts.CompactionRate; r > 0 && n > 0 {
		time.Sleep(time.Duration(int64(n) * int64(time.Second) / r))
	}
}

// maintenance runs Compact every CompactInterval and Checkpoint every
// CheckpointInterval (when the log grew since the last hint) until Close.
func (db *DB) maintenance() {
	defer close(db.compactDone)
	var compactC, ckptC <-chan time.Time
	if d := db.opts.CompactInterval; d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		compactC = t.C
	}
	if d := db.opts.CheckpointInterval; d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		ckptC = t.C
	}
	lastHint := db.Stats().HintPos
	for {
		select {
		case <-db.compactStop:
			return
		case <-compactC:
			if err := db.Compact(); err != nil && !errors.Is(err, ErrClosed) {
				db.opts.Logger.Warn("background compaction", "err", err)
			}
		case <-ckptC:
			if p := db.LastPos(); p != lastHint {
				if err := db.Checkpoint(); err != nil {
					if !errors.Is(err, ErrClosed) {
						db.opts.Logger.Warn("background checkpoint", "err", err)
					}
					continue
				}
				lastHint = p
			}
		}
	}
}
