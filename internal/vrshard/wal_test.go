package vrshard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
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

func newTestWAL(t *testing.T, fs vfs.FS) *wal {
	t.Helper()
	w, st, err := openWAL(fs, "/wal")
	if err != nil || !st.empty {
		t.Fatalf("open empty wal: %+v, %v", st, err)
	}
	w.addSnapshot(0, nil)
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
	w2.addSnapshot(5, []vr.ClientRecord{{Client: 1, ReqNum: 4, Op: 4, Result: []byte("r")}})
	w2.addEntries(st.entries[5:])
	w2.addHardState(st.hs)
	if err := w2.roll(); err != nil {
		t.Fatal(err)
	}
	w2.close()
	names, _ := mem.ReadDir("/wal")
	if len(names) != 1 {
		t.Fatalf("segments after checkpoint: %v", names)
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
func TestWALSurvivesPowerCutAnywhere(t *testing.T) {
	for cut := 1; cut < 40; cut++ {
		mem := vfs.NewMem()
		w := newTestWAL(t, mem)
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
				w.addSnapshot(12, nil)
				w.addEntries(entries(13, durable, 0))
				if w.roll() != nil {
					break
				}
				ckpt = true
			}
		}
		mem.Crash(nil)
		_, st, err := openWAL(mem, "/wal")
		if err != nil {
			t.Fatalf("cut %d: recovery failed: %v", cut, err)
		}
		if st.lastOp() < durable {
			t.Fatalf("cut %d: recovered up to op %d, but op %d was fsynced", cut, st.lastOp(), durable)
		}
		if ckpt && st.snap.Op != 12 {
			t.Fatalf("cut %d: a durable checkpoint was lost (snapshot op %d)", cut, st.snap.Op)
		}
		for i, e := range st.entries {
			if e.Op != st.snap.Op+uint64(i)+1 || string(e.Data) != fmt.Sprint("d", e.Op) {
				t.Fatalf("cut %d: entry %d is %+v", cut, i, e)
			}
		}
	}
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
	w.close()
	name := "/wal/" + segName(1)

	rewrite(t, mem, name, func(b []byte) { b[len(b)-5] ^= 0xff }) // inside the last record
	if _, st, err := openWAL(mem, "/wal"); err != nil || st.lastOp() != 3 {
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
	if _, _, err := openWAL(mem, "/wal"); !errors.Is(err, ErrWALCorrupt) {
		t.Fatalf("a bad record followed by good ones: %v, want ErrWALCorrupt", err)
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
	mem.FailSyncs(1)
	for i := range 20 {
		if _, err := c.write(set("b", fmt.Sprint(i)), shard.ReqID{}, 10*time.Second); err != nil {
			t.Fatalf("write %d after replica 3 lost its disk: %v", i, err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.reps[2].Info().Failed == nil {
		if time.Now().After(deadline) {
			t.Fatalf("replica 3 kept running after a failed fsync")
		}
		time.Sleep(5 * time.Millisecond)
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
	w2.addSnapshot(5, nil)
	w2.addEntries(entries(6, 10, 0))
	w2.addHardState(vr.HardState{View: 2, LastNormalView: 2, Commit: 8})
	if err := w2.roll(); err != nil {
		t.Fatal(err)
	}
	w2.close()
	var full []byte
	rewrite(t, scratch, "/wal/"+segName(2), func(b []byte) { full = append(full, b...) })
	partial := full[:len(full)/3]
	if typ, _, _, ok := nextRecord(partial); !ok || typ != recSnapshot {
		t.Fatalf("test setup: the partial segment must start with a whole snapshot record")
	}
	f, err := mem.Create("/wal/" + segName(2) + tmpSuffix)
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
		if strings.HasSuffix(n, tmpSuffix) {
			t.Fatalf("unfinished segment %s left behind: %v", n, names)
		}
	}
}
