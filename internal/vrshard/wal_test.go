package vrshard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
	"github.com/kefirdb/kefir/internal/vr"
)

func entries(from, to, view uint64) []vr.Entry {
	var es []vr.Entry
	for op := from; op <= to; op++ {
		es = append(es, vr.Entry{View: view, Op: op, Request: vr.Request{Client: op % 3, ReqNum: op, Data: []byte(fmt.Sprint("d", op))}})
	}
	return es
}

// testWALConfig: small zero-filled segments (64 KiB), filled on the
// caller's goroutine so a test's file operations come in a fixed order.
func testWALConfig() walConfig {
	return walConfig{fill: seglog.FillInline, minSeg: 64 << 10, maxSeg: 64 << 10}
}

func newTestWAL(t *testing.T, fs vfs.FS) *wal {
	t.Helper()
	return newTestWALWith(t, fs, testWALConfig())
}

func newTestWALWith(t *testing.T, fs vfs.FS, cfg walConfig) *wal {
	t.Helper()
	w, st, err := openWALWith(fs, "/wal", cfg)
	if err != nil || !st.empty {
		t.Fatalf("open empty wal: %+v, %v", st, err)
	}
	w.addSnapshot(vr.Snapshot{Op: 0})
	w.addHardState(vr.HardState{})
	if err := w.roll(); err != nil {
		t.Fatal(err)
	}
	return w
}

func commitBatch(t *testing.T, w *wal) {
	t.Helper()
	if err := w.write(); err != nil {
		t.Fatal(err)
	}
	if err := w.sync(); err != nil {
		t.Fatal(err)
	}
}

func TestWALRecoversEntriesTruncationHardStateAndCheckpoint(t *testing.T) {
	mem := vfs.NewMem()
	w := newTestWAL(t, mem)
	w.addEntries(entries(1, 10, 0))
	w.addHardState(vr.HardState{View: 0, Commit: 4})
	commitBatch(t, w)
	w.addTruncate(7)
	w.addEntries(entries(8, 9, 1))
	w.addHardState(vr.HardState{View: 1, LastNormalView: 1, Commit: 6})
	commitBatch(t, w)
	w.close()

	_, st, err := openWAL(mem, "/wal")
	if err != nil {
		t.Fatal(err)
	}
	if st.empty || len(st.entries) != 9 || st.entries[7].View != 1 || st.entries[6].View != 0 || st.hs.Commit != 6 || st.hs.View != 1 {
		t.Fatalf("recovered %d entries, hs %+v", len(st.entries), st.hs)
	}

	// A checkpoint starts a new segment; the old one goes.
	w2, _, _ := openWAL(mem, "/wal")
	w2.addSnapshot(vr.Snapshot{Op: 5, Clients: []vr.ClientRecord{{Client: 1, ReqNum: 4, Op: 4, Result: []byte("r")}}})
	w2.addEntries(st.entries[5:])
	w2.addHardState(st.hs)
	if err := w2.roll(); err != nil {
		t.Fatal(err)
	}
	w2.close()
	if segs := segments(t, mem); len(segs) != 1 {
		t.Fatalf("segments after checkpoint: %v", segs)
	}
	_, st2, err := openWAL(mem, "/wal")
	if err != nil {
		t.Fatal(err)
	}
	if st2.snap.Op != 5 || len(st2.snap.Clients) != 1 || !bytes.Equal(st2.snap.Clients[0].Result, []byte("r")) || len(st2.entries) != 4 || st2.entries[0].Op != 6 {
		t.Fatalf("after checkpoint: snap %+v, %d entries", st2.snap, len(st2.entries))
	}
}

// Power cuts at every point of a run: what was fsynced is recovered; a torn
// tail is cut off; a crash during a checkpoint leaves the old segment in use.
// With rng nil exactly the synced state survives a cut; with an rng a prefix
// of unsynced appends and any mix of unsynced overwritten pages and sectors
// (vfs.Mem's crash model) survives too.
func TestWALSurvivesPowerCutAnywhere(t *testing.T) {
	ops := powerCutRun(t, -1, nil) // a run without a cut counts its file operations
	if ops < 20 {
		t.Fatalf("a run makes only %d file operations", ops)
	}
	for _, seeded := range []bool{false, true} {
		for cut := 1; cut <= ops; cut++ {
			var rng *rand.Rand
			if seeded {
				rng = rand.New(rand.NewSource(int64(cut)))
			}
			powerCutRun(t, cut, rng)
		}
	}
}

// ckptNumber is the number powerCutRun's checkpoint keeps with its
// snapshot (core.Snapshot.Number: a chain sequence number of epoch 3).
const ckptNumber = 3<<chainSeqBits | 12

// powerCutRun writes eight synced batches with a checkpoint after the
// fourth, cuts the power after cut file operations (never if cut < 0),
// recovers and checks. It returns the operations the run made.
func powerCutRun(t *testing.T, cut int, rng *rand.Rand) int {
	t.Helper()
	mem := vfs.NewMem()
	w := newTestWAL(t, mem)
	start := mem.Ops()
	mem.CrashAfter(cut)
	var durable uint64 // highest op whose batch's fsync returned
	var ckpt bool
	for b := uint64(0); b < 8; b++ {
		w.addEntries(entries(b*5+1, b*5+5, 0))
		if w.write() != nil || w.sync() != nil {
			break
		}
		durable = b*5 + 5
		if b == 3 {
			w.addSnapshot(vr.Snapshot{Op: 12, Number: ckptNumber})
			w.addEntries(entries(13, durable, 0))
			if w.roll() != nil {
				break
			}
			ckpt = true
		}
	}
	// The last batch is written, not synced: a cut keeps any part of it.
	w.addEntries(entries(durable+1, durable+5, 0))
	w.write()
	ops := int(mem.Ops() - start)
	if cut < 0 && (w.rolls != 2 || w.zeroRolls != 2 || w.fileSize <= w.size) {
		t.Fatalf("both segments must be zero-filled and written in place: %d rolls, %d on zero-filled files, file %d bytes, log %d", w.rolls, w.zeroRolls, w.fileSize, w.size)
	}
	mem.Crash(rng)
	_, st, err := openWALWith(mem, "/wal", testWALConfig())
	if err != nil {
		t.Fatalf("cut %d: recovery failed: %v", cut, err)
	}
	if st.lastOp() < durable {
		t.Fatalf("cut %d: recovered up to op %d, but op %d was fsynced", cut, st.lastOp(), durable)
	}
	if ckpt && st.snap.Op != 12 {
		t.Fatalf("cut %d: a durable checkpoint was lost (snapshot op %d)", cut, st.snap.Op)
	}
	// The checkpoint's number rides its snapshot record: a cut leaves the
	// checkpoint with its number or the segment before it, never one
	// without the other.
	if want := map[uint64]uint64{0: 0, 12: ckptNumber}[st.snap.Op]; st.snap.Number != want {
		t.Fatalf("cut %d: snapshot at %d with number %#x, want %#x", cut, st.snap.Op, st.snap.Number, want)
	}
	for i, e := range st.entries {
		if e.Op != st.snap.Op+uint64(i)+1 || string(e.Data) != fmt.Sprint("d", e.Op) {
			t.Fatalf("cut %d: entry %d is %+v", cut, i, e)
		}
	}
	return ops
}

// segments lists the segment files in /wal.
func segments(t *testing.T, mem *vfs.Mem) []string {
	t.Helper()
	names, err := mem.ReadDir("/wal")
	if err != nil {
		t.Fatal(err)
	}
	var segs []string
	for _, n := range names {
		if _, ok := parseSeg(n); ok {
			segs = append(segs, n)
		}
	}
	return segs
}

func rewrite(t *testing.T, mem *vfs.Mem, name string, edit func([]byte)) {
	t.Helper()
	f, err := mem.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := f.Size()
	b := make([]byte, n)
	f.ReadAt(b, 0)
	f.Close()
	edit(b)
	g, _ := mem.Create(name)
	g.Write(b)
	g.Sync()
	g.Close()
}

func TestWALTornTailIsCutButCorruptionBeforeItIsRefused(t *testing.T) {
	mem := vfs.NewMem()
	w := newTestWAL(t, mem)
	w.addEntries(entries(1, 3, 0))
	commitBatch(t, w)
	head := w.size
	w.addEntries(entries(4, 6, 0))
	commitBatch(t, w)
	end := w.size
	w.close()
	name := "/wal/" + segName(1)

	rewrite(t, mem, name, func(b []byte) { b[end-5] ^= 0xff }) // inside the last record
	if _, st, err := openWALWith(mem, "/wal", testWALConfig()); err != nil || st.lastOp() != 3 {
		t.Fatalf("a bad last record is a torn tail (cut, ops 1-3 kept): op %d, %v", st.lastOp(), err)
	}

	mem = vfs.NewMem()
	w = newTestWAL(t, mem)
	w.addEntries(entries(1, 3, 0))
	commitBatch(t, w)
	w.addEntries(entries(4, 6, 0))
	commitBatch(t, w)
	w.close()
	rewrite(t, mem, name, func(b []byte) { b[head-3] ^= 0xff }) // inside the first entries record
	if _, _, err := openWALWith(mem, "/wal", testWALConfig()); !errors.Is(err, ErrWALCorrupt) {
		t.Fatalf("a bad record followed by one that says it was synced: %v, want ErrWALCorrupt", err)
	}
}

// A failed fsync of one replica's log stops that replica; the other two go on.
func TestFailedFsyncStopsOnlyThatReplica(t *testing.T) {
	mem := vfs.NewMem()
	c := newCluster(t, 3, func(o *Options) {
		if o.VR.Self == 3 {
			o.FS = mem
		}
	})
	if _, err := c.write(set("a", "1"), shard.ReqID{}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// The failure must hit the log's fsync, not the zero-filler's.
	for !c.reps[2].wal.fill.Idle() {
		time.Sleep(time.Millisecond)
	}
	mem.FailSyncs(1)
	for i := range 20 {
		if _, err := c.write(set("b", fmt.Sprint(i)), shard.ReqID{}, 10*time.Second); err != nil {
			t.Fatalf("write %d after replica 3 lost its disk: %v", i, err)
		}
	}
	if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { return c.reps[2].Info().Failed != nil }) {
		t.Fatalf("replica 3 kept running after a failed fsync")
	}
	if _, err := c.reps[2].Read(context.Background(), get("a"), level.ConsEventual, shard.Session{}); !errors.Is(err, ErrFailed) {
		t.Fatalf("read at the failed replica: %v, want ErrFailed", err)
	}
}

// A roll writes the new segment under a temporary name and renames it only once
// it is whole and fsynced. A crash before the rename leaves a partial ".tmp"
// file (a real file system may keep a new file's name and first pages): recovery
// must ignore and remove it and keep every entry of the complete old segment.
func TestWALUnfinishedRollNeverOutranksTheOldSegment(t *testing.T) {
	mem := vfs.NewMem()
	w := newTestWAL(t, mem)
	w.addEntries(entries(1, 10, 0))
	w.addHardState(vr.HardState{View: 2, LastNormalView: 2, Commit: 8})
	commitBatch(t, w)
	w.close()

	// What the next roll would have written: a checkpoint at op 5 (taken from a
	// scratch WAL), of which only the first record's worth reached the disk.
	scratch := vfs.NewMem()
	w2 := newTestWAL(t, scratch)
	w2.addSnapshot(vr.Snapshot{Op: 5})
	w2.addEntries(entries(6, 10, 0))
	w2.addHardState(vr.HardState{View: 2, LastNormalView: 2, Commit: 8})
	if err := w2.roll(); err != nil {
		t.Fatal(err)
	}
	w2.close()
	var full []byte
	rewrite(t, scratch, "/wal/"+segName(2), func(b []byte) { full = append(full, b[:w2.size]...) })
	partial := full[:len(full)/3]
	if !firstIsSnapshot(partial, 2) {
		t.Fatalf("test setup: the partial segment must start with a whole snapshot record")
	}
	f, err := mem.Create("/wal/" + segName(2) + seglog.TmpSuffix)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(partial)
	f.Sync()
	f.Close()
	mem.SyncDir("/wal")

	_, st, err := openWAL(mem, "/wal")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.entries) != 10 || st.hs.View != 2 || st.hs.Commit != 8 {
		t.Fatalf("recovered %d entries, hard state %+v: the complete old segment must win", len(st.entries), st.hs)
	}
	names, _ := mem.ReadDir("/wal")
	for _, n := range names {
		if strings.HasSuffix(n, segName(2)+seglog.TmpSuffix) {
			t.Fatalf("unfinished segment %s left behind: %v", n, names)
		}
	}
}

// The clean-stop mark counts only as the last record, and unmarkClean makes
// it stop counting durably: a power cut after it (only synced bytes survive)
// does not bring a "clean" log back, nor does a later unsynced record.
func TestWALCleanMarkIsTheLastRecordOnly(t *testing.T) {
	mem := vfs.NewMem()
	w := newTestWAL(t, mem)
	w.addEntries(entries(1, 3, 0))
	commitBatch(t, w)
	if err := w.markClean(); err != nil {
		t.Fatal(err)
	}
	w.close()
	w2, st, err := openWAL(mem, "/wal")
	if err != nil {
		t.Fatal(err)
	}
	if !st.clean || len(st.entries) != 3 {
		t.Fatalf("after a clean stop: clean %t, %d entries", st.clean, len(st.entries))
	}
	if err := w2.unmarkClean(false); err != nil {
		t.Fatal(err)
	}
	w2.addDLog([]vr.NilextRequest{{Request: vr.Request{Client: 9, ReqNum: 1, Data: []byte("x")}}})
	if err := w2.write(); err != nil { // written, not synced: a power cut takes it
		t.Fatal(err)
	}
	mem.Crash(nil)
	_, st, err = openWAL(mem, "/wal")
	if err != nil {
		t.Fatal(err)
	}
	if st.clean || len(st.dlog) != 0 {
		t.Fatalf("after a power cut in the life that followed the clean stop: clean %t, d-log %v", st.clean, st.dlog)
	}
}
