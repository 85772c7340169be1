package server

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// xgCluster is two groups over three nodes, with different leaders (group
// 1's members are 1,2,3, group 2's 2,3,1), cross-group transactions on, and
// a key of each group; l1 is group 1's leader (transactions begin there: a
// transaction's first key takes a linearizable start at its leader).
type xgCluster struct {
	g      *group
	l1     int
	k1, k2 string
}

func startXG(t *testing.T, on bool) *xgCluster {
	t.Helper()
	g := startGroupWith(t, func(c *Config) {
		c.CrossGroupTx = on
		c.Groups = []cluster.GroupSpec{
			{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{2, 3, 1}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
		}
	})
	x := &xgCluster{g: g}
	for i := 0; x.k1 == "" || x.k2 == ""; i++ {
		k := fmt.Sprintf("acct%d", i)
		if cluster.Slot([]byte(k)) < 8192 && x.k1 == "" {
			x.k1 = k
		} else if cluster.Slot([]byte(k)) >= 8192 && x.k2 == "" {
			x.k2 = k
		}
	}
	for _, gid := range []cluster.GroupID{1, 2} {
		if !testgroup.Until(20*time.Second, 10*time.Millisecond, func() bool {
			id, _, ok := g.nodes[0].multi.Leader(gid)
			for _, n := range g.nodes[1:] {
				if o, _, ok2 := n.multi.Leader(gid); !ok || !ok2 || o != id {
					return false
				}
			}
			if gid == 1 {
				x.l1 = int(id) - 1
			}
			return true
		}) {
			t.Fatalf("group %d has no agreed leader", gid)
		}
	}
	return x
}

// TestCrossGroupTx: a KEFIR.TX transaction over keys of two groups (led by
// different nodes) commits in two phases; a conflicting one aborts; a
// read-only one is validated; the locks are gone after each.
func TestCrossGroupTx(t *testing.T) {
	x := startXG(t, true)
	a, b := dial(t, x.g.nodes[x.l1]), dial(t, x.g.nodes[x.l1])
	a.expect(`
SET ` + x.k1 + ` 100 => OK
SET ` + x.k2 + ` 0 => OK
`)
	transfer := func(c *client) (h string) {
		h = txBegin(t, c, "SERIALIZABLE")
		c.expect(`
KEFIR.TX INCRBY ` + h + ` ` + x.k1 + ` -10 => (integer) *
KEFIR.TX INCRBY ` + h + ` ` + x.k2 + ` 10 => (integer) *
`)
		return h
	}
	h := transfer(a)
	a.expect(`KEFIR.TX COMMIT ` + h + ` => (integer) 0`)
	a.expect(`
GET ` + x.k1 + ` => "90"
GET ` + x.k2 + ` => "10"
`)
	// Two transfers from the same start: the second aborts.
	h1, h2 := transfer(a), transfer(b)
	a.expect(`KEFIR.TX COMMIT ` + h1 + ` => (integer) 0`)
	if got := b.do("KEFIR.TX", "COMMIT", h2); !strings.HasPrefix(got, "TXABORT") {
		t.Fatalf("second transfer: %s, want TXABORT", got)
	}
	a.expect(`GET ` + x.k1 + ` => "80"`)
	// A read-only transaction across groups is validated: a write between
	// its read and its commit aborts it.
	h = txBegin(t, a, "SERIALIZABLE")
	a.expect(`
KEFIR.TX GET ` + h + ` ` + x.k1 + ` => "80"
KEFIR.TX GET ` + h + ` ` + x.k2 + ` => "20"
`)
	b.expect(`SET ` + x.k2 + ` 21 => OK`)
	if got := a.do("KEFIR.TX", "COMMIT", h); !strings.HasPrefix(got, "TXABORT") {
		t.Fatalf("read-only across a write: %s, want TXABORT", got)
	}
	h = txBegin(t, a, "SI") // validated as SERIALIZABLE across groups
	a.expect(`
KEFIR.TX GET ` + h + ` ` + x.k1 + ` => "80"
KEFIR.TX GET ` + h + ` ` + x.k2 + ` => "21"
KEFIR.TX COMMIT ` + h + ` => (integer) 0
`)
	for i, n := range x.g.nodes {
		if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool {
			return !n.multi.TxLocked([][]byte{[]byte(x.k1), []byte(x.k2)}, true)
		}) {
			t.Errorf("node %d still holds locks", i+1)
		}
	}
}

// TestCrossGroupTxDecisionsCollected: every cross-group commit leaves a
// decision at its primary; the leaders' sweep deletes them once their
// transactions are older than the nodes' keep (here 1 s): their number
// goes back to zero.
func TestCrossGroupTxDecisionsCollected(t *testing.T) {
	x := startXG(t, true)
	for _, n := range x.g.nodes {
		n.multi.SetTxDecisionKeep(time.Second)
	}
	a := dial(t, x.g.nodes[x.l1])
	a.expect(`
SET ` + x.k1 + ` 100 => OK
SET ` + x.k2 + ` 0 => OK
`)
	for range 3 {
		h := txBegin(t, a, "SERIALIZABLE")
		a.expect(`
KEFIR.TX INCRBY ` + h + ` ` + x.k1 + ` -10 => (integer) *
KEFIR.TX INCRBY ` + h + ` ` + x.k2 + ` 10 => (integer) *
KEFIR.TX COMMIT ` + h + ` => (integer) 0
`)
	}
	count := func() int {
		total := 0
		for _, n := range x.g.nodes {
			c, err := n.multi.TxDecisionCount()
			if err != nil {
				t.Fatal(err)
			}
			total += c
		}
		return total
	}
	if c := count(); c == 0 {
		t.Fatal("no decision recorded by the commits")
	} else {
		t.Logf("%d decision records (3 commits, at the primary group's replicas that applied them) before the collection", c)
	}
	if !testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool { return count() == 0 }) {
		t.Fatalf("%d decision records left 15 s after the commits", count())
	}
	a.expect(`
GET ` + x.k1 + ` => "70"
GET ` + x.k2 + ` => "30"
`)
}

// TestCrossGroupTxOffAnswersCrossSlot: without the switch a second slot is
// refused as before.
func TestCrossGroupTxOffAnswersCrossSlot(t *testing.T) {
	x := startXG(t, false)
	a := dial(t, x.g.nodes[x.l1])
	h := txBegin(t, a, "SERIALIZABLE")
	a.expect(`
KEFIR.TX GET ` + h + ` ` + x.k1 + ` => (nil)
KEFIR.TX GET ` + h + ` ` + x.k2 + ` => CROSSSLOT*
`)
}

// TestCrossGroupTxPushAfterCoordinatorDeath: a transaction prepared at one
// group whose coordinator never decides (its prepare sent by hand) holds
// its locks: a write of its key waits, pushes it (abort at its primary, the
// other group) and then applies; a read of a written key waits the same
// way.
func TestCrossGroupTxPushAfterCoordinatorDeath(t *testing.T) {
	x := startXG(t, true)
	a := dial(t, x.g.nodes[x.l1])
	a.expect(`SET ` + x.k1 + ` 5 => OK`)
	prep := func(txid string) string {
		// No checks, so the start does not matter; the origin is the
		// group's (its slot table's, if it has one).
		o, err := kv.SlotOrigin(engineGetterOf(x.g.nodes[x.l1], x.k1), []byte(x.k1))
		if err != nil {
			t.Fatal(err)
		}
		op, err := kv.NewTxPrepare([]byte(txid), []byte(x.k2), 1<<40, o, nil, []kv.Op{{Kind: kv.KindSet, Key: []byte(x.k1), Value: []byte("666")}})
		if err != nil {
			t.Fatal(err)
		}
		return a.do("KEFIR.TXAPPLY", string(kv.AppendOp(nil, &op)))
	}
	if got := prep("dead1"); got != "PREPARED" {
		t.Fatalf("prepare: %s", got)
	}
	start := time.Now()
	a.expect(`SET ` + x.k1 + ` 7 => OK`)
	if d := time.Since(start); d < cluster.TxWaitBeforePush {
		t.Errorf("the write did not wait for the lock: %v", d)
	}
	a.expect(`GET ` + x.k1 + ` => "7"`) // aborted: its 666 never landed
	if got := prep("dead2"); got != "PREPARED" {
		t.Fatalf("prepare: %s", got)
	}
	a.expect(`GET ` + x.k1 + ` => "7"`) // waited, pushed: aborted
	// The push's decision is recorded at the primary: the coordinator's
	// late commit answers it.
	d := kv.NewTxDecide([]byte("dead2"), []byte(x.k2), true)
	a.expect(`KEFIR.TXAPPLY ` + string(kv.AppendOp(nil, &d)) + ` => ABORTED`)
}

// engineGetterOf reads node s's replica of key's group as applied.
func engineGetterOf(s *Server, key string) kv.Getter {
	for _, lg := range s.multi.Hosted() {
		for _, r := range lg.Spec.Slots {
			if sl := cluster.Slot([]byte(key)); sl >= r.Start && sl <= r.End {
				return lg.Hosted.Engine.Lookup
			}
		}
	}
	return nil
}

// TestCrossGroupTxMutationsCaught: a coordinator that decides commit on the
// primary's prepare alone commits a transaction another participant
// refused (half of it lands); a snapshot read that ignores a prepared
// write serves the value the transaction is replacing.
func TestCrossGroupTxMutationsCaught(t *testing.T) {
	mutation.Require(t)
	x := startXG(t, true)
	a, b := dial(t, x.g.nodes[x.l1]), dial(t, x.g.nodes[x.l1])
	a.expect(`
SET ` + x.k1 + ` 100 => OK
SET ` + x.k2 + ` 0 => OK
`)
	// k1 is the primary (first written); k2's prepare fails (a write
	// after the read).
	run := func() string {
		h := txBegin(t, a, "SERIALIZABLE")
		a.expect(`
KEFIR.TX GET ` + h + ` ` + x.k2 + ` => *
KEFIR.TX INCRBY ` + h + ` ` + x.k1 + ` -10 => (integer) *
KEFIR.TX INCRBY ` + h + ` ` + x.k2 + ` 10 => (integer) *
`)
		b.expect(`INCRBY ` + x.k2 + ` 1 => (integer) *`)
		return a.do("KEFIR.TX", "COMMIT", h)
	}
	if got := run(); !strings.HasPrefix(got, "TXABORT") {
		t.Fatalf("without the mutation: %s, want TXABORT", got)
	}
	cluster.MultiMut.DecideEarly.Store(true)
	got := run()
	cluster.MultiMut.DecideEarly.Store(false)
	k1 := a.do("GET", x.k1)
	if got != "(integer) 0" || k1 != `"90"` {
		t.Fatalf("decideEarly not caught: commit %s, %s = %s", got, x.k1, k1)
	}
	t.Logf("decideEarly caught: the commit answered %s with %s = %s and the other half refused", got, x.k1, k1)
}

// TestCrossGroupTxReadsWaitForLocks: a read of a key that a prepared
// transaction writes waits for its resolve and returns the committed value
// (here the decision comes by hand, before any push); a transaction's
// snapshot read of it aborts the transaction, and a READONLY transaction's
// first read of it waits as a plain read does. The mutations that serve the
// old value instead are caught.
func TestCrossGroupTxReadsWaitForLocks(t *testing.T) {
	// The decisions come by hand: no push may come first, however slow
	// the box.
	old := cluster.TxWaitBeforePush
	t.Cleanup(func() { cluster.TxWaitBeforePush = old }) // after the nodes close (LIFO)
	cluster.TxWaitBeforePush = 3 * time.Second
	x := startXG(t, true)
	a, b := dial(t, x.g.nodes[x.l1]), dial(t, x.g.nodes[x.l1])
	prepare := func(txid, val string) {
		t.Helper()
		o, err := kv.SlotOrigin(engineGetterOf(x.g.nodes[x.l1], x.k1), []byte(x.k1))
		if err != nil {
			t.Fatal(err)
		}
		// Its own primary: a decide at k1's group commits it there.
		op, err := kv.NewTxPrepare([]byte(txid), []byte(x.k1), 1<<40, o, nil, []kv.Op{{Kind: kv.KindSet, Key: []byte(x.k1), Value: []byte(val)}})
		if err != nil {
			t.Fatal(err)
		}
		b.expect(`KEFIR.TXAPPLY ` + string(kv.AppendOp(nil, &op)) + ` => PREPARED`)
	}
	decide := func(txid string) {
		t.Helper()
		d := kv.NewTxDecide([]byte(txid), []byte(x.k1), true)
		b.expect(`KEFIR.TXAPPLY ` + string(kv.AppendOp(nil, &d)) + ` => COMMITTED`)
	}
	read := func(txid, val string) string {
		prepare(txid, val)
		a.send("GET", x.k1)
		time.Sleep(50 * time.Millisecond)
		decide(txid)
		return a.reply()
	}
	a.expect(`SET ` + x.k1 + ` 5 => OK`)
	if got := read("r1", "6"); got != `"6"` {
		t.Fatalf("a read of a write-locked key answered %s, want \"6\" (the value its transaction committed)", got)
	}
	// A transaction's snapshot read of it aborts.
	prepare("r2", "7")
	h := txBegin(t, a, "SERIALIZABLE")
	if got := a.do("KEFIR.TX", "GET", h, x.k1); !strings.HasPrefix(got, "TXABORT") {
		t.Errorf("a transaction's read of a write-locked key: %s, want TXABORT", got)
	}
	decide("r2")
	// A READONLY transaction's first read of it waits for the resolve
	// instead (txAwaitReadLocks), as a plain read does, and reads the
	// committed value: the snapshot is taken after the lock is gone.
	prepare("r2ro", "7")
	h = txBegin(t, a, "READONLY")
	a.send("KEFIR.TX", "GET", h, x.k1)
	time.Sleep(50 * time.Millisecond)
	decide("r2ro")
	if got := a.reply(); got != `"7"` {
		t.Errorf("a READONLY transaction's read of a write-locked key: %s, want \"7\" (after the resolve)", got)
	}
	a.expect(`KEFIR.TX COMMIT ` + h + ` => (integer)*`)
	// The chained form: on the event loop the first read finds the lock and
	// the BEGIN is undone (wouldWait); the worker that runs the chain again
	// begins it anew and waits.
	prepare("r2roc", "77")
	a.send("KEFIR.TX", "BEGIN", "READONLY", "THEN", "GET", "100", x.k1)
	time.Sleep(50 * time.Millisecond)
	decide("r2roc")
	if got := a.reply(); got != `"77"` {
		t.Errorf("KEFIR.TX BEGIN READONLY THEN GET of a write-locked key: %s, want \"77\" (after the resolve)", got)
	}
	a.expect(`KEFIR.TX COMMIT 100 => (integer)*`)
	// The race: a transaction prepared between txSlotsReadOnly's wait
	// (nothing locked) and the snapshot taken after it (txReadLockHook
	// holds the worker there while this test prepares). The snapshot has
	// the lock: it is dropped, the wait meets the lock, and the read
	// answers the committed value. Before, it aborted.
	raceRead := func() string {
		reached, prepared := make(chan struct{}), make(chan struct{})
		var once sync.Once
		hook := func() {
			once.Do(func() {
				close(reached)
				<-prepared
			})
		}
		txReadLockHook.Store(&hook)
		defer txReadLockHook.Store(nil)
		h := txBegin(t, a, "READONLY")
		a.send("KEFIR.TX", "GET", h, x.k1)
		<-reached
		prepare("r2race", "77")
		close(prepared)
		time.Sleep(50 * time.Millisecond)
		decide("r2race")
		got := a.reply()
		a.do("KEFIR.TX", "ABORT", h)
		return got
	}
	if got := raceRead(); got != `"77"` {
		t.Errorf("a READONLY first read with a prepare between its wait and its snapshot: %s, want \"77\" (after the resolve)", got)
	}
	// At a follower of the key's group the first read answers -MOVED at
	// once, lock or not, as a plain read there does: its snapshot is the
	// leader's to take. Before, it waited for the lock first.
	prepare("r2f", "77")
	f := dial(t, x.g.nodes[(x.l1+1)%3])
	time.Sleep(200 * time.Millisecond) // the follower applies the prepare: its lock shows there
	hf := txBegin(t, f, "READONLY")
	moved := make(chan string, 1)
	go func() { moved <- f.do("KEFIR.TX", "GET", hf, x.k1) }()
	select {
	case got := <-moved:
		if !strings.HasPrefix(got, "MOVED") {
			t.Errorf("a READONLY first read at a follower: %s, want MOVED", got)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("a READONLY first read at a follower waited for a lock before its -MOVED")
		defer func() { <-moved }()
	}
	decide("r2f")
	if !mutation.On {
		return
	}
	cluster.MultiMut.ReadsIgnoreTxLocks.Store(true)
	got := read("r3", "8")
	cluster.MultiMut.ReadsIgnoreTxLocks.Store(false)
	if got != `"77"` {
		t.Fatalf("ReadsIgnoreTxLocks not caught: %s", got)
	}
	t.Logf("ReadsIgnoreTxLocks caught: the read answered %s while the transaction writing 8 was prepared", got)
	prepare("r4", "9")
	xgtxMut.readsIgnoreLocks = true
	h = txBegin(t, a, "SERIALIZABLE")
	got = a.do("KEFIR.TX", "GET", h, x.k1)
	xgtxMut.readsIgnoreLocks = false
	decide("r4")
	if got != `"8"` {
		t.Fatalf("readsIgnoreLocks not caught: %s", got)
	}
	t.Logf("readsIgnoreLocks caught: the transaction read %s while the transaction writing 9 was prepared", got)
}

// A single-group commit that only reads a key a prepared cross-group
// transaction read-locks shares the lock (docs/design/transactions.md,
// "Shared read locks"): it is neither held at the front door nor refused at
// apply, and commits at once while the lock stays. Before, it waited for
// the lock until it pushed the prepared transaction (TxWaitBeforePush).
func TestCrossGroupTxCommitSharesReadLock(t *testing.T) {
	x := startXG(t, true)
	a := dial(t, x.g.nodes[x.l1])
	a.expect(`SET ` + x.k1 + ` 5 => OK`)
	get := engineGetterOf(x.g.nodes[x.l1], x.k1)
	_, _, ver, _, err := get([]byte(x.k1))
	if err != nil {
		t.Fatal(err)
	}
	o, err := kv.SlotOrigin(get, []byte(x.k1))
	if err != nil {
		t.Fatal(err)
	}
	// A reader of k1 prepared and never decided (its coordinator gone).
	op, err := kv.NewTxPrepare([]byte("reader"), []byte(x.k2), 1<<40, o, []kv.TxCheck{{Key: []byte(x.k1), Version: ver}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.do("KEFIR.TXAPPLY", string(kv.AppendOp(nil, &op))); got != "PREPARED" {
		t.Fatalf("prepare: %s", got)
	}
	other := "{" + x.k1 + "}b"
	h := txBegin(t, a, "SERIALIZABLE")
	a.expect(`
KEFIR.TX GET ` + h + ` ` + x.k1 + ` => "5"
KEFIR.TX SET ` + h + ` ` + other + ` 1 => OK
`)
	start := time.Now()
	got := a.do("KEFIR.TX", "COMMIT", h)
	if d := time.Since(start); !strings.HasPrefix(got, "(integer)") || d >= cluster.TxWaitBeforePush {
		t.Fatalf("the commit reading the read-locked key answered %q after %v, want a version before %v", got, d, cluster.TxWaitBeforePush)
	}
	if _, mode, ok, err := kv.TxLockOf(get, []byte(x.k1)); err != nil || !ok || mode != kv.TxLockRead {
		t.Fatalf("k1's read lock after the commit: mode %q, held %v, %v", mode, ok, err)
	}
	a.expect(`GET ` + other + ` => "1"`)
}
