package storage

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/seglog/seglogtest"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Tests of zero-filled segments and record format 2 (zero.go; docs/design/zero-filled-logs.md,
// "Built for the storage log"). The randomized power-cut tests of crash_test.go run on
// them too (Options.Inline fills inline, the async variant on a goroutine).

// writeAt writes p at off in path on fs and syncs it.
func writeAt(t *testing.T, fs vfs.FS, path string, p []byte, off int64) {
	t.Helper()
	f, err := fs.OpenRW(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.(vfs.WriterAt).WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func isZero(b []byte) bool { return bytes.Equal(b, make([]byte, len(b))) }

// checkZeroTail fails unless every byte of the active segment's file after the log's
// end is zero.
func checkZeroTail(t *testing.T, fs vfs.FS, db *DB, what string) {
	t.Helper()
	db.mu.RLock()
	last := db.segs[len(db.segs)-1]
	path, end := last.path, last.size
	db.mu.RUnlock()
	b := seglogtest.ReadFile(t, fs, path)
	if !isZero(b[min(end, int64(len(b))):]) {
		t.Fatalf("%s: non-zero bytes after the end (%d) of %s", what, end, path)
	}
}

func TestZeroFilledRoll(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs) // Inline: the filler runs inline, one segment ahead
	db := mustOpen(t, o)
	for i := 0; i < 120; i++ {
		put(t, db, fmt.Sprintf("k%03d", i), uint64(i+1), strings.Repeat("v", 100))
		if i%7 == 0 {
			if _, err := db.Sync(db.LastPos()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	if r, z := db.rolls.Load(), db.zeroRolls.Load(); r < 4 || z != r {
		t.Fatalf("%d segments started, %d of them zero-filled; want >= 4, all", r, z)
	}
	// Sealed segments were cut to their logical end (ids stay positions); the active
	// one keeps its full zero-filled size, written in place.
	for i, s := range db.segs {
		size, err := fs.Stat(s.path)
		if err != nil {
			t.Fatal(err)
		}
		if i < len(db.segs)-1 {
			if next := db.segs[i+1].id; size != int64(next-s.id) {
				t.Fatalf("sealed %s: file size %d, want %d", s.path, size, next-s.id)
			}
			continue
		}
		if size != o.SegmentSize || s.size >= size {
			t.Fatalf("active %s: file size %d, log %d; want %d, less", s.path, size, s.size, o.SegmentSize)
		}
	}
	checkZeroTail(t, fs, db, "before the crash")
	db.Close()
	fs.Crash(nil)
	db2 := mustOpen(t, o)
	defer db2.Close()
	for i := 0; i < 120; i++ {
		wantGet(t, db2, fmt.Sprintf("k%03d", i), strings.Repeat("v", 100))
	}
	checkZeroTail(t, fs, db2, "after reopening")
}

// A roll that finds no zero-filled file ready (the filler is behind) creates the
// segment empty and appends to it; the next roll takes a zero-filled file again.
func TestRollWithoutReadyFileFallsBack(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.SegmentSize = 16 << 10
	o.mut.fill, o.mut.setFill = seglog.FillManual, true // only the first segment
	db := mustOpen(t, o)
	i := 0
	for ; db.rolls.Load() < 2; i++ {
		put(t, db, fmt.Sprintf("k%03d", i), uint64(i+1), strings.Repeat("v", 100))
	}
	if z := db.zeroRolls.Load(); z != 1 {
		t.Fatalf("%d zero-filled segments, want 1 (the first)", z)
	}
	for ; i < 60; i++ {
		put(t, db, fmt.Sprintf("k%03d", i), uint64(i+1), strings.Repeat("v", 100))
		if db.rolls.Load() > 2 {
			t.Fatal("rolled twice in 60 records")
		}
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	act := db.segs[len(db.segs)-1]
	if size, _ := fs.Stat(act.path); size != act.size {
		t.Fatalf("fallback segment %s: file size %d, log %d; want it appended", act.path, size, act.size)
	}
	// The filler catches up: the next roll takes its file.
	db.fill.FillNow("/db", o.SegmentSize)
	for ; db.rolls.Load() < 3; i++ {
		put(t, db, fmt.Sprintf("k%03d", i), uint64(i+1), strings.Repeat("v", 100))
	}
	if z := db.zeroRolls.Load(); z != 2 {
		t.Fatalf("%d zero-filled segments after the filler caught up, want 2", z)
	}
	db.Close()
	fs.Crash(nil)
	db2 := mustOpen(t, o)
	defer db2.Close()
	for j := 0; j < i; j++ {
		wantGet(t, db2, fmt.Sprintf("k%03d", j), strings.Repeat("v", 100))
	}
}

// The async filler (the default) has the next segment ready by the roll.
func TestAsyncFillerIsReadyForTheNextRoll(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.Inline = false
	db := mustOpen(t, o)
	defer db.Close()
	for i := 0; db.rolls.Load() < 4; i++ {
		put(t, db, fmt.Sprintf("k%03d", i), uint64(i+1), strings.Repeat("v", 100))
		// A disk fills faster than a segment's worth of writes, and a 4 KiB segment
		// must not fill up while the one before is being sealed.
		db.waitIdle()
		for !db.fill.Idle() {
			time.Sleep(50 * time.Microsecond)
		}
	}
	db.waitIdle()
	if r, z := db.rolls.Load(), db.zeroRolls.Load(); z != r {
		t.Fatalf("%d segments started, %d zero-filled; want all", r, z)
	}
}

// stalePlanted opens a log holding one synced record and, after the log's end, a hole
// and then a whole, valid record (key "zombie") that was never acknowledged — what a
// power cut leaves when the pages of an unsynced write land out of order. It reopens
// the engine with o (recovery must drop the zombie), writes one record exactly as long
// as the hole, so that it ends where the zombie begins, syncs, cuts the power and
// reopens once more. It returns the last engine.
func stalePlanted(t *testing.T, o Options) *DB {
	fs := o.FS
	clean := o
	clean.mut = mutations{}
	db := mustOpen(t, clean)
	put(t, db, "a", 1, "acked")
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	end := uint64(db.LastPos())
	db.Close()
	const valLen = 200
	zombieAt := end + uint64(recordSize(1, valLen))
	zombie := appendRecord(nil, &Record{Key: []byte("zombie"), Value: []byte("boo"), Version: 7, Timestamp: 7}, 0, 0, zombieAt, end)
	seg := "/db/" + segName(0)
	writeAt(t, fs, seg, zombie, int64(zombieAt))

	db = mustOpen(t, o)
	if db.LastPos() != Pos(end) {
		t.Fatalf("recovered to %d, want %d: the stale record after the hole was kept", db.LastPos(), end)
	}
	wantGet(t, db, "a", "acked")
	wantGet(t, db, "zombie", "")
	if p := put(t, db, "b", 2, strings.Repeat("x", valLen)); uint64(p) != zombieAt {
		t.Fatalf("the new record ends at %d, want %d (where the stale one begins)", p, zombieAt)
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	db.waitIdle()
	fs.(*vfs.Mem).Crash(nil)
	return mustOpen(t, clean)
}

func TestStaleTailIsZeroedBeforeNewWrites(t *testing.T) {
	fs := vfs.NewMem()
	db := stalePlanted(t, memOpts(fs))
	defer db.Close()
	wantGet(t, db, "a", "acked")
	wantGet(t, db, "b", strings.Repeat("x", 200))
	wantGet(t, db, "zombie", "")
	checkZeroTail(t, fs, db, "after the second recovery")
}

// Mutation skipZeroTail: recovery leaves the stale record in place, and the record that
// ends where it begins brings it back.
func TestMutationSkipZeroTailResurrectsAStaleRecord(t *testing.T) {
	mutation.Require(t)
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.mut.skipZeroTail = true
	db := stalePlanted(t, o)
	defer db.Close()
	if v, err := db.Get([]byte("zombie")); err != nil {
		t.Fatalf("mutation skipZeroTail: Get(zombie) = %q, %v; the test cannot see a resurrected record", v.Data, err)
	}
}

// A power cut after an unsynced write can leave a hole (a page that never reached the
// disk) followed by whole, valid records of the same write (pages that did). Recovery
// ends the log at the hole, keeps everything acknowledged, and zeroes the rest. (Format
// 1's rule, a valid record after a bad one is corruption, would refuse to open.)
func TestHoleThenValidUnacknowledgedRecords(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.SegmentSize = 64 << 10
	db := mustOpen(t, o)
	for i := 0; i < 5; i++ {
		put(t, db, fmt.Sprintf("k%d", i), uint64(i+1), "acked")
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	end := uint64(db.LastPos())
	db.Close()
	// The unsynced write: 40 records from end, carrying end as their synced mark; its
	// first page (up to the next 4 KiB boundary) lost.
	var batch []byte
	for i := 5; i < 45; i++ {
		r := Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(strings.Repeat("u", 300)), Version: uint64(i + 1)}
		batch = appendRecord(batch, &r, 0, 0, end+uint64(len(batch)), end)
	}
	hole := int(4096 - end%4096)
	writeAt(t, fs, "/db/"+segName(0), batch[hole:], int64(end)+int64(hole))
	// Whole, valid records lie after the hole.
	data := seglogtest.ReadFile(t, fs, "/db/"+segName(0))
	valid := 0
	for i := int(end) + 1; i+hdrSize <= len(data); i++ {
		if _, _, _, ok := decodeRecord(data[i:], uint64(i)); ok {
			valid++
		}
	}
	if valid < 5 {
		t.Fatalf("only %d valid records after the hole: the test proves nothing", valid)
	}
	db2 := mustOpen(t, o)
	defer db2.Close()
	if db2.LastPos() != Pos(end) {
		t.Fatalf("recovered to %d, want %d", db2.LastPos(), end)
	}
	for i := 0; i < 45; i++ {
		want := ""
		if i < 5 {
			want = "acked"
		}
		wantGet(t, db2, fmt.Sprintf("k%d", i), want)
	}
	checkZeroTail(t, fs, db2, "after recovery")
}

// damagedBelowMark writes ten records, syncs, writes one more (whose synced mark says
// the ten are durable), syncs, flips a byte of the third record and reopens with o.
func damagedBelowMark(t *testing.T, o Options) (*DB, Pos, error) {
	fs := o.FS
	clean := o
	clean.mut = mutations{}
	db := mustOpen(t, clean)
	ends := fill(t, db, 10)
	put(t, db, "after", 100, "x")
	db.Close()
	rewrite(t, fs, "/db/"+segName(0), func(b []byte) []byte { b[int(ends[2])+hdrSize+3] ^= 1; return b })
	db, err := Open(o)
	return db, ends[2], err
}

func TestCorruptionBelowSyncedMarkIsRefused(t *testing.T) {
	fs := vfs.NewMem()
	_, at, err := damagedBelowMark(t, memOpts(fs))
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.File != "/db/"+segName(0) || ce.Offset != int64(at) || !strings.Contains(ce.Reason, "synced") {
		t.Fatalf("Open = %v; want a CorruptionError at %d below the synced point", err, at)
	}
}

// Mutation ignoreSynced: recovery takes the damaged record for the end of the log and
// silently drops acknowledged records.
func TestMutationIgnoreSyncedMarkIsCaught(t *testing.T) {
	mutation.Require(t)
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.mut.ignoreSynced = true
	db, _, err := damagedBelowMark(t, o)
	if err != nil {
		t.Fatalf("mutation ignoreSynced: Open = %v; the test cannot see the damage go unnoticed", err)
	}
	defer db.Close()
	if _, err := db.Get([]byte("after")); !errors.Is(err, ErrNotFound) {
		t.Fatal("mutation ignoreSynced: the records after the damage survived")
	}
}

// A format 2 record is valid only at the position it claims.
func TestRecordIsValidOnlyWhereItClaims(t *testing.T) {
	r := Record{Key: []byte("k"), Value: []byte("v"), Version: 1}
	b := appendRecord(nil, &r, 0, 0, 4096, 100)
	if _, _, _, ok := decodeRecord(b, 4096); !ok {
		t.Fatal("a record does not decode where it claims to be")
	}
	if _, _, _, ok := decodeRecord(b, 4095); ok {
		t.Fatal("a record decodes at another position")
	}
	if _, _, _, ok := decodeRecord(appendRecord(nil, &r, 0, 0, 50, 51), 50); ok {
		t.Fatal("a record whose synced mark is past itself decodes")
	}
}

// formatOneLog writes a format 1 engine directory by hand (what the code before format 2
// wrote): two segments, records k0..k9 ("v<i>"), and returns the path of the second
// and the end of the log.
func formatOneLog(fs *vfs.Mem) (string, uint64) {
	fs.MkdirAll("/db")
	var segs [2][]byte
	second := ""

	for i := 0; i < 10; i++ {
		r := Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i)), Version: uint64(i + 1), Timestamp: 1}
		segs[i/5] = append(segs[i/5], encodeV1(r, 0, 0)...)
	}
	id := uint64(0)
	for _, b := range segs {
		second = "/db/" + segName(id)
		f, _ := fs.Create(second)
		f.Write(b)
		f.Sync()
		f.Close()
		id += uint64(len(b))
	}
	fs.SyncDir("/db")
	return second, id
}

func TestUpgradeFromFormatOne(t *testing.T) {
	fs := vfs.NewMem()
	last, end := formatOneLog(fs)
	// A torn tail, as format 1 left them: cut under format 1's rule.
	writeAt(t, fs, last, []byte{9, 9, 9}, int64(len(seglogtest.ReadFile(t, fs, last))))
	o := memOpts(fs)
	db := mustOpen(t, o)
	if db.fmtFrom != end || db.LastPos() != Pos(end) {
		t.Fatalf("upgraded: format 2 from %d, log end %d; want %d, %d", db.fmtFrom, db.LastPos(), end, end)
	}
	for i := 0; i < 10; i++ {
		wantGet(t, db, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
	}
	// New records (format 2) after the old ones, across rolls, then reopen.
	for i := 10; i < 80; i++ {
		put(t, db, fmt.Sprintf("k%d", i), uint64(i+1), fmt.Sprintf("v%d", i))
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	if err := db.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	put(t, db, "k0", 100, "new")
	db.Close()
	fs.Crash(nil)
	db2 := mustOpen(t, o)
	if db2.fmtFrom != end {
		t.Fatalf("format 2 from %d after reopening, want %d", db2.fmtFrom, end)
	}
	wantGet(t, db2, "k0", "new")
	for i := 1; i < 80; i++ {
		wantGet(t, db2, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
	}
	if err := db2.Compact(); err != nil {
		t.Fatal(err)
	}
	db2.Close()
	db3 := mustOpen(t, o)
	defer db3.Close()
	wantGet(t, db3, "k0", "new")
	wantGet(t, db3, "k9", "v9")
}

// A power cut at any file operation of the upgrade leaves a directory that opens with
// every record.
func TestUpgradeSurvivesPowerCutAnywhere(t *testing.T) {
	for n := 0; ; n++ {
		fs := vfs.NewMem()
		_, end := formatOneLog(fs)
		o := memOpts(fs)
		fs.CrashAfter(n)
		db, err := Open(o)
		if err == nil {
			db.Close()
		}
		cut := fs.PoweredOff()
		fs.Crash(nil)
		db = mustOpen(t, o)
		if db.LastPos() != Pos(end) {
			t.Fatalf("power cut after %d operations: log end %d, want %d", n, db.LastPos(), end)
		}
		for i := 0; i < 10; i++ {
			wantGet(t, db, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
		}
		db.Close()
		if !cut {
			return
		}
	}
}

// Below the point where format 2 began everything was durable: a bad format 1 record
// there is corruption, even in the last segment with nothing valid after it.
func TestUpgradedLogDamagedBelowFormatMarkIsRefused(t *testing.T) {
	fs := vfs.NewMem()
	last, _ := formatOneLog(fs)
	o := memOpts(fs)
	db := mustOpen(t, o)
	db.Close()
	b := seglogtest.ReadFile(t, fs, last)
	n := len(b)
	// The last format 1 record: damage it.
	rewrite(t, fs, last, func(b []byte) []byte { b[n-1] ^= 1; return b })
	_, err := Open(o)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.File != last || !strings.Contains(ce.Reason, "upgraded") {
		t.Fatalf("Open = %v; want a CorruptionError in %s below the format mark", err, last)
	}
}

// A format 1 directory keeps format 1's rule until it is upgraded: in the last segment,
// a bad record with a valid one after it is damage in the middle of the log (a torn
// write damages only the end), refused; a bad last record is a torn tail, cut.
func TestFormatOneDamagedMiddleIsRefusedTornTailIsCut(t *testing.T) {
	fs := vfs.NewMem()
	last, _ := formatOneLog(fs)
	b := seglogtest.ReadFile(t, fs, last)
	rec := len(b) / 5 // five records of one size
	rewrite(t, fs, last, func(b []byte) []byte { b[rec+hdrSize1] ^= 1; return b })
	o := memOpts(fs)
	_, err := Open(o)
	var ce *CorruptionError
	if !errors.As(err, &ce) || ce.File != last || ce.Offset != int64(rec) {
		t.Fatalf("Open = %v; want a CorruptionError in %s at offset %d", err, last, rec)
	}
	rewrite(t, fs, last, func(b []byte) []byte { b[rec+hdrSize1] ^= 1; b[len(b)-1] ^= 1; return b })
	db := mustOpen(t, o)
	defer db.Close()
	for i := 0; i < 9; i++ {
		wantGet(t, db, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
	}
	wantGet(t, db, "k9", "")
}

// The format mark's name is a gap file's name past every position: the code before
// format 2 lists it as the last piece of the log and refuses a log that ends with a gap
// (recover: "the log ends with a gap"), instead of cutting format 2 records off as a
// torn tail. This pins the name to that behaviour.
func TestFormatMarkLooksLikeATrailingGapToOldCode(t *testing.T) {
	id, ok := parseName(formatMarkName, ".gap")
	if !ok || id != math.MaxUint64 {
		t.Fatalf("parseName(%q) = %d, %v; want a gap at the largest position", formatMarkName, id, ok)
	}
	fs := vfs.NewMem()
	db := mustOpen(t, memOpts(fs))
	db.Close()
	if _, err := fs.Stat("/db/" + formatMarkName); err != nil {
		t.Fatalf("a new engine has no format mark: %v", err)
	}
}

// staleAfterEnd reports whether the segment data (id segID, format 2) holds, after its
// first invalid record, a whole, valid record: a hole followed by what a power cut kept.
func staleAfterEnd(data []byte, segID uint64) bool {
	p := 0
	for {
		h, _, _, ok := decodeRecord(data[p:], segID+uint64(p))
		if !ok {
			break
		}
		p += h.size()
	}
	for i := p + 1; i+hdrSize <= len(data); i++ {
		if _, _, _, ok := decodeRecord(data[i:], segID+uint64(i)); ok {
			return true
		}
	}
	return false
}

// TestRepeatedPowerCutsNeverResurrect: many incarnations of random batches (values up to
// 700 random bytes), some synced, each ended by a seeded power cut (unsynced appends'
// prefix, unsynced overwritten pages old, new or torn at 512-byte sectors). After every
// recovery: everything synced survives, what survives beyond it is exactly a prefix of
// the last incarnation's writes, and the active file is zero after the end. The same
// for engines that append (Options.NoZeroFill, a VR replica's), and for a directory
// each incarnation opens in either mode (a node upgraded to NoZeroFill, or back): a
// zero-filled active segment then grows by appends, and an appended one is written in
// place after a zero-filled roll.
func TestRepeatedPowerCutsNeverResurrect(t *testing.T) {
	seeds := *crashSeeds / 2
	if testing.Short() {
		seeds = 30
	}
	for _, tc := range []struct {
		name      string
		noZero    func(rng *rand.Rand) bool // the mode of the next incarnation
		wantHoles bool                      // stale valid records after a hole occur (zero-filled files)
	}{
		{"zero-filled", func(*rand.Rand) bool { return false }, true},
		{"appended", func(*rand.Rand) bool { return true }, false},
		{"switching", func(rng *rand.Rand) bool { return rng.Intn(2) == 0 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) { repeatedPowerCuts(t, seeds, tc.noZero, tc.wantHoles) })
	}
}

func repeatedPowerCuts(t *testing.T, seeds int, noZero func(*rand.Rand) bool, wantHoles bool) {
	holes, kept, switched := 0, 0, 0
	for seed := int64(0); seed < int64(seeds); seed++ {
		rng := rand.New(rand.NewSource(seed))
		fs := vfs.NewMem()
		o := memOpts(fs)
		o.SegmentSize = int64(2048 + rng.Intn(8192))
		o.WriteBufferSize = 64 + rng.Intn(4096)
		o.NoZeroFill = noZero(rng)
		db := mustOpen(t, o)
		model := map[string]string{}
		version := uint64(0)
		for inc := 0; inc < 6; inc++ {
			base := db.LastPos()
			type op struct {
				end      Pos
				key, val string
			}
			var ops []op
			durable := base
			for b := 1 + rng.Intn(30); b > 0; b-- {
				recs := make([]Record, 1+rng.Intn(3))
				for j := range recs {
					version++
					val := make([]byte, 1+rng.Intn(700))
					for k := range val {
						val[k] = byte('a' + rng.Intn(26))
					}
					recs[j] = Record{Key: []byte(fmt.Sprintf("key%02d-%d", rng.Intn(20), j)), Value: val, Version: version}
				}
				p, err := db.Append(recs...)
				if err != nil {
					t.Fatalf("seed %d: append: %v", seed, err)
				}
				end := p
				batch := make([]op, len(recs))
				for j := len(recs) - 1; j >= 0; j-- {
					batch[j] = op{end: end, key: string(recs[j].Key), val: string(recs[j].Value)}
					end -= Pos(recordSize(len(recs[j].Key), len(recs[j].Value)))
				}
				ops = append(ops, batch...)
				if rng.Intn(3) == 0 {
					if durable, err = db.Sync(p); err != nil {
						t.Fatalf("seed %d: sync: %v", seed, err)
					}
				}
			}
			if rng.Intn(2) == 0 {
				db.mu.Lock()
				db.flushLocked() // unsynced bytes in the file, not only in memory
				db.mu.Unlock()
			}
			db.waitIdle()
			fs.Crash(rng)
			names, _ := fs.ReadDir("/db")
			lastSeg := ""
			for _, n := range names {
				if strings.HasSuffix(n, ".log") {
					lastSeg = n
				}
			}
			segID, _ := parseName(lastSeg, ".log")
			if staleAfterEnd(seglogtest.ReadFile(t, fs, "/db/"+lastSeg), segID) {
				holes++
			}
			var err error
			if nz := noZero(rng); nz != o.NoZeroFill {
				o.NoZeroFill = nz
				switched++
			}
			if db, err = Open(o); err != nil {
				t.Fatalf("seed %d incarnation %d (NoZeroFill %v): reopen: %v\n%s", seed, inc, o.NoZeroFill, err, fs)
			}
			rec := db.LastPos()
			if rec < durable {
				t.Fatalf("seed %d incarnation %d: recovered to %d, but %d was synced", seed, inc, rec, durable)
			}
			if rec > durable {
				kept++
			}
			n := 0
			for n < len(ops) && ops[n].end <= rec {
				model[ops[n].key] = ops[n].val
				n++
			}
			if rec != base && (n == 0 || ops[n-1].end != rec) {
				t.Fatalf("seed %d incarnation %d: recovered to %d, not a record boundary of this incarnation", seed, inc, rec)
			}
			for k := 0; k < 20; k++ {
				for j := 0; j < 3; j++ {
					key := fmt.Sprintf("key%02d-%d", k, j)
					wantGet(t, db, key, model[key])
				}
			}
			checkZeroTail(t, fs, db, fmt.Sprintf("seed %d incarnation %d", seed, inc))
		}
		db.Close()
	}
	t.Logf("%d seeds x 6 power cuts: %d recoveries kept unsynced records, %d found valid stale records after a hole, %d switched the fill mode", seeds, kept, holes, switched)
	if (wantHoles && holes == 0) || kept == 0 {
		t.Fatal("the workload never left valid records after a hole, or never kept unsynced ones: it proves nothing")
	}
}

// A new engine starts with a minZeroSize segment; each next one is zero-filled to twice
// the one before (up to SegmentSize), and a smaller segment ends where its zeros end.
func TestZeroFilledSizesDouble(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.SegmentSize = 64 << 20
	db := mustOpen(t, o)
	val := strings.Repeat("v", 60<<10)
	i := 0
	for ; db.rolls.Load() < 3; i++ {
		put(t, db, fmt.Sprintf("k%04d", i), uint64(i+1), val)
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	want := []int64{minZeroSize, 2 * minZeroSize, 4 * minZeroSize}
	for j, s := range db.segs {
		if s.zeroSize != want[j] {
			t.Fatalf("segment %d zero-filled to %d, want %d", j, s.zeroSize, want[j])
		}
	}
	if size, _ := fs.Stat(db.segs[0].path); size > minZeroSize || size < minZeroSize-int64(recordSize(5, len(val))) {
		t.Fatalf("the first segment ends at %d, want where its zeros end (%d)", size, minZeroSize)
	}
	if got := db.zeroSizeAfter(&segment{zeroSize: 32 << 20}); got != 64<<20 {
		t.Fatalf("after 32 MiB: %d", got)
	}
	if got := db.zeroSizeAfter(&segment{zeroSize: 64 << 20}); got != 64<<20 {
		t.Fatalf("after 64 MiB: %d", got)
	}
	if got := db.zeroSizeAfter(&segment{}); got != 64<<20 {
		t.Fatalf("after an appended segment: %d", got)
	}
	db.Close()
	fs.Crash(nil)
	db2 := mustOpen(t, o)
	defer db2.Close()
	for j := 0; j < i; j++ {
		wantGet(t, db2, fmt.Sprintf("k%04d", j), val)
	}
}
