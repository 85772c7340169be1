package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

// versionedReplica is a group's replica whose keys have values (vals; nil:
// "v") and versions: a scan's result has the largest version of the keys it
// returned, as kv.readScan's.
type versionedReplica struct {
	shard.Replica
	keys, vals [][]byte // keys sorted
	ver        map[string]uint64
	t          *kv.SlotTable
}

func (r *versionedReplica) Read(_ context.Context, op kv.Op, _ level.Consistency, _ shard.Session) (kv.Result, error) {
	i, _ := slices.BinarySearchFunc(r.keys, op.Key, bytes.Compare)
	res := kv.Result{Kind: kv.ResArray}
	for ; i < len(r.keys) && (op.End == nil || bytes.Compare(r.keys[i], op.End) < 0) && (op.Limit <= 0 || len(res.Array)/2 < op.Limit); i++ {
		v := []byte("v")
		if r.vals != nil {
			v = r.vals[i]
		}
		res.Array = append(res.Array, r.keys[i], v)
		res.Version = max(res.Version, r.ver[string(r.keys[i])])
	}
	return res, nil
}

func (r *versionedReplica) SlotTable() *kv.SlotTable   { return r.t }
func (r *versionedReplica) ReadPaths() shard.ReadPaths { return shard.ReadPaths{} }

// A keyspace scan's session after the scan has read each group at least as
// far as every key the page returned: a group's part read again past keys
// of slots it does not serve (servedPart) returns keys of every read, so the
// part's version is the largest of them all, not the last read's. Here
// group 1's engine holds a served key written at version 100, then keys of
// group 2's slots (not yet purged, version 1), then a served key at version
// 1: with a limit of 2 its part takes three reads, and the token after the
// scan must say group 1 was read up to 100 — else a later session read at
// a replica of group 1 that has applied only up to 1 serves the key's older
// state (monotonic reads broken).
func TestScanSessionCoversEveryReadOfAPart(t *testing.T) {
	sm, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{1}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// a (group 1's), u1..u3 (group 2's), b (group 1's), in key order.
	var picked [][]byte
	for i := 0; len(picked) < 5; i++ {
		k := []byte(fmt.Sprintf("k%04d", i))
		own := Slot(k) <= 8191
		if want := len(picked) == 0 || len(picked) == 4; own == want {
			picked = append(picked, k)
		}
	}
	a, b := picked[0], picked[4]
	ver := map[string]uint64{string(a): 100}
	for _, k := range picked[1:] {
		ver[string(k)] = 1
	}
	rep1 := &versionedReplica{keys: picked, ver: ver, t: kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 8191}}, 1)}
	rep2 := &versionedReplica{t: kv.NewSlotTable([]kv.SlotRange{{Start: 8192, End: 16383}}, 1)}
	spec1, _ := sm.Group(1)
	spec2, _ := sm.Group(2)
	st := &stateGroup{st: State{Normal: true, Leader: 1}}
	m, err := NewMulti(sm, 1, []Member{{ID: 1, ClientAddr: "n1:1"}}, []LocalGroup{
		{Spec: spec1, Hosted: Hosted{Replica: rep1, Group: st}},
		{Spec: spec2, Hosted: Hosted{Replica: rep2, Group: st}},
	})
	if err != nil {
		t.Fatal(err)
	}
	res, after, err := m.Scan(context.Background(), kv.Op{Kind: kv.KindScan, Limit: 2}, level.Consistency{Kind: level.Session}, shard.Session{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Array) != 4 || !bytes.Equal(res.Array[0], a) || !bytes.Equal(res.Array[2], b) {
		t.Fatalf("the page: %q, want %q and %q", res.Array, a, b)
	}
	if p := after.For(1); p.MaxRead < 100 {
		t.Fatalf("the token after the scan: group 1's part %+v, read only up to %d, but the page returned %q written at version 100", p, p.MaxRead, a)
	}
}

// A node asks another for a group's part of a keyspace scan on a pooled
// forwarding connection, which many scans of many clients share. The node
// asked reads a KEFIR.GROUPSCAN sent without SESSION at the connection's
// own session and advances it (server conn.groupScan), so the request must
// carry the scan's session whatever it is — the fresh session too, at level
// session, and at every other level: else a fresh session's scan is read at
// what earlier scans on that connection read (another client's positions,
// one a view change may have dropped: ErrSessionLost for a client that never
// saw it).
func TestAskGroupScanCarriesItsSession(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan [][]byte, 8)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				rd, w := resp.NewReader(nc, 4096), resp.NewWriter(nc, 4096)
				for {
					cmd, err := rd.ReadCommand(nil)
					if err != nil {
						return
					}
					args := make([][]byte, len(cmd))
					for i, a := range cmd {
						args[i] = slices.Clone(a)
					}
					got <- args
					if slices.ContainsFunc(args, func(a []byte) bool { return string(a) == "SESSION" }) {
						_ = w.WriteArrayHeader(2)
						_ = w.WriteBulkString("")
					}
					_ = w.WriteValue(GroupScanReply(GroupPart{Ended: true, served: &slotSet{}}))
					_ = w.Flush()
				}
			}()
		}
	}()
	r := NewRouter(RouterConfig{})
	for _, c := range []level.Consistency{{Kind: level.Session}, level.ConsLinearizable, {Kind: level.Eventual}} {
		if _, err := r.AskGroupScan(context.Background(), ln.Addr().String(), 2, kv.Op{Kind: kv.KindScan, Limit: 10}, c, shard.Session{}); err != nil {
			t.Fatal(err)
		}
		args := <-got
		if i := slices.IndexFunc(args, func(a []byte) bool { return string(a) == "SESSION" }); i < 0 || len(args[i+1]) != 0 {
			t.Errorf("level %s, a fresh session: KEFIR.GROUPSCAN asked as %q, want SESSION \"\" (the scan's own session, not the connection's)", c, args)
		}
	}
}

// A node of an older build answers KEFIR.GROUPSCAN in five elements and
// reads its part without the session that KEFIR.CALL SESSION carries (its
// GroupScan took none): at level session its part may lack the session's
// own writes, so a scan of a session that has any refuses it, as every
// scan at level session needing another node did before; a fresh session
// (nothing to wait for) and other levels take it.
func TestScanAtLevelSessionRefusesAnOlderNodesPart(t *testing.T) {
	sm, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{2}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec1, _ := sm.Group(1)
	members := []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}}
	n1, err := NewMulti(sm, 1, members, []LocalGroup{{Spec: spec1, Hosted: Hosted{Replica: &sortedReplica{}, Group: &stateGroup{st: State{Normal: true, Leader: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	n1.SetGroupScanAsker(askerFunc(func(_ context.Context, addr string, _ GroupID, _ kv.Op, _ level.Consistency, _ shard.Session) (GroupPart, error) {
		v := GroupScanReply(GroupPart{Ended: true, Res: kv.Result{Version: 5}})
		v.Elems = v.Elems[:5] // an older build's reply
		return parseGroupScanReply(addr, v)
	}))
	scan := func(c level.Consistency, s shard.Session) error {
		_, _, err := n1.Scan(context.Background(), kv.Op{Kind: kv.KindScan, Limit: 10}, c, s)
		return err
	}
	wrote := shard.Session{}.AfterWrite(kv.Result{Version: 10, Group: 2}.Pos())
	if err := scan(level.Consistency{Kind: level.Session}, wrote); err == nil {
		t.Fatal("a scan at level session took an older node's part, read without the session's write")
	}
	for _, c := range []level.Consistency{level.ConsLinearizable, {Kind: level.Session}} {
		if err := scan(c, shard.Session{}); err != nil {
			t.Fatalf("level %s, a fresh session: %v", c, err)
		}
	}
}

// A key two parts of a page return — its slot served by both groups' tables
// at their reads — is kept once, and the copy kept is the one of the group a
// keyed read of it goes to (SlotOwner: at one epoch the destination that owns
// the slot over a source whose replica here has not applied its hand-over).
// At level session a group's replica here may be a follower behind the
// hand-over, its table still serving the slot, its engine the slot's state
// before the move: the destination's copy is the session's own write, the
// source's is older. Keeping either (the sort's order) returned the older
// value to the session that wrote the newer (read your writes broken).
func TestScanKeepsTheOwnersCopyOfAKeyTwoPartsReturn(t *testing.T) {
	sm, err := NewSlotMap(1, []GroupSpec{
		{ID: 1, Members: []uint64{1}, Slots: []SlotRange{{Start: 0, End: 8191}}},
		{ID: 2, Members: []uint64{1}, Slots: []SlotRange{{Start: 8192, End: 16383}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var k []byte
	for i := 0; k == nil; i++ {
		if c := []byte(fmt.Sprintf("k%04d", i)); Slot(c) <= 8191 {
			k = c
		}
	}
	x := []kv.SlotRange{{Start: Slot(k), End: Slot(k)}}
	src, err1 := kv.NewSlotTable([]kv.SlotRange{{Start: 0, End: 8191}}, 1).Set(x, kv.SlotMigrating, 2, 2)
	dst0, err2 := kv.NewSlotTable([]kv.SlotRange{{Start: 8192, End: 16383}}, 1).Set(x, kv.SlotImporting, 1, 2)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	dst, err := dst0.Set(x, kv.SlotOwned, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	spec1, _ := sm.Group(1)
	spec2, _ := sm.Group(2)
	st := &stateGroup{st: State{Normal: true, Leader: 1}}
	m, err := NewMulti(sm, 1, []Member{{ID: 1, ClientAddr: "n1:1"}}, []LocalGroup{
		// Group 1's replica here has applied the move's first step only.
		{Spec: spec1, Hosted: Hosted{Replica: &versionedReplica{keys: [][]byte{k}, vals: [][]byte{[]byte("old")}, t: src}, Group: st}},
		{Spec: spec2, Hosted: Hosted{Replica: &versionedReplica{keys: [][]byte{k}, vals: [][]byte{[]byte("new")}, t: dst}, Group: st}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := m.owner(Slot(k)); id != 2 {
		t.Fatalf("a keyed read of %q goes to group %d, want 2", k, id)
	}
	sess := shard.Session{}.AfterWrite(kv.Result{Version: 9, Group: 2}.Pos()) // wrote "new" through group 2
	res, _, err := m.Scan(context.Background(), kv.Op{Kind: kv.KindScan, Limit: 10}, level.Consistency{Kind: level.Session}, sess)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Array) != 2 || string(res.Array[1]) != "new" {
		t.Fatalf("the page: %q, want %q once with the owner's value \"new\"", res.Array, k)
	}
}
