package shard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vfs"
)

var ctx = context.Background()

// testNode is a shard over a real engine on an in-memory file system that can crash.
type testNode struct {
	t    *testing.T
	fs   *vfs.Mem
	db   *storage.DB
	s    *Shard
	opts Options
}

func newNode(t *testing.T, opts Options) *testNode {
	t.Helper()
	n := &testNode{t: t, fs: vfs.NewMem(), opts: opts}
	n.open()
	t.Cleanup(func() {
		if n.s != nil {
			n.s.Close()
			n.db.Close()
		}
	})
	return n
}

func (n *testNode) open() {
	n.t.Helper()
	db, err := storage.Open(storage.Options{Devices: []storage.Device{{Dir: "/data"}}, FS: n.fs})
	if err != nil {
		n.t.Fatalf("open storage: %v", err)
	}
	s, err := Open(db, n.opts)
	if err != nil {
		n.t.Fatalf("open shard: %v", err)
	}
	n.db, n.s = db, s
}

// crash cuts power (unsynced bytes are lost) and reopens.
func (n *testNode) crash(seed uint64) {
	n.t.Helper()
	n.fs.Crash(rand.New(rand.NewSource(int64(seed))))
	// The old handles are stale after a crash; closing them may fail, which is fine.
	_ = n.s.Close()
	_ = n.db.Close()
	n.open()
}

func (n *testNode) write(op kv.Op, d level.Durability, id ReqID) kv.Result {
	n.t.Helper()
	r, err := n.s.Write(ctx, op, d, id)
	if err != nil {
		n.t.Fatalf("write %v: %v", op.Kind, err)
	}
	return r
}

func (n *testNode) get(key string) (string, bool) {
	n.t.Helper()
	r, err := n.s.Read(ctx, kv.Op{Kind: kv.KindGet, Key: []byte(key)}, level.ConsLinearizable, Session{})
	if err != nil {
		n.t.Fatalf("get %s: %v", key, err)
	}
	return string(r.Bulk), r.Kind == kv.ResBulk
}

func set(k, v string) kv.Op { return kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte(v)} }
func incr(k string, d int64) kv.Op {
	return kv.Op{Kind: kv.KindIncrBy, Key: []byte(k), Delta: d}
}

func TestSyncWriteIsDurableWhenAcknowledged(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true})
	for i := range 50 {
		n.write(set(fmt.Sprint("k", i), fmt.Sprint("v", i)), level.Sync, ReqID{})
	}
	n.crash(1)
	for i := range 50 {
		if v, ok := n.get(fmt.Sprint("k", i)); !ok || v != fmt.Sprint("v", i) {
			t.Fatalf("acknowledged sync write k%d lost after crash: %q %v", i, v, ok)
		}
	}
}

// The check above must be able to fail: async writes are not synced, so a crash
// loses them.
func TestAsyncWritesCanBeLostByACrash(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true, NoReadDurabilityCheck: true})
	n.write(set("k", "v"), level.Async, ReqID{})
	n.crash(1)
	if _, ok := n.get("k"); ok {
		t.Fatal("an unsynced async write survived a crash; the crash model is not exercising anything")
	}
}

func TestCADReadMakesTheValueDurableFirst(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true})
	r := n.write(set("k", "v"), level.CAD, ReqID{})
	if n.db.DurablePos() >= n.db.LastPos() {
		t.Fatal("a cad write was synced before its reply; the test cannot observe the read check")
	}
	if v, ok := n.get("k"); !ok || v != "v" {
		t.Fatalf("get = %q %v", v, ok)
	}
	if n.db.DurablePos() < n.db.LastPos() {
		t.Fatalf("read returned version %d before it was durable", r.Version)
	}
	n.crash(2)
	if v, ok := n.get("k"); !ok || v != "v" {
		t.Fatal("a value a read returned was lost by a crash")
	}
}

// Without the read check, the same sequence returns a value a crash takes back:
// the check is what makes cad safe.
func TestWithoutReadCheckAReadValueCanBeLost(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true, NoReadDurabilityCheck: true})
	n.write(set("k", "v"), level.CAD, ReqID{})
	if _, ok := n.get("k"); !ok {
		t.Fatal("missing")
	}
	n.crash(2)
	if _, ok := n.get("k"); ok {
		t.Fatal("expected the read value to be lost without the check")
	}
}

func TestCADWritesBecomeDurableInTheBackground(t *testing.T) {
	n := newNode(t, Options{})
	n.write(set("k", "v"), level.CAD, ReqID{})
	for range 1000 {
		if n.db.DurablePos() >= n.db.LastPos() {
			return
		}
		runtimeGosched()
	}
	t.Fatal("background syncer did not sync a cad write")
}

func TestVersionsContinueAfterRestart(t *testing.T) {
	n := newNode(t, Options{})
	r1 := n.write(set("a", "1"), level.Sync, ReqID{})
	n.s.Close()
	n.db.Close()
	n.open()
	r2 := n.write(set("b", "2"), level.Sync, ReqID{})
	if r2.Version <= r1.Version {
		t.Fatalf("version after restart %d not above %d", r2.Version, r1.Version)
	}
}

func TestReadModifyWritesInOneBatchSeeEachOther(t *testing.T) {
	n := newNode(t, Options{})
	reqs := []WriteReq{
		{Op: incr("x", 1)}, {Op: incr("x", 1)}, {Op: incr("x", 5)},
		{Op: kv.Op{Kind: kv.KindAppend, Key: []byte("s"), Value: []byte("ab")}},
		{Op: kv.Op{Kind: kv.KindAppend, Key: []byte("s"), Value: []byte("cd")}},
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte("n"), Value: []byte("1"), Cond: kv.IfAbsent}},
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte("n"), Value: []byte("2"), Cond: kv.IfAbsent}},
		{Op: kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("n"), []byte("n"), []byte("missing")}}},
		{Op: kv.Op{Kind: kv.KindCAS, Key: []byte("s"), Expected: []byte("abcd"), Value: []byte("z")}},
		{Op: kv.Op{Kind: kv.KindGetSet, Key: []byte("s"), Value: []byte("y")}},
	}
	p, err := n.s.Apply(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.s.Wait(ctx, p); err != nil {
		t.Fatal(err)
	}
	want := []string{"int 1", "int 2", "int 7", "int 2", "int 4", "ok", "nil", "int 1", "int 1", "bulk z"}
	for i, r := range reqs {
		if r.Err != nil {
			t.Fatalf("req %d: %v", i, r.Err)
		}
		if got := show(r.Result); got != want[i] {
			t.Errorf("req %d (%v): got %s, want %s", i, r.Op.Kind, got, want[i])
		}
	}
	if v, _ := n.get("s"); v != "y" {
		t.Fatalf("s = %q", v)
	}
}

func show(r kv.Result) string {
	switch r.Kind {
	case kv.ResOK:
		return "ok"
	case kv.ResInt:
		return fmt.Sprint("int ", r.Int)
	case kv.ResBulk:
		return "bulk " + string(r.Bulk)
	case kv.ResNil:
		return "nil"
	}
	return fmt.Sprint("array ", len(r.Array))
}

func TestIncrErrors(t *testing.T) {
	n := newNode(t, Options{})
	n.write(set("s", "abc"), level.Sync, ReqID{})
	for _, v := range []string{"abc", "", " 1", "1 ", "+1", "01", "99999999999999999999"} {
		n.write(set("s", v), level.Sync, ReqID{})
		if _, err := n.s.Write(ctx, incr("s", 1), 0, ReqID{}); !errors.Is(err, kv.ErrWrongType) {
			t.Errorf("INCR of %q: err = %v, want kv.ErrWrongType", v, err)
		}
	}
	n.write(set("m", fmt.Sprint(int64(math.MaxInt64))), level.Sync, ReqID{})
	if _, err := n.s.Write(ctx, incr("m", 1), 0, ReqID{}); !errors.Is(err, kv.ErrOverflow) {
		t.Errorf("overflow: err = %v", err)
	}
	if v, _ := n.get("m"); v != fmt.Sprint(int64(math.MaxInt64)) {
		t.Errorf("failed INCR changed the value to %q", v)
	}
}

func TestRetriedWriteExecutesAtMostOnceAcrossACrash(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true})
	id := ReqID{Client: 42, Seq: 1}
	r1 := n.write(incr("x", 1), level.Sync, id)
	r2 := n.write(incr("x", 1), level.Sync, id) // a retry: same id
	if r1.Int != 1 || r2.Int != 1 {
		t.Fatalf("retry re-executed: %d then %d", r1.Int, r2.Int)
	}
	n.crash(3)
	r3 := n.write(incr("x", 1), level.Sync, id) // a retry after the crash
	if r3.Int != 1 {
		t.Fatalf("retry after crash re-executed: got %d", r3.Int)
	}
	if _, err := n.s.Write(ctx, incr("x", 1), level.Sync, ReqID{Client: 42, Seq: 0}); !errors.Is(err, ErrStaleRequest) {
		t.Fatalf("older seq: err = %v, want ErrStaleRequest", err)
	}
	if r := n.write(incr("x", 1), level.Sync, ReqID{Client: 42, Seq: 2}); r.Int != 2 {
		t.Fatalf("next seq: %d", r.Int)
	}
	if v, _ := n.get("x"); v != "2" {
		t.Fatalf("x = %q", v)
	}
}

// The dedup check must be able to fail: without ids the same write executes twice.
func TestWithoutRequestIDsRetriesExecuteTwice(t *testing.T) {
	n := newNode(t, Options{})
	n.write(incr("x", 1), level.Sync, ReqID{})
	if r := n.write(incr("x", 1), level.Sync, ReqID{}); r.Int != 2 {
		t.Fatalf("got %d", r.Int)
	}
}

func TestReservedKeysAreRefusedAndHidden(t *testing.T) {
	n := newNode(t, Options{})
	n.write(incr("a", 1), level.Sync, ReqID{Client: 7, Seq: 1})
	if _, err := n.s.Write(ctx, set(string(kv.ReservedPrefix)+"x", "v"), 0, ReqID{}); !errors.Is(err, kv.ErrReservedKey) {
		t.Fatalf("err = %v", err)
	}
	r, err := n.s.Read(ctx, kv.Op{Kind: kv.KindScan, Key: []byte("")}, level.ConsLinearizable, Session{})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Array) != 2 || string(r.Array[0]) != "a" {
		t.Fatalf("scan shows %q", r.Array)
	}
}

func TestScanIsOrderedAndLimited(t *testing.T) {
	n := newNode(t, Options{})
	n.write(kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("c"), []byte("3"), []byte("a"), []byte("1"), []byte("b"), []byte("2"), []byte("d"), []byte("4")}}, 0, ReqID{})
	r, err := n.s.Read(ctx, kv.Op{Kind: kv.KindScan, Key: []byte("a"), End: []byte("d"), Limit: 2}, level.ConsEventual, Session{})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%s", r.Array); got != "[a 1 b 2]" {
		t.Fatalf("scan = %s", got)
	}
}

func TestSessionAheadOfReplicaIsRefused(t *testing.T) {
	n := newNode(t, Options{})
	r := n.write(set("a", "1"), level.Sync, ReqID{})
	s := Session{}.AfterWrite(r.Pos())
	if _, err := n.s.Read(ctx, kv.Op{Kind: kv.KindGet, Key: []byte("a")}, level.ConsSession, s); err != nil {
		t.Fatalf("own session refused: %v", err)
	}
	s.LastWrite += 100
	if _, err := n.s.Read(ctx, kv.Op{Kind: kv.KindGet, Key: []byte("a")}, level.ConsSession, s); !errors.Is(err, ErrSessionAhead) {
		t.Fatalf("err = %v, want ErrSessionAhead", err)
	}
}

func TestSessionTokens(t *testing.T) {
	for _, tok := range []string{"", "v1.0.5", "v1.12.7"} {
		s, err := ParseSession(tok)
		if err != nil {
			t.Fatalf("%q: %v", tok, err)
		}
		if s.String() != tok && !(tok == "v1.0.0") {
			t.Errorf("round trip %q -> %q", tok, s.String())
		}
	}
	for _, bad := range []string{"v2.1.1", "v1.1", "v1.a.1", "v1.1.-1", "x", "v1.1.1.1"} {
		if _, err := ParseSession(bad); !errors.Is(err, ErrBadSession) {
			t.Errorf("%q accepted", bad)
		}
	}
}

func runtimeGosched() { time.Sleep(time.Millisecond) }

func TestIdleClientsExpireFromTheTable(t *testing.T) {
	now := time.Unix(1000, 0)
	n := newNode(t, Options{ClientTTL: time.Hour, Now: func() time.Time { return now }})
	n.s.sweepEvery = 1
	n.write(incr("x", 1), level.Sync, ReqID{Client: 1, Seq: 1})
	n.write(incr("y", 1), level.Sync, ReqID{Client: 2, Seq: 1})
	now = now.Add(50 * time.Minute)
	n.write(incr("y", 1), level.Sync, ReqID{Client: 2, Seq: 2}) // client 2 stays active
	now = now.Add(20 * time.Minute)
	n.write(set("z", "1"), level.Sync, ReqID{}) // a write triggers the sweep
	if got := n.s.Status().Clients; got != 1 {
		t.Fatalf("client table has %d entries, want 1 (client 1 idle > TTL)", got)
	}
	// Forgotten across a restart too: the tombstone is in the engine.
	n.s.Close()
	n.db.Close()
	n.open()
	if got := n.s.Status().Clients; got != 1 {
		t.Fatalf("after restart the table has %d entries, want 1", got)
	}
	// Client 2 is still deduplicated; client 1's old retry now executes again,
	// which is the documented limit of the TTL.
	if r := n.write(incr("y", 1), level.Sync, ReqID{Client: 2, Seq: 2}); r.Int != 2 {
		t.Fatalf("active client's retry re-executed: %d", r.Int)
	}
	if r := n.write(incr("x", 1), level.Sync, ReqID{Client: 1, Seq: 1}); r.Int != 2 {
		t.Fatalf("expired client's retry: %d", r.Int)
	}
}

// A read that reports a key missing because of a cad deletion makes the deletion
// durable first: a crash must not bring back a value a read said was gone.
func TestCADReadOfADeletedKeyMakesTheDeletionDurable(t *testing.T) {
	for _, check := range []bool{true, false} {
		n := newNode(t, Options{NoBackgroundSync: true, NoReadDurabilityCheck: !check})
		n.write(set("k", "v"), level.Sync, ReqID{})
		n.write(kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte("k")}}, level.CAD, ReqID{})
		if _, ok := n.get("k"); ok {
			t.Fatal("deleted key still visible")
		}
		n.crash(4)
		_, back := n.get("k")
		if check && back {
			t.Fatal("with the read check, a deletion a read observed was undone by a crash")
		}
		if !check && !back {
			t.Fatal("without the read check the deletion should have been lost (the test would prove nothing)")
		}
	}
}

// Async writes promise nothing, so reading them costs no fsync; a cad value read
// right after is still made durable.
func TestReadCheckSkipsAsyncValues(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true})
	n.write(set("a", "1"), level.Async, ReqID{})
	n.get("a")
	if n.db.DurablePos() >= n.db.LastPos() {
		t.Fatal("reading an async value forced an fsync")
	}
	n.write(set("c", "1"), level.CAD, ReqID{})
	n.write(set("a", "2"), level.Async, ReqID{})
	n.get("c")
	if n.s.Status().ReadSyncs != 1 {
		t.Fatalf("read syncs = %d, want 1 (reading the cad value)", n.s.Status().ReadSyncs)
	}
	n.crash(5)
	if v, ok := n.get("c"); !ok || v != "1" {
		t.Fatal("a cad value a read returned was lost by a crash")
	}
}

// A retry answered from the client table is not acknowledged as sync before the
// original write is durable.
func TestDedupedSyncRetryWaitsForDurability(t *testing.T) {
	n := newNode(t, Options{NoBackgroundSync: true})
	id := ReqID{Client: 9, Seq: 1}
	n.write(set("k", "v"), level.Async, id)
	if n.db.DurablePos() >= n.db.LastPos() {
		t.Fatal("setup: the async write is already durable")
	}
	n.write(set("k", "v"), level.Sync, id)
	if n.db.DurablePos() < n.db.LastPos() {
		t.Fatal("a sync retry was answered from the table before the original write was durable")
	}
	if n.s.Status().Deduped != 1 {
		t.Fatal("the retry was not deduplicated")
	}
}
