package storage

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/seglog"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

func TestCheckpointReopenReplaysTail(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	db := mustOpen(t, o)
	for i := 0; i < 300; i++ {
		put(t, db, fmt.Sprintf("k%03d", i%50), uint64(i+1), fmt.Sprint(i))
	}
	if err := db.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	ckpt := db.LastPos()
	// After the checkpoint: overwrites, a delete and new keys, all in the tail.
	put(t, db, "k001", 1000, "after")
	del(t, db, "k002", 1001)
	put(t, db, "new", 1002, "n")
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	check := func(db *DB) {
		wantGet(t, db, "k001", "after")
		wantGet(t, db, "k002", "")
		wantGet(t, db, "new", "n")
		wantGet(t, db, "k049", "299")
		if db.LastVersion() != 1002 {
			t.Fatalf("LastVersion = %d", db.LastVersion())
		}
	}
	db.Close()
	fs.Crash(nil)
	db2 := mustOpen(t, o)
	if db2.Stats().HintPos != ckpt {
		t.Fatalf("recovered from %d, want the checkpoint at %d", db2.Stats().HintPos, ckpt)
	}
	check(db2)
	db2.Close()

	// A damaged hint is ignored: the log is replayed in full, with the same result.
	rewrite(t, fs, "/db/"+hintName(uint64(ckpt)), func(b []byte) []byte { b[40] ^= 1; return b })
	db3 := mustOpen(t, o)
	defer db3.Close()
	if db3.Stats().HintPos != 0 {
		t.Fatal("a damaged hint was used")
	}
	check(db3)
}

func TestDeviceChain(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.Devices = []Device{{Dir: "/ssd"}, {Dir: "/hdd"}, {Dir: "/remote"}}
	o.SegmentSize = 512
	db := mustOpen(t, o)
	for i := 0; i < 100; i++ {
		put(t, db, fmt.Sprintf("k%02d", i%10), uint64(i+1), fmt.Sprintf("%030d", i))
	}
	db.Sync(db.LastPos())
	perDev := map[string]int{}
	for _, d := range o.Devices {
		names, _ := fs.ReadDir(d.Dir)
		perDev[d.Dir] = len(names)
	}
	if perDev["/ssd"] == 0 || perDev["/hdd"] == 0 || perDev["/remote"] == 0 {
		t.Fatalf("segments not chained over every device: %v", perDev)
	}
	// Compaction frees the head: almost everything is overwritten garbage.
	before := db.Stats().Segments
	if err := db.Compact(); err != nil {
		t.Fatal(err)
	}
	if after := db.Stats().Segments; after >= before {
		t.Fatalf("segments %d -> %d", before, after)
	}
	db.Close()
	fs.Crash(nil)
	db2 := mustOpen(t, o)
	defer db2.Close()
	for k := 0; k < 10; k++ {
		wantGet(t, db2, fmt.Sprintf("k%02d", k), fmt.Sprintf("%030d", 90+k))
	}
}

func TestDeviceModelAndCost(t *testing.T) {
	dir := t.TempDir()
	slow := &DeviceModel{Latency: 2 * time.Millisecond, Bandwidth: 1 << 20, QueueDepth: 1}
	o := Options{Devices: []Device{{Dir: dir + "/fast"}, {Dir: dir + "/slow", Model: slow}}, SegmentSize: 300, Inline: true}
	db := mustOpen(t, o)
	defer db.Close()
	// Segment 0 is on the fast device, segment 1 on the slow one.
	put(t, db, "fast", 1, string(make([]byte, 200)))
	put(t, db, "slow", 2, string(make([]byte, 200)))
	put(t, db, "tail", 3, string(make([]byte, 200))) // rolls again: "slow" is written out, "tail" is buffered
	cFast, cSlow, cBuf := db.Cost([]byte("fast"), 10), db.Cost([]byte("slow"), 10), db.Cost([]byte("tail"), 10)
	if !(cSlow > cFast && cFast > cBuf) {
		t.Fatalf("costs fast=%d slow=%d buffered=%d; want slow > fast > buffered", cFast, cSlow, cBuf)
	}
	if c := db.Cost([]byte("missing"), 10); c != 0 {
		t.Fatalf("cost of a missing key = %d", c)
	}
	start := time.Now()
	wantGet(t, db, "slow", string(make([]byte, 200)))
	if el := time.Since(start); el < 2*time.Millisecond {
		t.Fatalf("read from the emulated device took %v, want >= its 2ms latency", el)
	}
	// Now cached: cheap to read again.
	if c := db.Cost([]byte("slow"), 10); c >= cFast {
		t.Fatalf("cost after caching = %d, want below an uncached read (%d)", c, cFast)
	}
	// A busy queue makes the device more expensive.
	dev := db.devs[1]
	dev.inflight.Add(3)
	busy := dev.cost(200)
	dev.inflight.Add(-3)
	if busy <= dev.cost(200) {
		t.Fatalf("cost with 3 queued reads %d not above idle %d", busy, dev.cost(200))
	}
}

func TestCacheSieve(t *testing.T) {
	c := newCache(cacheShards * (3 * (10 + centryOverhead))) // three 10-byte values per shard
	s := c.shard(0)
	var pos []uint64 // positions that land in shard 0
	for p := uint64(1); len(pos) < 5; p++ {
		if c.shard(p) == s {
			pos = append(pos, p)
		}
	}
	val := make([]byte, 10)
	c.put(pos[0], val)
	c.put(pos[1], val)
	c.put(pos[2], val)
	c.get(pos[0], true) // visited: survives the next eviction
	c.put(pos[3], val)
	if _, ok := c.get(pos[0], true); !ok {
		t.Fatal("visited entry was evicted")
	}
	if _, ok := c.get(pos[1], true); ok {
		t.Fatal("the oldest unvisited entry survived")
	}
	if s.size > s.max {
		t.Fatalf("shard holds %d bytes, bound %d", s.size, s.max)
	}
	got, _ := c.get(pos[3], true)
	got[0] = 9 // the caller's copy: the cache is unaffected
	if again, _ := c.get(pos[3], true); again[0] != 0 {
		t.Fatal("cache returned its own buffer")
	}
}

func TestBackgroundSyncer(t *testing.T) {
	for _, o := range []Options{{SyncInterval: 2 * time.Millisecond}, {SyncBytes: 100}} {
		o.Devices = []Device{{Dir: t.TempDir()}}
		db := mustOpen(t, o)
		p := put(t, db, "k", 1, string(make([]byte, 200)))
		if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return db.DurablePos() >= p }) {
			t.Fatalf("background syncer never synced (%+v)", o)
		}
		db.Close()
	}
}

func TestCheckpointOnFailedEngine(t *testing.T) {
	fs := vfs.NewMem()
	db := mustOpen(t, memOpts(fs))
	defer db.Close()
	put(t, db, "a", 1, "x")
	fs.FailSyncs(1)
	db.Sync(db.LastPos())
	if err := db.Checkpoint(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Checkpoint on a failed engine = %v", err)
	}
}

// A full disk when a segment fills is not fatal: the engine keeps the current segment
// and rolls later, once there is room.
func TestDiskFullAtRoll(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.SegmentSize = 200
	// Appended segments: a zero-filled next segment made before the disk filled up
	// would let the roll go through.
	o.mut.fill, o.mut.setFill = seglog.FillOff, true
	db := mustOpen(t, o)
	defer db.Close()
	put(t, db, "a", 1, string(make([]byte, 150)))
	db.Sync(db.LastPos())
	// With the disk exactly full, the roll this append triggers cannot create the next
	// segment.
	fs.SetCapacity(fs.Used())
	if _, err := db.Append(Record{Key: []byte("b"), Value: make([]byte, 150), Version: 2}); err != nil {
		t.Fatalf("append on a full disk: %v", err)
	}
	if n := db.Stats().Segments; n != 1 {
		t.Fatalf("%d segments after a roll on a full disk, want 1", n)
	}
	if _, err := db.Sync(db.LastPos()); !errors.Is(err, ErrDiskFull) {
		t.Fatalf("sync on a full disk = %v, want ErrDiskFull", err)
	}
	if db.Stats().Failed != nil {
		t.Fatalf("a full disk failed the engine: %v", db.Stats().Failed)
	}
	fs.SetCapacity(0)
	put(t, db, "c", 3, "after")
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatalf("sync after space came back: %v", err)
	}
	wantGet(t, db, "b", string(make([]byte, 150)))
	wantGet(t, db, "c", "after")
	if n := db.Stats().Segments; n < 2 {
		t.Fatalf("still %d segment(s) once the disk has room", n)
	}
}

func TestBackgroundCompaction(t *testing.T) {
	o := Options{Devices: []Device{{Dir: t.TempDir()}}, SegmentSize: 1 << 10, CompactInterval: time.Millisecond}
	db := mustOpen(t, o)
	defer db.Close()
	for i := 0; i < 400; i++ {
		put(t, db, fmt.Sprintf("k%d", i%5), uint64(i+1), fmt.Sprintf("%050d", i))
	}
	db.Sync(db.LastPos())
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return db.Stats().Compactions != 0 }) {
		t.Fatal("no background compaction within 5s")
	}
	wantGet(t, db, "k4", fmt.Sprintf("%050d", 399))
}

func TestBackgroundCheckpoint(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.CheckpointInterval = time.Millisecond
	db := mustOpen(t, o)
	put(t, db, "a", 1, "x")
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool {
		names, _ := fs.ReadDir("/db")
		for _, n := range names {
			if _, ok := parseName(n, ".hint"); ok {
				return true
			}
		}
		return false
	}) {
		t.Fatal("no background checkpoint within 5s")
	}
	db.Close()
	fs.Crash(nil)
	o.CheckpointInterval = 0
	db2 := mustOpen(t, o)
	defer db2.Close()
	if db2.Stats().HintPos == 0 {
		t.Fatal("reopen did not use the background checkpoint")
	}
	wantGet(t, db2, "a", "x")
}

// GetShared returns the same bytes as Get, from the cache without a copy once cached;
// Get keeps handing out private copies of those same cached bytes. A value longer than
// a cache entry's inline room is cached as read; a short one is kept in the entry,
// and hits share that.
func TestGetSharedIsGetWithoutTheCopy(t *testing.T) {
	for _, value := range []string{strings.Repeat("value", 8), "value"} {
		t.Run(fmt.Sprint(len(value)), func(t *testing.T) { testGetSharedIsGetWithoutTheCopy(t, value) })
	}
}

func testGetSharedIsGetWithoutTheCopy(t *testing.T, value string) {
	db, err := Open(Options{Devices: []Device{{Dir: t.TempDir()}}, CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Append(Record{Key: []byte("k"), Value: []byte(value), Version: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.GetShared([]byte("missing")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetShared(missing) = %v, want ErrNotFound", err)
	}
	// Still in the write buffer: served from it, so not shared with anything.
	if v, err := db.GetShared([]byte("k")); err != nil || string(v.Data) != value || v.Version != 1 {
		t.Fatalf("GetShared from the write buffer = %q %d %v", v.Data, v.Version, err)
	}
	if _, err := db.Sync(db.LastPos()); err != nil {
		t.Fatal(err)
	}
	first, err := db.GetShared([]byte("k")) // a cache miss: read from the file, then cached as is
	if err != nil || string(first.Data) != value {
		t.Fatalf("GetShared from the file = %q %v", first.Data, err)
	}
	second, err := db.GetShared([]byte("k"))
	if err != nil || string(second.Data) != value {
		t.Fatalf("GetShared from the cache = %q %v", second.Data, err)
	}
	third, err := db.GetShared([]byte("k"))
	if err != nil || string(third.Data) != value {
		t.Fatalf("GetShared from the cache again = %q %v", third.Data, err)
	}
	if &third.Data[0] != &second.Data[0] || len(value) > len(centry{}.small) && &first.Data[0] != &second.Data[0] {
		t.Fatal("GetShared copied a cached value")
	}
	private, err := db.Get([]byte("k"))
	if err != nil || string(private.Data) != value {
		t.Fatalf("Get = %q %v", private.Data, err)
	}
	if &private.Data[0] == &second.Data[0] {
		t.Fatal("Get handed out the cache's own bytes")
	}
	private.Data[0] = 'X'
	if again, _ := db.GetShared([]byte("k")); string(again.Data) != value {
		t.Fatalf("modifying Get's copy changed the cached value: %q", again.Data)
	}
}
