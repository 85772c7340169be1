package vrshard

import (
	"encoding/binary"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/vfs"
)

// engineRows counts the client-table rows in r's engine by scanning them.
func engineRows(t testing.TB, r *Replica) int {
	t.Helper()
	n := 0
	err := r.db.Scan(kv.ClientRowPrefix, kv.ClientRowEnd, 0, 0, func([]byte, storage.Value) bool { n++; return true })
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// engineRowSet returns r's engine rows: client id → row version.
func engineRowSet(t testing.TB, r *Replica) map[uint64]uint64 {
	t.Helper()
	rows := map[uint64]uint64{}
	err := r.db.Scan(kv.ClientRowPrefix, kv.ClientRowEnd, 0, 0, func(k []byte, v storage.Value) bool {
		rows[binary.BigEndian.Uint64(k[len(kv.ClientRowPrefix):])] = v.Version
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

const testClientCap = 20

// boundedRows writes with 10×testClientCap client ids (the core's table capped
// at testClientCap) and checks, after every Ready of every replica, the rule
// that makes forgetting rows safe: each client the core's table holds still
// has its engine row, written by the op the record names (a crash rebuilds its
// result from that row). It returns the cluster and a function that returns
// the violations seen so far (the check stays on for replicas reopened later).
func boundedRows(t *testing.T, tooEarly bool) (*cluster, func() []string) {
	mutation.Require(t) // test hooks too
	var mu sync.Mutex
	var bad []string
	c := newCluster(t, 3, func(o *Options) {
		o.VR.ClientCap = testClientCap
		o.mut.forgetTooEarly = tooEarly
		o.mut.afterHandle = func(r *Replica) {
			for _, rec := range r.core.ClientTable() {
				v, err := r.db.Get(kv.ClientRowKey(rec.Client))
				if err != nil || v.Version != rec.Op {
					mu.Lock()
					if len(bad) < 5 {
						bad = append(bad, fmt.Sprintf("replica %d at op %d: client %d (op %d) in the core's table, row %d %v",
							r.cfg.Self, r.applied.Load(), rec.Client, rec.Op, v.Version, err))
					}
					mu.Unlock()
				}
			}
		}
	})
	for i := range 10 * testClientCap {
		if _, err := c.write(set(fmt.Sprint("k", i%7), fmt.Sprint(i)), shard.ReqID{Client: uint64(1000 + i), Seq: 1}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return c, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), bad...)
	}
}

// Client rows are forgotten once the core's table dropped their client, on
// every replica alike: with 200 client ids and a table of 20, each engine
// holds a few more than 20 rows (200 before), the same rows at the same
// versions everywhere, and never lacks the row of a client the table holds.
func TestClientRowsForgottenWithTheCoresTable(t *testing.T) {
	c, bad := boundedRows(t, false)
	if b := bad(); len(b) > 0 {
		t.Fatalf("the core's table names clients without their row: %v", b)
	}
	sets := c.sameRows(t)
	l := c.leader(5 * time.Second)
	if f := c.reps[l].Stats().Forgets; f == 0 {
		t.Fatal("the leader proposed no forget entry")
	}
	t.Logf("%d rows on every replica; the leader proposed %d forget entries", len(sets[0]), c.reps[l].Stats().Forgets)
	// Every replica is killed (the engine loses what it had not written) and
	// restarts: it replays the log from its last checkpoint, forget entries
	// included, over an engine that may hold them already, to the same rows.
	for i := range c.reps {
		c.kill(i)
	}
	for i := range c.reps {
		c.open(i, false, nil)
	}
	if _, err := c.write(set("after", "1"), shard.ReqID{Client: 1, Seq: 1}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if b := bad(); len(b) > 0 {
		t.Fatalf("after a restart, the core's table names clients without their row: %v", b)
	}
	after := c.sameRows(t)
	delete(after[0], 1)
	// The replay restores the same rows. A restarted leader may then forget
	// a few more: the rows before the restart may be up to a tenth over the
	// table's cap with the next forget not yet due (at most one per cap/10
	// ops), and the new leader's first forget is due at once. A forget
	// drops only the oldest rows, so what is left must be the newest of the
	// rows from before, at the same versions.
	if !maps.Equal(after[0], sets[0]) && !newestOf(after[0], sets[0]) {
		t.Fatalf("after a restart the replicas hold rows %v, before %v", after[0], sets[0])
	}
}

// newestOf reports whether rows (client → version) are the newest of before,
// each at its version there: a forget after the restart dropped the oldest.
func newestOf(rows, before map[uint64]uint64) bool {
	minKept := ^uint64(0)
	for c, v := range rows {
		if bv, ok := before[c]; !ok || bv != v {
			return false
		}
		minKept = min(minKept, v)
	}
	for c, v := range before {
		if _, kept := rows[c]; !kept && v >= minKept {
			return false
		}
	}
	return true
}

// sameRows waits until every replica's engine holds the same client rows, and
// checks their number against the bound and each replica's count.
func (c *cluster) sameRows(t *testing.T) []map[uint64]uint64 {
	t.Helper()
	var sets []map[uint64]uint64
	testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool {
		sets = sets[:0]
		for _, r := range c.reps {
			sets = append(sets, engineRowSet(t, r))
		}
		return maps.Equal(sets[0], sets[1]) && maps.Equal(sets[0], sets[2])
	})
	for i, s := range sets {
		if !maps.Equal(s, sets[0]) {
			t.Fatalf("replica %d holds rows %v, replica 0 %v", c.ids[i], s, sets[0])
		}
		if n := len(s); n == 0 || n > 2*testClientCap {
			t.Fatalf("replica %d holds %d client rows; want at most %d", c.ids[i], n, 2*testClientCap)
		}
		if got := c.reps[i].Status().Clients; got != len(s) {
			t.Fatalf("replica %d counts %d rows, its engine holds %d", c.ids[i], got, len(s))
		}
	}
	return sets
}

// The mutation (forgetTooEarly): rows of clients the core still holds go too.
func TestForgetTooEarlyDropsRowsTheCoreNeeds(t *testing.T) {
	_, bad := boundedRows(t, true)
	b := bad()
	if len(b) == 0 {
		t.Fatal("forgetTooEarly: every client in the core's table kept its row")
	}
	t.Logf("mutation caught: %v", b[0])
}

// A replay that reaches a client's row through an older op first must leave
// the applier's row version at the engine's: client 7 writes at ops 1 and 2,
// the replica restarts and replays both (op 1 is re-evaluated, its row being
// op 2's; op 2's result comes from the row). The core's table then names
// client 7 at op 2, and a forget "below 2" (op 2 the oldest in the table)
// must keep its row — a lower version left in applier.rows made it delete
// the row on this replica only (engines diverge, and a later crash rebuilds
// client 7's result by re-evaluation).
func TestReplayKeepsRowVersionForForget(t *testing.T) {
	mem := vfs.NewMem()
	db := openMemEngine(t, mem)
	ops := []testOp{
		{op: kv.Op{Kind: kv.KindIncrBy, Key: []byte("ctr"), Delta: 1}, client: 7, seq: 1},
		{op: kv.Op{Kind: kv.KindIncrBy, Key: []byte("ctr"), Delta: 1}, client: 7, seq: 2},
	}
	applyAll(t, newApplier(db), ops)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db2 := openMemEngine(t, mem)
	a := newApplier(db2)
	if err := a.loadRows(); err != nil {
		t.Fatal(err)
	}
	applyAll(t, a, ops) // the replay after a restart from a checkpoint at op 0
	if got := a.rows[7]; got != 2 {
		t.Errorf("after the replay applier.rows has client 7 at version %d, the engine at 2", got)
	}
	a.begin()
	a.applyForget(3, 2, 1)
	if err := a.flush(); err != nil {
		t.Fatal(err)
	}
	if v, err := db2.Get(kv.ClientRowKey(7)); err != nil || v.Version != 2 {
		t.Fatalf("forget below 2 deleted client 7's row (op 2, still in the core's table): %+v, %v", v, err)
	}
}
