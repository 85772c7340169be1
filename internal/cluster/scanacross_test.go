package cluster

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// sortedReplica is a group's replica whose engine holds keys (sorted):
// a scan reads up to Limit of them from op.Key, as the engine does.
type sortedReplica struct {
	shard.Replica
	keys  [][]byte
	t     *kv.SlotTable
	reads int
}

func (r *sortedReplica) Read(_ context.Context, op kv.Op, _ level.Consistency, _ shard.Session) (kv.Result, error) {
	r.reads++
	i, _ := slices.BinarySearchFunc(r.keys, op.Key, bytes.Compare)
	var arr [][]byte
	for ; i < len(r.keys) && (op.End == nil || bytes.Compare(r.keys[i], op.End) < 0) && (op.Limit <= 0 || len(arr)/2 < op.Limit); i++ {
		arr = append(arr, r.keys[i], []byte("v"))
	}
	return kv.Result{Kind: kv.ResArray, Array: arr, Version: 9}, nil
}

func (r *sortedReplica) SlotTable() *kv.SlotTable   { return r.t }
func (r *sortedReplica) ReadPaths() shard.ReadPaths { return shard.ReadPaths{} }

// askerFunc is a GroupScanAsker: here another Multi's GroupScan, in place
// of KEFIR.GROUPSCAN over TCP (server TestKeyspaceScansAcrossNodes runs it).
type askerFunc func(ctx context.Context, addr string, id GroupID, op kv.Op, c level.Consistency, s shard.Session) (GroupPart, error)

func (f askerFunc) AskGroupScan(ctx context.Context, addr string, id GroupID, op kv.Op, c level.Consistency, s shard.Session) (GroupPart, error) {
	return f(ctx, addr, id, op, c, s)
}

// A keyspace scan at a node that hosts group 1 only: group 2's part comes
// from node 2 (GroupScan there). Each group's engine also holds keys of
// slots it does not serve (the other group's, as after a move before the
// purge), interleaved with its own, which the scan must drop and read past.
// Paged as SCAN pages it — the next page from the key after the last —
// every served key comes back exactly once, in order, for any page size;
// the unserved ones never. Without the refill of a part thinned by its
// table, a page comes back short and the scan ends early (limit 1: no key).
func TestScanAcrossNodesReturnsEveryServedKeyOnce(t *testing.T) {
	sm, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{2}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	reps := map[GroupID]*sortedReplica{}
	var want [][]byte
	for _, id := range []GroupID{1, 2} {
		lo, hi := uint16(0), uint16(8191)
		if id == 2 {
			lo, hi = 8192, 16383
		}
		reps[id] = &sortedReplica{t: kv.NewSlotTable([]kv.SlotRange{{Start: lo, End: hi}}, 1)}
	}
	for i := range 3000 {
		k := []byte(fmt.Sprintf("key:%06d", rng.IntN(1_000_000)))
		owner := GroupID(1)
		if Slot(k) > 8191 {
			owner = 2
		}
		// A third of the keys also sit, unserved, in the other group's
		// engine; some only there (a purge pending, the key deleted since).
		switch i % 6 {
		case 0:
			reps[3-owner].keys = append(reps[3-owner].keys, k)
			continue
		case 1:
			reps[3-owner].keys = append(reps[3-owner].keys, k)
		}
		reps[owner].keys = append(reps[owner].keys, k)
		want = append(want, k)
	}
	for _, r := range reps {
		slices.SortFunc(r.keys, bytes.Compare)
		r.keys = slices.CompactFunc(r.keys, bytes.Equal)
	}
	slices.SortFunc(want, bytes.Compare)
	want = slices.CompactFunc(want, bytes.Equal)

	members := []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}}
	node := func(self uint64, id GroupID) *Multi {
		spec, _ := sm.Group(id)
		m, err := NewMulti(sm, self, members, []LocalGroup{{Spec: spec, Hosted: Hosted{Replica: reps[id], Group: &stateGroup{st: State{Normal: true, Leader: self}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	n1, n2 := node(1, 1), node(2, 2)
	var asked []string
	n1.SetGroupScanAsker(askerFunc(func(ctx context.Context, addr string, id GroupID, op kv.Op, c level.Consistency, s shard.Session) (GroupPart, error) {
		asked = append(asked, addr)
		return n2.GroupScan(ctx, id, op, c, s)
	}))
	for _, limit := range []int{1, 7, 50, 1000} {
		var got [][]byte
		op := kv.Op{Kind: kv.KindScan, Limit: limit}
		for pages := 0; ; pages++ {
			if pages > len(want)+1 {
				t.Fatalf("limit %d: more pages than keys", limit)
			}
			res, _, err := n1.Scan(context.Background(), op, level.ConsLinearizable, shard.Session{})
			if err != nil {
				t.Fatalf("limit %d: %v", limit, err)
			}
			for i := 0; i < len(res.Array); i += 2 {
				got = append(got, res.Array[i])
			}
			if len(res.Array)/2 < limit { // the engine's rule: fewer than asked, the range ended
				break
			}
			op.Key = append(slices.Clone(res.Array[len(res.Array)-2]), 0)
		}
		if !slices.EqualFunc(got, want, bytes.Equal) {
			missing, extra := 0, 0
			for _, k := range want {
				if _, ok := slices.BinarySearchFunc(got, k, bytes.Compare); !ok {
					missing++
				}
			}
			extra = len(got) + missing - len(want)
			t.Fatalf("limit %d: %d keys, want %d (%d missing, %d extra or repeated)", limit, len(got), len(want), missing, extra)
		}
	}
	if len(asked) == 0 || asked[0] != "n2:2" {
		t.Fatalf("group 2's part was asked at %v, want node 2 (n2:2)", asked)
	}
}

// A part's node that fails (a broken connection, no leader yet) is asked
// again, of the leader known by then; an error reply that asking again
// cannot change fails the scan at once.
func TestScanAcrossNodesAsksAgain(t *testing.T) {
	sm, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{2}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := sm.Group(1)
	n1, err := NewMulti(sm, 1, []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}},
		[]LocalGroup{{Spec: spec, Hosted: Hosted{Replica: &sortedReplica{t: kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 8191}}, 1)}, Group: &stateGroup{st: State{Normal: true, Leader: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	var calls int
	fails := []error{fmt.Errorf("read tcp: connection reset by peer"), &ReplyError{"UNAVAILABLE no leader"}}
	n1.SetGroupScanAsker(askerFunc(func(context.Context, string, GroupID, kv.Op, level.Consistency, shard.Session) (GroupPart, error) {
		calls++
		if calls <= len(fails) {
			return GroupPart{}, fails[calls-1]
		}
		return GroupPart{Res: kv.Result{Kind: kv.ResArray, Array: [][]byte{[]byte("b"), []byte("v")}}, Ended: true}, nil
	}))
	res, _, err := n1.Scan(context.Background(), kv.Op{Kind: kv.KindScan, Limit: 10}, level.ConsLinearizable, shard.Session{})
	if err != nil || len(res.Array) != 2 || calls != 3 {
		t.Fatalf("after two failures: %v %q, %d calls", err, res.Array, calls)
	}
	calls, fails = 0, []error{&ReplyError{"ERR group 2 is not a group of the slot map (epoch 1)"}}
	if _, _, err := n1.Scan(context.Background(), kv.Op{Kind: kv.KindScan, Limit: 10}, level.ConsLinearizable, shard.Session{}); err == nil || calls != 1 {
		t.Fatalf("an error reply: %v after %d calls, want it at once", err, calls)
	}
}

// A part whose engine read stopped at kv.MaxScanBytes over keys its group
// does not serve (an import in progress into it: large values, not served
// yet) holds few served pairs, or none, and says nothing past its last key
// ("b" here); the merge drops the other parts' keys after it ("c", "d").
// The page then has fewer keys than asked and few bytes, which SCAN and
// KEYS take for the range's end (server rangeEnded: fewer than the limit,
// not stopped at MaxScanBytes), so "c" and "d" are never returned (review29;
// fails until the merged result tells its caller it did not end).
func TestScanAcrossNodesByteBoundPartDoesNotEndTheScan(t *testing.T) {
	sm, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{2}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Group 1's served keys: four of its slots' (found, not assumed).
	var local [][]byte
	for i := 0; len(local) < 4; i++ {
		if k := []byte(fmt.Sprintf("k%03d", i)); Slot(k) <= 8191 {
			local = append(local, k)
		}
	}
	spec, _ := sm.Group(1)
	n1, err := NewMulti(sm, 1, []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}},
		[]LocalGroup{{Spec: spec, Hosted: Hosted{Replica: &sortedReplica{keys: local, t: kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 8191}}, 1)},
			Group: &stateGroup{st: State{Normal: true, Leader: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	stop := local[1] // group 2's engine read stopped at 64 MiB of unserved keys, the last one just after local[1]
	stop = append(slices.Clone(stop), 0)
	n1.SetGroupScanAsker(askerFunc(func(_ context.Context, _ string, _ GroupID, op kv.Op, _ level.Consistency, _ shard.Session) (GroupPart, error) {
		if bytes.Compare(op.Key, stop) <= 0 {
			return GroupPart{Res: kv.Result{Kind: kv.ResArray}, Ended: false, Last: stop}, nil
		}
		return GroupPart{Res: kv.Result{Kind: kv.ResArray}, Ended: true}, nil
	}))
	const limit = 10
	var got [][]byte
	op := kv.Op{Kind: kv.KindScan, Limit: limit}
	for pages := 0; pages < 10; pages++ {
		res, _, err := n1.Scan(context.Background(), op, level.ConsLinearizable, shard.Session{})
		if err != nil {
			t.Fatal(err)
		}
		size := 0
		for i := 0; i < len(res.Array); i += 2 {
			got = append(got, res.Array[i])
			size += len(res.Array[i]) + len(res.Array[i+1])
		}
		if len(res.Array)/2 < limit && size < kv.MaxScanBytes { // server rangeEnded: the scan ends
			break
		}
		op.Key = append(slices.Clone(res.Array[len(res.Array)-2]), 0)
	}
	if !slices.EqualFunc(got, local, bytes.Equal) {
		t.Fatalf("the scan returned %q, want every served key %q", got, local)
	}
}
