package shard

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"testing"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

// Crashes with no write between them: each open records the versions the life
// before may have handed out as a hole. Before the fix the second such open
// recorded a hole at the same start as the first (same reserved key, same engine
// version), the engine refused it, and the directory never opened again; with a
// write in the first life that write became unreachable with it.
func TestRepeatedCrashesWithoutWrites(t *testing.T) {
	for _, c := range []struct {
		name  string
		setup func(n *testNode)
	}{
		{"fresh", func(*testNode) {}},
		{"one write first", func(n *testNode) { n.write(set("first", "v"), level.Sync, ReqID{}) }},
		{"clean restart first", func(n *testNode) {
			n.write(set("first", "v"), level.Sync, ReqID{})
			n.closeClean()
			n.open()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t, Options{NoBackgroundSync: true})
			c.setup(n)
			_, hadFirst := n.get("first")
			for i := range 6 {
				n.crashClean() // fails the test if the directory does not open
				if _, ok := n.get("first"); ok != hadFirst {
					t.Fatalf("crash %d: first write present = %v, want %v", i+1, ok, hadFirst)
				}
			}
			// The node still works, hands out versions above every hole, and the
			// holes of consecutive write-less crashes are one range in memory.
			r := n.write(set("after", "v"), level.Sync, ReqID{})
			for _, h := range n.s.holes {
				if r.Version < h.hi {
					t.Fatalf("version %d handed out below hole %+v", r.Version, h)
				}
			}
			if len(n.s.holes) != 1 {
				t.Fatalf("holes = %+v, want the write-less crashes merged into one", n.s.holes)
			}
			n.crashClean()
			if v, _ := n.get("after"); v != "v" {
				t.Fatalf("after = %q, want v", v)
			}
		})
	}
}

// quiet drops the shard's log: a crash loop logs a hole on almost every open.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// closeClean closes the shard and the engine as a graceful stop does.
func (n *testNode) closeClean() {
	n.t.Helper()
	if err := n.s.Close(); err != nil {
		n.t.Fatal(err)
	}
	if err := n.db.Close(); err != nil {
		n.t.Fatal(err)
	}
}

// tryOpen opens the engine and the shard, reporting a failure instead of
// failing the test (a power cut may interrupt the open itself).
func (n *testNode) tryOpen() error {
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/data"}}, FS: n.fs})
	if err != nil {
		return fmt.Errorf("open storage: %w", err)
	}
	s, err := Open(db, n.opts)
	if err != nil {
		db.Close()
		return fmt.Errorf("open shard: %w", err)
	}
	n.db, n.s = db, s
	return nil
}

// TestCrashLoopRandom crashes one directory many times in a row at random
// moments: during open, between writes, mid-write, and after lives that wrote
// nothing; sometimes with a clean stop in between. After each crash the
// directory must open, hold every write acknowledged as durable (sync), never
// hand a version out twice, and fail the session of an async write the crash
// took back.
func TestCrashLoopRandom(t *testing.T) {
	seeds, lives := 15, 30
	switch {
	case os.Getenv("KEFIR_SOAK") == "1":
		seeds, lives = 1000, 60
	case testing.Short():
		seeds = 5
	}
	var crashes, writeless, midOpen, lostAsync, cleanStops int
	for seed := int64(0); seed < int64(seeds); seed++ {
		rng := rand.New(rand.NewSource(seed))
		n := &testNode{t: t, fs: vfs.NewMem(), opts: Options{NoBackgroundSync: true, Logger: quiet}}
		durable := map[string]string{} // key -> value acknowledged as durable
		type asyncWrite struct {
			key string
			ver uint64
		}
		var async []asyncWrite
		seen := map[uint64]bool{}
		for life := 0; life < lives; life++ {
			if rng.Intn(6) == 0 {
				n.fs.CrashAfter(rng.Intn(8)) // a power cut during the open itself
			}
			if err := n.tryOpen(); err != nil {
				if !n.fs.PoweredOff() {
					t.Fatalf("seed %d life %d: %v", seed, life, err)
				}
				midOpen++
				crashes++
				n.fs.Crash(rng)
				continue
			}
			n.fs.CrashAfter(-1)
			for k, v := range durable {
				got, ok := n.get(k)
				if !ok || got != v {
					t.Fatalf("seed %d life %d: acknowledged %s=%q, read %q (present %v)", seed, life, k, v, got, ok)
				}
			}
			for _, a := range async {
				if _, ok := n.get(a.key); ok {
					continue
				}
				if _, err := n.sessionGet(a.key, Session{LastWrite: a.ver}); !errors.Is(err, ErrSessionLost) {
					t.Fatalf("seed %d life %d: async %s (version %d) was lost but its session got %v", seed, life, a.key, a.ver, err)
				}
				lostAsync++
			}
			async = async[:0]
			nw := 0
			if rng.Intn(2) == 0 {
				nw = 1 + rng.Intn(20)
			}
			if nw > 0 && rng.Intn(2) == 0 {
				n.fs.CrashAfter(rng.Intn(4 * nw)) // a power cut mid-write
			}
			for i := 0; i < nw; i++ {
				key := fmt.Sprintf("k%d.%d", life, i)
				d := level.Sync
				if rng.Intn(3) == 0 {
					d = level.Async
				}
				r, err := n.s.Write(ctx, set(key, key), d, ReqID{})
				if err != nil {
					if !n.fs.PoweredOff() {
						t.Fatalf("seed %d life %d: write: %v", seed, life, err)
					}
					break
				}
				if seen[r.Version] {
					t.Fatalf("seed %d life %d: version %d handed out twice", seed, life, r.Version)
				}
				seen[r.Version] = true
				if d == level.Sync {
					durable[key] = key
				} else {
					async = append(async, asyncWrite{key, r.Version})
				}
			}
			if nw == 0 {
				writeless++
			}
			if !n.fs.PoweredOff() && rng.Intn(8) == 0 {
				// A graceful stop, unless a scheduled power cut interrupts it.
				serr, derr := n.s.Close(), n.db.Close()
				if serr == nil && derr == nil {
					cleanStops++
					continue
				}
				if !n.fs.PoweredOff() {
					t.Fatalf("seed %d life %d: clean stop: %v, %v", seed, life, serr, derr)
				}
			}
			crashes++
			n.fs.Crash(rng)
			_ = n.s.Close() // stale handles after the crash: errors are expected
			_ = n.db.Close()
		}
		if err := n.tryOpen(); err != nil {
			t.Fatalf("seed %d: final open: %v", seed, err)
		}
		for k, v := range durable {
			if got, ok := n.get(k); !ok || got != v {
				t.Fatalf("seed %d: after the last crash, acknowledged %s=%q reads %q (present %v)", seed, k, v, got, ok)
			}
		}
		n.closeClean()
	}
	t.Logf("%d seeds x %d lives: %d crashes (%d during open), %d write-less lives, %d clean stops, %d lost async writes refused to their sessions",
		seeds, lives, crashes, midOpen, writeless, cleanStops, lostAsync)
	if midOpen == 0 || writeless == 0 || lostAsync == 0 {
		t.Fatal("the loop did not exercise crashes during open, write-less lives and lost async writes")
	}
}
