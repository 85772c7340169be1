package storage

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// DB is an open engine. All methods are safe for concurrent use.
//
// Locking: mu guards the index, the segment list, the write buffer and the positions.
// Appends hold it exclusively for a memcpy and an index update; write(2) happens under it
// only when the buffer is full or a Sync flushes it; fsync never happens under it (except
// the once-per-segment roll). Reads hold it shared to find a record and pin its segment,
// then read the file without it.
type DB struct {
	opts Options
	fs   vfs.FS

	mu       sync.RWMutex
	syncCond *sync.Cond    // signalled when an in-flight fsync or roll finishes
	notify   chan struct{} // closed and replaced at the same moments (see signalLocked)
	durA     atomic.Uint64 // dur, readable without mu
	// changes counts the Appends that changed the index (Changes), bumped under
	// mu's write lock so that a reader's two loads bracket what its reads saw.
	changes atomic.Uint64

	idx    *tree
	segs   []*segment // sorted by id; the last is the active (tail) segment
	buf    []byte     // appended records not yet written: logical range [written, next)
	next   Pos        // end of the last appended record (LastPos)
	writ   Pos        // everything before it is in the segment files
	dur    Pos        // everything before it is fsynced
	lastV  uint64
	tail   int // device index of the active segment
	snaps  []uint64
	failed error
	closed bool
	// syncing is set while one goroutine (the leader) runs an fsync outside mu; others
	// wait on syncCond and the next leader takes everything appended meanwhile.
	syncing bool
	// syncer is set while the background goroutine serves Syncs; wantSync is the highest
	// position a waiter asked for; syncAttempts counts its fsync attempts and syncErr is
	// the last one's non-fatal error (disk full).
	syncer       bool
	wantSync     Pos
	syncAttempts uint64
	syncErr      error
	// sealing is set from a segment roll until the next segment exists (see rollLocked).
	sealing     bool
	sealID      uint64 // the id of the segment being created
	pendingLive int64  // live bytes appended to it meanwhile

	hintPos Pos // the checkpoint Open recovered from
	nvers   int // versions in the index

	// fmtFrom is the log position where format 2 records begin (see formatMarkName);
	// math.MaxUint64 while a format 1 directory is being recovered.
	fmtFrom uint64
	// fill makes the next segment's zero-filled file (zero.go); fillFor is the id+1 of
	// the segment for whose successor it was last asked.
	fill    *seglog.Filler
	fillFor uint64
	// rolls counts segments started since Open, zeroRolls those that took a
	// zero-filled file (tests).
	rolls, zeroRolls atomic.Int64

	devs  []*device
	cache *cache

	maint sync.Mutex // serialises checkpoints and compactions

	compactStop, compactDone chan struct{}

	bgKick chan struct{}
	bgStop chan struct{}
	bgDone chan struct{}

	st struct {
		appends, writes, syncs, compactions, compacted atomic.Int64
	}
}

type segment struct {
	id   uint64 // logical position of its first byte
	dev  int
	path string
	f    vfs.File
	size int64 // bytes of log in the file (for the active segment: written so far)
	// fileSize is the file's length: larger than size while the active segment has a
	// zero-filled tail (written in place). A sealed segment is cut to size.
	fileSize int64
	// zeroSize is the zero-filled file's size when the segment started (0: appended).
	zeroSize int64
	live     int64 // bytes of records the index points at (under DB.mu)
	// mm maps the segment read-only (nil: read with ReadAt), sealed or active (mapActive:
	// reads stay below the written end). Unmapped only once the segment has left the
	// list and every reader has released it.
	mm atomic.Pointer[[]byte]
	// outgrown are the shorter mappings an appended active segment had before growMap
	// replaced them (a reader may still be copying from one): unmapped with mm.
	outgrown [][]byte
	// refs counts the segment list's reference plus readers in flight; the file is
	// removed only once compaction has dropped the list's reference and readers left.
	refs atomic.Int32
}

func (s *segment) end() uint64 { return s.id + uint64(s.size) }

func segName(id uint64) string { return fmt.Sprintf("%016x.log", id) }

// Append writes records and makes them visible to readers on return. It does not fsync:
// call Sync with the returned position for durability. The records of one call are
// applied atomically: either all of them or, on error, none.
func (db *DB) Append(recs ...Record) (Pos, error) {
	if len(recs) == 0 {
		return db.LastPos(), nil
	}
	total := 0
	for i := range recs {
		r := &recs[i]
		switch {
		case len(r.Key) == 0:
			return 0, ErrEmptyKey
		case len(r.Key) > db.opts.MaxKeySize:
			return 0, fmt.Errorf("%w: %d bytes > %d", ErrKeyTooLarge, len(r.Key), db.opts.MaxKeySize)
		case len(r.Value) > db.opts.MaxValueSize:
			return 0, fmt.Errorf("%w: %d bytes > %d", ErrValueTooLarge, len(r.Value), db.opts.MaxValueSize)
		case r.Tombstone && (len(r.Value) != 0 || len(r.Meta) != 0):
			return 0, fmt.Errorf("storage: tombstone for %q carries a value or meta", r.Key)
		case len(r.Meta) > MaxMetaSize:
			return 0, fmt.Errorf("storage: meta of %q is %d bytes > %d", r.Key, len(r.Meta), MaxMetaSize)
		}
		total += recSize(r)
	}

	db.mu.Lock()
	defer db.mu.Unlock()
	if err := db.writableLocked(); err != nil {
		return 0, err
	}
	if len(recs) > 1 {
		if err := db.checkOrderLocked(recs); err != nil {
			return 0, err
		}
	}
	if len(db.buf) >= db.opts.WriteBufferSize && !db.sealing {
		if err := db.flushLocked(); err != nil {
			return 0, err
		}
	}
	if db.rollDueLocked(total) {
		// A batch never straddles segments, so a failed roll leaves nothing applied.
		if err := db.rollLocked(); err != nil {
			return 0, err
		}
	}
	now := db.now()
	for i := range recs {
		r := &recs[i]
		start := uint64(db.next)
		var cont uint8
		if i < len(recs)-1 && !(mutation.On && db.opts.mut.noBatchCont) {
			cont = flagBatchCont // recovery keeps the batch whole or drops it
		}
		db.buf = appendRecord(db.buf, r, cont, 0, start, uint64(db.dur))
		size := uint32(recSize(r))
		v := ver{version: r.Version, ts: r.Timestamp, pos: start, size: size}
		if r.Tombstone {
			v.flags = verTombstone
		}
		if len(r.Meta) > 0 {
			v.flags |= verMeta | db.countMeta(r.Meta)
		}
		if err := db.insertLocked(r.Key, v, now, r.Hint); err != nil {
			// Only a single record can fail here (batches were checked), and nothing
			// was applied: take its bytes back out of the buffer.
			db.buf = db.buf[:len(db.buf)-int(size)]
			return 0, err
		}
		db.next += Pos(size)
		if r.Version > db.lastV {
			db.lastV = r.Version
		}
	}
	db.changes.Add(1)
	db.liveAdd(uint64(db.next)-1, int64(total))
	db.askFillLocked()
	db.st.appends.Add(int64(len(recs)))
	if db.bgKick != nil && db.opts.SyncBytes > 0 && int64(db.next-db.dur) >= db.opts.SyncBytes {
		db.kick()
	}
	return db.next, nil
}

func (db *DB) writableLocked() error {
	if db.closed {
		return ErrClosed
	}
	if db.failed != nil {
		return db.failed
	}
	return nil
}

// checkOrderLocked rejects a batch in which some version is not newer than its key's
// newest (in the index or earlier in the batch).
func (db *DB) checkOrderLocked(recs []Record) error {
	if risingAbove(recs, db.lastV) {
		// The common case: versions come from one counter, so a batch whose versions
		// do not fall, start above every version the store holds (lastV bounds them
		// all) and never repeat a key within one version is in order without looking
		// any key up — a map and a tree descent per record were an eighth of a
		// pipelined SET's CPU, and a tenth of a replica's (each replicated write
		// stores its key and its client's row at one version).
		return nil
	}
	return db.checkOrderFullLocked(recs)
}

// checkOrderFullLocked is checkOrderLocked without the fast path.
func (db *DB) checkOrderFullLocked(recs []Record) error {
	var inBatch map[string]uint64 // newest version per key earlier in the batch (large batches)
	if len(recs) > 8 {
		inBatch = make(map[string]uint64, len(recs))
	}
	for i := range recs {
		r := &recs[i]
		newest, exists := uint64(0), false
		if it, ok := db.idx.Get(keyString(r.Key)); ok {
			newest, exists = it.v.version, true
		}
		if inBatch != nil {
			if v, ok := inBatch[string(r.Key)]; ok {
				newest, exists = v, true // later in the batch means newer, or we failed already
			}
			inBatch[string(r.Key)] = r.Version
		} else {
			for j := 0; j < i; j++ {
				if bytes.Equal(recs[j].Key, r.Key) && (!exists || recs[j].Version > newest) {
					newest, exists = recs[j].Version, true
				}
			}
		}
		if exists && r.Version <= newest {
			return fmt.Errorf("%w: key %q version %d, newest %d", ErrVersionOrder, r.Key, r.Version, newest)
		}
	}
	return nil
}

// risingAbove reports whether the versions of recs never fall, the first is above
// floor, and the records sharing a version have distinct keys. Runs of one version
// longer than maxRun are not checked pairwise: it reports false for them. One op's
// records share a version: an HSET of n fields writes n+1 (its hash's metadata and a
// row per field), and a batch holding an HSET of 10 fields took the full check, a
// tree descent per record of the whole batch, until maxRun was raised from 8 (a run
// of 32 costs at most 496 key comparisons).
func risingAbove(recs []Record, floor uint64) bool {
	const maxRun = 32
	start := 0 // first record of the current run of equal versions
	for i := range recs {
		v := recs[i].Version
		switch {
		case i > 0 && v == recs[i-1].Version:
			if i-start >= maxRun {
				return false
			}
			for j := start; j < i; j++ {
				if bytes.Equal(recs[j].Key, recs[i].Key) {
					return false
				}
			}
		case v <= floor:
			return false
		default:
			start = i
		}
		floor = v
	}
	return true
}

// insertLocked adds a version newer than every version of key and applies retention.
// The order was checked already for batches; a single record is checked here, so the
// common path descends the tree once and updates the item in place.
func (db *DB) insertLocked(key []byte, v ver, now int64, h Hint) error {
	p := db.idx.hinted(keyString(key), h)
	if p == nil {
		db.idx.insertHinted(item{kref: db.idx.arena.add(key), v: v}, h)
		db.nvers++
		return nil
	}
	it := *p
	if v.version <= it.v.version {
		return fmt.Errorf("%w: key %q version %d, newest %d", ErrVersionOrder, key, v.version, it.v.version)
	}
	db.nvers++
	if !it.hasOlder() && db.opts.Retention.KeepVersions <= 1 && !db.keepOld(v, it.v, now) {
		// The common case: the previous version becomes garbage at once.
		db.dropLocked(it.v)
		v.flags |= verPruned
		it.v = v
		db.idx.update(p, it)
		return nil
	}
	var stack [8]ver
	vs := append(stack[:0], v)
	old := db.idx.vers(&it)
	vs = old.appendTo(vs)
	db.idx.update(p, db.retainLocked(it, vs, now))
	return nil
}

// retainLocked applies the retention policy to vs (newest first, distinct versions),
// drops what it does not keep and returns prev (the key's item) with the rest, to store
// in prev's place (makeItem).
func (db *DB) retainLocked(prev item, vs []ver, now int64) item {
	kept := vs[:1]
	pruned := false
	for i := 1; i < len(vs); i++ {
		if i < db.opts.Retention.KeepVersions || db.keepOld(vs[i-1], vs[i], now) {
			kept = append(kept, vs[i])
			continue
		}
		db.dropLocked(vs[i])
		pruned = true
	}
	if pruned {
		kept[len(kept)-1].flags |= verPruned
	}
	return db.idx.makeItem(prev, kept)
}

// now returns the retention clock, read only when time-based retention is on.
func (db *DB) now() int64 {
	if db.opts.Retention.KeepFor <= 0 {
		return 0
	}
	return db.opts.Now().UnixNano()
}

// keepOld reports whether old, superseded by newer, must be kept regardless of the
// version count: it was superseded less than KeepFor ago, or a snapshot reads it.
func (db *DB) keepOld(newer, old ver, now int64) bool {
	if kf := db.opts.Retention.KeepFor; kf > 0 && newer.ts >= now-int64(kf) {
		return true
	}
	return db.pinnedLocked(old.version, newer.version)
}

// pinnedLocked reports whether an open snapshot at S has lo <= S < hi.
func (db *DB) pinnedLocked(lo, hi uint64) bool {
	i := sort.Search(len(db.snaps), func(i int) bool { return db.snaps[i] >= lo })
	return i < len(db.snaps) && db.snaps[i] < hi
}

// dropLocked accounts for a version leaving the index.
func (db *DB) dropLocked(v ver) {
	db.nvers--
	db.liveAdd(v.pos, -int64(v.size))
}

// liveAdd accounts n live bytes to the segment holding pos (or to the segment being
// created, while a roll is sealing the previous one).
func (db *DB) liveAdd(pos uint64, n int64) {
	if db.sealing && pos >= db.sealID {
		db.pendingLive += n
		return
	}
	if s := db.segFor(pos); s != nil {
		s.live += n
	}
}

// segFor returns the segment holding logical position pos, or nil.
func (db *DB) segFor(pos uint64) *segment {
	i := sort.Search(len(db.segs), func(i int) bool { return db.segs[i].id > pos }) - 1
	if i < 0 {
		return nil
	}
	return db.segs[i]
}

// flushLocked writes the buffer to the active segment. A short write is cut back so the
// file never holds half a record; on a full disk the buffer is kept for a later attempt.
func (db *DB) flushLocked() error {
	if len(db.buf) == 0 {
		return nil
	}
	if db.sealing {
		panic("storage: flush while the next segment is being created")
	}
	act := db.segs[len(db.segs)-1]
	// At the logical end: over the zero-filled tail (extending the file if the buffer
	// is longer than what is left of it), or appended.
	n, inPlace, err := seglog.WriteAtEnd(act.f, db.buf, act.size, act.fileSize)
	db.st.writes.Add(1)
	if err != nil {
		if n > 0 {
			if terr := seglog.UndoWrite(act.f, act.size, act.fileSize, n, inPlace); terr != nil {
				db.failLocked(fmt.Errorf("cut short write of %s back to %d: %w (after %v)", act.path, act.size, terr, err))
				return db.failed
			}
		}
		if vfs.IsNoSpace(err) {
			return fmt.Errorf("%w: write %s: %w", ErrDiskFull, act.path, err)
		}
		db.failLocked(fmt.Errorf("write %s: %w", act.path, err))
		return db.failed
	}
	act.size += int64(len(db.buf))
	act.fileSize = max(act.fileSize, act.size)
	db.writ = db.next
	db.growMap(act)
	if cap(db.buf) > 4*db.opts.WriteBufferSize {
		// It grew while a roll was sealing; do not keep megabytes for good.
		db.buf = make([]byte, 0, 2*db.opts.WriteBufferSize)
	} else {
		db.buf = db.buf[:0]
	}
	return nil
}

// rollDueLocked reports whether a batch of n bytes must start a new segment: it would
// take the active one past SegmentSize, or past its zeros when it is a zero-filled
// segment smaller than SegmentSize and the next file is ready.
func (db *DB) rollDueLocked(n int) bool {
	act := db.segs[len(db.segs)-1]
	used := int64(uint64(db.next) - act.id)
	if db.sealing || used == 0 {
		return false
	}
	if used+int64(n) > db.opts.SegmentSize {
		return true
	}
	return act.zeroSize > 0 && used+int64(n) > act.zeroSize && db.fill.ReadyIn(db.nextDir())
}

// zeroSizeAfter returns the zero-filled size of the segment to follow act: twice act's,
// from minZeroSize up to SegmentSize; SegmentSize after an appended one.
func (db *DB) zeroSizeAfter(act *segment) int64 {
	if act.zeroSize == 0 {
		return db.opts.SegmentSize
	}
	return min(db.opts.SegmentSize, max(minZeroSize, 2*act.zeroSize))
}

func (db *DB) nextDir() string { return db.devs[(db.tail+1)%len(db.devs)].dir }

// askFillLocked asks the filler for the next segment's zero-filled file once a quarter
// of the active segment's zeros (or of SegmentSize, if it is appended) is used, once
// per segment, so it is ready by the roll.
func (db *DB) askFillLocked() {
	act := db.segs[len(db.segs)-1]
	span := act.zeroSize
	if span == 0 {
		span = db.opts.SegmentSize
	}
	if db.fillFor == act.id+1 || int64(uint64(db.next)-act.id) < span/4 {
		return
	}
	db.fillFor = act.id + 1
	db.fill.Request(db.nextDir(), db.zeroSizeAfter(act))
}

// rollLocked seals the active segment and starts a new one on the next device. Sealing
// writes out and fsyncs the old segment before anything is written to the new one, so a
// later segment never holds data while an earlier one could have a torn tail (recovery
// relies on this). The fsync and the new file's creation run in the background unless
// Options.Inline: appends continue into the memory buffer meanwhile, and flushes and
// syncs wait for the new segment.
func (db *DB) rollLocked() error {
	if err := db.flushLocked(); err != nil {
		return err
	}
	old := db.segs[len(db.segs)-1]
	dev := (db.tail + 1) % len(db.devs)
	id := uint64(db.next)
	db.sealing, db.sealID = true, id
	db.tail = dev
	if db.opts.Inline {
		seg, err := db.seal(old, id, dev)
		db.installLocked(old, seg, err)
		return db.failed
	}
	go func() {
		seg, err := db.seal(old, id, dev)
		db.mu.Lock()
		db.installLocked(old, seg, err)
		db.mu.Unlock()
	}()
	return nil
}

// seal cuts old to its logical end, fsyncs it and creates the segment that follows it.
// It does not take mu (old's sizes do not change while sealing; installLocked records
// the cut).
func (db *DB) seal(old *segment, id uint64, dev int) (*segment, error) {
	if old.fileSize > old.size {
		// Sealed segments hold exactly their records, as appended ones did. The cut is
		// durable (the fsync below) before the next segment's name is. Reads through
		// the active segment's mapping stop at the cut first: a page past a file's end
		// faults.
		old.shortenMap(old.size)
		if err := old.f.Truncate(old.size); err != nil {
			return nil, fmt.Errorf("cut %s to its end: %w", old.path, err)
		}
	}
	if err := db.timedSync(old.f); err != nil {
		return nil, fmt.Errorf("fsync %s: %w", old.path, err)
	}
	db.st.syncs.Add(1)
	return db.createSegment(id, dev)
}

func (db *DB) installLocked(old, seg *segment, err error) {
	db.sealing = false
	defer db.signalLocked()
	if err == nil || errors.Is(err, ErrDiskFull) {
		old.fileSize = old.size // seal cut it
	}
	if errors.Is(err, ErrDiskFull) {
		// The old segment is synced but no new one could be created: keep appending to
		// the old one (positions are contiguous) and try again at the next roll.
		db.opts.Logger.Warn("cannot start a new segment; the current one grows past its size", "err", err)
		db.dur = max(db.dur, Pos(old.end()))
		old.live += db.pendingLive
		db.pendingLive = 0
		db.tail = old.dev
		return
	}
	if err != nil {
		db.failLocked(err)
		return
	}
	if e := old.end(); Pos(e) > db.dur {
		db.dur = Pos(e)
	}
	seg.live, db.pendingLive = db.pendingLive, 0
	db.segs = append(db.segs, seg)
	db.mapSegment(old) // sealed: its bytes never change again (mapped already if it was mapped active)
	db.mapActive(seg)
}

// mapSegment memory-maps a sealed segment if the file system supports it.
func (db *DB) mapSegment(s *segment) { db.mapFirst(s, s.size) }

// mapActive memory-maps the active segment s for reads: the file's length when it
// starts (a zero-filled file's zeros, or what an existing last segment holds at Open),
// so every mapped byte lies inside the file. Bytes the log has written never change
// (the log only appends past them; cutting a short write back and sealing cut only
// what is past the written end), and a shared mapping shows the page cache that
// pwrite fills, so a record the index points at reads the same through the mapping as
// with pread. Records past the mapping (appended beyond the zeros) are read with
// pread; seal shortens the mapping to the segment's end before it cuts the file
// (sealed segments keep their exact-size guard in readAt). Without it, every record
// of the active segment (the newest data, up to 64 MiB) cost a pread: in YCSB-E (scans
// of 1 KB values inserted in random order) the preads and the value cache's probes and
// fills that stood in for them were ~15 % of the server's CPU (docs/design/scans.md).
func (db *DB) mapActive(s *segment) { db.mapFirst(s, s.fileSize) }

// mapFirst maps s's first n bytes unless they are mapped already, n is 0 or the file
// system cannot (then s is read with pread). A shorter mapping is replaced and kept
// in outgrown until closeSegment: a reader may be copying from it (growMap does the
// same when an appended segment outgrows its reservation). Callers hold mu (or own s
// alone, at Open).
func (db *DB) mapFirst(s *segment, n int64) {
	m, ok := s.f.(vfs.Mapper)
	cur := s.mm.Load()
	if !ok || n == 0 || (cur != nil && int64(len(*cur)) >= n) {
		return
	}
	mm, err := m.Map(n)
	if err != nil {
		db.opts.Logger.Warn("cannot map segment; reading it with pread", "file", s.path, "err", err)
		return
	}
	if cur != nil {
		s.outgrown = append(s.outgrown, (*cur)[:cap(*cur)])
	}
	s.mm.Store(&mm)
}

// growMap keeps an appended active segment (one that was not zero-filled: a VR
// replica's engine, Options.NoZeroFill) mapped up to its written end. mapActive maps a
// segment's length when it starts, which for an appended one is nothing, so without
// this every record of a replica's active segment (the newest data, up to 64 MiB) cost
// a pread and a value-cache probe in a scan: 8.7 % of a 3-replica group's leader's CPU
// under YCSB-E, and ~20 % once the mapped records' copies were cheaper (touchReads;
// docs/design/scans.md, "Fifth round").
//
// The segment is mapped once, SegmentSize ahead of what the file holds (Linux maps
// past a file's end; a page wholly past it would fault, a SIGBUS, if touched), and each
// flush only lengthens the slice readers see to the written end: the bytes below it are
// in the file, and nothing reads a mapping past its length (readAt, touchReads), so
// the pages past the end are never touched — the rule "every readable mapped byte lies
// inside the file" still holds, for len rather than cap. pwrite fills the page cache a
// shared mapping shows, so a byte the log has written reads the same through it as
// with pread. (Before: remapped in steps, every time the written end had passed the
// mapping by as much as it held or by 8 MiB, so up to 8 MiB of the newest records —
// ~8 % of YCSB-E's 100 MB — were read with pread: 4–6 % of a 3-replica leader's CPU,
// sixth round; each remap also faulted every page in again.) A batch larger than the
// reservation (a segment past SegmentSize) maps the file's whole length anew.
func (db *DB) growMap(s *segment) {
	if s.zeroSize != 0 || s.size == 0 {
		return // a zero-filled segment is mapped whole from the start
	}
	cur := s.mm.Load()
	if cur != nil && int64(cap(*cur)) >= s.size {
		if int64(len(*cur)) < s.size {
			longer := (*cur)[:s.size]
			s.mm.Store(&longer)
		}
		return
	}
	m, ok := s.f.(vfs.Mapper)
	if !ok {
		return
	}
	mm, err := m.Map(max(db.opts.SegmentSize, s.fileSize))
	if err != nil {
		db.opts.Logger.Warn("cannot map segment; reading it with pread", "file", s.path, "err", err)
		return
	}
	if cur != nil {
		s.outgrown = append(s.outgrown, (*cur)[:cap(*cur)])
	}
	mm = mm[:s.size]
	s.mm.Store(&mm)
}

// shortenMap limits reads through s's mapping to its first n bytes (the mapping itself
// stays whole until closeSegment: its capacity).
func (s *segment) shortenMap(n int64) {
	if p := s.mm.Load(); p != nil && int64(len(*p)) > n {
		short := (*p)[:n:cap(*p)]
		s.mm.Store(&short)
	}
}

// readAt reads len(buf) bytes of s at off, from the mapping if there is one.
func (s *segment) readAt(buf []byte, off int64) error {
	if p := s.mm.Load(); p != nil && off+int64(len(buf)) <= int64(len(*p)) {
		copy(buf, (*p)[off:])
		return nil
	}
	_, err := s.f.ReadAt(buf, off)
	return err
}

// closeSegment releases s's mapping and file. Readers must be gone.
func closeSegment(s *segment) error {
	var err error
	if p := s.mm.Swap(nil); p != nil {
		err = vfs.Unmap((*p)[:cap(*p)]) // the whole mapping, also when shortenMap limited reads
	}
	for _, m := range s.outgrown {
		if uerr := vfs.Unmap(m); err == nil {
			err = uerr
		}
	}
	s.outgrown = nil
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// createSegment starts segment id on device dev and makes its name durable: the
// filler's zero-filled file if one is ready there, otherwise an empty file.
func (db *DB) createSegment(id uint64, dev int) (*segment, error) {
	db.rolls.Add(1)
	path := vfs.Join(db.devs[dev].dir, segName(id))
	if seg := db.takeZeroFilled(id, dev, path); seg != nil {
		db.zeroRolls.Add(1)
		return seg, nil
	}
	f, err := db.fs.Create(path)
	if err != nil {
		if vfs.IsNoSpace(err) {
			return nil, fmt.Errorf("%w: create %s: %w", ErrDiskFull, path, err)
		}
		return nil, fmt.Errorf("storage: create segment: %w", err)
	}
	if p, ok := f.(vfs.Preallocator); ok {
		// Best effort: reserved blocks make each append's fdatasync cheaper; a failure
		// (say, no room for a whole segment) only loses that.
		_ = p.Preallocate(0, db.opts.SegmentSize)
	}
	if err := db.fs.SyncDir(db.devs[dev].dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("sync dir %s: %w", db.devs[dev].dir, err)
	}
	s := &segment{id: id, dev: dev, path: path, f: f}
	s.refs.Store(1)
	return s, nil
}

// takeZeroFilled renames the filler's ready file in dev's directory to path and
// returns it as segment id, or returns nil if none is ready or a step fails (the caller
// then creates the segment empty, truncating whatever the rename left).
func (db *DB) takeZeroFilled(id uint64, dev int, path string) *segment {
	dir := db.devs[dev].dir
	f, size, _ := db.fill.TakeOpen(dir, path)
	if f == nil {
		return nil
	}
	if err := db.fs.SyncDir(dir); err != nil {
		f.Close()
		return nil
	}
	s := &segment{id: id, dev: dev, path: path, f: f, fileSize: size, zeroSize: size}
	s.refs.Store(1)
	return s
}

func (db *DB) failLocked(err error) {
	if db.failed == nil {
		db.failed = fmt.Errorf("%w: %w", ErrFailed, err)
		db.opts.Logger.Error("storage engine failed; refusing writes until reopened", "err", err)
	}
}

// Sync makes everything up to pos durable and returns the durable position (>= pos, or
// the last position if pos is beyond it). Concurrent callers share one fsync.
//
// A caller that finds no fsync in flight runs one itself (no hand-off: the single-writer
// case pays one fsync and nothing else). Callers that find one in flight post the
// position they need and wait for the syncer goroutine (unless Options.Inline), which
// starts the next fsync the moment the previous one returns while anyone waits past it,
// so under load no goroutine wake-up sits between two fsyncs. Inline, a waiter leads the
// next fsync itself.
func (db *DB) Sync(pos Pos) (Pos, error) {
	db.mu.Lock()
	gen := db.syncAttempts
	for {
		if db.failed != nil {
			d, err := db.dur, db.failed
			db.mu.Unlock()
			return d, err
		}
		if pos > db.next {
			pos = db.next
		}
		if db.dur >= pos {
			d := db.dur
			db.mu.Unlock()
			return d, nil
		}
		if db.closed {
			d := db.dur
			db.mu.Unlock()
			return d, ErrClosed
		}
		if !db.syncing && !db.sealing {
			break // idle: lead the fsync ourselves, with no hand-off
		}
		if db.syncer {
			if db.syncAttempts != gen && db.syncErr != nil {
				d, err := db.dur, db.syncErr
				db.mu.Unlock()
				return d, err // the attempt made for us failed (disk full)
			}
			if pos > db.wantSync {
				db.wantSync = pos
				db.kick()
			}
		}
		// Wait for the next change without holding mu, and return without retaking it
		// when it made us durable: a group's waiters leave in parallel instead of
		// queueing on the lock.
		ch := db.notify
		db.mu.Unlock()
		<-ch
		if d := Pos(db.durA.Load()); d >= pos {
			return d, nil
		}
		db.mu.Lock()
	}
	err := db.syncOnceLocked()
	if db.syncer && db.wantSync > db.dur {
		db.kick() // others queued behind us: the syncer takes over
	}
	d := db.dur
	db.mu.Unlock()
	return d, err
}

// signalLocked publishes the durable position and wakes everyone waiting for a change
// (an fsync or a roll finished, or the engine failed).
func (db *DB) signalLocked() {
	db.durA.Store(uint64(db.dur))
	db.syncCond.Broadcast()
	close(db.notify)
	db.notify = make(chan struct{})
}

func (db *DB) kick() {
	select {
	case db.bgKick <- struct{}{}:
	default:
	}
}

// syncOnceLocked writes the buffer and fsyncs the active segment, with mu released
// during the fsync. The caller has checked that no fsync or roll is in flight.
func (db *DB) syncOnceLocked() error {
	db.syncing = true
	defer func() {
		db.syncing = false
		db.signalLocked()
	}()
	if err := db.flushLocked(); err != nil {
		return err
	}
	target := db.next
	act := db.segs[len(db.segs)-1]
	db.mu.Unlock()
	err := db.timedSync(act.f)
	db.mu.Lock()
	db.st.syncs.Add(1)
	if err != nil {
		db.failLocked(fmt.Errorf("fsync %s: %w", act.path, err))
		return db.failed
	}
	if target > db.dur {
		db.dur = target
	}
	return nil
}

// timedSync fsyncs f and reports how long it took to Options.OnSync.
func (db *DB) timedSync(f vfs.File) error { return vfs.SyncTimed(f, db.opts.OnSync) }

// DurablePos returns the position up to which everything is fsynced.
func (db *DB) DurablePos() Pos { return Pos(db.durA.Load()) }

// Changes is a count that moves with every Append that changed what a read
// finds, read without the lock: equal values before a group of reads and after
// it mean no append came between them, so they all saw one state (as one
// Snapshot would, for the cost of two atomic loads). Compaction, which moves
// records but changes no read's answer, does not move it; nor does Open's
// replay, which ends before the DB is handed out.
func (db *DB) Changes() uint64 { return db.changes.Load() }

// LastPos returns the position of the last appended record.
func (db *DB) LastPos() Pos {
	db.mu.RLock()
	defer db.mu.RUnlock()
	return db.next
}

// MaxValueSize is the largest value Append accepts (Options.MaxValueSize). A
// state machine that computes a value (APPEND) checks it before writing, so a
// too-large result is the operation's error, not a failed batch.
func (db *DB) MaxValueSize() int { return db.opts.MaxValueSize }

// MaxKeySize is the longest key Append accepts (Options.MaxKeySize).
func (db *DB) MaxKeySize() int { return db.opts.MaxKeySize }

// LastVersion returns the highest version appended or recovered.
func (db *DB) LastVersion() uint64 {
	db.mu.RLock()
	defer db.mu.RUnlock()
	return db.lastV
}

// Get returns the newest version of key; ErrNotFound if it is missing or deleted.
func (db *DB) Get(key []byte) (Value, error) { return db.getAt(key, math.MaxUint64, false) }

// GetShared is Get without the copy: the returned Data may be the engine's cached bytes,
// shared with every other reader, so the caller must never modify it (it may keep it:
// a record's bytes at a position never change, and eviction only drops the cache's
// reference). It exists for the read hot path that only writes the value to a socket,
// where the copy and its allocation were a measurable share of a GET.
func (db *DB) GetShared(key []byte) (Value, error) { return db.getAt(key, math.MaxUint64, true) }

// GetAt returns the newest version of key that is <= v.
func (db *DB) GetAt(key []byte, v uint64) (Value, error) { return db.getAt(key, v, false) }

// GetAtShared is GetAt without the copy, as GetShared is Get: a transaction's
// snapshot reads, whose values only go to the socket (shard.TxSnap.GetShared).
func (db *DB) GetAtShared(key []byte, v uint64) (Value, error) { return db.getAt(key, v, true) }

// Lookup is Get in the shape of internal/kv's Getter (a method value of it is
// one): the newest version's data, meta and version, and whether key holds
// one; a missing or deleted key is not an error. The engine's latest state
// read by kv's decoders (a replica's applied state), one copy for every
// caller that needs it.
func (db *DB) Lookup(key []byte) (data, meta []byte, version uint64, ok bool, err error) {
	v, err := db.Get(key)
	if errors.Is(err, ErrNotFound) {
		return nil, nil, 0, false, nil
	}
	if err != nil {
		return nil, nil, 0, false, err
	}
	return v.Data, v.Meta, v.Version, true, nil
}

// getAt serves Get, GetShared and GetAt; shared lets a cache hit (and a miss, whose
// freshly read value then becomes the cached copy) hand out bytes without copying.
func (db *DB) getAt(key []byte, at uint64, shared bool) (Value, error) {
	for {
		db.mu.RLock()
		if db.closed {
			db.mu.RUnlock()
			return Value{}, ErrClosed
		}
		// The item in place (under the read lock), not idx.Get's copy: this
		// is every GET's path, and the copy and the call cost a pipelined
		// GET a few per cent of its instructions (docs/design/one-house.md).
		it := db.idx.get(keyString(key))
		if it == nil {
			db.mu.RUnlock()
			return Value{}, ErrNotFound
		}
		v := it.v
		if v.version > at || it.hasOlder() { // not the common case of the newest of one version
			vs := db.idx.vers(it)
			i, gone := vs.pick(at)
			if i < 0 {
				db.mu.RUnlock()
				if gone {
					return Value{}, fmt.Errorf("%w: %q at %d", ErrVersionGone, key, at)
				}
				return Value{}, ErrNotFound
			}
			v = vs.at(i)
		}
		if v.tombstone() {
			db.mu.RUnlock()
			return Value{}, ErrNotFound
		}
		out := Value{Version: v.version, Timestamp: v.ts, Pos: v.end()}
		if v.pos >= uint64(db.writ) {
			off := v.pos - uint64(db.writ)
			b := db.buf[off : off+uint64(v.size)]
			h, _, _, ok := decodeRecord(b, v.pos)
			if !ok {
				db.mu.RUnlock()
				panic("storage: record in the write buffer fails its checksum")
			}
			out.Meta, out.Data = splitPayload(append([]byte{}, payload(b, h)...), v.hasMeta())
			db.mu.RUnlock()
			return out, nil
		}
		db.mu.RUnlock()
		// A record's bytes never change at a position, so the cache needs no pin.
		if db.cache != nil {
			if data, ok := db.cache.get(v.pos, !shared); ok {
				out.Meta, out.Data = splitPayload(data, v.hasMeta())
				return out, nil
			}
		}
		db.mu.RLock()
		seg := db.segFor(v.pos)
		if seg == nil || seg.f == nil || v.pos+uint64(v.size) > seg.end() {
			// Compaction moved the record since we looked: look again.
			db.mu.RUnlock()
			continue
		}
		seg.refs.Add(1)
		db.mu.RUnlock()
		val, err := db.readRecord(seg, key, v)
		db.release(seg)
		if err != nil {
			return Value{}, err
		}
		if db.cache != nil {
			if shared {
				db.cache.putOwned(v.pos, val)
			} else {
				db.cache.put(v.pos, val)
			}
		}
		out.Meta, out.Data = splitPayload(val, v.hasMeta())
		return out, nil
	}
}

// readRecord reads and verifies the record of v from seg and returns its payload (a
// fresh slice): its value, preceded by its meta if it has any (splitPayload).
func (db *DB) readRecord(seg *segment, key []byte, v ver) ([]byte, error) {
	buf := make([]byte, v.size)
	off := int64(v.pos - seg.id)
	dev := db.devs[seg.dev]
	done := dev.begin(len(buf))
	err := seg.readAt(buf, off)
	dev.end(done)
	if err != nil {
		return nil, fmt.Errorf("storage: read %s at %d: %w", seg.path, off, err)
	}
	h, k, _, ok := decodeRecord(buf, v.pos)
	if !ok || h.version != v.version || (key != nil && !bytes.Equal(k, key)) {
		return nil, &CorruptionError{File: seg.path, Offset: off, Reason: "record read back does not match its checksum or the index"}
	}
	p := payload(buf, h)
	return p[:len(p):len(p)], nil
}

func (db *DB) release(s *segment) { s.refs.Add(-1) }

// Scan calls fn for each key in [start, end) in order (end nil = no bound) with its newest
// version <= at (at 0 = latest), skipping keys deleted or absent at that version, until fn
// returns false or limit keys (limit <= 0 = no limit) have been passed.
func (db *DB) Scan(start, end []byte, at uint64, limit int, fn func(key []byte, v Value) bool) error {
	if at == 0 {
		at = math.MaxUint64
	}
	return db.scanAt(start, end, at, limit, nil, fn)
}

// ScanInto is Scan with the values read into *buf, appended after what it holds, instead
// of into fresh memory (buf nil: as Scan). The Values fn sees alias *buf's array (or, when
// it had no room, a bigger one that becomes *buf): they stay valid until the caller
// reuses the buffer, which it must not do while it still uses them. The keys are fresh.
// A caller that scans often (a connection writing scan replies) reuses one buffer instead
// of allocating a scan's values every time: under YCSB-E they were 86 % of the bytes the
// server allocated (docs/design/scans.md).
func (db *DB) ScanInto(start, end []byte, at uint64, limit int, buf *[]byte, fn func(key []byte, v Value) bool) error {
	if at == 0 {
		at = math.MaxUint64
	}
	return db.scanAt(start, end, at, limit, buf, fn)
}

func (db *DB) scanAt(start, end []byte, at uint64, limit int, buf *[]byte, fn func(key []byte, v Value) bool) error {
	size := scanBatch
	if limit > 0 && limit < size {
		size = limit
	}
	sc := scanScratches.Get().(*scanScratch)
	defer func() {
		clear(sc.hits) // drop references to keys, values and segments
		scanScratches.Put(sc)
	}()
	batch := sc.hits[:0:size]
	from := string(start)
	inclusive := true
	n := 0
	for {
		batch = batch[:0]
		db.mu.RLock()
		if db.closed {
			db.mu.RUnlock()
			return ErrClosed
		}
		want := cap(batch)
		if limit > 0 && limit-n < want {
			want = limit - n
		}
		db.idx.ascend(from, func(it *item) bool {
			key := db.idx.keyOf(it)
			if !inclusive && key == from {
				return true
			}
			if end != nil && key >= keyString(end) {
				return false
			}
			from = key
			vs := db.idx.vers(it)
			i, _ := vs.pick(at)
			if i < 0 || vs.at(i).tombstone() {
				return true
			}
			// The key's bytes are not touched here (copyKeys copies them after the
			// walk): keyOf's string only points into the index's arena.
			h := scanHit{ikey: key, v: vs.at(i)}
			if h.v.pos >= uint64(db.writ) {
				off := h.v.pos - uint64(db.writ)
				b := db.buf[off : off+uint64(h.v.size)]
				rh, _, _, _ := decodeRecord(b, h.v.pos)
				h.val = append([]byte{}, payload(b, rh)...)
			} else {
				// Pin the segment so compaction cannot remove it before we read.
				h.seg = db.segFor(h.v.pos)
				h.seg.refs.Add(1)
			}
			batch = append(batch, h)
			return len(batch) < want
		})
		copyKeys(batch, sc)
		db.mu.RUnlock()
		if len(batch) == 0 {
			return nil
		}
		if err := db.readBatch(batch, buf, sc); err != nil {
			return err
		}
		for _, h := range batch {
			n++
			v := Value{Version: h.v.version, Timestamp: h.v.ts, Pos: h.v.end()}
			v.Meta, v.Data = splitPayload(h.val, h.v.hasMeta())
			if !fn(h.key, v) || (limit > 0 && n >= limit) {
				return nil
			}
		}
		inclusive = false
	}
}

const scanBatch = 128

// scanScratch is a scan's bookkeeping, recycled (none of it escapes a scan): the
// batch's hits, and readBatch's misses and reads (4 KB a batch, a quarter of what a
// YCSB-E scan still allocated once its values went into a lent buffer).
type scanScratch struct {
	hits  []scanHit
	miss  []int
	reads []scanRead
	order []uint64 // sortByPos's keys
	sink  uint     // the sums of copyKeys' and touchReads' loads: a use of them
}

var scanScratches = sync.Pool{New: func() any {
	return &scanScratch{hits: make([]scanHit, scanBatch), miss: make([]int, 0, scanBatch), reads: make([]scanRead, 0, scanBatch)}
}}

// sortByPos orders miss (indexes into hits) by the records' log positions, as readBatch
// reads them, using order as scratch (returned, for reuse). Each index is packed below
// its position into one uint64 (position << posShift | index: a batch holds at most
// scanBatch hits) and the keys are sorted as plain integers — no comparison function,
// whose indirect calls and double indexing made slices.SortFunc ~4.6 % of a YCSB-E
// scan's server CPU (docs/design/scans.md, sixth round). A position too large for the
// packing (a log past 2^56 bytes) sorts with the comparison function instead.
func sortByPos(hits []scanHit, miss []int, order []uint64) []uint64 {
	for _, i := range miss {
		pos := hits[i].v.pos
		if pos>>(64-posShift) != 0 || i >= 1<<posShift {
			slices.SortFunc(miss, func(a, b int) int { return cmp.Compare(hits[a].v.pos, hits[b].v.pos) })
			return order
		}
		order = append(order, pos<<posShift|uint64(i))
	}
	slices.Sort(order)
	for k, o := range order {
		miss[k] = int(o & (1<<posShift - 1))
	}
	return order
}

// posShift is how many low bits of sortByPos's keys hold a hit's index: room for
// scanBatch hits.
const posShift = 8

// scanRead is one read of readBatch: log bytes [lo, hi) holding the records of
// hits[miss[k:k+n]].
type scanRead struct {
	lo, hi uint64
	k, n   int
}

type scanHit struct {
	ikey   string // the key in the index's arena (set by the walk, copied into key)
	key    []byte
	v      ver
	seg    *segment // pinned until readBatch fills val; nil if val came from the buffer
	val    []byte
	shared bool // val is the value cache's bytes, until readBatch copies them
}

// scanCaches reports whether a scan consults and fills the value cache for a record of
// seg. Only for a segment read with pread (on a file system that maps nothing: every
// segment, the active one too, is mapped where mapping works): there a scattered record costs a syscall of
// its own (~1.5 µs for 1 KB), a cache hit a probe and a copy. A mapped segment's record
// costs a copy already, the same as a hit, so probing (and filling: an allocation and a
// copy more) would only add work; measured with BenchmarkScanThroughput, consulting the
// cache for every record cost the random-order scan ~5 % more CPU, for pread segments only
// it saved ~20 %. Merged records are not put either: re-reading them is cheap, and a bulk
// scan must not flush the point-read set. A scan's new entries are unvisited, so SIEVE
// evicts them before the values point reads keep hitting.
func (db *DB) scanCaches(seg *segment) bool { return db.cache != nil && seg.mm.Load() == nil }

// Reads closer than scanGap bytes apart are merged into one, up to scanSpan bytes.
const (
	scanGap  = 4 << 10
	scanSpan = 256 << 10
)

// readBatch fills the values of hits pinned to segments with as few reads and
// allocations as possible, and releases every pin, even on error:
//
//   - Records adjacent in the log (keys loaded in order) come in one read: reads closer
//     than scanGap merge, up to scanSpan bytes.
//   - Every value lands in one buffer per batch, not one allocation per record (each was
//     garbage to sweep soon after the reply went out). Values stay fresh copies, as
//     Value promises.
//   - A record of a segment read with pread (where the file system maps nothing)
//     is taken from the value cache if it is there, and one read alone (scattered in the
//     log: keys inserted out of order) is put there (scanCaches says why only those).
//   - With buf (ScanInto) that buffer is the caller's reused one (scanArena); the value
//     cache copies what it keeps, so it never aliases it.
func (db *DB) readBatch(hits []scanHit, buf *[]byte, sc *scanScratch) error {
	miss := sc.miss[:0]
	defer func() { sc.miss = miss[:0] }()
	total := 0
	for i := range hits {
		h := &hits[i]
		if h.seg == nil {
			continue
		}
		if db.scanCaches(h.seg) {
			if data, ok := db.cache.get(h.v.pos, false); ok {
				h.val, h.shared = data, true
				total += len(data)
				db.release(h.seg)
				h.seg = nil
				continue
			}
		}
		miss = append(miss, i)
	}
	sc.order = sortByPos(hits, miss, sc.order[:0])
	// Group the misses into reads (hits in miss[k:k+n] come in one), and size the buffer.
	reads := sc.reads[:0]
	defer func() { sc.reads = reads[:0] }()
	for k := 0; k < len(miss); {
		first := &hits[miss[k]]
		lo, hi := first.v.pos, first.v.pos+uint64(first.v.size)
		j := k + 1
		for ; j < len(miss); j++ {
			h := &hits[miss[j]]
			if h.seg != first.seg || h.v.pos > hi+scanGap || h.v.pos+uint64(h.v.size)-lo > scanSpan {
				break
			}
			hi = max(hi, h.v.pos+uint64(h.v.size))
		}
		reads = append(reads, scanRead{lo, hi, k, j - k})
		total += int(hi - lo)
		k = j
	}
	arena := scanArena(buf, total)
	for i := range hits {
		if h := &hits[i]; h.shared {
			k := len(arena)
			arena = append(arena, h.val...)
			h.val, h.shared = arena[k:len(arena):len(arena)], false
		}
	}
	sc.sink += touchReads(hits, miss, reads)
	var err error
	for _, r := range reads {
		first := &hits[miss[r.k]]
		k := len(arena)
		arena = arena[:k+int(r.hi-r.lo)]
		buf := arena[k:]
		dev := db.devs[first.seg.dev]
		held := dev.begin(len(buf))
		rerr := first.seg.readAt(buf, int64(r.lo-first.seg.id))
		dev.end(held)
		if rerr != nil {
			err = fmt.Errorf("storage: read %s at %d: %w", first.seg.path, r.lo-first.seg.id, rerr)
			break
		}
		for _, i := range miss[r.k : r.k+r.n] {
			h := &hits[i]
			off := h.v.pos - r.lo
			b := buf[off : off+uint64(h.v.size)]
			rh, key, _, ok := decodeRecord(b, h.v.pos)
			if !ok || rh.version != h.v.version || !bytes.Equal(key, h.key) {
				err = &CorruptionError{File: h.seg.path, Offset: int64(h.v.pos - h.seg.id), Reason: "record read back does not match its checksum or the index"}
				break
			}
			p := payload(b, rh)
			h.val = p[:len(p):len(p)] // capped: appending to one value cannot overwrite the next
			if r.n == 1 && db.scanCaches(h.seg) {
				db.cache.put(h.v.pos, h.val)
			}
		}
		if err != nil {
			break
		}
	}
	for i := range hits {
		if hits[i].seg != nil {
			db.release(hits[i].seg)
			hits[i].seg = nil
		}
	}
	if buf != nil {
		*buf = (*buf)[:len(*buf)+len(arena)]
	}
	return err
}

// copyKeys copies the keys of a batch out of the index's arena into one new array
// (the scan's keys are fresh, the caller's to keep), each capped. Callers hold mu.
// The keys of a range inserted in random order lie anywhere in the arena, a cache miss
// each: copied in the walk, one after the other, they were 8–11 % of a YCSB-E scan's
// server CPU. Here a first
// pass loads the first and last byte of every key — loads that do not depend on each
// other, so their misses overlap — and the copy then finds the keys in the cache.
func copyKeys(batch []scanHit, sc *scanScratch) {
	n := 0
	var sum uint
	for i := range batch {
		k := batch[i].ikey
		if len(k) > 0 {
			sum += uint(k[0]) + uint(k[len(k)-1])
		}
		n += len(k)
	}
	sc.sink += sum
	arena := make([]byte, 0, n)
	for i := range batch {
		h := &batch[i]
		k0 := len(arena)
		arena = append(arena, h.ikey...)
		h.key, h.ikey = arena[k0:len(arena):len(arena)], ""
	}
}

// touchReads loads one byte of every cache line the batch's reads of mapped segments
// will copy, before any copy starts, and returns their sum (kept by the caller, so the
// loads are not dropped). The loads do not depend on each other, so the CPU keeps many
// cache misses (and page walks) in flight at once; the copies that follow then read
// lines already on their way. A copy alone takes the misses of one record at a time —
// of a scan of scattered 1 KB records that was the copy out of the mapping, a quarter
// of a YCSB-E scan's server CPU (docs/design/scans.md, "Fifth round"). It stops after
// touchBudget bytes: lines touched further ahead than the CPU's cache holds would be
// gone again before their copy (a batch of large values).
func touchReads(hits []scanHit, miss []int, reads []scanRead) (sum uint) {
	left := touchBudget
	for _, r := range reads {
		if left <= 0 {
			break
		}
		seg := hits[miss[r.k]].seg
		p := seg.mm.Load()
		if p == nil {
			continue
		}
		lo, hi := int64(r.lo-seg.id), int64(r.hi-seg.id)
		if hi > int64(len(*p)) {
			continue // readAt's pread path
		}
		b := (*p)[lo:hi]
		if len(b) > left {
			b = b[:left]
		}
		left -= len(b)
		for i := 0; i < len(b); i += 64 {
			sum += uint(b[i])
		}
		if len(b) > 0 {
			sum += uint(b[len(b)-1])
		}
	}
	return sum
}

// touchBudget bounds what touchReads loads ahead of a batch's copies: well inside a
// core's L2 (512 KiB–2 MiB on current x86 and arm64 server parts); a YCSB-E batch is
// ~50 KB.
const touchBudget = 256 << 10

// scanArena returns an empty slice with room for n bytes: fresh without buf, else the
// free end of *buf (capped, so filling it cannot reach past its n bytes), which
// readBatch then extends *buf over. If *buf has no room, a bigger array replaces it;
// the values already read stay in the old one (still referenced, so still valid), and
// the caller's next scan reuses the bigger one.
func scanArena(buf *[]byte, n int) []byte {
	if buf == nil {
		return make([]byte, 0, n)
	}
	b := *buf
	if cap(b)-len(b) < n {
		b = make([]byte, 0, max(n, 2*cap(b), minScanBuf))
		*buf = b
	}
	return b[len(b) : len(b) : len(b)+n]
}

// minScanBuf is the smallest buffer scanArena makes: a short scan of 1 KB values
// (YCSB-E's ranges are up to 100 keys) fits at once.
const minScanBuf = 128 << 10

// Versions returns the retained versions of key, newest first.
func (db *DB) Versions(key []byte) ([]VersionInfo, error) {
	db.mu.RLock()
	defer db.mu.RUnlock()
	p := db.idx.get(keyString(key))
	if p == nil {
		return nil, ErrNotFound
	}
	vs := db.idx.vers(p)
	out := make([]VersionInfo, vs.n())
	for i := range out {
		v := vs.at(i)
		out[i] = VersionInfo{Version: v.version, Timestamp: v.ts, Tombstone: v.tombstone(), Pos: v.end(), Size: int(v.size)}
	}
	return out, nil
}

// Has reports whether key's newest version holds a value (is not a deletion),
// from the index alone: no record is read. A hash write asks it of each field
// row whose value it does not need (HSET counts new fields, HDEL removed ones):
// Get would read the row's record back, a pread of the segment and a cache
// insert per field, most of what an HSET cost (docs/design/hashes.md).
func (db *DB) Has(key []byte) (bool, error) {
	ok, _, err := db.Probe(key)
	return ok, err
}

// Probe is Has that also returns a hint to key's item (the zero Hint if key
// has none): a writer probes the keys it is about to write (an HSET's field
// rows), and gives the hint back with the key's record (Record.Hint) so that
// the Append starts from the item instead of walking the index again.
func (db *DB) Probe(key []byte) (bool, Hint, error) {
	// No defer: nothing below panics, and a pipelined HSET probes once per
	// field (~25 instructions of deferred-call bookkeeping each).
	db.mu.RLock()
	if db.closed {
		db.mu.RUnlock()
		return false, Hint{}, ErrClosed
	}
	// lookup, not findHint: a call less (~10 instructions of a pipelined
	// HSET; docs/design/hashes.md, "Session 35").
	n, i, ok := db.idx.lookup(keyString(key))
	h := db.idx.hintAt(n, i, ok)
	// The flag read in place: tombstone's value receiver copied the item's
	// 32-byte ver to the stack first.
	live := ok && n.items[i].v.flags&verTombstone == 0
	db.mu.RUnlock()
	return live, h, nil
}

// VersionRange returns the interval of versions [lo, hi] over which a read of key at v
// returns the same value: lo is the version read (0 if the key did not exist yet), hi the
// version before the next one (math.MaxUint64 if the one read is still current).
func (db *DB) VersionRange(key []byte, v uint64) (lo, hi uint64, err error) {
	db.mu.RLock()
	defer db.mu.RUnlock()
	p := db.idx.get(keyString(key))
	if p == nil {
		return 0, math.MaxUint64, nil
	}
	vs := db.idx.vers(p)
	i, gone := vs.pick(v)
	if i < 0 {
		if gone {
			return 0, 0, fmt.Errorf("%w: %q at %d", ErrVersionGone, key, v)
		}
		return 0, vs.at(vs.n()-1).version - 1, nil
	}
	lo = vs.at(i).version
	if i == 0 {
		return lo, math.MaxUint64, nil
	}
	return lo, vs.at(i-1).version - 1, nil
}

// CountLive counts the keys in [start, end) whose newest version is not a
// deletion (an empty end: to the last key), from the index alone: no record is
// read. It walks the range, so it is for small ranges (the shard's reserved
// rows, which DBSIZE leaves out).
func (db *DB) CountLive(start, end []byte) int {
	db.mu.RLock()
	defer db.mu.RUnlock()
	n := 0
	db.idx.ascend(keyString(start), func(it *item) bool {
		if len(end) > 0 && db.idx.keyOf(it) >= keyString(end) {
			return false
		}
		n += liveness(it)
		return true
	})
	return n
}

// Stats returns current counters.
func (db *DB) Stats() Stats {
	db.mu.RLock()
	defer db.mu.RUnlock()
	s := Stats{
		Keys:        db.idx.Len(),
		LiveKeys:    db.idx.Live(),
		MetaKeys:    db.idx.WithMeta(),
		Segments:    len(db.segs),
		LastPos:     db.next,
		DurablePos:  db.dur,
		Appends:     db.st.appends.Load(),
		Writes:      db.st.writes.Load(),
		Syncs:       db.st.syncs.Load(),
		Compactions: db.st.compactions.Load(),
		Compacted:   db.st.compacted.Load(),
		Snapshots:   len(db.snaps),
		HintPos:     db.hintPos,
		Failed:      db.failed,
	}
	for _, seg := range db.segs {
		if seg.f == nil {
			continue // a gap left by compaction
		}
		s.DiskBytes += seg.size
		s.LiveBytes += seg.live
	}
	s.DiskBytes += int64(len(db.buf))
	s.Versions = db.nvers
	if db.cache != nil {
		s.CacheHits, s.CacheMisses = db.cache.stats()
	}
	return s
}

// Close flushes and fsyncs what was appended (unless the engine failed) and closes the
// files. Reads and writes after Close return ErrClosed.
func (db *DB) Close() error {
	if db.fill != nil {
		db.fill.Close()
	}
	if db.compactStop != nil {
		close(db.compactStop)
		<-db.compactDone
		db.compactStop = nil
	}
	if db.bgStop != nil {
		close(db.bgStop)
		<-db.bgDone
		db.bgStop = nil
	}
	var err error
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return ErrClosed
	}
	for db.syncing || db.sealing {
		db.syncCond.Wait()
	}
	if db.failed == nil && db.next > db.dur {
		db.mu.Unlock()
		_, err = db.Sync(db.next)
		db.mu.Lock()
	}
	db.closed = true
	db.mu.Unlock()
	db.maint.Lock() // wait for a running compaction or checkpoint
	defer db.maint.Unlock()
	db.mu.RLock()
	segs := db.segs
	db.mu.RUnlock()
	for _, s := range segs {
		if s.f == nil {
			continue
		}
		for s.refs.Load() > 1 { // readers that pinned it before Close
			time.Sleep(50 * time.Microsecond)
		}
		if cerr := closeSegment(s); cerr != nil && err == nil {
			err = fmt.Errorf("storage: close %s: %w", s.path, cerr)
		}
	}
	return err
}

// background is the syncer goroutine: it serves Sync requests (unless Inline) and the
// periodic / every-N-bytes background sync.
func (db *DB) background() {
	defer close(db.bgDone)
	var tick <-chan time.Time
	if db.opts.SyncInterval > 0 {
		t := time.NewTicker(db.opts.SyncInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		periodic := false
		select {
		case <-db.bgStop:
			db.mu.Lock()
			db.syncer = false // later Syncs lead themselves
			db.signalLocked()
			db.mu.Unlock()
			return
		case <-tick:
			periodic = true
		case <-db.bgKick:
		}
		db.mu.Lock()
		if periodic || (db.opts.SyncBytes > 0 && int64(db.next-db.dur) >= db.opts.SyncBytes) {
			db.wantSync = max(db.wantSync, db.next)
		}
		if !db.syncer {
			want := db.wantSync
			db.mu.Unlock()
			db.Sync(want)
			continue
		}
		for db.failed == nil && !db.closed && db.wantSync > db.dur {
			if db.syncing || db.sealing {
				db.syncCond.Wait()
				continue
			}
			err := db.syncOnceLocked()
			db.syncAttempts++
			db.syncErr = err
			if err != nil {
				db.wantSync = 0 // waiters see syncErr or failed; new ones ask again
				db.signalLocked()
				break
			}
		}
		db.mu.Unlock()
	}
}

// waitIdle waits until no fsync or segment roll is in flight (tests use it before they
// cut the power, so no background file operation lands on the rebooted disk).
func (db *DB) waitIdle() {
	db.mu.Lock()
	for db.syncing || db.sealing {
		db.syncCond.Wait()
	}
	db.mu.Unlock()
}
