package vrshard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

// The replication WAL holds what the VR core must find after a restart: its
// log entries, its hard state and the latest snapshot point (op number and
// client table; the state itself is in the storage engine, synced before the
// snapshot record is written).
//
// Files: wal-<seq>.log. A segment (format 2) is a 16-byte header
//
//	"KWAL" | version uint32 LE (2) | segment number uint64 LE
//
// then a sequence of records
//
//	length uint32 LE (type + payload) | CRC-32C uint32 LE | pos uint64 LE |
//	synced uint64 LE | type byte | payload
//
// where pos is the record's own offset in the segment and synced a point of
// the segment below which every byte was durable (a completed fsync) when the
// record was written. The CRC covers the segment number, pos, synced, type
// and payload, so a record is valid only in its segment at the offset it
// claims.
//
// Segments are zero-filled and synced ahead of need (wal_zero.go), and
// records are written in place at the log's logical end: the file does not
// grow, so an fdatasync commits no metadata (docs/design/zero-filled-logs.md).
// If no zero-filled file is ready at a roll, the segment is appended to, as
// before; the format is the same.
//
// Every segment starts with a snapshot record, so the newest segment whose
// first record is valid is self-contained: older ones are deleted once it is
// durable (a checkpoint, or a snapshot received from a peer, starts a new
// segment holding the snapshot point, the entries after it and the hard
// state). A Ready batch is one write; its fsync runs in the background.
//
// Recovery replays the newest segment until the first invalid record: that
// is the end (a zero header is the ordinary clean end). Unsynced pages of an
// overwrite may land in any order, so valid records may follow a hole; they
// were never acknowledged, unless one of them says (synced) that the hole
// was below a completed fsync: then the middle of the log is damaged and
// openWAL refuses with ErrWALCorrupt, as it refuses a bad record below any
// synced mark read before the end. Everything non-zero after the end is
// overwritten with zeros and synced before the log takes a write, so a stale
// record can never be resurrected by a later record that ends where it
// begins.
//
// Format 1 (no segment header, records length | CRC | type | payload; written
// before zero-filled segments) is still read: openWAL replays it under its
// old rules (a valid record after a bad one is corruption) and rewrites the
// recovered state into a format-2 segment, as a checkpoint would.

const (
	recEntries   = 1 // count uvarint, then per entry: view, op, client, reqnum uvarints, data
	recHardState = 2 // view, last normal view, commit uvarints
	recTruncate  = 3 // op uvarint: discard entries after it
	recSnapshot  = 4 // op uvarint, count uvarint, per client: client, reqnum, op, result; then, if not 0, the engine's number (uvarint)
	recFlags     = 5 // flags byte: 1 = recovering (the replica has not finished VR recovery), 2 = engine marked (below), 4 = clean stop (see walState.clean)
	// recHardStateMember: a hard state with the group's configuration after
	// a reconfiguration (vr.Membership): the hard state's three uvarints,
	// then epoch, start, the member count and ids, the previous count and
	// ids. One record, so a torn batch keeps both or neither (the core's
	// rule: a membership without its hard state, or the reverse, could
	// restart the replica in an epoch its commit point contradicts). Once a
	// replica has a membership every hard state record is one of these, so
	// a new segment (checkpoint, snapshot) carries it on.
	recHardStateMember = 7

	walHeader = 9 // format 1 record header

	segHeader   = 16 // format 2 segment header
	segMagic    = "KWAL"
	segVersion  = 2
	recTypeAt   = 4 + 4 + 8 + 8 // offset of the type byte in a format 2 record: after length, crc, pos, synced
	recHeader   = recTypeAt + 1 // format 2 record header: length, crc, pos, synced, type
	recLenBytes = recTypeAt     // header bytes not counted in length (it counts type + payload)

	// maxWALRecord bounds a record so a corrupted length cannot make recovery
	// allocate without bound.
	maxWALRecord = 1 << 30
)

// ErrWALCorrupt: the WAL holds a bad record before its tail.
var ErrWALCorrupt = errors.New("vrshard: replication log corrupt")

type walState struct {
	empty      bool // no segment at all: a new replica, or a wiped disk
	snap       vr.Snapshot
	entries    []vr.Entry
	hs         vr.HardState
	recovering bool
	// engineMarked: the engine was synced holding its applied-op mark
	// (statemachine.go appliedKey) before this log's snapshot point was
	// written, so an engine without the mark has lost its state. Logs
	// written before the mark existed lack the flag.
	engineMarked bool
	dlog         []vr.NilextRequest // nilext d-log records (nilext.go)
	// member: the configuration the last recHardStateMember recorded (nil:
	// the group has never been reconfigured; the Options' configuration).
	member *vr.Membership
	// clean: the last record is a flags record a clean stop wrote after its
	// final fsync (Replica.Close): every record written before it, every
	// d-log record the replica acknowledged included, is on disk.
	clean bool
}

type wal struct {
	fs   vfs.FS
	dir  string
	seg  vfs.File // the active segment: sf, or nil
	sf   *seglog.SyncedFile
	segN uint64
	// size is the logical end of the active segment: where the next record
	// goes. fileSize is the file's length, larger while a zero-filled tail
	// remains.
	size     int64
	fileSize int64
	buf      []byte // records not yet written, framed but not positioned
	syncs    uint64
	// member, once set, goes with every hard state record
	// (recHardStateMember): the replica's configuration after a
	// reconfiguration.
	member *vr.Membership
	// marked is the engine-marked flag every flags record carries
	// (walState.engineMarked): set once an engine sync covered the mark.
	marked bool

	cfg  walConfig
	fill *seglog.Filler
	// writeAt: the file system's files implement vfs.WriterAt (learned from
	// the first writable segment file; 0 unknown, 1 yes, -1 no).
	writeAt int8
	// rolls counts segments started, zeroRolls those on a zero-filled file.
	rolls, zeroRolls uint64
}

func segName(n uint64) string { return fmt.Sprintf("wal-%016d.log", n) }

func parseSeg(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, "wal-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".log")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// openWAL recovers the WAL in dir with the default configuration (a
// background filler; wal_zero.go).
func openWAL(fs vfs.FS, dir string) (*wal, walState, error) {
	return openWALWith(fs, dir, defaultWALConfig())
}

// openWALWith recovers the WAL in dir. It leaves the newest segment open for
// writing (its tail after the last valid record zeroed, or cut off), or none
// if the directory is empty.
func openWALWith(fs vfs.FS, dir string, cfg walConfig) (*wal, walState, error) {
	w := &wal{fs: fs, dir: dir, cfg: cfg}
	w.fill = seglog.NewFiller(fs, zeroName, cfg.fill)
	st, err := w.recover()
	if err != nil {
		w.close()
		return nil, st, err
	}
	w.member = st.member // every later hard state record carries it on
	if w.seg != nil {
		w.requestFill(w.size)
	}
	return w, st, nil
}

func (w *wal) recover() (walState, error) {
	fs, dir := w.fs, w.dir
	if err := fs.MkdirAll(dir); err != nil {
		return walState{}, fmt.Errorf("vrshard: wal: mkdir: %w", err)
	}
	names, err := fs.ReadDir(dir)
	if err != nil {
		return walState{}, fmt.Errorf("vrshard: wal: list: %w", err)
	}
	var segs []uint64
	for _, n := range names {
		if id, ok := parseSeg(n); ok {
			segs = append(segs, id)
		} else if seglog.IsTmp(n) {
			// A roll that crashed before its rename (the old segment is
			// whole), or the filler's zero-filled file: made again.
			if err := seglog.RemoveLeftover(fs, vfs.Join(dir, n)); err != nil {
				return walState{}, fmt.Errorf("vrshard: wal: %w", err)
			}
		}
	}
	slices.Sort(segs)
	st := walState{empty: true}
	// Find the newest segment that starts with a valid snapshot record; a
	// newer one that does not is a checkpoint that crashed before its fsync.
	start := -1
	var b []byte
	for i := len(segs) - 1; i >= 0; i-- {
		if b, err = w.readAll(segs[i]); err != nil {
			return st, err
		}
		if firstIsSnapshot(b, segs[i]) {
			start = i
			break
		}
	}
	if start < 0 {
		if len(segs) > 0 {
			// Segments exist but none is usable: only a crash during the very
			// first segment's creation can cause that.
			for _, id := range segs {
				_ = fs.Remove(vfs.Join(dir, segName(id)))
			}
		}
		return st, nil
	}
	st.empty = false
	// Newer segments are checkpoints that crashed before their first record
	// was durable; older ones were superseded (a crash may have left them).
	for i, id := range segs {
		if i != start {
			if err := fs.Remove(vfs.Join(dir, segName(id))); err != nil {
				return st, fmt.Errorf("vrshard: wal: remove stale segment: %w", err)
			}
		}
	}
	id := segs[start]
	if !isFormat2(b) {
		return w.upgrade(id, b, st)
	}
	end, err := replaySegment(b, id, &st, w.cfg.mut)
	if err != nil {
		return st, fmt.Errorf("%w: %s: %w", ErrWALCorrupt, segName(id), err)
	}
	f, err := fs.OpenRW(vfs.Join(dir, segName(id)))
	if err != nil {
		return st, fmt.Errorf("vrshard: wal: open: %w", err)
	}
	w.writeAt = -1
	if _, ok := f.(vfs.WriterAt); ok {
		w.writeAt = 1
	}
	// Nothing non-zero may stay behind the end (zeroed, or cut off on a file
	// system without positional writes, as format 1 did).
	fileSize, _, err := seglog.EndTail(f, b[end:], end, int64(len(b)), mutation.On && w.cfg.mut.skipZeroTail)
	if err != nil {
		f.Close()
		return st, fmt.Errorf("vrshard: wal: %s: %w", segName(id), err)
	}
	// Sync even when nothing changed: after a process crash (not a power
	// cut) the records read above may be in the page cache only, and the
	// next record will say they are durable.
	if err := f.Sync(); err != nil {
		f.Close()
		return st, fmt.Errorf("vrshard: wal: sync: %w", err)
	}
	w.install(f, id, end, fileSize)
	w.sf.MarkSynced(end)
	w.marked = st.engineMarked
	return st, nil
}

// upgrade recovers a format 1 segment under format 1's rules and rewrites
// the recovered state into a new format 2 segment (a roll: the new segment
// is durable before the old one is removed).
func (w *wal) upgrade(id uint64, b []byte, st walState) (walState, error) {
	off, err := replayWAL(b, &st)
	if err != nil && (!errors.Is(err, errTorn) || validAfter(b, off)) {
		// A torn write only ever damages the end of an appended log: a
		// valid record after the bad one means the middle of the log is
		// damaged, and cutting there would silently drop acknowledged
		// entries.
		return st, fmt.Errorf("%w: %s (format 1) at offset %d: %w", ErrWALCorrupt, segName(id), off, err)
	}
	w.segN = id
	w.addSnapshot(st.snap)
	w.addFlags(st.recovering)
	w.addEntries(st.entries)
	w.addDLog(st.dlog)
	w.addHardState(st.hs)
	if err := w.roll(); err != nil {
		return st, fmt.Errorf("vrshard: wal: rewrite format 1 segment %s: %w", segName(id), err)
	}
	return st, nil
}

func (w *wal) readAll(id uint64) ([]byte, error) {
	f, err := w.fs.Open(vfs.Join(w.dir, segName(id)))
	if err != nil {
		return nil, fmt.Errorf("vrshard: wal: open %s: %w", segName(id), err)
	}
	defer f.Close()
	n, err := f.Size()
	if err != nil {
		return nil, fmt.Errorf("vrshard: wal: size %s: %w", segName(id), err)
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil && n > 0 {
		return nil, fmt.Errorf("vrshard: wal: read %s: %w", segName(id), err)
	}
	return b, nil
}

var errTorn = errors.New("incomplete or corrupt record")

func isFormat2(b []byte) bool {
	return len(b) >= segHeader && string(b[:4]) == segMagic
}

// firstIsSnapshot reports whether segment id (contents b, either format)
// starts with a valid snapshot record.
func firstIsSnapshot(b []byte, id uint64) bool {
	if isFormat2(b) {
		if binary.LittleEndian.Uint32(b[4:]) != segVersion || binary.LittleEndian.Uint64(b[8:]) != id {
			return false
		}
		r, ok := parseRecord(b, segHeader, id, walMutations{})
		return ok && r.typ == recSnapshot
	}
	typ, _, _, ok := nextRecord(b)
	return ok && typ == recSnapshot
}

// nextRecord parses the format 1 record at the start of b.
func nextRecord(b []byte) (typ byte, payload []byte, n int, ok bool) {
	if len(b) < walHeader {
		return 0, nil, 0, false
	}
	l := binary.LittleEndian.Uint32(b)
	if l == 0 || l > maxWALRecord || int(l)+8 > len(b) {
		return 0, nil, 0, false
	}
	body := b[8 : 8+l]
	if crc32.Checksum(body, seglog.CRCTable) != binary.LittleEndian.Uint32(b[4:]) {
		return 0, nil, 0, false
	}
	return body[0], body[1:], 8 + int(l), true
}

// validAfter reports whether a valid format 1 record starts anywhere after
// off (seglog.ScanPastEnd; a record's length, at 0, is never zero).
func validAfter(b []byte, off int) bool {
	return seglog.ScanPastEnd(b, off, walHeader, 0, func(i int) bool {
		_, _, _, ok := nextRecord(b[i:])
		return ok
	}) >= 0
}

// replayWAL applies the records of a format 1 segment to st and returns how
// many bytes were valid.
func replayWAL(b []byte, st *walState) (int, error) {
	off := 0
	for off < len(b) {
		typ, p, n, ok := nextRecord(b[off:])
		if !ok {
			return off, errTorn
		}
		if err := st.apply(typ, p); err != nil {
			return off, err
		}
		off += n
	}
	return off, nil
}

// record2 is a parsed format 2 record.
type record2 struct {
	typ     byte
	payload []byte
	n       int   // bytes, header included
	synced  int64 // the durable point it carries
}

// recordCRC is the CRC of a format 2 record: the segment number, then the
// record from pos to the end of its payload.
func recordCRC(seg uint64, rec []byte) uint32 {
	var sb [8]byte
	binary.LittleEndian.PutUint64(sb[:], seg)
	return crc32.Update(crc32.Checksum(sb[:], seglog.CRCTable), seglog.CRCTable, rec[8:])
}

// parseRecord parses the format 2 record at b[off:] of segment seg: valid
// only if whole, its CRC matches, it claims to be at off, and the durable
// point it carries is not past itself.
func parseRecord(b []byte, off int, seg uint64, mut walMutations) (record2, bool) {
	if off+recHeader > len(b) || off < 0 {
		return record2{}, false
	}
	h := b[off:]
	l := binary.LittleEndian.Uint32(h)
	if l == 0 || l > maxWALRecord || int64(off)+recLenBytes+int64(l) > int64(len(b)) {
		return record2{}, false
	}
	pos := binary.LittleEndian.Uint64(h[8:])
	synced := binary.LittleEndian.Uint64(h[16:])
	if !(mutation.On && mut.ignorePos) && pos != uint64(off) {
		return record2{}, false
	}
	if synced > pos {
		return record2{}, false
	}
	rec := h[:recLenBytes+int(l)]
	if recordCRC(seg, rec) != binary.LittleEndian.Uint32(h[4:]) {
		return record2{}, false
	}
	return record2{typ: rec[recTypeAt], payload: rec[recTypeAt+1:], n: len(rec), synced: int64(synced)}, true
}

// replaySegment applies the records of format 2 segment seg (contents b) to
// st and returns the log's end: the offset of its first invalid record. It
// returns an error if the end is below a point that a valid record after it
// says was durable (the middle of the log is damaged), or if a valid record
// does not apply.
func replaySegment(b []byte, seg uint64, st *walState, mut walMutations) (int64, error) {
	off := segHeader
	for {
		r, ok := parseRecord(b, off, seg, mut)
		if !ok {
			break
		}
		if err := st.apply(r.typ, r.payload); err != nil {
			return int64(off), fmt.Errorf("record at offset %d: %w", off, err)
		}
		off += r.n
	}
	if mutation.On && mut.ignoreSynced {
		return int64(off), nil
	}
	// A record's synced mark is never past its own offset, so only records
	// after the end can say the end was durable. The valid ones there are
	// stale (written, never synced, landed while an earlier page did not)
	// unless one says so: then a synced record is damaged.
	var proof record2
	i := seglog.ScanPastEnd(b, off, recHeader, 0, func(i int) bool {
		r, ok := parseRecord(b, i, seg, mut)
		proof = r
		return ok && r.synced > int64(off)
	})
	if i >= 0 {
		return int64(off), fmt.Errorf("bad record at offset %d, but the valid record at offset %d says the log was durable up to %d", off, i, proof.synced)
	}
	return int64(off), nil
}

func (st *walState) lastOp() uint64 { return st.snap.Op + uint64(len(st.entries)) }

func (st *walState) apply(typ byte, p []byte) error {
	r := reader{b: p}
	st.clean = false // only a clean mark that is the last record counts
	switch typ {
	case recSnapshot:
		st.snap = vr.Snapshot{Op: r.uvarint()}
		d := r.decoder()
		st.snap.Clients = kv.DecodeClientEntries(&d)
		r.update(&d)
		if len(r.b) > 0 {
			// The engine's number of the snapshot's last entry
			// (core.Snapshot.Number). A record without one — VR's, or a
			// chain member's written by a build before the number — ends
			// after its clients: the number is unknown (0).
			st.snap.Number = r.uvarint()
		}
		st.entries = st.entries[:0]
		st.dlog = st.dlog[:0]
	case recEntries:
		n := r.uvarint()
		if n > uint64(len(r.b)) {
			return ErrCorruptEntry
		}
		for i := uint64(0); i < n && r.err == nil; i++ {
			e := vr.Entry{View: r.uvarint(), Op: r.uvarint()}
			e.Client, e.ReqNum = r.uvarint(), r.uvarint()
			e.Data = append([]byte(nil), r.bytes()...)
			if r.err != nil {
				break
			}
			if e.Op <= st.snap.Op {
				continue // a checkpoint's snapshot covers it
			}
			if e.Op != st.lastOp()+1 {
				return fmt.Errorf("entry %d after %d", e.Op, st.lastOp())
			}
			st.entries = append(st.entries, e)
		}
	case recHardState:
		st.hs = vr.HardState{View: r.uvarint(), LastNormalView: r.uvarint(), Commit: r.uvarint()}
	case recHardStateMember:
		st.hs = vr.HardState{View: r.uvarint(), LastNormalView: r.uvarint(), Commit: r.uvarint()}
		m := &vr.Membership{Epoch: r.uvarint(), Start: r.uvarint()}
		m.Members, m.Previous = r.ids(), r.ids()
		st.member = m
	case recTruncate:
		op := r.uvarint()
		if r.err == nil && op < st.lastOp() {
			if op < st.snap.Op {
				return fmt.Errorf("truncate to %d below snapshot %d", op, st.snap.Op)
			}
			st.entries = st.entries[:op-st.snap.Op]
		}
	case recFlags:
		b := r.byte()
		st.recovering = b&1 != 0
		st.engineMarked = b&2 != 0
		st.clean = b&4 != 0
	case recDLog:
		return st.applyDLog(p)
	default:
		return fmt.Errorf("unknown record type %d", typ)
	}
	return r.err
}

// record appends one record to w.buf, framed but not yet positioned: write
// fills in pos, synced and the CRC when it knows where the batch goes.
func (w *wal) record(typ byte, fill func(b []byte) []byte) {
	start := len(w.buf)
	w.buf = append(w.buf, make([]byte, recTypeAt)...)
	w.buf = append(w.buf, typ)
	w.buf = fill(w.buf)
	binary.LittleEndian.PutUint32(w.buf[start:], uint32(len(w.buf)-start-recLenBytes))
}

// position stamps every buffered record with its offset in segment seg (the
// batch lands at base), the durable point synced, and its CRC.
func (w *wal) position(seg uint64, base, synced int64) {
	for s := 0; s < len(w.buf); {
		rec := w.buf[s:]
		n := recLenBytes + int(binary.LittleEndian.Uint32(rec))
		binary.LittleEndian.PutUint64(rec[8:], uint64(base)+uint64(s))
		binary.LittleEndian.PutUint64(rec[16:], uint64(synced))
		binary.LittleEndian.PutUint32(rec[4:], recordCRC(seg, rec[:n]))
		s += n
	}
}

func (w *wal) addEntries(es []vr.Entry) {
	if len(es) == 0 {
		return
	}
	w.record(recEntries, func(b []byte) []byte {
		b = binary.AppendUvarint(b, uint64(len(es)))
		for i := range es {
			e := &es[i]
			b = binary.AppendUvarint(b, e.View)
			b = binary.AppendUvarint(b, e.Op)
			b = binary.AppendUvarint(b, e.Client)
			b = binary.AppendUvarint(b, e.ReqNum)
			b = appendBytes(b, e.Data)
		}
		return b
	})
}

func (w *wal) addHardState(hs vr.HardState) {
	typ := byte(recHardState)
	if w.member != nil {
		typ = recHardStateMember
	}
	w.record(typ, func(b []byte) []byte {
		b = binary.AppendUvarint(b, hs.View)
		b = binary.AppendUvarint(b, hs.LastNormalView)
		b = binary.AppendUvarint(b, hs.Commit)
		if m := w.member; m != nil {
			b = binary.AppendUvarint(b, m.Epoch)
			b = binary.AppendUvarint(b, m.Start)
			b = appendIDs(b, m.Members)
			b = appendIDs(b, m.Previous)
		}
		return b
	})
}

// appendIDs appends a count and the ids (reader.ids reads them).
func appendIDs(b []byte, ids []uint64) []byte {
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, id)
	}
	return b
}

func (w *wal) addTruncate(op uint64) {
	w.record(recTruncate, func(b []byte) []byte { return binary.AppendUvarint(b, op) })
}

func (w *wal) addFlags(recovering bool) {
	f := w.flags(recovering)
	w.record(recFlags, func(b []byte) []byte { return append(b, f) })
}

// flags is the flags byte every flags record carries: recovering, and the
// engine-marked flag (older code reads bit 0 only).
func (w *wal) flags(recovering bool) byte {
	var f byte
	if recovering {
		f |= 1
	}
	if w.marked {
		f |= 2
	}
	return f
}

// markClean ends a clean stop: a flags record saying so, written and
// synced after everything else (walState.clean). Its fsync also makes every
// earlier write durable, held group-commit batches included.
func (w *wal) markClean() error {
	// Only a replica that is not recovering stops cleanly (Replica.Close).
	f := w.flags(false) | 4
	w.record(recFlags, func(b []byte) []byte { return append(b, f) })
	if err := w.write(); err != nil {
		return err
	}
	return w.sync()
}

// unmarkClean makes a clean mark found at open no longer the last record,
// durably, before the replica acknowledges anything in this life: a power
// cut later in this life must not find it last.
func (w *wal) unmarkClean(recovering bool) error {
	w.addFlags(recovering)
	if err := w.write(); err != nil {
		return err
	}
	return w.sync()
}

// addSnapshot records a snapshot point: s's op, clients and number (its
// state is in the engine). The number goes last and only when known, so a
// snapshot without one (every VR snapshot) is written as before it existed,
// and a build before it reads the record, ignoring the number.
func (w *wal) addSnapshot(s vr.Snapshot) {
	w.record(recSnapshot, func(b []byte) []byte {
		b = binary.AppendUvarint(b, s.Op)
		b = kv.AppendClientEntries(b, s.Clients)
		if s.Number != 0 {
			b = binary.AppendUvarint(b, s.Number)
		}
		return b
	})
}

// pending reports whether records wait to be written.
func (w *wal) pending() bool { return len(w.buf) > 0 }

// write writes the buffered records with one write at the log's logical end
// (no fsync): in place over the zero-filled tail, or appended.
func (w *wal) write() error {
	if len(w.buf) == 0 {
		return nil
	}
	if w.seg == nil {
		return errors.New("vrshard: wal: no open segment")
	}
	w.position(w.segN, w.size, w.sf.Synced())
	err := w.put(w.buf)
	w.buf = w.buf[:0]
	return err
}

// put writes p at the logical end of the active segment.
func (w *wal) put(p []byte) error {
	// w.size < w.fileSize only on a file that implements WriterAt: a segment
	// recovered without it was cut to its end. A failed write is not taken
	// back (seglog.UndoWrite): it stops the replica, and recovery ends the
	// log at the first bad record.
	n, _, err := seglog.WriteAtEnd(w.sf.File, p, w.size, w.fileSize)
	w.size += int64(n)
	w.fileSize = max(w.fileSize, w.size)
	w.sf.SetEnd(w.size)
	if err != nil {
		return fmt.Errorf("vrshard: wal: write: %w", err)
	}
	return nil
}

func (w *wal) sync() error {
	if err := w.seg.Sync(); err != nil {
		return fmt.Errorf("vrshard: wal: fsync: %w", err)
	}
	w.syncs++
	return nil
}

// install makes f the active segment n: end is its logical end, size its
// file's length.
func (w *wal) install(f vfs.File, n uint64, end, size int64) {
	w.sf = seglog.NewSyncedFile(f, end, w.cfg.onSync)
	w.seg, w.segN, w.size, w.fileSize = w.sf, n, end, size
}

// roll starts a new segment holding the buffered records, which must begin
// with a snapshot record, makes it durable, and deletes the older segments.
// The new segment is the filler's zero-filled file if one is ready;
// otherwise it is created empty and appended to.
func (w *wal) roll() error {
	if len(w.buf) <= recTypeAt || w.buf[recTypeAt] != recSnapshot {
		panic("vrshard: wal: a segment must start with a snapshot record")
	}
	n := w.segN + 1
	// The new segment is written under a temporary name and renamed only once
	// it is whole and fsynced: recovery trusts the newest segment that starts
	// with a snapshot record and deletes older ones, and a real file system
	// may keep a new file's name and first pages without its tail after a
	// crash — that must never outrank the complete old segment.
	final := vfs.Join(w.dir, segName(n))
	if w.seg == nil {
		// The first segment (a new replica, or an upgraded log): nothing
		// waits on the write path yet, so zero-fill it here.
		w.fill.FillNow(w.dir, w.cfg.minSeg)
	}
	// The filler's file keeps its temporary name until the segment is
	// durable (the rename below).
	f, size, tmp := w.fill.TakeOpen(w.dir, "")
	if f == nil {
		tmp = final + seglog.TmpSuffix
		var err error
		if f, err = w.fs.Create(tmp); err != nil {
			return fmt.Errorf("vrshard: wal: create segment: %w", err)
		}
		size = 0
		if _, ok := f.(vfs.WriterAt); !ok {
			w.writeAt = -1
		}
	} else {
		w.writeAt = 1
		w.zeroRolls++
	}
	w.rolls++
	old, oldN, oldEnd := w.seg, w.segN, w.size
	w.install(f, n, 0, size)
	var hdr [segHeader]byte
	copy(hdr[:], segMagic)
	binary.LittleEndian.PutUint32(hdr[4:], segVersion)
	binary.LittleEndian.PutUint64(hdr[8:], n)
	if err := w.put(hdr[:]); err != nil {
		return err
	}
	if err := w.write(); err != nil {
		return err
	}
	if err := w.sync(); err != nil {
		return err
	}
	if err := w.fs.Rename(tmp, final); err != nil {
		return fmt.Errorf("vrshard: wal: install segment: %w", err)
	}
	if err := w.fs.SyncDir(w.dir); err != nil {
		return fmt.Errorf("vrshard: wal: sync dir: %w", err)
	}
	// The sealed segment is not cut to its logical end: it is deleted now
	// that its successor is durable, and if the deletion is lost in a crash
	// recovery ignores it (older than a valid segment).
	if old != nil {
		old.Close()
	}
	names, err := w.fs.ReadDir(w.dir)
	if err != nil {
		return fmt.Errorf("vrshard: wal: list: %w", err)
	}
	for _, name := range names {
		if id, ok := parseSeg(name); ok && id <= oldN {
			if err := w.fs.Remove(vfs.Join(w.dir, name)); err != nil {
				return fmt.Errorf("vrshard: wal: remove old segment: %w", err)
			}
		}
	}
	// Not fatal if lost: recovery ignores segments older than a valid one.
	_ = w.fs.SyncDir(w.dir)
	w.requestFill(oldEnd)
	return nil
}

func (w *wal) close() error {
	w.fill.Close()
	if w.seg == nil {
		return nil
	}
	err := w.seg.Close()
	w.seg, w.sf = nil, nil
	return err
}
