package vrshard

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/seglog/seglogtest"
	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

// One test per rule of zero-filled segments (docs/design/zero-filled-logs.md),
// and the mutations they catch.

func manualFill() walConfig {
	c := testWALConfig()
	c.fill = seglog.FillManual
	return c
}

// A header of zeros is the clean end of the log: recovery of a zero-filled
// segment writes nothing (one fsync, no zeroing, no truncation) and the log
// goes on in place.
func TestWALZeroTailIsTheEnd(t *testing.T) {
	mem := vfs.NewMem()
	w := newTestWALWith(t, mem, manualFill())
	w.addEntries(entries(1, 5, 0))
	w.addHardState(vr.HardState{View: 1, Commit: 3})
	commitBatch(t, w)
	end, size := w.size, w.fileSize
	if size != 64<<10 || end >= size {
		t.Fatalf("segment file %d bytes, log %d: want a 64 KiB zero-filled file", size, end)
	}
	w.close()
	mem.Crash(nil)

	before := mem.Ops()
	w, st, err := openWALWith(mem, "/wal", manualFill())
	if err != nil {
		t.Fatal(err)
	}
	if ops := mem.Ops() - before; ops != 1 {
		t.Fatalf("recovery of a clean zero tail made %d file operations, want 1 (the fsync)", ops)
	}
	if st.lastOp() != 5 || st.hs.Commit != 3 || w.size != end || w.fileSize != size {
		t.Fatalf("recovered op %d, %+v, end %d (want %d), file %d", st.lastOp(), st.hs, w.size, end, w.fileSize)
	}
	w.addEntries(entries(6, 7, 1))
	commitBatch(t, w)
	w.close()
	if n, _ := mem.Stat("/wal/" + segName(1)); n != size {
		t.Fatalf("the file grew to %d bytes: the write did not go in place", n)
	}
	if _, st, err = openWALWith(mem, "/wal", manualFill()); err != nil || st.lastOp() != 7 {
		t.Fatalf("after a write in place: op %d, %v", st.lastOp(), err)
	}
}

// staleTail runs the resurrection scenario: batch 1 synced; batches 2 and 3
// written, not synced, and a power cut keeps batch 3 but not batch 2 (a
// hole, then a whole, valid, never acknowledged record). Recovery ends the
// log at batch 2. A new batch exactly as long as batch 2 then ends where
// batch 3 begins; it is synced, the power is cut again. It returns the view
// recovered after that (4 is right: batch 3's view 3 must not come back).
func staleTail(t *testing.T, cfg walConfig) (view uint64, tailZero bool) {
	mem := vfs.NewMem()
	w := newTestWALWith(t, mem, cfg)
	w.addHardState(vr.HardState{View: 1})
	commitBatch(t, w)
	start2 := w.size
	w.addHardState(vr.HardState{View: 2})
	if err := w.write(); err != nil {
		t.Fatal(err)
	}
	start3 := w.size
	w.addHardState(vr.HardState{View: 3, LastNormalView: 3})
	if err := w.write(); err != nil {
		t.Fatal(err)
	}
	w.close()
	name := "/wal/" + segName(1)
	rewrite(t, mem, name, func(b []byte) { clear(b[start2:start3]) })
	mem.SyncDir("/wal") // rewrite made a new file: make it the durable one
	mem.Crash(nil)

	w, st, err := openWALWith(mem, "/wal", cfg)
	if err != nil {
		t.Fatalf("a hole then a stale record: %v", err)
	}
	if st.hs.View != 1 || w.size != start2 {
		t.Fatalf("recovered view %d, end %d: want view 1, end %d", st.hs.View, w.size, start2)
	}
	// Everything after the end reads as zeros, durably.
	mem.Crash(nil)
	b := seglogtest.ReadFile(t, mem, name)
	tailZero = !bytes.ContainsFunc(b[start2:], func(r rune) bool { return r != 0 })
	w, st, err = openWALWith(mem, "/wal", cfg)
	if err != nil || st.hs.View != 1 {
		t.Fatalf("reopen: view %d, %v", st.hs.View, err)
	}
	w.addHardState(vr.HardState{View: 4})
	if err := w.write(); err != nil {
		t.Fatal(err)
	}
	if w.size != start3 {
		t.Fatalf("test setup: the new batch ends at %d, not where the stale one begins (%d)", w.size, start3)
	}
	if err := w.sync(); err != nil {
		t.Fatal(err)
	}
	w.close()
	mem.Crash(nil)
	_, st, err = openWALWith(mem, "/wal", cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st.hs.View, tailZero
}

// A torn or stale tail is zeroed (and synced) before the log takes a write,
// so a second crash cannot resurrect a stale record.
func TestWALStaleTailIsZeroedBeforeNewWrites(t *testing.T) {
	view, zero := staleTail(t, testWALConfig())
	if !zero {
		t.Fatalf("non-zero bytes left after the recovered end")
	}
	if view != 4 {
		t.Fatalf("recovered view %d after the second crash, want 4: a stale record came back", view)
	}
}

// Mutation: recovery that does not zero the stale tail resurrects batch 3.
func TestMutationSkipZeroTailResurrectsAStaleRecord(t *testing.T) {
	mutation.Require(t)
	cfg := testWALConfig()
	cfg.mut.skipZeroTail = true
	if view, zero := staleTail(t, cfg); zero || view == 4 {
		t.Fatalf("with the tail left as it was: view %d, tail zero %v; the test cannot see the bug", view, zero)
	}
}

// syncedBatches writes four batches of entries, each synced, and returns the
// WAL's memory and the offsets where batches 2, 3 and 4 start.
func syncedBatches(t *testing.T) (*vfs.Mem, []int64) {
	mem := vfs.NewMem()
	w := newTestWAL(t, mem)
	var starts []int64
	for b := uint64(0); b < 4; b++ {
		if b > 0 {
			starts = append(starts, w.size)
		}
		w.addEntries(entries(b*3+1, b*3+3, 0))
		commitBatch(t, w)
	}
	w.close()
	return mem, starts
}

// Below the synced mark a bad record is corruption: the batches after batch
// 2 say it was durable, so a bad byte in it refuses to open. A damaged last
// batch is indistinguishable from a torn one (nothing after it says it was
// synced) and is cut, as a bad last record was before zero-filled segments.
func TestWALCorruptionBelowSyncedMarkIsRefused(t *testing.T) {
	mem, starts := syncedBatches(t)
	rewrite(t, mem, "/wal/"+segName(1), func(b []byte) { b[starts[0]+30] ^= 0x40 })
	if _, _, err := openWALWith(mem, "/wal", testWALConfig()); !errors.Is(err, ErrWALCorrupt) || !strings.Contains(err.Error(), "durable up to") {
		t.Fatalf("a bad synced batch with synced batches after it: %v, want ErrWALCorrupt", err)
	}
	// The same bad byte in the last batch: a torn tail.
	mem, starts = syncedBatches(t)
	rewrite(t, mem, "/wal/"+segName(1), func(b []byte) { b[starts[2]+30] ^= 0x40 })
	if _, st, err := openWALWith(mem, "/wal", testWALConfig()); err != nil || st.lastOp() != 9 {
		t.Fatalf("a bad last batch: op %d, %v; want a cut at op 9", st.lastOp(), err)
	}
}

// Mutation: recovery that ignores the synced marks after the end takes the
// damaged batch 2 for the end and silently drops batches 2-4.
func TestMutationIgnoreSyncedMarkIsCaught(t *testing.T) {
	mutation.Require(t)
	mem, starts := syncedBatches(t)
	rewrite(t, mem, "/wal/"+segName(1), func(b []byte) { b[starts[0]+30] ^= 0x40 })
	cfg := testWALConfig()
	cfg.mut.ignoreSynced = true
	if _, st, err := openWALWith(mem, "/wal", cfg); err != nil || errors.Is(err, ErrWALCorrupt) {
		t.Fatalf("mutation: %v (op %d); the mutation should open and drop acknowledged ops", err, st.lastOp())
	} else if st.lastOp() != 3 {
		t.Fatalf("mutation: recovered op %d", st.lastOp())
	}
}

// A record is valid only at the offset it claims: a copy of an old record
// just past the end (a misdirected write, a block from elsewhere) is not
// part of the log. Mutation ignorePos applies it.
func TestWALRecordIsValidOnlyWhereItClaims(t *testing.T) {
	mutation.Require(t)
	run := func(cfg walConfig) uint64 {
		mem := vfs.NewMem()
		w := newTestWALWith(t, mem, cfg)
		start := w.size
		w.addHardState(vr.HardState{View: 9, LastNormalView: 9})
		commitBatch(t, w)
		rec := w.size - start
		w.addHardState(vr.HardState{View: 1})
		commitBatch(t, w)
		end := w.size
		w.close()
		rewrite(t, mem, "/wal/"+segName(1), func(b []byte) { copy(b[end:], b[start:start+rec]) })
		_, st, err := openWALWith(mem, "/wal", cfg)
		if err != nil {
			t.Fatal(err)
		}
		return st.hs.View
	}
	if v := run(testWALConfig()); v != 1 {
		t.Fatalf("a copied record after the end was applied: view %d, want 1", v)
	}
	cfg := testWALConfig()
	cfg.mut.ignorePos = true
	if v := run(cfg); v != 9 {
		t.Fatalf("mutation ignorePos: view %d; the test cannot see a record out of place", v)
	}
}

// A roll with no zero-filled file ready appends to a new file, as before;
// it recovers from a power cut like any segment, and a later roll with a
// ready file writes in place again.
func TestWALRollWithoutReadySegmentFallsBack(t *testing.T) {
	mem := vfs.NewMem()
	w := newTestWALWith(t, mem, manualFill()) // the first segment is zero-filled
	w.addEntries(entries(1, 4, 0))
	commitBatch(t, w)
	w.addSnapshot(vr.Snapshot{Op: 2})
	w.addEntries(entries(3, 4, 0))
	if err := w.roll(); err != nil {
		t.Fatal(err)
	}
	if w.rolls != 2 || w.zeroRolls != 1 || w.fileSize != w.size {
		t.Fatalf("%d rolls, %d zero-filled, file %d, log %d: want an appended segment", w.rolls, w.zeroRolls, w.fileSize, w.size)
	}
	var durable uint64 = 4
	for b := uint64(0); b < 5; b++ {
		w.addEntries(entries(durable+1, durable+3, 0))
		commitBatch(t, w)
		durable += 3
		if n, _ := mem.Stat("/wal/" + segName(2)); n != w.size {
			t.Fatalf("appended segment is %d bytes, log %d", n, w.size)
		}
	}
	w.addEntries(entries(durable+1, durable+3, 0))
	w.write()
	w.close()
	mem.Crash(rand.New(rand.NewSource(3)))
	w, st, err := openWALWith(mem, "/wal", manualFill())
	if err != nil || st.lastOp() < durable || st.snap.Op != 2 {
		t.Fatalf("appended segment after a cut: op %d (synced %d), snapshot %d, %v", st.lastOp(), durable, st.snap.Op, err)
	}
	w.fill.FillNow(w.dir, 64<<10)
	w.addSnapshot(vr.Snapshot{Op: st.lastOp()})
	if err := w.roll(); err != nil {
		t.Fatal(err)
	}
	if w.zeroRolls != 1 || w.fileSize != 64<<10 {
		t.Fatalf("a roll with a ready file: %d zero-filled rolls, file %d", w.zeroRolls, w.fileSize)
	}
	if segs := segments(t, mem); len(segs) != 1 || segs[0] != segName(3) {
		t.Fatalf("segments: %v", segs)
	}
}

// formatOne rewrites records framed by w.record into format 1 (length | CRC
// of type and payload | type | payload), as the code before zero-filled
// segments wrote them.
func formatOne(buf []byte) []byte {
	var out []byte
	for s := 0; s < len(buf); {
		l := int(binary.LittleEndian.Uint32(buf[s:]))
		body := buf[s+recTypeAt : s+recLenBytes+l]
		out = binary.LittleEndian.AppendUint32(out, uint32(len(body)))
		out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(body, seglog.CRCTable))
		out = append(out, body...)
		s += recLenBytes + l
	}
	return out
}

// A log written by the previous code (format 1) opens: its torn tail is cut
// by format 1's rules, and its state is rewritten into a format 2 segment
// before the old one is removed. Damage in its middle still refuses.
func TestWALUpgradesFormatOneSegment(t *testing.T) {
	enc := &wal{}
	enc.addSnapshot(vr.Snapshot{Op: 2, Clients: []vr.ClientRecord{{Client: 7, ReqNum: 3, Op: 2, Result: []byte("ok")}}})
	enc.addFlags(false)
	enc.addEntries(entries(3, 6, 1))
	enc.addHardState(vr.HardState{View: 1, LastNormalView: 1, Commit: 4})
	head := len(formatOne(enc.buf))
	enc.addTruncate(5)
	enc.addEntries(entries(6, 8, 2))
	enc.addHardState(vr.HardState{View: 2, LastNormalView: 2, Commit: 6})
	good := formatOne(enc.buf)
	enc.addEntries(entries(9, 9, 2))
	old := formatOne(enc.buf)
	old = old[:len(old)-3] // a torn last record

	write := func(b []byte) *vfs.Mem {
		mem := vfs.NewMem()
		mem.MkdirAll("/wal")
		f, _ := mem.Create("/wal/" + segName(7))
		f.Write(b)
		f.Sync()
		f.Close()
		mem.SyncDir("/wal")
		return mem
	}
	mem := write(old)
	w, st, err := openWALWith(mem, "/wal", testWALConfig())
	if err != nil {
		t.Fatal(err)
	}
	check := func(st walState, last uint64) {
		t.Helper()
		if st.snap.Op != 2 || len(st.snap.Clients) != 1 || string(st.snap.Clients[0].Result) != "ok" || st.lastOp() != last ||
			st.entries[2].View != 1 || st.entries[3].View != 2 || st.hs.View != 2 || st.hs.Commit != 6 {
			t.Fatalf("recovered snapshot %+v, op %d (want %d), entries %+v, %+v", st.snap, st.lastOp(), last, st.entries, st.hs)
		}
	}
	check(st, 8)
	if segs := segments(t, mem); len(segs) != 1 || segs[0] != segName(8) {
		t.Fatalf("after the upgrade: %v", segs)
	}
	if b := seglogtest.ReadFile(t, mem, "/wal/"+segName(8)); !isFormat2(b) || int64(len(b)) != 64<<10 {
		t.Fatalf("the rewritten segment is not a zero-filled format 2 segment (%d bytes)", len(b))
	}
	w.addEntries(entries(9, 10, 2))
	commitBatch(t, w)
	w.close()
	mem.Crash(nil)
	if _, st, err = openWALWith(mem, "/wal", testWALConfig()); err != nil {
		t.Fatal(err)
	}
	check(st, 10)

	// A crash during the upgrade (before the new segment's rename is durable)
	// leaves the format 1 segment, which opens again.
	for cut := 1; cut < 12; cut++ {
		mem := write(old)
		mem.CrashAfter(cut)
		if w, _, err := openWALWith(mem, "/wal", testWALConfig()); err == nil {
			w.close()
		}
		mem.Crash(nil)
		_, st, err := openWALWith(mem, "/wal", testWALConfig())
		if err != nil {
			t.Fatalf("cut %d during the upgrade: %v", cut, err)
		}
		check(st, 8)
	}

	bad := append([]byte(nil), good...)
	bad[head-2] ^= 0xff
	if _, _, err := openWALWith(write(bad), "/wal", testWALConfig()); !errors.Is(err, ErrWALCorrupt) {
		t.Fatalf("format 1 with a bad record before good ones: %v, want ErrWALCorrupt", err)
	}
}

// Repeated power cuts with vfs.Mem's overwrite model (unsynced pages old,
// new or torn at sectors, in any combination): every recovery keeps what was
// synced, and what it keeps beyond is exactly a prefix of what was written
// since the last recovery — never a record from before it (a resurrected
// stale record shows up as an entry from an older incarnation) — and the
// file holds only zeros after the recovered end. (Over the 300 seeds about
// 200 whole, valid, stale records turn up after a hole: the old rule, "a
// valid record after a bad one is corruption", would refuse to open.)
func TestWALRepeatedPowerCutsNeverResurrect(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	for seed := range seeds {
		rng := rand.New(rand.NewSource(int64(seed)))
		mem := vfs.NewMem()
		w := newTestWAL(t, mem)
		model := map[uint64]string{} // op -> data of the last incarnation that wrote it
		var last uint64              // recovered last op
		for inc := 0; inc < 6; inc++ {
			var durable uint64 = last
			next := last + 1
			batches := 1 + rng.Intn(6)
			for b := 0; b < batches; b++ {
				n := uint64(1 + rng.Intn(12))
				var es []vr.Entry
				for op := next; op < next+n; op++ {
					d := fmt.Sprintf("i%d-op%d-%s", inc, op, strings.Repeat("x", rng.Intn(700)))
					model[op] = d
					es = append(es, vr.Entry{View: uint64(inc), Op: op, Request: vr.Request{Data: []byte(d)}})
				}
				w.addEntries(es)
				w.addHardState(vr.HardState{View: uint64(inc), Commit: next})
				next += n
				if err := w.write(); err != nil {
					t.Fatal(err)
				}
				if rng.Intn(3) > 0 {
					if err := w.sync(); err != nil {
						t.Fatal(err)
					}
					durable = next - 1
				}
			}
			w.close()
			mem.Crash(rng)
			var st walState
			var err error
			w, st, err = openWALWith(mem, "/wal", testWALConfig())
			if err != nil {
				t.Fatalf("seed %d incarnation %d: %v", seed, inc, err)
			}
			if st.lastOp() < durable {
				t.Fatalf("seed %d incarnation %d: recovered op %d, synced %d", seed, inc, st.lastOp(), durable)
			}
			for i, e := range st.entries {
				if e.Op != uint64(i)+1 || string(e.Data) != model[e.Op] {
					t.Fatalf("seed %d incarnation %d: entry %d is %.40q (op %d), want %.40q", seed, inc, i, e.Data, e.Op, model[e.Op])
				}
			}
			last = st.lastOp()
			// Recovery zeroed everything after the end before returning.
			b := seglogtest.ReadFile(t, mem, "/wal/"+segName(w.segN))
			if i := bytes.IndexFunc(b[w.size:], func(r rune) bool { return r != 0 }); i >= 0 {
				t.Fatalf("seed %d incarnation %d: a non-zero byte at %d, after the end %d", seed, inc, w.size+int64(i), w.size)
			}
		}
		w.close()
	}
}

// The zero-filled size follows the last interval's log, within bounds.
func TestWALSegmentSize(t *testing.T) {
	c := defaultWALConfig()
	for _, tc := range []struct{ end, want int64 }{
		{0, 4 << 20}, {1 << 20, 4 << 20}, {3 << 20, 6 << 20}, {10<<20 + 1, 21 << 20}, {40 << 20, 64 << 20}, {200 << 20, 64 << 20},
	} {
		if got := c.segSizeAfter(tc.end); got != tc.want {
			t.Errorf("after a segment of %d bytes: %d, want %d", tc.end, got, tc.want)
		}
	}
}

// The background filler (as replicas run it) has the next segment's file
// ready for the next roll, and close stops a fill in progress.
func TestWALAsyncFillerIsReadyForTheNextRoll(t *testing.T) {
	mem := vfs.NewMem()
	cfg := testWALConfig()
	cfg.fill = seglog.FillAsync
	w := newTestWALWith(t, mem, cfg)
	for i := uint64(1); i <= 3; i++ {
		for !w.fill.Idle() {
			time.Sleep(time.Millisecond)
		}
		w.addSnapshot(vr.Snapshot{Op: i})
		if err := w.roll(); err != nil {
			t.Fatal(err)
		}
		if w.zeroRolls != i+1 || w.fileSize != 64<<10 {
			t.Fatalf("roll %d: %d of %d rolls on a zero-filled file, file %d bytes", i, w.zeroRolls, w.rolls, w.fileSize)
		}
	}
	// A large fill, stopped by close part way.
	w.cfg.minSeg, w.cfg.maxSeg = 64<<20, 64<<20
	w.addSnapshot(vr.Snapshot{Op: 9})
	if err := w.roll(); err != nil {
		t.Fatal(err)
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	if !w.fill.Idle() {
		t.Fatalf("a fill still runs after close")
	}
	_, st, err := openWALWith(mem, "/wal", testWALConfig())
	if err != nil || st.snap.Op != 9 {
		t.Fatalf("reopen: snapshot %d, %v", st.snap.Op, err)
	}
}

// listHookFS runs afterList after every directory listing.
type listHookFS struct {
	*vfs.Mem
	afterList func()
}

func (l *listHookFS) ReadDir(dir string) ([]string, error) {
	names, err := l.Mem.ReadDir(dir)
	if l.afterList != nil {
		l.afterList()
	}
	return names, err
}

// A leftover temporary file that vanished between recovery's listing and its
// removal is not an error, whoever removed it (a filler that outlived its
// log: the power-cut tests drop a WAL without closing it, and its filler
// removes its file by name when its write fails); any other failure to
// remove one still fails the open. The storage log had this fix
// (TestRecoveryRemovesLeftoversStrictly) and this log did not: openWAL
// failed with "remove unfinished segment: ... file does not exist".
func TestWALRecoveryRemovesLeftoversStrictly(t *testing.T) {
	mem := vfs.NewMem()
	fs := &listHookFS{Mem: mem}
	w := newTestWALWith(t, fs, manualFill())
	w.addEntries(entries(1, 5, 0))
	commitBatch(t, w)
	w.close()
	leftovers := []string{"/wal/" + zeroName, "/wal/" + segName(2) + seglog.TmpSuffix}
	for _, name := range leftovers {
		f, err := mem.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	fs.afterList = func() { _ = mem.Remove("/wal/" + zeroName) } // someone else got there first
	w, st, err := openWALWith(fs, "/wal", manualFill())
	if err != nil {
		t.Fatalf("open with a leftover that vanished: %v", err)
	}
	if st.lastOp() != 5 {
		t.Fatalf("recovered op %d, want 5", st.lastOp())
	}
	for _, name := range leftovers {
		if _, err := mem.Stat(name); err == nil {
			t.Fatalf("%s is still there after recovery", name)
		}
	}
	w.close()
	// A removal that fails for another reason (here: the power is off) fails
	// the open.
	f, err := mem.Create("/wal/" + zeroName)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	fs.afterList = func() { mem.CrashAfter(0) }
	if w, _, err := openWALWith(fs, "/wal", manualFill()); err == nil {
		w.close()
		t.Fatal("openWAL succeeded although a leftover could not be removed")
	}
}

// A replication log written by the code before internal/seglog (commit
// 7f562ff) opens with everything in it, and goes on. The archive was made at
// 7f562ff on vfs.Mem with testWALConfig: newTestWAL; entries 1-200 (view 1)
// and hard state {1 1 150}, synced; a checkpoint roll: snapshot at 150 with
// client {1 148 148 "ok"}, flags engine marked, entries 151-200, hard state
// {1 1 190}; entries 201-260 (view 2), truncate to 250, hard state {2 2 240},
// synced; markClean; close. It holds the zero-filled segment 2 and the
// filler's wal-zero.tmp.
func TestWALOpensLogWrittenBeforeSeglog(t *testing.T) {
	mem := vfs.NewMem()
	seglogtest.LoadDir(t, mem, "/wal", "testdata/wal-7f562ff.tar.gz")
	w, st, err := openWALWith(mem, "/wal", testWALConfig())
	if err != nil {
		t.Fatal(err)
	}
	wantClients := []vr.ClientRecord{{Client: 1, ReqNum: 148, Op: 148, Result: []byte("ok")}}
	if st.empty || st.snap.Op != 150 || fmt.Sprint(st.snap.Clients) != fmt.Sprint(wantClients) {
		t.Fatalf("snapshot %+v (empty %v), want op 150 and %v", st.snap, st.empty, wantClients)
	}
	if st.lastOp() != 250 || st.entries[0].Op != 151 || st.entries[49].View != 1 || st.entries[50].View != 2 {
		t.Fatalf("entries up to %d: %v ... ", st.lastOp(), st.entries[:2])
	}
	if st.hs != (vr.HardState{View: 2, LastNormalView: 2, Commit: 240}) {
		t.Fatalf("hard state %+v", st.hs)
	}
	if !st.engineMarked || !st.clean || st.recovering {
		t.Fatalf("flags: engine marked %v, clean %v, recovering %v; want true, true, false", st.engineMarked, st.clean, st.recovering)
	}
	if w.segN != 2 || w.fileSize != 64<<10 {
		t.Fatalf("segment %d, file %d bytes: want segment 2, zero-filled 64 KiB", w.segN, w.fileSize)
	}
	if err := w.unmarkClean(false); err != nil {
		t.Fatal(err)
	}
	w.addEntries(entries(251, 260, 3))
	commitBatch(t, w)
	w.close()
	_, st, err = openWALWith(mem, "/wal", testWALConfig())
	if err != nil || st.lastOp() != 260 || st.clean || !st.engineMarked {
		t.Fatalf("after writing on: op %d, clean %v, engine marked %v, %v", st.lastOp(), st.clean, st.engineMarked, err)
	}
}
