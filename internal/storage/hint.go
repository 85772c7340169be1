package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/vfs"
)

// A hint file is a checkpoint of the index as of log position P, named "%016x.hint" after
// P, in the first device's directory:
//
//	"KFHINT02" | P u64 | lastVersion u64
//	items, in key order: uvarint keyLen | key | uvarint n | n × (uvarint version,
//	  varint ts, uvarint pos, uvarint size, uvarint flags)
//	item count u64
//	crc32c u32 of everything before
//
// Reopening loads the newest valid hint and replays only the log after P. A hint may only
// reference durable data (Checkpoint syncs to P first) and segments that still exist
// (compaction removes every hint before it removes a segment).
//
// KFHINT02 added the verCounted flag (Options.CountMeta). A KFHINT01 hint,
// written by an older build, lacks it, so it is not used: the first open
// after an upgrade replays the whole log, as without a hint, and the next
// checkpoint writes a KFHINT02 one (TestCountMetaSurvivesEverything).
const hintMagic = "KFHINT02"

func hintName(p uint64) string { return fmt.Sprintf("%016x.hint", p) }

// Checkpoint writes a hint file for the current index. Appends and reads continue
// meanwhile: the index is copied out in chunks under the read lock. Items copied later
// than P may already reflect records after P; replaying from P re-applies those records,
// which is idempotent (same version, same or later position). Compaction, which could
// drop a key outright, is excluded for the duration.
func (db *DB) Checkpoint() error {
	db.maint.Lock()
	defer db.maint.Unlock()
	db.mu.RLock()
	if err := db.writableLocked(); err != nil {
		db.mu.RUnlock()
		return err
	}
	p, lastV := db.next, db.lastV
	db.mu.RUnlock()

	dir := db.devs[0].dir
	final := vfs.Join(dir, hintName(uint64(p)))
	tmp := final + ".tmp"
	f, err := db.fs.Create(tmp)
	if err != nil {
		return fmt.Errorf("storage: checkpoint: %w", err)
	}
	crc := crc32.New(seglog.CRCTable)
	w := &hintWriter{f: f, crc: crc, buf: make([]byte, 0, 1<<20)}
	var hdr [24]byte
	copy(hdr[:], hintMagic)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(p))
	binary.LittleEndian.PutUint64(hdr[16:], lastV)
	w.write(hdr[:])
	count := uint64(0)
	type hintItem struct {
		key string // arena-backed: immutable, safe to use after the lock is released
		vs  vlist  // likewise (vlist)
	}
	chunk := make([]hintItem, 0, 4096)
	from, first := "", true
	for w.err == nil {
		chunk = chunk[:0]
		db.mu.RLock()
		db.idx.ascend(from, func(it *item) bool {
			if k := db.idx.keyOf(it); first || k != from {
				chunk = append(chunk, hintItem{k, db.idx.vers(it)})
			}
			return len(chunk) < cap(chunk)
		})
		db.mu.RUnlock()
		if len(chunk) == 0 {
			break
		}
		for i := range chunk {
			vs := &chunk[i].vs
			w.uvarint(uint64(len(chunk[i].key)))
			w.write([]byte(chunk[i].key))
			w.uvarint(uint64(vs.n()))
			for i := 0; i < vs.n(); i++ {
				v := vs.at(i)
				w.uvarint(v.version)
				w.varint(v.ts)
				w.uvarint(v.pos)
				w.uvarint(uint64(v.size))
				w.uvarint(uint64(v.flags))
			}
		}
		count += uint64(len(chunk))
		from, first = chunk[len(chunk)-1].key, false
	}
	var cnt [8]byte
	binary.LittleEndian.PutUint64(cnt[:], count)
	w.write(cnt[:])
	w.flush()
	// Items may point past P: make everything they point at durable first.
	if w.err == nil {
		_, w.err = db.Sync(db.LastPos())
	}
	var tail [4]byte
	binary.LittleEndian.PutUint32(tail[:], crc.Sum32())
	if w.err == nil {
		_, w.err = f.Write(tail[:])
	}
	if err = db.publish(f, w.err, dir, tmp, final); err != nil {
		db.fs.Remove(tmp)
		return fmt.Errorf("storage: checkpoint %s: %w", final, err)
	}
	// Older hints are now redundant.
	names, err := db.fs.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("storage: checkpoint: %w", err)
	}
	for _, name := range names {
		if id, ok := parseName(name, ".hint"); ok && id != uint64(p) {
			if err := db.fs.Remove(vfs.Join(dir, name)); err != nil {
				return fmt.Errorf("storage: remove old hint: %w", err)
			}
		}
	}
	return nil
}

type hintWriter struct {
	f   vfs.File
	crc interface{ Write([]byte) (int, error) }
	buf []byte
	err error
}

func (w *hintWriter) write(b []byte) {
	w.buf = append(w.buf, b...)
	if len(w.buf) >= 1<<20 {
		w.flush()
	}
}

func (w *hintWriter) uvarint(x uint64) { w.buf = binary.AppendUvarint(w.buf, x) }
func (w *hintWriter) varint(x int64)   { w.buf = binary.AppendVarint(w.buf, x) }

func (w *hintWriter) flush() {
	if w.err != nil || len(w.buf) == 0 {
		return
	}
	w.crc.Write(w.buf)
	_, w.err = w.f.Write(w.buf)
	w.buf = w.buf[:0]
}

var errBadHint = errors.New("bad hint file")

// loadHint loads the hint at path (checkpoint position p) into the empty index; no item
// may point past logEnd.
func (db *DB) loadHint(path string, p, logEnd uint64) error {
	f, err := db.fs.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return err
	}
	if size < 36 {
		return fmt.Errorf("%w: %d bytes", errBadHint, size)
	}
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	body := data[:len(data)-4]
	if crc32.Checksum(body, seglog.CRCTable) != binary.LittleEndian.Uint32(data[len(data)-4:]) {
		return fmt.Errorf("%w: checksum mismatch", errBadHint)
	}
	if string(body[:8]) != hintMagic || binary.LittleEndian.Uint64(body[8:]) != p {
		return fmt.Errorf("%w: header", errBadHint)
	}
	lastV := binary.LittleEndian.Uint64(body[16:])
	n := binary.LittleEndian.Uint64(body[len(body)-8:])
	r := hintReader{b: body[24 : len(body)-8]}
	var vs []ver
	prev := ""
	for i := uint64(0); i < n; i++ {
		kl := r.uvarint()
		kb := r.bytes(kl)
		key := keyString(kb) // aliases the file's bytes: only compared, never kept
		nv := r.uvarint()
		if r.err != nil || nv == 0 || nv > 1<<20 || (i > 0 && key <= prev) {
			return fmt.Errorf("%w: item %d", errBadHint, i)
		}
		vs = vs[:0]
		for j := uint64(0); j < nv; j++ {
			v := ver{version: r.uvarint(), ts: r.varint(), pos: r.uvarint()}
			v.size = uint32(r.uvarint())
			v.flags = uint32(r.uvarint())
			if v.flags&^verFlags != 0 {
				return fmt.Errorf("%w: item %d: unknown version flags %#x", errBadHint, i, v.flags)
			}
			if v.pos+uint64(v.size) > logEnd {
				return fmt.Errorf("%w: item %d points past the end of the log", errBadHint, i)
			}
			vs = append(vs, v)
		}
		if r.err != nil {
			return fmt.Errorf("%w: item %d: %w", errBadHint, i, r.err)
		}
		db.idx.load(db.idx.newItem(kb, vs)) // in key order: checked above
		prev = key
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errBadHint, len(r.b))
	}
	db.lastV = lastV
	return nil
}

type hintReader struct {
	b   []byte
	err error
}

func (r *hintReader) uvarint() uint64 {
	x, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errBadHint
		r.b = nil
		return 0
	}
	r.b = r.b[n:]
	return x
}

func (r *hintReader) varint() int64 {
	x, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errBadHint
		r.b = nil
		return 0
	}
	r.b = r.b[n:]
	return x
}

func (r *hintReader) bytes(n uint64) []byte {
	if uint64(len(r.b)) < n {
		r.err = errBadHint
		r.b = nil
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

// removeHints deletes every hint file (before segments they may reference go away).
func (db *DB) removeHints() error {
	dir := db.devs[0].dir
	names, err := db.fs.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("storage: list hints: %w", err)
	}
	removed := false
	for _, name := range names {
		if _, ok := parseName(name, ".hint"); ok {
			if err := db.fs.Remove(vfs.Join(dir, name)); err != nil {
				return fmt.Errorf("storage: remove hint: %w", err)
			}
			removed = true
		}
	}
	if removed {
		if err := db.fs.SyncDir(dir); err != nil {
			return fmt.Errorf("storage: sync dir %s: %w", dir, err)
		}
	}
	return nil
}
