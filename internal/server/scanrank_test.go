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

// A keyspace scan at level session at a node whose replica of a move's
// source is a follower behind the hand-over (docs/design/cluster.md §8,
// "The scan merge"). Node f (leading neither group) applies the session's
// writes of two group 1 keys, then its peer links are cut: its replicas of
// both groups stop applying. The keys' slots move to group 2 (the other
// two nodes carry both groups), and the session, at another node, deletes
// one key (kd) and overwrites the other (kw) there. Back at f, KEFIR.SCAN
// with that session reads group 1's part at f's replica — which still
// serves the slots (it has not even applied the move's first step) from
// its engine's state before the move — and group 2's part at its leader
// (f's replica is behind the session's writes there). The page must hold
// neither kd nor kw's old value: group 2's part ranks the slots above
// group 1's (cluster/slotrank.go). With the mutation ScanPartsUnranked
// the source's keys are kept, as before: kd comes back with its old value,
// and so does kw's old value (f's map still names group 1 as the slots'
// owner, whose copy the merge kept of a key two parts return).
func TestSessionScanAtAFollowerBehindAHandOver(t *testing.T) {
	g := startTwoGroups(t)
	l1, l2 := groupLeaders(g, 1)[0], groupLeaders(g, 2)[0]
	f := 0
	for f == l1 || f == l2 {
		f++
	}
	kd, kw := keyOfGroup(1, "deleted"), keyOfGroup(1, "overwritten")
	if cluster.Slot([]byte(kd)) == cluster.Slot([]byte(kw)) {
		t.Fatalf("%s and %s share a slot", kd, kw)
	}
	c := dial(t, g.nodes[f])
	c.expect(`KEFIR.CONSISTENCY session => OK`)
	c.expect(`SET ` + kd + ` old => OK`)
	c.expect(`SET ` + kw + ` old => OK`)
	tok := strings.Trim(c.do("KEFIR.SESSION"), `"`)
	s, err := shard.ParseSession(tok)
	if err != nil {
		t.Fatal(err)
	}
	// f's replica of group 1 applies the writes before it is cut off.
	var rep1 shard.Replica
	for _, lg := range g.nodes[f].multi.Hosted() {
		if lg.Spec.ID == 1 {
			rep1 = lg.Hosted.Replica
		}
	}
	if !testgroup.Until(10*time.Second, 10*time.Millisecond, func() bool { return rep1.Status().LastVersion >= s.For(1).LastWrite }) {
		t.Fatalf("node %d's replica of group 1 did not apply the session's writes (up to %d)", f+1, s.For(1).LastWrite)
	}
	g.isolatePeers(t, f, true)
	defer g.isolatePeers(t, f, false)

	var seeds []string
	for i, cfg := range g.cfgs {
		if i != f {
			seeds = append(seeds, cfg.ClientAddr)
		}
	}
	mv := &cluster.Mover{Seeds: seeds, RetryFor: 10 * time.Second, Meta: true, Driver: "TestSessionScanAtAFollowerBehindAHandOver"}
	defer mv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	moved := []kv.SlotRange{{Start: cluster.Slot([]byte(kd)), End: cluster.Slot([]byte(kd))}, {Start: cluster.Slot([]byte(kw)), End: cluster.Slot([]byte(kw))}}
	if _, err := mv.Move(ctx, 1, 2, moved); err != nil {
		t.Fatalf("move the keys' slots to group 2: %v", err)
	}

	w := dial(t, g.nodes[l2])
	w.expect(`KEFIR.CONSISTENCY session => OK`)
	w.expect(`KEFIR.SESSION ` + tok + ` => OK`)
	w.expect(`DEL ` + kd + ` => (integer) 1`)
	w.expect(`SET ` + kw + ` new => OK`)
	tok = strings.Trim(w.do("KEFIR.SESSION"), `"`)

	scan := func() string {
		t.Helper()
		rc := dial(t, g.nodes[f])
		rc.expect(`KEFIR.CONSISTENCY session => OK`)
		rc.expect(`KEFIR.SESSION ` + tok + ` => OK`)
		return rc.do("KEFIR.SCAN", "", "")
	}
	got := scan()
	if strings.Contains(got, `"`+kd+`"`) || !strings.Contains(got, `"`+kw+`"`) || strings.Contains(got, `"old"`) {
		t.Fatalf("KEFIR.SCAN at node %d (its replica of group 1 behind the move) with the session that deleted %s and overwrote %s at group 2: %s, want %s with \"new\" and no %s", f+1, kd, kw, got, kw, kd)
	}
	t.Logf("the page: %s", got)
	if mutation.On {
		cluster.MultiMut.ScanPartsUnranked.Store(true)
		got := scan()
		cluster.MultiMut.ScanPartsUnranked.Store(false)
		if !strings.Contains(got, `"`+kd+`"`) {
			t.Fatalf("ScanPartsUnranked not caught: %s", got)
		}
		t.Logf("with ScanPartsUnranked the deleted key is back: %s", got)
	}
}
