package vrshard

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// sourceAhead makes group 1 some ops ahead of group 2 (so that group 2 can
// be brought to the same op number for its import of k), owning every
// slot, with k=100; it returns k's version there.
func sourceAhead(t *testing.T, g1 *cluster, k string) (vk uint64) {
	t.Helper()
	for i := 0; i < 30; i++ {
		mustWrite(t, g1, set("{pad}a", "x"))
	}
	mustWrite(t, g1, slotOp(kv.KindSlotInit, []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}, 0, 0, 1))
	return mustWrite(t, g1, set(k, "100")).Version
}

// moveAligned pads group 2's op numbers so that its import of k (the op
// after the importing step) is op vk, moves k's slot from group 1 to it,
// and returns k as group 2 holds it; it skips the test when the op numbers
// cannot be aligned. The caller checks got.Version == vk (the alignment
// held) after its own checks of the value.
func moveAligned(t *testing.T, g1, g2 *cluster, k string, vk uint64) storage.Value {
	t.Helper()
	var last uint64
	for {
		last = mustWrite(t, g2, set("{pad}b", "y")).Version
		if last+3 >= vk {
			break
		}
	}
	if last+3 != vk {
		t.Skipf("could not align group 2 (last %d, vk %d)", last, vk)
	}
	s := kv.KeySlot([]byte(k))
	mustWrite(t, g2, slotOp(kv.KindSlotInit, nil, 0, 0, 1))             // last+1
	moveSlots(t, g1, g2, []kv.SlotRange{{Start: s, End: s}}, func() {}) // importing last+2, load last+3 == vk
	got, err := leaderOf(g2, 10*time.Second).db.Get([]byte(k))
	if err != nil {
		t.Fatalf("after the move k at group 2: %v", err)
	}
	return got
}

// A KEFIR.TX transaction begun at a slot's source group and committed after
// the slot moved is validated at the destination. Versions are each group's
// own op numbers, so a key whose destination version (its import op) equals
// the version the transaction read at the source passed the check although
// it was written in the window: a lost update, committed. The commit carries
// the origin its snapshot saw (kv.SlotOrigin: the slot's epoch and state at
// the source), which differs at the destination: TXABORT.
func TestTxCommitAcrossAMoveAbortsOnTheOrigin(t *testing.T) {
	g1, g2 := twoGroups(t, nil, nil)
	const timeout = 10 * time.Second
	must := func(g *cluster, op kv.Op) kv.Result { t.Helper(); return mustWrite(t, g, op) }
	k := "acct"
	vk := sourceAhead(t, g1, k)

	// The transaction: BEGIN at group 1, read k (version vk), will write
	// k = 100+10 (read-modify-write).
	snap, err := leaderOf(g1, timeout).TxBegin(context.Background(), []byte(k))
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	data, _, ver, ok, err := snap.Get([]byte(k))
	if err != nil || !ok || string(data) != "100" || ver != vk {
		t.Fatalf("tx read %q@%d %v %v", data, ver, ok, err)
	}
	// Another client writes k in the window (its update must not be lost).
	must(g1, set(k, "500"))

	got := moveAligned(t, g1, g2, k, vk)
	if string(got.Data) != "500" {
		t.Fatalf("after the move k at group 2: %+v", got)
	}
	if got.Version != vk {
		t.Skipf("alignment missed: k is version %d at group 2, the tx read %d at group 1", got.Version, vk)
	}

	// COMMIT: routed by slot, it reaches group 2 (the front door forwards a
	// refused write to the slot's new group).
	origin, err := kv.SlotOrigin(snap.Get, []byte(k)) // as the front door's txStart
	if err != nil {
		t.Fatal(err)
	}
	commit, err := kv.NewTxCommit(snap.Version(), kv.TxSI, origin, []kv.TxCheck{{Key: []byte(k), Version: vk}},
		[]kv.Op{{Kind: kv.KindSet, Key: []byte(k), Value: []byte("110")}})
	if err != nil {
		t.Fatal(err)
	}
	res := must(g2, commit)
	r, err := leaderOf(g2, timeout).Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(res.Bulk), "-") || string(r.Bulk) != "500" {
		t.Fatalf("a transaction that read k=100 at group 1 (version %d) committed at group 2 over the concurrent k=500 "+
			"(reply %q, k now %q): group 2's version %d of k is its import op, not group 1's version", vk, res.Bulk, r.Bulk, got.Version)
	}
}

// The same with WATCH: the observation WATCH took at the source ("live at
// version vk") is compared at the destination, where vk is the import op's
// number; a WATCH; MULTI; SET; EXEC whose key another client wrote after the
// WATCH executed. The observation ends with its origin (kv.Observe), which
// differs at the destination: a null array.
func TestWatchAcrossAMoveFailsOnTheOrigin(t *testing.T) {
	g1, g2 := twoGroups(t, nil, nil)
	const timeout = 10 * time.Second
	must := func(g *cluster, op kv.Op) kv.Result { t.Helper(); return mustWrite(t, g, op) }
	k := "acct"
	vk := sourceAhead(t, g1, k)
	w, err := leaderOf(g1, timeout).Read(context.Background(), kv.Op{Kind: kv.KindWatch, Keys: [][]byte{[]byte(k)}}, level.ConsLinearizable, shard.Session{})
	if err != nil {
		t.Fatal(err)
	}
	must(g1, set(k, "500")) // another client, after the WATCH
	if got := moveAligned(t, g1, g2, k, vk); got.Version != vk {
		t.Skipf("alignment missed: k is version %d at group 2, WATCH saw %d at group 1", got.Version, vk)
	}
	res := must(g2, execOp([]kv.Watch{{Key: []byte(k), Seen: w.Array[0]}}, []string{"SET", k, "110"}))
	r, err := leaderOf(g2, timeout).Read(context.Background(), get(k), level.ConsLinearizable, shard.Session{})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Bulk) != string(kv.NullArray) || string(r.Bulk) != "500" {
		t.Fatalf("EXEC watching k (seen at group 1, version %d) ran at group 2 after k was written: reply %q, k now %q", vk, res.Bulk, r.Bulk)
	}
}
