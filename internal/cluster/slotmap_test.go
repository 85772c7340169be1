package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

// EvenGroups splits the slots as redis-cli --cluster create splits them
// among masters, places the groups' members round the nodes (each node
// first in one group), and its map is valid; --groups round-trips.
func TestEvenGroupsIsRedisClisSplit(t *testing.T) {
	gs := EvenGroups(3, []uint64{1, 2, 3}, 3)
	if got := FormatGroups(gs); got != "1=1,2,3:0-5460;2=2,3,1:5461-10922;3=3,1,2:10923-16383" {
		t.Fatalf("EvenGroups(3) = %s", got)
	}
	back, err := ParseGroups(FormatGroups(gs))
	if err != nil || FormatGroups(back) != FormatGroups(gs) {
		t.Fatalf("ParseGroups(FormatGroups) = %v, %v", back, err)
	}
	for _, n := range []int{1, 2, 5, 7, 64} {
		m, err := NewSlotMap(1, EvenGroups(n, []uint64{1, 2, 3, 4, 5}, 3))
		if err != nil {
			t.Fatalf("EvenGroups(%d): %v", n, err)
		}
		if m.Owner(0) != 1 || m.Owner(Slots-1) != GroupID(n) {
			t.Fatalf("EvenGroups(%d): slot 0 in %d, slot 16383 in %d", n, m.Owner(0), m.Owner(Slots-1))
		}
	}
}

// A group that owns no slots (kefir cluster add-group's, before a move
// gives it some) round-trips through --groups' syntax, as a joined node's
// record keeps the map's groups, and its map is valid.
func TestGroupsOfNoSlotsRoundTrip(t *testing.T) {
	const s = "1=1,2,3:0-16383;2=4,5,6:"
	gs, err := ParseGroups(s)
	if err != nil || len(gs) != 2 || len(gs[1].Slots) != 0 || FormatGroups(gs) != s {
		t.Fatalf("ParseGroups(%q) = %+v, %v", s, gs, err)
	}
	m, err := NewSlotMap(1, gs)
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := m.Group(2); !ok || len(g.Slots) != 0 || m.Owner(0) != 1 {
		t.Fatalf("the map of %q: %+v", s, m.Groups)
	}
	if _, err := ParseGroups("1=1,2,3:0-16383;2=4,5,6:+"); err == nil {
		t.Fatal("an empty range after a '+' was taken")
	}
}

// A slot map covers every slot exactly once.
func TestSlotMapRefusesGapsAndOverlaps(t *testing.T) {
	for _, tc := range []struct{ groups, want string }{
		{"1=1:0-16000", "slot 16001 belongs to no group"},
		{"1=1:0-9000;2=2:9000-16383", "slot 9000 is in group 1 and group 2"},
		{"1=1:0-16383;1=2:0-1", "group 1 listed twice"},
		{"1=1:0-16384", "bad slot range"},
	} {
		gs, err := ParseGroups(tc.groups)
		if err == nil {
			_, err = NewSlotMap(1, gs)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.groups, err, tc.want)
		}
	}
}

// fakeReplica is a shard.Replica that records the ops it is given and
// answers them, or refuses every one with refuse.
type fakeReplica struct {
	shard.Replica
	name   string
	ops    []kv.Op
	refuse error
}

func (f *fakeReplica) Apply(_ context.Context, reqs []shard.WriteReq) (shard.Pending, error) {
	for i := range reqs {
		f.ops = append(f.ops, reqs[i].Op)
		reqs[i].Err = f.refuse
		reqs[i].Result = kv.Result{Kind: kv.ResBulk, Bulk: []byte(f.name)}
	}
	return shard.Pending{}, nil
}

func (f *fakeReplica) Read(_ context.Context, op kv.Op, _ level.Consistency, _ shard.Session) (kv.Result, error) {
	f.ops = append(f.ops, op)
	if op.Kind == kv.KindScan {
		return kv.Result{Kind: kv.ResArray, Array: [][]byte{[]byte(f.name + "-k"), []byte("v")}}, f.refuse
	}
	return kv.Result{Kind: kv.ResBulk, Bulk: []byte(f.name)}, f.refuse
}

func (f *fakeReplica) ReadPaths() shard.ReadPaths { return shard.ReadPaths{} }

// keyIn returns a key whose slot group id owns in m.
func keyIn(m *SlotMap, id GroupID) string {
	for i := 0; ; i++ {
		if k := fmt.Sprintf("k%d", i); m.Owner(Slot([]byte(k))) == id {
			return k
		}
	}
}

func newTestMulti(t *testing.T, hosted ...GroupID) (*Multi, *SlotMap, map[GroupID]*fakeReplica) {
	t.Helper()
	m, err := NewSlotMap(1, EvenGroups(3, []uint64{1, 2, 3}, 3))
	if err != nil {
		t.Fatal(err)
	}
	reps := map[GroupID]*fakeReplica{}
	var locals []LocalGroup
	for _, id := range hosted {
		spec, _ := m.Group(id)
		reps[id] = &fakeReplica{name: fmt.Sprintf("g%d", id)}
		locals = append(locals, LocalGroup{Spec: spec, Hosted: Hosted{Replica: reps[id], Group: &stateGroup{}}})
	}
	members := []Member{{ID: 1, ClientAddr: "n1:1"}, {ID: 2, ClientAddr: "n2:2"}, {ID: 3, ClientAddr: "n3:3"}}
	mu, err := NewMulti(m, 1, members, locals)
	if err != nil {
		t.Fatal(err)
	}
	return mu, m, reps
}

// Multi sends each write and read to the group that owns its keys' slot,
// a batch of several groups split among them; keys of several slots are
// refused with CROSSSLOT before any group sees them.
func TestMultiRoutesBySlot(t *testing.T) {
	mu, m, reps := newTestMulti(t, 1, 2, 3)
	k1, k2, k3 := keyIn(m, 1), keyIn(m, 2), keyIn(m, 3)
	reqs := []shard.WriteReq{
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte(k2), Value: []byte("x")}},
		{Op: kv.Op{Kind: kv.KindSet, Key: []byte(k1), Value: []byte("x")}},
		{Op: kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("{t}a"), []byte("1"), []byte("{t}b"), []byte("2")}}},
		{Op: kv.Op{Kind: kv.KindDel, Keys: [][]byte{[]byte(k1), []byte(k3)}}},
	}
	if _, err := mu.Apply(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	tg := m.Owner(Slot([]byte("t")))
	for i, want := range []string{"g2", "g1", fmt.Sprintf("g%d", tg)} {
		if reqs[i].Err != nil || string(reqs[i].Result.Bulk) != want {
			t.Errorf("write %d: %v %q, want served by %s", i, reqs[i].Err, reqs[i].Result.Bulk, want)
		}
	}
	if !errors.Is(reqs[3].Err, ErrCrossSlot) {
		t.Errorf("DEL across slots: %v, want CROSSSLOT", reqs[3].Err)
	}
	for id, r := range reps {
		for _, op := range r.ops {
			for _, k := range append([][]byte{op.Key}, op.Keys...) {
				if len(k) > 0 && op.Kind != kv.KindMSet && m.Owner(Slot(k)) != id {
					t.Errorf("group %d was given key %q of slot %d", id, k, Slot(k))
				}
			}
		}
	}
	res, err := mu.Read(context.Background(), kv.Op{Kind: kv.KindGet, Key: []byte(k3)}, level.ConsLinearizable, shard.Session{})
	if err != nil || string(res.Bulk) != "g3" {
		t.Fatalf("GET %s = %q, %v; want group 3's", k3, res.Bulk, err)
	}
	// A scan of the keyspace merges every group's, in key order.
	res, err = mu.Read(context.Background(), kv.Op{Kind: kv.KindScan}, level.ConsLinearizable, shard.Session{})
	if err != nil || fmt.Sprintf("%s", res.Array) != "[g1-k v g2-k v g3-k v]" {
		t.Fatalf("scan = %s, %v", res.Array, err)
	}
}

// A request for a group this node does not host, or whose replica here is
// a follower, fails with a not-leader error that names the slot, which
// SlotRedirect makes Redis Cluster's -MOVED <slot> <addr>.
func TestMultiRedirectNamesTheSlot(t *testing.T) {
	mu, m, reps := newTestMulti(t, 1, 2)
	k3 := keyIn(m, 3)
	_, err := mu.Read(context.Background(), kv.Op{Kind: kv.KindGet, Key: []byte(k3)}, level.ConsLinearizable, shard.Session{})
	e, ok := SlotRedirect(err)
	if want := fmt.Sprintf("MOVED %d n3:3", Slot([]byte(k3))); !ok || e.Msg != want {
		t.Fatalf("GET of a group not hosted: %v (%v), want %s", err, e, want)
	}
	reps[2].refuse = &NotLeaderError{Leader: 3, Addr: "n3:3"}
	k2 := keyIn(m, 2)
	reqs := []shard.WriteReq{{Op: kv.Op{Kind: kv.KindSet, Key: []byte(k2), Value: []byte("x")}}}
	if _, err := mu.Apply(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	e, ok = SlotRedirect(reqs[0].Err)
	if want := fmt.Sprintf("MOVED %d n3:3", Slot([]byte(k2))); !ok || e.Msg != want {
		t.Fatalf("SET at a follower of its group: %v, want %s", reqs[0].Err, want)
	}
	if _, ok := SlotRedirect(&NotLeaderError{Leader: 3, Addr: "n3:3"}); ok {
		t.Fatal("a not-leader error without a slot (one group) is not a slot redirect")
	}
	// A chain member sending a read to its tail (ReadAt) names no leader:
	// never a redirect, slot or not — the front door forwards it.
	tail := withSlot(&NotLeaderError{Leader: 3, Addr: "n3:3", ReadAt: true}, 7)
	if _, ok := SlotRedirect(tail); ok || !ReadElsewhere(tail) {
		t.Fatalf("a read sent to a chain's tail: slot redirect %v, read elsewhere %v; want forwarded", ok, ReadElsewhere(tail))
	}
	if ReadElsewhere(reqs[0].Err) {
		t.Fatal("a write at a follower is read elsewhere")
	}
}

// A group refuses keys of slots it does not own by its own account, even
// when the routing map sends them to it (a map older than the group's
// knowledge, once the metadata group moves slots): nothing is proposed.
func TestGroupRefusesSlotsItDoesNotOwn(t *testing.T) {
	routing, err := NewSlotMap(1, EvenGroups(3, []uint64{1, 2, 3}, 3))
	if err != nil {
		t.Fatal(err)
	}
	// Group 1 gave up slots 0-99 (to group 2) by its own account; the
	// routing map still sends them to it.
	own := GroupSpec{ID: 1, Members: []uint64{1, 2, 3}, Slots: []SlotRange{{100, 5460}}}
	rep := &fakeReplica{name: "g1"}
	mu, err := NewMulti(routing, 1, nil, []LocalGroup{{Spec: own, Hosted: Hosted{Replica: rep, Group: &stateGroup{}}}})
	if err != nil {
		t.Fatal(err)
	}
	var k string
	for i := 0; ; i++ {
		if k = fmt.Sprintf("k%d", i); Slot([]byte(k)) < 100 {
			break
		}
	}
	reqs := []shard.WriteReq{{Op: kv.Op{Kind: kv.KindSet, Key: []byte(k), Value: []byte("x")}}}
	if _, err := mu.Apply(context.Background(), reqs); err != nil {
		t.Fatal(err)
	}
	if reqs[0].Err == nil || !strings.HasPrefix(reqs[0].Err.Error(), "TRYAGAIN") || len(rep.ops) != 0 {
		t.Fatalf("write of slot %d the group gave away: %v, the group saw %d ops", Slot([]byte(k)), reqs[0].Err, len(rep.ops))
	}
	if _, err := mu.Read(context.Background(), kv.Op{Kind: kv.KindGet, Key: []byte(k)}, level.ConsLinearizable, shard.Session{}); err == nil || len(rep.ops) != 0 {
		t.Fatalf("read of slot %d the group gave away: %v", Slot([]byte(k)), err)
	}
}

// A forwarded request answered with Redis Cluster's "MOVED <slot> <addr>"
// (a node of several groups) is followed to addr, as "MOVED <addr>" is.
func TestForwarderFollowsSlotMoved(t *testing.T) {
	leader := fakeLeader(t, func(int, []string) string { return "*2\r\n$1\r\n0\r\n+OK\r\n" })
	follower := fakeLeader(t, func(int, []string) string { return "-MOVED 1234 " + leader + "\r\n" })
	f := newForwarder("", "", "")
	f.retryFor = 300 * time.Millisecond
	defer f.close()
	fc := &Call{Args: [][]byte{[]byte("SET"), []byte("k"), []byte("v")}, Dur: level.Sync}
	f.forward(follower, []*Call{fc}, func() (string, bool) { return "", false })
	if fc.Err != nil || fc.Reply.Kind != resp.Simple || string(fc.Reply.Str) != "OK" {
		t.Fatalf("outcome %v, reply %v; want the leader's OK", fc.Err, fc.Reply)
	}
}

// The routing cost per request at a node of several groups: hash the key,
// read the owner, check the group's own bitmap (go test -bench MultiRoute).
func BenchmarkMultiRoute(b *testing.B) {
	m, err := NewSlotMap(1, EvenGroups(3, []uint64{1, 2, 3}, 3))
	if err != nil {
		b.Fatal(err)
	}
	var locals []LocalGroup
	for _, g := range m.Groups {
		locals = append(locals, LocalGroup{Spec: g, Hosted: Hosted{Replica: &fakeReplica{}, Group: &stateGroup{}}})
	}
	mu, err := NewMulti(m, 1, nil, locals)
	if err != nil {
		b.Fatal(err)
	}
	op := kv.Op{Kind: kv.KindGet, Key: []byte("key:000000012345")}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := mu.route(&op); err != nil {
			b.Fatal(err)
		}
	}
}
