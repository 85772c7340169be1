package vrshard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

// The replication WAL holds what the VR core must find after a restart: its
// log entries, its hard state and the latest snapshot point (op number and
// client table; the state itself is in the storage engine, synced before the
// snapshot record is written).
//
// Files: wal-<seq>.log, each a sequence of records
//
//	length uint32 LE | CRC-32C (type + payload) uint32 LE | type byte | payload
//
// Every segment starts with a snapshot record, so the newest segment whose
// first record is valid is self-contained: older ones are deleted once it is
// durable (a checkpoint, or a snapshot received from a peer, starts a new
// segment holding the snapshot point, the entries after it and the hard
// state). A Ready batch is one Write and one fsync. Recovery reads the
// segments in order and stops at the first bad record of the last one (a torn
// tail: truncated away); a bad record anywhere else is corruption.

const (
	recEntries   = 1 // count uvarint, then per entry: view, op, client, reqnum uvarints, data
	recHardState = 2 // view, last normal view, commit uvarints
	recTruncate  = 3 // op uvarint: discard entries after it
	recSnapshot  = 4 // op uvarint, count uvarint, per client: client, reqnum, op, result
	recFlags     = 5 // flags byte: 1 = recovering (the replica has not finished VR recovery)

	walHeader = 9
	// maxWALRecord bounds a record so a corrupted length cannot make recovery
	// allocate without bound.
	maxWALRecord = 1 << 30
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// ErrWALCorrupt: the WAL holds a bad record before its tail.
var ErrWALCorrupt = errors.New("vrshard: replication log corrupt")

type walState struct {
	empty      bool // no segment at all: a new replica, or a wiped disk
	snap       vr.Snapshot
	entries    []vr.Entry
	hs         vr.HardState
	recovering bool
	dlog       []vr.NilextRequest // nilext d-log records (nilext.go)
}

type wal struct {
	fs    vfs.FS
	dir   string
	seg   vfs.File
	segN  uint64
	size  int64
	buf   []byte
	syncs uint64
}

func segName(n uint64) string { return fmt.Sprintf("wal-%016d.log", n) }

// tmpSuffix marks a segment being written by a roll; it is renamed into place
// once complete and durable.
const tmpSuffix = ".tmp"

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

// openWAL recovers the WAL in dir. It leaves the newest segment open for
// appending (its torn tail cut off), or none if the directory is empty.
func openWAL(fs vfs.FS, dir string) (*wal, walState, error) {
	w := &wal{fs: fs, dir: dir}
	if err := fs.MkdirAll(dir); err != nil {
		return nil, walState{}, fmt.Errorf("vrshard: wal: mkdir: %w", err)
	}
	names, err := fs.ReadDir(dir)
	if err != nil {
		return nil, walState{}, fmt.Errorf("vrshard: wal: list: %w", err)
	}
	var segs []uint64
	for _, n := range names {
		if id, ok := parseSeg(n); ok {
			segs = append(segs, id)
		} else if strings.HasSuffix(n, tmpSuffix) {
			// A roll that crashed before its rename: the old segment is whole.
			if err := fs.Remove(vfs.Join(dir, n)); err != nil {
				return nil, walState{}, fmt.Errorf("vrshard: wal: remove unfinished segment: %w", err)
			}
		}
	}
	slices.Sort(segs)
	st := walState{empty: true}
	// Find the newest segment that starts with a valid snapshot record; a
	// newer one that does not is a checkpoint that crashed before its fsync.
	start := -1
	for i := len(segs) - 1; i >= 0; i-- {
		b, err := w.readAll(segs[i])
		if err != nil {
			return nil, st, err
		}
		if typ, _, _, ok := nextRecord(b); ok && typ == recSnapshot {
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
		return w, st, nil
	}
	st.empty = false
	// Newer segments are checkpoints that crashed before their first record
	// was durable; older ones were superseded (a crash may have left them).
	for i, id := range segs {
		if i != start {
			if err := fs.Remove(vfs.Join(dir, segName(id))); err != nil {
				return nil, st, fmt.Errorf("vrshard: wal: remove stale segment: %w", err)
			}
		}
	}
	id := segs[start]
	b, err := w.readAll(id)
	if err != nil {
		return nil, st, err
	}
	off, err := replayWAL(b, &st)
	if err != nil && (!errors.Is(err, errTorn) || validAfter(b, off)) {
		// A torn write only ever damages the end: a valid record after the
		// bad one means the middle of the log is damaged, and cutting there
		// would silently drop acknowledged entries.
		return nil, st, fmt.Errorf("%w: %s at offset %d: %w", ErrWALCorrupt, segName(id), off, err)
	}
	f, err := fs.OpenRW(vfs.Join(dir, segName(id)))
	if err != nil {
		return nil, st, fmt.Errorf("vrshard: wal: open: %w", err)
	}
	if off < len(b) {
		// A torn tail: the batch being written when the replica stopped, never
		// acknowledged (fsync had not returned).
		if err := f.Truncate(int64(off)); err != nil {
			f.Close()
			return nil, st, fmt.Errorf("vrshard: wal: cut torn tail: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, st, fmt.Errorf("vrshard: wal: sync: %w", err)
		}
	}
	w.seg, w.segN, w.size = f, id, int64(off)
	return w, st, nil
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

// nextRecord parses the record at the start of b.
func nextRecord(b []byte) (typ byte, payload []byte, n int, ok bool) {
	if len(b) < walHeader {
		return 0, nil, 0, false
	}
	l := binary.LittleEndian.Uint32(b)
	if l == 0 || l > maxWALRecord || int(l)+8 > len(b) {
		return 0, nil, 0, false
	}
	body := b[8 : 8+l]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[4:]) {
		return 0, nil, 0, false
	}
	return body[0], body[1:], 8 + int(l), true
}

// validAfter reports whether a valid record starts anywhere after off.
func validAfter(b []byte, off int) bool {
	for i := off + 1; i+walHeader <= len(b); i++ {
		if _, _, _, ok := nextRecord(b[i:]); ok {
			return true
		}
	}
	return false
}

// replayWAL applies the records of one segment to st and returns how many
// bytes were valid.
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

func (st *walState) lastOp() uint64 { return st.snap.Op + uint64(len(st.entries)) }

func (st *walState) apply(typ byte, p []byte) error {
	r := reader{b: p}
	switch typ {
	case recSnapshot:
		st.snap = vr.Snapshot{Op: r.uvarint()}
		n := r.uvarint()
		if n > uint64(len(r.b)) {
			return ErrCorruptEntry
		}
		for i := uint64(0); i < n && r.err == nil; i++ {
			c := vr.ClientRecord{Client: r.uvarint(), ReqNum: r.uvarint(), Op: r.uvarint()}
			c.Result = append([]byte(nil), r.bytes()...)
			st.snap.Clients = append(st.snap.Clients, c)
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
	case recTruncate:
		op := r.uvarint()
		if r.err == nil && op < st.lastOp() {
			if op < st.snap.Op {
				return fmt.Errorf("truncate to %d below snapshot %d", op, st.snap.Op)
			}
			st.entries = st.entries[:op-st.snap.Op]
		}
	case recFlags:
		st.recovering = r.byte()&1 != 0
	case recDLog:
		return st.applyDLog(p)
	default:
		return fmt.Errorf("unknown record type %d", typ)
	}
	return r.err
}

// record appends one record framing to w.buf; fill appends the payload.
func (w *wal) record(typ byte, fill func(b []byte) []byte) {
	start := len(w.buf)
	w.buf = append(w.buf, 0, 0, 0, 0, 0, 0, 0, 0, typ)
	w.buf = fill(w.buf)
	body := w.buf[start+8:]
	binary.LittleEndian.PutUint32(w.buf[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(w.buf[start+4:], crc32.Checksum(body, crcTable))
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
	w.record(recHardState, func(b []byte) []byte {
		b = binary.AppendUvarint(b, hs.View)
		b = binary.AppendUvarint(b, hs.LastNormalView)
		return binary.AppendUvarint(b, hs.Commit)
	})
}

func (w *wal) addTruncate(op uint64) {
	w.record(recTruncate, func(b []byte) []byte { return binary.AppendUvarint(b, op) })
}

func (w *wal) addFlags(recovering bool) {
	w.record(recFlags, func(b []byte) []byte {
		if recovering {
			return append(b, 1)
		}
		return append(b, 0)
	})
}

func (w *wal) addSnapshot(op uint64, clients []vr.ClientRecord) {
	w.record(recSnapshot, func(b []byte) []byte {
		b = binary.AppendUvarint(b, op)
		b = binary.AppendUvarint(b, uint64(len(clients)))
		for _, c := range clients {
			b = binary.AppendUvarint(b, c.Client)
			b = binary.AppendUvarint(b, c.ReqNum)
			b = binary.AppendUvarint(b, c.Op)
			b = appendBytes(b, c.Result)
		}
		return b
	})
}

// pending reports whether records wait to be written.
func (w *wal) pending() bool { return len(w.buf) > 0 }

// write writes the buffered records with one Write (no fsync).
func (w *wal) write() error {
	if len(w.buf) == 0 {
		return nil
	}
	if w.seg == nil {
		return errors.New("vrshard: wal: no open segment")
	}
	n, err := w.seg.Write(w.buf)
	w.size += int64(n)
	w.buf = w.buf[:0]
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

// roll starts a new segment holding the buffered records, which must begin
// with a snapshot record, makes it durable, and deletes the older segments.
func (w *wal) roll() error {
	if typ, _, _, ok := nextRecord(w.buf); !ok || typ != recSnapshot {
		panic("vrshard: wal: a segment must start with a snapshot record")
	}
	n := w.segN + 1
	// The new segment is written under a temporary name and renamed only once
	// it is whole and fsynced: recovery trusts the newest segment that starts
	// with a snapshot record and deletes older ones, and a real file system
	// may keep a new file's name and first pages without its tail after a
	// crash — that must never outrank the complete old segment.
	final := vfs.Join(w.dir, segName(n))
	tmp := final + tmpSuffix
	f, err := w.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("vrshard: wal: create segment: %w", err)
	}
	old, oldN := w.seg, w.segN
	w.seg, w.segN, w.size = f, n, 0
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
	if old != nil {
		old.Close()
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
	}
	return nil
}

func (w *wal) close() error {
	if w.seg == nil {
		return nil
	}
	err := w.seg.Close()
	w.seg = nil
	return err
}
