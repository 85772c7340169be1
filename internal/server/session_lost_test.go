package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A session whose write a view change dropped in one group is lost at
// every group of a node that hosts the first (cluster.Multi.sessionAt), and
// so in particular at the group the write's key moved to — which holds
// nothing of the first group's log and could not tell (docs/design/cluster.md
// §8, "What carries across a move"). The dropped write is the token's: its
// group 1 part names the op of the session's SET with a view that op was not
// ordered in, exactly what a cad or async write acknowledged in a view that
// lost it leaves in a token (vrshard TestSessionTokenDetectsAWriteAViewChangeDropped
// makes one for real). Reads of group 2's keys with it fail with the lost
// session's error; with the mutation OtherPartsUnchecked they are served.
// Then the key's slot moves to group 2, and its read there fails too, while
// a fresh session reads the key.
func TestSessionLostInOneGroupIsLostAtEvery(t *testing.T) {
	g := startTwoGroups(t)
	ka, kb := keyOfGroup(1, "lost"), keyOfGroup(2, "other")
	c := dial(t, g.nodes[0])
	c.expect(`KEFIR.CONSISTENCY session => OK`)
	c.expect(`SET ` + ka + ` a0 => OK`)
	c.expect(`SET ` + kb + ` b0 => OK`)
	tok := strings.Trim(c.do("KEFIR.SESSION"), `"`)
	s, err := shard.ParseSession(tok)
	if err != nil || len(s.Groups) != 2 || s.Groups[0].Group != 1 || !s.Groups[0].WriteViewKnown {
		t.Fatalf("token %q: %+v %v", tok, s, err)
	}
	s.Groups[0].WriteView++ // the op went to another view's write
	lost := s.String()

	read := func(k string) string {
		t.Helper()
		rc := dial(t, g.nodes[0])
		rc.expect(`KEFIR.CONSISTENCY session => OK`)
		rc.expect(`KEFIR.SESSION ` + lost + ` => OK`)
		return rc.do("GET", k)
	}
	isLost := func(got string) bool {
		return strings.Contains(got, "lost") && strings.Contains(got, "group 1")
	}
	if got := read(ka); !strings.Contains(got, "lost") {
		t.Fatalf("GET %s (group 1) with the lost token: %s, want the lost session's error", ka, got)
	}
	if got := read(kb); !isLost(got) {
		t.Fatalf("GET %s (group 2) with a token whose group 1 part is lost: %s, want the lost session's error naming group 1", kb, got)
	}
	if mutation.On {
		cluster.MultiMut.OtherPartsUnchecked.Store(true)
		got := read(kb)
		cluster.MultiMut.OtherPartsUnchecked.Store(false)
		if isLost(got) {
			t.Fatalf("OtherPartsUnchecked not caught: %s", got)
		}
		t.Logf("with OtherPartsUnchecked group 2 serves the lost session: %s", got)
	}

	slot := uint16(cluster.Slot([]byte(ka)))
	mv := &cluster.Mover{Seeds: []string{g.cfgs[0].ClientAddr, g.cfgs[1].ClientAddr}, RetryFor: 10 * time.Second, Meta: true, Driver: "TestSessionLostInOneGroupIsLostAtEvery"}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := mv.Move(ctx, 1, 2, []kv.SlotRange{{Start: slot, End: slot}}); err != nil {
		t.Fatalf("move slot %d to group 2: %v", slot, err)
	}
	if got := read(ka); !isLost(got) {
		t.Fatalf("GET %s after its slot moved to group 2, with the lost token: %s, want the lost session's error naming group 1", ka, got)
	}
	fresh := dial(t, g.nodes[0])
	fresh.expect(`KEFIR.CONSISTENCY session => OK`)
	fresh.expect(`GET ` + ka + ` => "a0"`)
}

// The same at a node that does not host the group that lost the write:
// group 1 (slots 0-8191) on node 1 alone, group 2 (the rest) on node 3
// alone (node 2 hosts a third group, which owns no slots), the session reading at node 3. Node 3 has no replica of group 1 to
// judge the token's part by; a move of group 1's slots to group 2 brings
// group 1's view history along (kv/viewcopy.go), and group 2's replica
// judges the part by that copy: the moved key's read reports the lost write
// naming group 1 — and so does a read of any group 2 key — also after node 3
// restarts (the copy is in group 2's state), while a fresh session reads the
// key. With the mutation NoViewCopies the first move takes no copy and the
// moved key is served to the lost session; with CopiesUnchecked the copy is
// not consulted and it is served as well.
func TestSessionLostAtANodeThatDoesNotHostItsGroup(t *testing.T) {
	g := startGroupWith(t, func(c *Config) {
		c.Groups = []cluster.GroupSpec{
			{ID: 1, Members: []uint64{1}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{3}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
			{ID: 3, Members: []uint64{2}}, // a node is a member of some group
		}
	})
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool {
		return len(groupLeaders(g, 1)) == 1 && len(groupLeaders(g, 2)) == 1
	}) {
		t.Fatal("the groups have no leaders")
	}
	ka, kc, kb := keyOfGroup(1, "lost"), keyOfGroup(1, "carrier"), keyOfGroup(2, "other")
	if cluster.Slot([]byte(ka)) == cluster.Slot([]byte(kc)) {
		t.Fatalf("%s and %s share a slot", ka, kc)
	}
	c := dial(t, g.nodes[2])
	c.expect(`KEFIR.CONSISTENCY session => OK`)
	c.expect(`SET ` + ka + ` a0 => OK`)
	c.expect(`SET ` + kb + ` b0 => OK`)
	tok := strings.Trim(c.do("KEFIR.SESSION"), `"`)
	s, err := shard.ParseSession(tok)
	if err != nil || len(s.Groups) != 2 || s.Groups[0].Group != 1 || !s.Groups[0].WriteViewKnown {
		t.Fatalf("token %q: %+v %v", tok, s, err)
	}
	s.Groups[0].WriteView++ // the op went to another view's write
	lost := s.String()

	node3 := g.nodes[2]
	read := func(k string) string {
		t.Helper()
		rc := dial(t, node3)
		rc.expect(`KEFIR.CONSISTENCY session => OK`)
		rc.expect(`KEFIR.SESSION ` + lost + ` => OK`)
		return rc.do("GET", k)
	}
	isLost := func(got string) bool {
		return strings.Contains(got, "lost") && strings.Contains(got, "group 1")
	}
	// Nothing at node 3 can judge group 1's part yet.
	t.Logf("before any move, GET %s (group 2) at node 3 with the lost token: %s", kb, read(kb))

	move := func(k string, copies int) {
		t.Helper()
		slot := uint16(cluster.Slot([]byte(k)))
		mv := &cluster.Mover{Seeds: []string{g.cfgs[0].ClientAddr, g.cfgs[2].ClientAddr}, RetryFor: 10 * time.Second, Meta: true, Driver: "TestSessionLostAtANodeThatDoesNotHostItsGroup"}
		defer mv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := mv.Move(ctx, 1, 2, []kv.SlotRange{{Start: slot, End: slot}})
		if err != nil {
			t.Fatalf("move slot %d to group 2: %v", slot, err)
		}
		if res.ViewCopies != copies {
			t.Fatalf("the move of slot %d took %d view copies to group 2, want %d", slot, res.ViewCopies, copies)
		}
	}
	if mutation.On {
		cluster.MultiMut.NoViewCopies.Store(true)
		move(ka, 0)
		cluster.MultiMut.NoViewCopies.Store(false)
		got := read(ka)
		if isLost(got) {
			t.Fatalf("NoViewCopies not caught: %s", got)
		}
		t.Logf("moved without group 1's view history, %s is served to the lost session at node 3: %s", ka, got)
		// Another slot's move brings the copy (any slot of the group does).
		move(kc, 1)
	} else {
		move(ka, 1)
	}
	for _, k := range []string{ka, kb} {
		if got := read(k); !isLost(got) {
			t.Fatalf("GET %s at node 3 (group 2's only node) once group 1's view history came with a move, with the lost token: %s, want the lost session's error naming group 1", k, got)
		}
	}
	if mutation.On {
		cluster.MultiMut.CopiesUnchecked.Store(true)
		got := read(ka)
		cluster.MultiMut.CopiesUnchecked.Store(false)
		if isLost(got) {
			t.Fatalf("CopiesUnchecked not caught: %s", got)
		}
	}

	// The copy is group 2's state: it survives node 3's restart.
	cfg := g.cfgs[2]
	cfg.Bootstrap = false
	if err := node3.Close(); err != nil {
		t.Fatal(err)
	}
	node3 = g.start(t, cfg)
	g.nodes[2] = node3
	if !testgroup.Until(20*time.Second, 20*time.Millisecond, func() bool { return len(groupLeaders(g, 2)) == 1 }) {
		t.Fatal("group 2 has no leader after node 3's restart")
	}
	if got := read(ka); !isLost(got) {
		t.Fatalf("GET %s at node 3 after its restart, with the lost token: %s, want the lost session's error naming group 1", ka, got)
	}
	fresh := dial(t, node3)
	fresh.expect(`KEFIR.CONSISTENCY session => OK`)
	fresh.expect(`GET ` + ka + ` => "a0"`)
}
