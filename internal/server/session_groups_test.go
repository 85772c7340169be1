package server

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/transport"
)

// startTwoGroups starts three nodes that each host a replica of two
// 3-replica groups, group 1 owning slots 0-8191 and group 2 the rest, and
// waits for both groups' leaders.
func startTwoGroups(t *testing.T) *group {
	t.Helper()
	g := startGroupWith(t, func(c *Config) {
		// A follower cut off for the test's few hundred milliseconds must
		// not start a view change meanwhile (its reads would then wait
		// for a leader rather than be forwarded at once).
		c.ViewChangeTimeout = 3 * time.Second
		c.Groups = []cluster.GroupSpec{
			{ID: 1, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 0, End: 8191}}},
			{ID: 2, Members: []uint64{1, 2, 3}, Slots: []cluster.SlotRange{{Start: 8192, End: 16383}}},
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for _, id := range []cluster.GroupID{1, 2} {
		for len(groupLeaders(g, id)) != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("group %d has no leader", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return g
}

// groupLeaders returns the nodes (indexes) whose replica of group id leads.
func groupLeaders(g *group, id cluster.GroupID) []int {
	var out []int
	for i, s := range g.nodes {
		if st, ok := s.multi.GroupState(id); ok && st.Normal && st.IsLeader {
			out = append(out, i)
		}
	}
	return out
}

// isolatePeers cuts (or heals) node i's peer links to the others: its
// replicas of every group stop receiving the groups' logs. Client
// connections (and so forwarded calls) still reach it.
func (g *group) isolatePeers(t *testing.T, i int, on bool) {
	t.Helper()
	for j, cfg := range g.cfgs {
		if j != i {
			if err := g.nodes[i].peerTr.SetLinkFault(cfg.ReplicaID, transport.Fault{Partition: on}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// keyOfGroup returns a key whose slot group id (of startTwoGroups) owns.
func keyOfGroup(id cluster.GroupID, prefix string) string {
	for i := 0; ; i++ {
		k := prefix + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		if s := cluster.Slot([]byte(k)); (s < 8192) == (id == 1) {
			return k
		}
	}
}

// A session at level session on a node of two groups reads its own writes
// of both groups' keys at a follower of both that the groups' logs do not
// reach: each read waits for its group's part of the token, then (past
// FollowerWait) is forwarded to that group's leader. The session checker
// judges the history. With the mutation WrongSessionPart (every group's
// replica is given the token's top-level part, none of its own), the
// follower serves its stale state at once and the checker fails.
func TestSessionReadsAcrossGroupsAtFollowers(t *testing.T) {
	run := func(t *testing.T) (check.Verdict, string) {
		g := startTwoGroups(t)
		l1, l2 := groupLeaders(g, 1)[0], groupLeaders(g, 2)[0]
		f := 0
		for f == l1 || f == l2 {
			f++
		}
		ka, kb := keyOfGroup(1, "a"), keyOfGroup(2, "b")
		rec := check.NewRecorder(nil)
		sess := level.Consistency{Kind: level.Session}
		put := func(c *client, client int, k, v string) {
			id := rec.Invoke(check.Op{Client: client, Kind: check.Put, Key: k, Value: v, Cons: sess})
			if got := c.do("SET", k, v); got != "OK" {
				t.Fatalf("SET %s %s = %s", k, v, got)
			}
			rec.Complete(id, check.Result{Node: -1})
		}
		get := func(c *client, client int, k string) string {
			id := rec.Invoke(check.Op{Client: client, Kind: check.Get, Key: k, Cons: sess})
			got := c.do("GET", k)
			if got == "(nil)" {
				rec.Complete(id, check.Result{Node: f})
				return got
			}
			if !strings.HasPrefix(got, `"`) {
				t.Fatalf("GET %s = %s", k, got)
			}
			rec.Complete(id, check.Result{Found: true, Value: strings.Trim(got, `"`), Node: f})
			return got
		}
		// The first values, written and read back at f by a session of
		// its own, reach f's replicas of both groups.
		c0 := dial(t, g.nodes[f])
		c0.expect(`KEFIR.CONSISTENCY session => OK`)
		put(c0, 0, ka, "a0")
		put(c0, 0, kb, "b0")
		get(c0, 0, ka)
		get(c0, 0, kb)

		g.isolatePeers(t, f, true)
		defer g.isolatePeers(t, f, false)
		c := dial(t, g.nodes[f])
		c.expect(`KEFIR.CONSISTENCY session => OK`)
		put(c, 1, ka, "a1") // forwarded to group 1's leader
		put(c, 1, kb, "b1") // and to group 2's
		tok := c.do("KEFIR.SESSION")
		if !strings.HasPrefix(tok, `"v3.1:`) || !strings.Contains(tok, ",2:") {
			t.Fatalf("session token %s, want a v3 token with parts of groups 1 and 2", tok)
		}
		get(c, 1, ka)
		get(c, 1, kb)
		put(c, 1, kb, "b2")
		get(c, 1, kb)
		get(c, 1, ka)
		// CLUSTER COUNTKEYSINSLOT, a read of the slot's group too, counts
		// the session's new key of a slot that had none.
		kc := keyOfGroup(1, "c")
		for cluster.Slot([]byte(kc)) == cluster.Slot([]byte(ka)) {
			kc += "c"
		}
		put(c, 1, kc, "c1")
		count := c.do("CLUSTER", "COUNTKEYSINSLOT", strconv.Itoa(int(cluster.Slot([]byte(kc)))))
		v := check.Session(rec.History(), check.SessionOptions{})
		t.Logf("token after the writes: %s; %s; COUNTKEYSINSLOT %s", tok, v, count)
		return v, count
	}
	if v, count := run(t); !v.OK || count != "(integer) 1" {
		t.Fatalf("session across groups: %s; CLUSTER COUNTKEYSINSLOT of the session's new key's slot = %s, want 1", v, count)
	}
	if !mutation.On {
		return
	}
	cluster.MultiMut.WrongSessionPart.Store(true)
	defer cluster.MultiMut.WrongSessionPart.Store(false)
	if v, count := run(t); v.OK || count != "(integer) 0" {
		t.Fatalf("WrongSessionPart not caught: %s; COUNTKEYSINSLOT %s (want the stale 0)", v, count)
	} else {
		t.Logf("caught: %s", v)
	}
}

// A keyspace scan at level session on a node of two groups reads every
// group at the session's part for it and advances every group's part by
// what it read there (cluster.Multi.Scan): a session that then reads at a
// replica behind either group waits for what the scan saw. KEFIR.SCAN (one
// read) and KEYS (readMore) both.
func TestSessionScanAcrossGroupsAdvancesEveryGroupsPart(t *testing.T) {
	g := startTwoGroups(t)
	ka, kb := keyOfGroup(1, "a"), keyOfGroup(2, "b")
	w := dial(t, g.nodes[0])
	w.expect(`KEFIR.CONSISTENCY session => OK`)
	w.expect("SET " + ka + " 1 => OK\nSET " + kb + " 2 => OK")
	written := w.do("KEFIR.SESSION")
	for i, cmd := range [][]string{{"KEFIR.SCAN", "", ""}, {"KEYS", "*"}} {
		c := dial(t, g.nodes[(i+1)%3])
		c.expect(`KEFIR.CONSISTENCY session => OK`)
		// Start from the writer's token: the scan must see both writes.
		if got := c.do("KEFIR.SESSION", strings.Trim(written, `"`)); got != "OK" {
			t.Fatalf("KEFIR.SESSION %s = %s", written, got)
		}
		got := c.do(cmd...)
		if !strings.Contains(got, `"`+ka+`"`) || !strings.Contains(got, `"`+kb+`"`) {
			t.Fatalf("%v = %s, want both keys", cmd, got)
		}
		tok := strings.Trim(c.do("KEFIR.SESSION"), `"`)
		s, err := shard.ParseSession(tok)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range []uint32{1, 2} {
			if p := s.For(id); p.MaxRead == 0 || p.MaxRead < p.LastWrite {
				t.Fatalf("%v: token %s: group %d's part %+v: the scan did not advance its reads", cmd, tok, id, p)
			}
		}
		t.Logf("%v: token %s", cmd, tok)
	}
}
