package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Open opens (creating if needed) an engine over the configured devices and recovers its
// state: the newest valid hint file (index checkpoint) if any, then every record after it.
func Open(opts Options) (*DB, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	db := &DB{opts: opts, fs: opts.FS, idx: newTree()}
	db.syncCond = sync.NewCond(&db.mu)
	db.notify = make(chan struct{})
	for _, d := range opts.Devices {
		if err := db.fs.MkdirAll(d.Dir); err != nil {
			return nil, fmt.Errorf("storage: create %s: %w", d.Dir, err)
		}
		db.devs = append(db.devs, newDevice(d))
	}
	if opts.CacheBytes > 0 {
		db.cache = newCache(opts.CacheBytes)
	}
	mode := seglog.FillAsync
	if opts.Inline {
		mode = seglog.FillInline
	}
	if opts.NoZeroFill {
		mode = seglog.FillOff
	}
	if opts.mut.setFill {
		mode = opts.mut.fill
	}
	db.fill = seglog.NewFiller(db.fs, zeroName, mode)
	if err := db.recover(); err != nil {
		db.fill.Close()
		db.closeFiles()
		return nil, err
	}
	if !opts.Inline || opts.SyncInterval > 0 || opts.SyncBytes > 0 {
		db.syncer = !opts.Inline
		db.bgKick = make(chan struct{}, 1)
		db.bgStop = make(chan struct{})
		db.bgDone = make(chan struct{})
		go db.background()
	}
	if opts.CompactInterval > 0 || opts.CheckpointInterval > 0 {
		db.compactStop = make(chan struct{})
		db.compactDone = make(chan struct{})
		go db.maintenance()
	}
	return db, nil
}

func (db *DB) closeFiles() {
	for _, s := range db.segs {
		if s.f != nil {
			closeSegment(s)
		}
	}
}

type fileRef struct {
	id   uint64
	dev  int
	path string
	gap  bool
}

// parseName parses "%016x" + suffix.
func parseName(name, suffix string) (uint64, bool) {
	if !strings.HasSuffix(name, suffix) || len(name) != 16+len(suffix) {
		return 0, false
	}
	id, err := strconv.ParseUint(name[:16], 16, 64)
	return id, err == nil
}

// list returns the segments and gap files, sorted, the hint files, and the format
// mark's path ("" if there is none).
func (db *DB) list() (segs, hints []fileRef, mark string, err error) {
	for d, dev := range db.devs {
		names, err := db.fs.ReadDir(dev.dir)
		if err != nil {
			return nil, nil, "", fmt.Errorf("storage: list %s: %w", dev.dir, err)
		}
		for _, name := range names {
			path := vfs.Join(dev.dir, name)
			if name == formatMarkName {
				mark = path
			} else if id, ok := parseName(name, ".log"); ok {
				segs = append(segs, fileRef{id, d, path, false})
			} else if id, ok := parseName(name, ".gap"); ok {
				segs = append(segs, fileRef{id, d, path, true})
			} else if id, ok := parseName(name, ".hint"); ok {
				hints = append(hints, fileRef{id, d, path, false})
			} else if seglog.IsTmp(name) {
				// An unfinished hint, compaction output or format mark, or the
				// filler's zero-filled file: never referenced.
				if err := seglog.RemoveLeftover(db.fs, path); err != nil {
					return nil, nil, "", fmt.Errorf("storage: %w", err)
				}
			}
		}
	}
	cmp := func(a, b fileRef) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	}
	slices.SortFunc(segs, cmp)
	slices.SortFunc(hints, cmp)
	out := segs[:0]
	for i, s := range segs {
		if i > 0 && s.id == segs[i-1].id {
			a, b := segs[i-1], s
			if a.gap == b.gap {
				return nil, nil, "", &CorruptionError{File: b.path, Reason: "two segments with the same start position: " + a.path}
			}
			// Compaction crashed between writing the gap file and removing the segment:
			// the segment (whose records were also copied) wins.
			g := a
			if b.gap {
				g = b
			} else {
				out[len(out)-1] = b
			}
			if err := db.fs.Remove(g.path); err != nil {
				return nil, nil, "", fmt.Errorf("storage: remove stale gap: %w", err)
			}
			continue
		}
		out = append(out, s)
	}
	return out, hints, mark, nil
}

func (db *DB) recover() error {
	refs, hints, mark, err := db.list()
	if err != nil {
		return err
	}
	db.fmtFrom = math.MaxUint64 // format 1 throughout
	if mark != "" {
		if db.fmtFrom, err = db.readFormatMark(mark); err != nil {
			return err
		}
	}
	if len(refs) == 0 {
		// A new engine: format 2 from the start, marked before any record exists.
		if db.fmtFrom != 0 {
			if err := db.writeFormatMark(0); err != nil {
				return err
			}
		}
		// Nothing waits on the write path yet: zero-fill the first segment here.
		db.fill.FillNow(db.devs[0].dir, min(db.opts.SegmentSize, minZeroSize))
		seg, err := db.createSegment(0, 0)
		if err != nil {
			return err
		}
		db.segs = []*segment{seg}
		db.mapActive(seg)
		return nil
	}
	if refs[len(refs)-1].gap {
		return &CorruptionError{File: refs[len(refs)-1].path, Reason: "the log ends with a gap (its tail segment is missing)"}
	}
	for i, r := range refs {
		if r.gap {
			end, err := db.readGap(r.path)
			if err != nil {
				return err
			}
			s := &segment{id: r.id, dev: r.dev, path: r.path, size: int64(end - r.id)}
			s.refs.Store(1)
			db.segs = append(db.segs, s)
			continue
		}
		var f vfs.File
		if i == len(refs)-1 {
			f, err = db.fs.OpenRW(r.path)
		} else {
			f, err = db.fs.Open(r.path)
		}
		if err != nil {
			return fmt.Errorf("storage: open segment: %w", err)
		}
		size, err := f.Size()
		if err != nil {
			f.Close()
			return fmt.Errorf("storage: size of %s: %w", r.path, err)
		}
		s := &segment{id: r.id, dev: r.dev, path: r.path, f: f, size: size, fileSize: size}
		s.refs.Store(1)
		db.segs = append(db.segs, s)
	}
	for i := 0; i+1 < len(db.segs); i++ {
		if a, b := db.segs[i], db.segs[i+1]; a.end() != b.id {
			cerr := &CorruptionError{File: a.path, Offset: min(a.size, int64(b.id-a.id)),
				Reason: fmt.Sprintf("log gap or overlap: segment ends at %d, next (%s) starts at %d", a.end(), b.path, b.id)}
			if !db.opts.Salvage || a.f == nil {
				return cerr
			}
			if err := db.salvage(i, min(a.size, int64(b.id-a.id)), cerr); err != nil {
				return err
			}
			break
		}
	}

	from := db.segs[0].id
	last := db.segs[len(db.segs)-1]
	for i := len(hints) - 1; i >= 0; i-- {
		h := hints[i]
		if h.id < db.segs[0].id || h.id > last.end() {
			continue
		}
		if err := db.loadHint(h.path, h.id, last.end()); err != nil {
			db.opts.Logger.Warn("ignoring hint file", "file", h.path, "err", err)
			db.idx = newTree()
			db.lastV = 0
			continue
		}
		from = h.id
		db.hintPos = Pos(h.id)
		break
	}

	floors := map[string]uint64{}
	for i := 0; i < len(db.segs); i++ {
		s := db.segs[i]
		if s.end() <= from || s.f == nil {
			continue
		}
		if err := db.replay(i, max(from, s.id), floors); err != nil {
			return err
		}
	}
	// A copy made by compaction whose key no longer has any version >= the copy's floor
	// belongs to a key deleted since (its tombstone was reclaimed): it must not resurrect.
	for k, floor := range floors {
		if it, ok := db.idx.Get(k); ok && it.v.version < floor {
			db.idx.Delete(k)
		}
	}
	// Recount live bytes from the index (replay over-counts superseded copies).
	for _, s := range db.segs {
		s.live = 0
	}
	db.nvers = 0
	db.idx.Scan(func(it item) bool {
		vs := db.idx.vers(&it)
		db.nvers += vs.n()
		for i := 0; i < vs.n(); i++ {
			v := vs.at(i)
			if s := db.segFor(v.pos); s != nil {
				s.live += int64(v.size)
			}
		}
		return true
	})
	last = db.segs[len(db.segs)-1]
	// Sync even when nothing changed: after a process crash (not a power cut) the
	// records just read may be in the page cache only, and the next record's synced
	// mark will say they are durable.
	if err := last.f.Sync(); err != nil {
		return fmt.Errorf("storage: fsync %s: %w", last.path, err)
	}
	if db.fmtFrom == math.MaxUint64 {
		// Upgrade: records from here on are format 2; everything before is durable.
		if err := db.writeFormatMark(last.end()); err != nil {
			return err
		}
	}
	for _, s := range db.segs[:len(db.segs)-1] {
		if s.f != nil {
			db.mapSegment(s)
		}
	}
	db.tail = last.dev
	db.next = Pos(last.end())
	db.writ, db.dur = db.next, db.next
	db.durA.Store(uint64(db.dur))
	if last.fileSize > last.size {
		last.zeroSize = last.fileSize
	}
	db.mapActive(last)
	db.askFillLocked()
	return nil
}

// replay reads segment i from logical position from and indexes its records: format 1
// records below db.fmtFrom, format 2 records (at the position they claim) from it on.
//
// The first bad record of the last segment is the end of the log if the log was not
// durable there: it is not below db.fmtFrom (everything before was synced when the
// directory was upgraded) and no valid record after it carries a synced mark past it.
// Then every non-zero block after the end is overwritten with zeros (the file is cut
// there if it cannot be written in place), so a stale record can never come back. In a
// format 1 directory the old rule holds: a bad record in the last segment with nothing
// valid after it is a torn tail and is cut off. Anything else is corruption.
func (db *DB) replay(i int, from uint64, floors map[string]uint64) error {
	s := db.segs[i]
	off := int64(from - s.id)
	data := make([]byte, s.size-off)
	if _, err := s.f.ReadAt(data, off); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("storage: read %s: %w", s.path, err)
	}
	now := db.now()
	p := 0
	var pending []replayed // the batch being read (flagBatchCont)
	batchStart := 0        // its offset in data
	for p < len(data) {
		at := s.id + uint64(off) + uint64(p)
		h, key, _, ok := decodeRecord(data[p:], at)
		if ok && h.v2() != (at >= db.fmtFrom) {
			ok = false // a format 1 record where format 2 began, or the reverse
		}
		if !ok {
			bad := off + int64(p)
			lastSeg := i == len(db.segs)-1
			reason := "checksum or framing mismatch before the end of the log"
			switch {
			case !lastSeg:
			case db.fmtFrom == math.MaxUint64:
				if !anyValidAfter(data, p) {
					if len(pending) > 0 { // format 1 has no batches: cannot happen
						return &CorruptionError{File: s.path, Offset: bad, Reason: "a batch of records in a format 1 log"}
					}
					db.opts.Logger.Info("cutting torn tail", "file", s.path, "offset", bad, "bytes", len(data)-p)
					if err := s.f.Truncate(bad); err != nil {
						return fmt.Errorf("storage: truncate torn tail of %s: %w", s.path, err)
					}
					s.size, s.fileSize = bad, bad
					return nil
				}
			case at < db.fmtFrom:
				reason = fmt.Sprintf("checksum or framing mismatch below %d, where the log was durable when its format was upgraded", db.fmtFrom)
			default:
				j := -1
				if !(mutation.On && db.opts.mut.ignoreSynced) {
					j = validAfterEnd(data, p, s.id, uint64(off))
				}
				if j < 0 {
					if len(pending) > 0 {
						return db.dropIncompleteBatch(s, data[batchStart:], off+int64(batchStart), len(pending))
					}
					return db.endLog(s, data[p:], bad)
				}
				reason = fmt.Sprintf("checksum or framing mismatch below the synced point: the valid record at offset %d says the log was durable up to %d",
					off+int64(j), binary.LittleEndian.Uint64(data[j+45:]))
			}
			cerr := &CorruptionError{File: s.path, Offset: bad, Reason: reason}
			if !db.opts.Salvage {
				return cerr
			}
			return db.salvage(i, bad, cerr)
		}
		size := h.size()
		v := ver{version: h.version, ts: h.ts, pos: s.id + uint64(off) + uint64(p), size: uint32(size)}
		if h.flags&flagTombstone != 0 {
			v.flags = verTombstone
		}
		if h.flags&flagMeta != 0 {
			meta, _ := splitPayload(payload(data[p:], h), true)
			v.flags |= verMeta | db.countMeta(meta)
		}
		// A record of a batch that goes on (flagBatchCont) waits for the
		// batch's last record: a batch is indexed whole or not at all.
		if len(pending) == 0 {
			batchStart = p
		}
		pending = append(pending, replayed{key: key, v: v, h: h})
		if h.flags&flagBatchCont == 0 {
			for _, r := range pending {
				db.indexReplayed(r, floors, now)
			}
			pending = pending[:0]
		}
		p += size
	}
	if len(pending) > 0 {
		if i != len(db.segs)-1 {
			return &CorruptionError{File: s.path, Offset: off + int64(batchStart), Reason: "a batch of records that the segment does not finish (a batch never straddles segments)"}
		}
		return db.dropIncompleteBatch(s, data[batchStart:], off+int64(batchStart), len(pending))
	}
	return nil
}

// replayed is a record read by replay, indexed once its batch is complete.
type replayed struct {
	key []byte
	v   ver
	h   recHdr
}

// indexReplayed indexes a replayed record (and notes a compaction copy's
// floor, and the highest version).
func (db *DB) indexReplayed(r replayed, floors map[string]uint64, now int64) {
	db.recoverInsert(r.key, r.v, now)
	if r.h.flags&flagCopy != 0 && r.h.floor > r.h.version {
		if f, ok := floors[string(r.key)]; !ok || r.h.floor > f {
			floors[string(r.key)] = r.h.floor
		}
	}
	if r.h.version > db.lastV {
		db.lastV = r.h.version
	}
}

// dropIncompleteBatch ends the log of the last segment s at file offset end,
// where a batch begins whose last record the log lost (a crash tore the
// unsynced tail inside it: n records of it survived). Its records are not
// indexed and are zeroed with the rest of the tail, so one Append is
// all-or-nothing across a crash (a single node's multi-record op: a HSET of
// many fields, an MSET) and no later batch can seem to finish it.
func (db *DB) dropIncompleteBatch(s *segment, tail []byte, end int64, n int) error {
	db.opts.Logger.Info("dropping a batch the crash cut short", "file", s.path, "offset", end, "records", n)
	return db.endLog(s, tail, end)
}

// endLog makes file offset end of the last segment s the end of the log; tail holds
// the file from there on. Nothing non-zero may stay behind the end: a later record
// ending where a stale one begins would resurrect it at the next recovery.
func (db *DB) endLog(s *segment, tail []byte, end int64) error {
	s.size = end
	fileSize, n, err := seglog.EndTail(s.f, tail, end, s.fileSize, mutation.On && db.opts.mut.skipZeroTail)
	s.fileSize = fileSize
	if err != nil {
		return fmt.Errorf("storage: %s: %w", s.path, err)
	}
	if n > 0 {
		db.opts.Logger.Info("zeroed the unsynced tail", "file", s.path, "offset", end, "bytes", n)
	}
	return nil
}

// anyValidAfter reports whether a complete, checksummed format 1 record starts anywhere
// in b after offset end (seglog.ScanPastEnd; a record's key length, at 4, is never
// zero).
func anyValidAfter(b []byte, end int) bool {
	return seglog.ScanPastEnd(b, end, hdrSize1, 4, func(i int) bool {
		h, _, _, ok := decodeRecord(b[i:], 0)
		return ok && !h.v2()
	}) >= 0
}

// salvage cuts the log at segment i, offset off, dropping everything after it.
func (db *DB) salvage(i int, off int64, cause error) error {
	db.opts.Logger.Error("salvaging: dropping the log after corruption", "err", cause)
	s := db.segs[i]
	f, err := db.fs.OpenRW(s.path)
	if err != nil {
		return fmt.Errorf("storage: salvage: %w", err)
	}
	if err := f.Truncate(off); err != nil {
		f.Close()
		return fmt.Errorf("storage: salvage truncate: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("storage: salvage fsync: %w", err)
	}
	s.f.Close()
	s.f, s.size, s.fileSize = f, off, off
	for _, later := range db.segs[i+1:] {
		if later.f != nil {
			later.f.Close()
		}
		if err := db.fs.Remove(later.path); err != nil {
			return fmt.Errorf("storage: salvage: %w", err)
		}
	}
	db.segs = db.segs[:i+1]
	if err := db.removeHints(); err != nil {
		return err
	}
	for _, d := range db.devs {
		if err := db.fs.SyncDir(d.dir); err != nil {
			return fmt.Errorf("storage: salvage: sync dir: %w", err)
		}
	}
	return nil
}

// recoverInsert indexes a record found during replay. Unlike Append, versions may arrive
// out of order (compaction copies an old version to the tail) and twice (a crash between
// copying and removing the source): the later copy wins.
func (db *DB) recoverInsert(key []byte, v ver, now int64) {
	it, ok := db.idx.Get(keyString(key))
	if !ok {
		db.idx.insert(item{kref: db.idx.arena.add(key), v: v})
		return
	}
	if v.version > it.v.version {
		if err := db.insertLocked(key, v, now, Hint{}); err != nil {
			panic(err) // just checked
		}
		return
	}
	old := db.idx.vers(&it)
	vs := old.appendTo(nil)
	j, found := slices.BinarySearchFunc(vs, v.version, func(a ver, t uint64) int {
		switch { // vs is sorted by version, descending
		case a.version > t:
			return -1
		case a.version < t:
			return 1
		}
		return 0
	})
	if found {
		if v.pos > vs[j].pos {
			v.flags |= vs[j].flags & verPruned
			vs[j] = v
		}
	} else {
		if j == len(vs) && vs[j-1].flags&verPruned != 0 {
			// Older than what retention already pruned: garbage.
			return
		}
		vs = slices.Insert(vs, j, v)
	}
	db.idx.Set(db.retainLocked(it, vs, now))
}
