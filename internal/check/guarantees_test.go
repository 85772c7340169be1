package check

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
)

type checkCase struct {
	name  string
	build func(b *hist)
	// wantReason is a substring of the first violation; "" means must pass.
	wantReason string
}

func runCases(t *testing.T, check func(History) Verdict, cases []checkCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b hist
			c.build(&b)
			v := check(b.h)
			if c.wantReason == "" {
				if !v.OK {
					t.Fatalf("want pass, got %v", v)
				}
				return
			}
			if v.OK {
				t.Fatalf("want violation %q, got %v", c.wantReason, v)
			}
			if !strings.Contains(v.Violations[0].Reason, c.wantReason) {
				t.Fatalf("want violation %q, got %v", c.wantReason, v)
			}
			if n := len(v.Violations[0].Ops); n == 0 || n > 4 {
				t.Fatalf("counter-example should be 1-4 ops, got %v", v)
			}
		})
	}
}

func TestSession(t *testing.T) {
	s := cons(level.ConsSession)
	runCases(t, func(h History) Verdict { return Session(h, SessionOptions{}) }, []checkCase{
		{"own write then own read", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.get(0, "x", "a", 20, 30, s)
		}, ""},
		{"another session may read stale", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30)
			b.get(1, "x", "a", 40, 50, s)
			b.get(1, "x", "a", 60, 70, s)
		}, ""},
		{"read-my-writes broken", func(b *hist) {
			b.put(1, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30)
			b.get(0, "x", "a", 40, 50, s)
		}, "read-my-writes"},
		{"read-my-writes broken by absent read", func(b *hist) {
			b.put(0, "x", "b", 20, 30)
			b.get(0, "x", "nil", 40, 50, s)
		}, "read-my-writes"},
		{"session token shared by two clients carries read-my-writes", func(b *hist) {
			b.put(3, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30, sess("t1"))
			b.get(1, "x", "a", 40, 50, s, sess("t1"))
		}, "read-my-writes"},
		{"monotonic reads broken", func(b *hist) {
			b.put(1, "x", "a", 0, 10)
			b.put(1, "x", "b", 20, 30)
			b.get(0, "x", "b", 40, 50, s)
			b.get(0, "x", "a", 60, 70, s)
		}, "monotonic reads"},
		{"monotonic writes broken (versions)", func(b *hist) {
			b.put(0, "x", "a", 0, 10, ver(9))
			b.put(0, "x", "b", 20, 30, ver(5))
		}, "monotonic writes"},
		{"versions decide, not real time", func(b *hist) {
			// With versions, b (v5) is older than a (v9) although it completed
			// later in real time: reading a after b is fine.
			b.put(1, "x", "a", 0, 10, ver(9))
			b.put(2, "x", "b", 20, 30, ver(5))
			b.get(0, "x", "b", 40, 50, s, ver(5))
			b.get(0, "x", "a", 60, 70, s, ver(9))
		}, ""},
	})
}

// NoMonotonicWrites drops only that guarantee: reads are judged as before.
func TestSessionWithoutMonotonicWrites(t *testing.T) {
	s := cons(level.ConsSession)
	runCases(t, func(h History) Verdict { return Session(h, SessionOptions{NoMonotonicWrites: true}) }, []checkCase{
		{"monotonic writes not judged", func(b *hist) {
			b.put(0, "x", "a", 0, 10, ver(9))
			b.put(0, "x", "b", 20, 30, ver(5))
		}, ""},
		{"read-my-writes still judged", func(b *hist) {
			b.put(0, "x", "b", 20, 30, ver(9))
			b.get(0, "x", "a", 40, 50, s, ver(5))
		}, "read-my-writes"},
		// A lost write's op number reused: the session's later write got a
		// lower version than its earlier (lost) one, and a read returning
		// that later write reflects every write of the session.
		{"a later write with a reused lower version supersedes", func(b *hist) {
			b.put(0, "x", "a", 0, 10, ver(9))
			b.put(0, "x", "b", 20, 30, ver(5))
			b.get(0, "x", "b", 40, 50, s, ver(5))
		}, ""},
		{"read older than the session's latest write", func(b *hist) {
			b.put(0, "x", "a", 0, 10, ver(9))
			b.put(0, "x", "b", 20, 30, ver(5))
			b.put(1, "x", "c", 32, 35, ver(3))
			b.get(0, "x", "c", 40, 50, s, ver(3))
		}, "read-my-writes"},
		{"monotonic reads still judged", func(b *hist) {
			b.put(1, "x", "a", 0, 10)
			b.put(1, "x", "b", 20, 30)
			b.get(0, "x", "b", 40, 50, s)
			b.get(0, "x", "a", 60, 70, s)
		}, "monotonic reads"},
	})
}

func TestSessionNotesMissingVersions(t *testing.T) {
	var b hist
	b.put(0, "x", "a", 0, 10)
	v := Session(b.h, SessionOptions{})
	if !v.OK || !strings.Contains(v.Note, "monotonic writes not checked") {
		t.Fatalf("want pass with a note, got %v", v)
	}
}

func TestCrossClientMonotonic(t *testing.T) {
	c := cons(level.ConsCrossClient)
	runCases(t, CrossClientMonotonic, []checkCase{
		{"concurrent reads may disagree", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 100)
			b.get(1, "x", "b", 30, 60, c)
			b.get(2, "x", "a", 50, 70, c)
		}, ""},
		{"stale read allowed before anyone saw the new value", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30)
			b.get(2, "x", "a", 50, 70, c)
			b.get(1, "x", "b", 80, 90, c)
		}, ""},
		{"another client's later read goes back in time", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30)
			b.get(1, "x", "b", 40, 50, c)
			b.get(2, "x", "a", 60, 70, c)
		}, "older than one an earlier read"},
		{"key seen then not found", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.get(1, "x", "a", 40, 50, c)
			b.get(2, "x", "nil", 60, 70, c)
		}, "older than one an earlier read"},
		{"read of a value never written", func(b *hist) {
			b.get(2, "x", "zz", 60, 70, c)
		}, "no write produced"},
		{"eventual reads are not judged", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30)
			b.get(1, "x", "b", 40, 50, c)
			b.get(2, "x", "a", 60, 70, cons(level.ConsEventual))
		}, ""},
	})
}

func TestBoundedStaleness(t *testing.T) {
	runCases(t, BoundedStaleness, []checkCase{
		{"one version behind within bound(1)", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30)
			b.get(1, "x", "a", 40, 50, bounded(1))
		}, ""},
		{"two versions behind breaks bound(1)", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30)
			b.put(0, "x", "c", 40, 50)
			b.get(1, "x", "a", 60, 70, bounded(1))
		}, "2 versions stale, bound is 1"},
		{"bound(0) is a fresh read", func(b *hist) {
			b.put(0, "x", "a", 0, 10)
			b.put(0, "x", "b", 20, 30)
			b.get(1, "x", "a", 40, 50, bounded(0))
		}, "1 versions stale"},
		{"superseded recently enough", func(b *hist) {
			b.put(0, "x", "a", 0, ms(10))
			b.put(0, "x", "b", ms(20), ms(30))
			b.get(1, "x", "a", ms(100), ms(110), within(100*time.Millisecond))
		}, ""},
		{"superseded too long ago", func(b *hist) {
			b.put(0, "x", "a", 0, ms(10))
			b.put(0, "x", "b", ms(20), ms(30))
			b.get(1, "x", "a", ms(200), ms(210), within(100*time.Millisecond))
		}, "superseded"},
	})
}

// TestEventual: an eventual read may be stale, but only within the window:
// a version superseded more than the window before the read began fails,
// as do phantoms; other levels' reads are not judged here.
func TestEventual(t *testing.T) {
	window := 100 * time.Millisecond
	check := func(h History) Verdict { return Eventual(h, window) }
	ev := cons(level.ConsEventual)
	runCases(t, check, []checkCase{
		{"stale within the window", func(b *hist) {
			b.put(0, "x", "a", 0, ms(10))
			b.put(0, "x", "b", ms(20), ms(30))
			b.get(1, "x", "a", ms(100), ms(110), ev)
		}, ""},
		{"absent before the first write completed long ago is too old", func(b *hist) {
			b.put(0, "x", "a", 0, ms(10))
			b.get(1, "x", "nil", ms(500), ms(510), ev)
		}, "superseded"},
		{"a partitioned follower serving for seconds", func(b *hist) {
			b.put(0, "x", "a", 0, ms(10))
			b.put(0, "x", "b", ms(20), ms(30))
			b.get(1, "x", "a", ms(3000), ms(3010), ev)
		}, "superseded"},
		{"a write still in flight does not count", func(b *hist) {
			b.put(0, "x", "a", 0, ms(10))
			b.put(0, "x", "b", ms(20), ms(900))
			b.get(1, "x", "a", ms(500), ms(510), ev)
		}, ""},
		{"phantom", func(b *hist) {
			b.put(0, "x", "a", 0, ms(10))
			b.get(1, "x", "zz", ms(20), ms(30), ev)
		}, "no write produced"},
		{"linearizable reads are not judged", func(b *hist) {
			b.put(0, "x", "a", 0, ms(10))
			b.put(0, "x", "b", ms(20), ms(30))
			b.get(1, "x", "a", ms(3000), ms(3010))
		}, ""},
	})
}

func TestDurability(t *testing.T) {
	sync, cad, async := dur(level.Sync), dur(level.CAD), dur(level.Async)
	runCases(t, Durability, []checkCase{
		{"sync write survives", func(b *hist) {
			b.put(0, "x", "a", 0, 10, sync)
			b.crash(AllNodes, 20)
			b.get(1, "x", "a", 30, 40)
		}, ""},
		{"sync write lost", func(b *hist) {
			b.put(0, "x", "a", 0, 10, sync)
			b.put(0, "x", "b", 12, 15, sync)
			b.crash(AllNodes, 20)
			b.get(1, "x", "a", 30, 40)
		}, "sync write acknowledged before the crash is lost"},
		{"cad write nobody read may be lost", func(b *hist) {
			b.put(0, "x", "a", 0, 10, sync)
			b.put(0, "x", "b", 12, 15, cad)
			b.crash(AllNodes, 20)
			b.get(1, "x", "a", 30, 40)
		}, ""},
		{"cad write that was read must not be lost", func(b *hist) {
			b.put(0, "x", "a", 0, 10, sync)
			b.put(0, "x", "b", 12, 15, cad)
			b.get(2, "x", "b", 16, 18, cons(level.ConsEventual))
			b.crash(AllNodes, 20)
			b.get(1, "x", "a", 30, 40)
		}, "value read before the crash is lost"},
		{"async write that was read may be lost", func(b *hist) {
			b.put(0, "x", "a", 0, 10, sync)
			b.put(0, "x", "b", 12, 15, async)
			b.get(2, "x", "b", 16, 18)
			b.crash(AllNodes, 20)
			b.get(1, "x", "a", 30, 40)
		}, ""},
		{"sync delete lost brings a value back", func(b *hist) {
			b.put(0, "x", "a", 0, 10, sync)
			b.del(0, "x", 12, 15, sync)
			b.crash(2, 20)
			b.get(1, "x", "a", 30, 40)
		}, "sync write acknowledged before the crash is lost"},
	})
}

func TestDurabilityWithoutCrashesSaysSo(t *testing.T) {
	var b hist
	b.put(0, "x", "a", 0, 10)
	if v := Durability(b.h); !v.OK || v.Note == "" {
		t.Fatalf("want pass with a note, got %v", v)
	}
}

func TestRecorderConcurrentClients(t *testing.T) {
	r := NewRecorder(nil)
	var wg sync.WaitGroup
	for c := 0; c < 8; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				id := r.Invoke(Op{Client: c, Kind: Put, Key: "k", Value: "v"})
				switch i % 3 {
				case 0:
					r.Complete(id, Result{Version: uint64(i + 1), Node: 1})
				case 1:
					r.Unknown(id)
				case 2:
					r.Fail(id)
				}
			}
		}()
	}
	wg.Wait()
	pending := r.Invoke(Op{Client: 99, Kind: Get, Key: "k"})
	r.Crash(AllNodes)
	h := r.History()
	if len(h.Ops) != 801 || len(h.Crashes) != 1 {
		t.Fatalf("got %d ops, %d crashes", len(h.Ops), len(h.Crashes))
	}
	for i, op := range h.Ops {
		if op.ID != i {
			t.Fatalf("op %d has id %d", i, op.ID)
		}
		if op.Outcome == OK && op.Return < op.Invoke {
			t.Fatalf("op returned before invoked: %v", op)
		}
		if op.Outcome == Unknown && op.Return != Never {
			t.Fatalf("unknown op must return at Never: %v", op)
		}
	}
	if h.Ops[pending].Outcome != Unknown {
		t.Fatalf("pending op should read as unknown, got %v", h.Ops[pending])
	}
}

func TestRecorderRejectsHarnessBugs(t *testing.T) {
	r := NewRecorder(func() int64 { return 0 })
	id := r.Invoke(Op{Client: 1, Kind: Get, Key: "k"})
	mustPanic(t, "second op in flight", func() { r.Invoke(Op{Client: 1, Kind: Get, Key: "k"}) })
	r.Complete(id, Result{})
	mustPanic(t, "double completion", func() { r.Complete(id, Result{}) })
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatalf("%s: want panic", what)
		}
	}()
	f()
}

// A server that reports versions on writes but not on some reads must not
// make those reads look like reads of the initial state.
func TestVersionsOnlyWhenReadsCarryThem(t *testing.T) {
	c := cons(level.ConsCrossClient)
	var b hist
	b.put(0, "x", "a", 0, 10, ver(5))
	b.get(1, "x", "a", 20, 30, c, ver(5))
	b.get(2, "x", "a", 40, 50, c) // no version reported
	if v := CrossClientMonotonic(b.h); !v.OK {
		t.Fatalf("unversioned read judged as initial state: %v", v)
	}
	var d hist
	d.put(0, "x", "a", 0, 10, ver(5))
	d.del(0, "x", 20, 30, ver(6))
	d.get(1, "x", "nil", 40, 50, c, ver(6))
	d.get(2, "x", "nil", 60, 70, c) // tombstone version not reported
	if v := CrossClientMonotonic(d.h); !v.OK {
		t.Fatalf("absent read without tombstone version judged as initial state: %v", v)
	}
}

func TestMonotonicState(t *testing.T) {
	c := cons(level.ConsCrossClient)
	runCases(t, MonotonicState, []checkCase{
		{"later write seen, earlier one seen after", func(b *hist) {
			b.put(0, "a", "1", 0, 10)
			b.put(0, "b", "1", 20, 30)
			b.get(1, "b", "1", 40, 50, c)
			b.get(2, "a", "1", 60, 70, c)
		}, ""},
		{"concurrent reads may disagree", func(b *hist) {
			b.put(0, "a", "1", 0, 10)
			b.put(0, "b", "1", 20, 30)
			b.get(1, "b", "1", 40, 50, c)
			b.get(2, "a", "nil", 45, 70, c)
		}, ""},
		{"writes of different clients carry no order", func(b *hist) {
			b.put(0, "a", "1", 0, 10)
			b.put(3, "b", "1", 20, 30)
			b.get(1, "b", "1", 40, 50, c)
			b.get(2, "a", "nil", 60, 70, c)
		}, ""},
		{"saw b=1 so a=1 is in the state; a later read misses it", func(b *hist) {
			b.put(0, "a", "1", 0, 10)
			b.put(0, "b", "1", 20, 30)
			b.get(1, "b", "1", 40, 50, c)
			b.get(2, "a", "nil", 60, 70, c)
		}, "older than client 0's write"},
		{"after a crash the prefix must survive too", func(b *hist) {
			b.put(0, "a", "1", 0, 10)
			b.put(0, "a", "2", 12, 15)
			b.put(0, "b", "1", 20, 30)
			b.get(1, "b", "1", 40, 50, c)
			b.crash(AllNodes, 55)
			b.get(2, "a", "1", 60, 70, c)
		}, "older than client 0's write"},
	})
}
