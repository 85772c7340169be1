package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
)

func repairMap(groups ...kv.MapGroup) *kv.ClusterMap {
	cm := &kv.ClusterMap{Epoch: 3, Groups: groups}
	ids := map[uint64]bool{}
	for _, g := range groups {
		for _, id := range g.Members {
			ids[id] = true
		}
	}
	for id := uint64(1); ids[id]; id++ {
		cm.Nodes = append(cm.Nodes, kv.MapNode{ID: id, ClientAddr: "c", PeerAddr: "p"})
	}
	return cm
}

// probe records a probe round at t: every node of cm answers but down.
func probe(w *RepairWatch, t time.Time, cm *kv.ClusterMap, down ...uint64) {
	for _, n := range cm.Nodes {
		w.Observe(t, n.ID, !slices.Contains(down, n.ID))
	}
}

func sameChanges(a, b []GroupChange) bool {
	return slices.EqualFunc(a, b, func(x, y GroupChange) bool { return x.Group == y.Group && slices.Equal(x.Members, y.Members) })
}

// checkRepairAfter is the repairer's "who is dead, and when" on the
// e2e's cluster (4 nodes, group 1 [1 2 4], group 2 [4 3 1], the metadata
// group on 1-3), with an injected clock: node 4 stops answering at 1 s;
// it is due exactly --repair-after (5 s) after it last answered, not
// before; a node that answers in between starts its wait again; nothing is
// due while a move is in flight, for a node whose repair just failed, or
// with repair off.
func checkRepairAfter() error {
	const after = 5 * time.Second
	cm := repairMap(kv.MapGroup{ID: 1, Members: []uint64{1, 2, 4}}, kv.MapGroup{ID: 2, Members: []uint64{4, 3, 1}})
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var w RepairWatch
	if _, ok, _ := w.Due(t0, cm, after); ok {
		return errors.New("due at the watch's start")
	}
	probe(&w, at(0), cm)
	for s := time.Second; s < after; s += 500 * time.Millisecond {
		probe(&w, at(s), cm, 4)
		if d, ok, _ := w.Due(at(s), cm, after); ok {
			return fmt.Errorf("node %d due %v after node 4 last answered (--repair-after %v)", d.Node, s, after)
		}
	}
	probe(&w, at(after), cm, 4)
	d, ok, stuck := w.Due(at(after), cm, after) // last answered at 0
	if !ok || d.Node != 4 || len(stuck) != 0 || len(d.Skipped) != 0 {
		return fmt.Errorf("node 4 not due --repair-after after it last answered: %+v %v %+v", d, ok, stuck)
	}
	// Each group takes the live node not in it, as replace-node --old 4
	// does (TestGroupsReplaceAFailedNodeOnTheClustersNodes).
	if want := []GroupChange{{Group: 1, Members: []uint64{1, 2, 3}}, {Group: 2, Members: []uint64{2, 3, 1}}}; !sameChanges(d.Plan, want) {
		return fmt.Errorf("node 4's plan %+v, want %+v", d.Plan, want)
	}
	if _, ok, _ := w.Due(at(after), cm, 0); ok {
		return errors.New("due with repair off (--repair-after 0)")
	}
	moving := *cm
	moving.Moves = []kv.MapMove{{From: 1, To: 2, Epoch: 9}}
	if _, ok, _ := w.Due(at(after), &moving, after); ok {
		return errors.New("due while a move is in flight")
	}
	w.Failed(at(after), 4, after)
	if _, ok, _ := w.Due(at(after+time.Second), cm, after); ok {
		return errors.New("due again a second after its repair failed")
	}
	if _, ok, _ := w.Due(at(2*after), cm, after); !ok {
		return errors.New("not tried again --repair-after after its repair failed")
	}
	// Node 4 answers at 7 s, then not: due at 12 s, not 11.
	probe(&w, at(7*time.Second), cm)
	probe(&w, at(8*time.Second), cm, 4)
	if _, ok, _ := w.Due(at(11*time.Second), cm, after); ok {
		return errors.New("due 4 s after node 4 answered again")
	}
	if d, ok, _ := w.Due(at(12*time.Second), cm, after); !ok || d.Node != 4 {
		return fmt.Errorf("node 4 not due 5 s after it answered again: %+v %v", d, ok)
	}
	// A new leader's watch: nothing before a whole --repair-after of its
	// own, whatever the last one saw.
	w.Reset()
	if _, ok, _ := w.Due(at(13*time.Second), cm, after); ok {
		return errors.New("due at a new watch's start")
	}
	probe(&w, at(13*time.Second), cm, 4)
	if _, ok, _ := w.Due(at(17*time.Second), cm, after); ok {
		return errors.New("due 4 s into a new watch")
	}
	return nil
}

// checkRepairQuorum: a group a majority of whose members do not answer is
// never planned — VR reconfigures a group only through its current
// epoch's quorum, so the change could not commit (and picking a member's
// replacement then would lose the only knowledge of what the group
// committed): it is skipped and reported, the node's other groups are
// repaired; a node every group of which is so is reported and not due.
func checkRepairQuorum() error {
	const after = time.Second
	t0 := time.Unix(1000, 0)
	// Nodes 2 and 4 dead: group 1 [1 2 4] has lost its majority, group 2
	// [3 4 5] and the metadata group [1 2 3] have not.
	cm := repairMap(kv.MapGroup{ID: 1, Members: []uint64{1, 2, 4}}, kv.MapGroup{ID: 2, Members: []uint64{3, 4, 5}})
	var w RepairWatch
	probe(&w, t0, cm, 2, 4)
	d, ok, _ := w.Due(t0.Add(after), cm, after)
	if !ok || d.Node != 2 {
		return fmt.Errorf("node 2 not due: %+v %v", d, ok)
	}
	if len(d.Skipped) != 1 || d.Skipped[0].Group != 1 || !slices.Equal(d.Skipped[0].Down, []uint64{2, 4}) {
		return fmt.Errorf("node 2's group 1 (2 of 3 members down) not skipped: %+v", d)
	}
	if want := []GroupChange{{Group: MetaGroupID, Members: []uint64{1, 5, 3}}}; !sameChanges(d.Plan, want) {
		return fmt.Errorf("node 2's plan %+v, want %+v (the metadata group only)", d.Plan, want)
	}
	// Nodes 2 and 3 dead, every group of each has lost its majority:
	// nothing due, both reported.
	cm = repairMap(kv.MapGroup{ID: 1, Members: []uint64{1, 2, 3}}, kv.MapGroup{ID: 2, Members: []uint64{2, 3, 4}})
	w = RepairWatch{}
	probe(&w, t0, cm, 2, 3)
	d, ok, stuck := w.Due(t0.Add(after), cm, after)
	if ok {
		return fmt.Errorf("node %d due with every group of it short of a quorum: %+v", d.Node, d)
	}
	if len(stuck) != 2 || stuck[0].Node != 2 || len(stuck[0].Skipped) != 3 || stuck[0].Err != nil {
		return fmt.Errorf("nodes 2 and 3 not reported as skipped: %+v", stuck)
	}
	return nil
}

// checkRepairChainQuorum: a chain group is reconfigured by its master
// through any one member that has the state, so it is repaired while one
// of its members answers — though a majority does not — and skipped only
// when none does (Due's chain branch; the VR rule would skip it).
func checkRepairChainQuorum() error {
	const after = time.Second
	t0 := time.Unix(1000, 0)
	// Group 1 [1 5 6] (VR), chain group 2 [2 3 4], the metadata group
	// [1 2 3]. Nodes 2 and 3 dead: the chain keeps node 4, the metadata
	// group has lost its majority.
	cm := repairMap(kv.MapGroup{ID: 1, Members: []uint64{1, 5, 6}}, kv.MapGroup{ID: 2, Members: []uint64{2, 3, 4}, Engine: kv.EngineChain})
	var w RepairWatch
	probe(&w, t0, cm, 2, 3)
	d, ok, _ := w.Due(t0.Add(after), cm, after)
	if !ok || d.Node != 2 {
		return fmt.Errorf("node 2 not due with one member of its chain answering: %+v %v", d, ok)
	}
	if len(d.Plan) != 1 || d.Plan[0].Group != 2 || !d.Plan[0].Chain || !slices.Equal(d.Plan[0].Join, []uint64{5}) || !slices.Equal(d.Plan[0].Leave, []uint64{2}) {
		return fmt.Errorf("node 2's plan %+v, want chain group 2 joining node 5, leaving node 2", d.Plan)
	}
	if len(d.Skipped) != 1 || d.Skipped[0].Group != MetaGroupID {
		return fmt.Errorf("node 2's skipped groups %+v, want the metadata group alone", d.Skipped)
	}
	// Every member of the chain dead: skipped, nothing due for node 2; the
	// log says each group's rule — the chain's "none answers", not VR's
	// "a majority".
	w = RepairWatch{}
	probe(&w, t0, cm, 2, 3, 4)
	d, ok, stuck := w.Due(t0.Add(after), cm, after)
	if ok {
		return fmt.Errorf("node %d due with no member of its chain answering: %+v", d.Node, d)
	}
	i := slices.IndexFunc(stuck, func(d RepairDecision) bool { return d.Node == 2 })
	if i < 0 {
		return fmt.Errorf("node 2 is not stuck: %+v", stuck)
	}
	msg := stuckMessage(stuck[i], after)
	for _, want := range []string{
		"group 2 (members [2 3 4], not answering [2 3 4]): none of its members answers: a chain is repaired through a member that holds its state;",
		"the metadata group (members [1 2 3], not answering [2 3]): a majority of its members do not answer",
	} {
		if !strings.Contains(msg, want) {
			return fmt.Errorf("node 2's stuck message %q does not say %q", msg, want)
		}
	}
	return nil
}

// checkRepairerOneAtATime: the leader's repairer runs one repair at a
// time however many ticks find it due, and losing the leadership cancels
// the one in hand and forgets the watch (the next leader starts afresh).
// The cluster is stood in for (exec): the decision is the watch's.
func checkRepairerOneAtATime() error {
	cm := repairMap(kv.MapGroup{ID: 1, Members: []uint64{1, 2, 4}}, kv.MapGroup{ID: 2, Members: []uint64{4, 3, 1}})
	var r Repairer
	var mu sync.Mutex
	running, most := 0, 0
	started := make(chan uint64, 8)
	// release ends every repair still running when the check fails (with
	// two at once, lost cancels only the one it knows).
	release := make(chan struct{})
	r.Exec = func(ctx context.Context, _ *Mover, _ *kv.ClusterMap, d RepairDecision) error {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		started <- d.Node
		select { // until the leadership is lost
		case <-ctx.Done():
		case <-release:
		}
		mu.Lock()
		running--
		mu.Unlock()
		return ctx.Err()
	}
	// Node 4 silent for an hour; a probe round is under way (none starts).
	now := time.Now()
	probe(&r.watch, now.Add(-time.Hour), cm)
	probe(&r.watch, now, cm, 4)
	r.probing = true
	r.After = time.Minute
	for range 3 {
		r.Tick(context.Background(), cm)
	}
	select {
	case n := <-started:
		if n != 4 {
			return fmt.Errorf("repairing node %d, want 4", n)
		}
	case <-time.After(5 * time.Second):
		return errors.New("no repair started")
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	n := most
	mu.Unlock()
	if n != 1 {
		close(release)
		r.Lost()
		r.Wait()
		return fmt.Errorf("%d repairs ran at once", n)
	}
	r.Lost()
	waited := make(chan struct{})
	go func() { r.Wait(); close(waited) }()
	select {
	case <-waited: // the repair in hand returned: cancelled
	case <-time.After(5 * time.Second):
		close(release)
		<-waited
		return errors.New("the repair in hand was not cancelled when the leadership was lost")
	}
	r.Tick(context.Background(), cm)
	select {
	case <-started:
		close(release)
		r.Lost()
		r.Wait()
		return errors.New("a repair started right after the leadership was lost and found again (the watch was not forgotten)")
	case <-time.After(50 * time.Millisecond):
	}
	return nil
}

// checkRepairerLostBeforeStart: a repair the leader decided on, whose job
// had not started when the leadership was lost (Go defers it: a goroutine
// not yet scheduled, the simulation's job waiting for a coroutine), never
// runs — Lost had no cancel to call — and leaves the repairer free for the
// next term's repair.
func checkRepairerLostBeforeStart() error {
	cm := repairMap(kv.MapGroup{ID: 1, Members: []uint64{1, 2, 4}}, kv.MapGroup{ID: 2, Members: []uint64{4, 3, 1}})
	type job struct {
		ctx context.Context
		mv  *Mover
		run func(context.Context, *Mover)
	}
	var queued []job
	ran := 0
	r := Repairer{After: time.Minute,
		Go: func(ctx context.Context, _ string, mv *Mover, run func(context.Context, *Mover)) {
			queued = append(queued, job{ctx, mv, run})
		},
		Exec: func(context.Context, *Mover, *kv.ClusterMap, RepairDecision) error {
			ran++
			return nil
		}}
	now := time.Now()
	probe(&r.watch, now.Add(-time.Hour), cm)
	probe(&r.watch, now, cm, 4)
	r.probing = true // no probe round: the watch above decides
	r.Tick(context.Background(), cm)
	if len(queued) != 1 {
		return fmt.Errorf("%d jobs started for node 4's due repair, want 1", len(queued))
	}
	r.Lost()
	j := queued[0]
	j.run(j.ctx, j.mv)
	if ran > 0 {
		return errors.New("a repair decided before the leadership was lost ran after it (its job started late)")
	}
	if r.running {
		return errors.New("a repair dropped before it started still counts as running: the next term's repair never starts")
	}
	return nil
}

func TestRepairerLostBeforeStart(t *testing.T) {
	if err := checkRepairerLostBeforeStart(); err != nil {
		t.Fatal(err)
	}
}

func TestRepairerOneAtATime(t *testing.T) {
	if err := checkRepairerOneAtATime(); err != nil {
		t.Fatal(err)
	}
}

func TestRepairWatch(t *testing.T) {
	if err := checkRepairAfter(); err != nil {
		t.Fatal(err)
	}
	if err := checkRepairQuorum(); err != nil {
		t.Fatal(err)
	}
	if err := checkRepairChainQuorum(); err != nil {
		t.Fatal(err)
	}
	if err := checkRepairDroppedChainMember(); err != nil {
		t.Fatal(err)
	}
	if err := checkRepairDeadChainJoiner(); err != nil {
		t.Fatal(err)
	}
	if err := checkRepairZones(); err != nil {
		t.Fatal(err)
	}
}

// checkRepairZones: the repair of a dead node re-creates its replicas in
// its zone, the one its groups miss, over less loaded nodes of zones they
// have. Zones a, b, c: group 1 [1 2 3], chain group 2 [1 2] (its master
// dropped 3 already), group 3 [6 5 4], the metadata group [1 2 3]; node 3
// (c) dies. Nodes 4 (a) and 5 (b) host one replica each, as 6 (c) does:
// before zones, group 1 took 4 and the metadata group 5; now every group
// takes 6, the one node of zone c.
func checkRepairZones() error {
	const after = time.Second
	t0 := time.Unix(1000, 0)
	cm := &kv.ClusterMap{Epoch: 3, Nodes: zonedNodes("a", "b", "c", "a", "b", "c"), Groups: []kv.MapGroup{
		{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}},
		{ID: 2, Members: []uint64{1, 2}, Dropped: []uint64{3}, Engine: kv.EngineChain},
		{ID: 3, Members: []uint64{6, 5, 4}},
	}}
	var w RepairWatch
	probe(&w, t0, cm, 3)
	d, ok, stuck := w.Due(t0.Add(after), cm, after)
	if !ok || d.Node != 3 {
		return fmt.Errorf("zones: node 3 not due: %+v %v (stuck %+v)", d, ok, stuck)
	}
	if len(d.Plan) != 3 || !slices.Equal(d.Plan[0].Members, []uint64{1, 2, 6}) || !slices.Equal(d.Plan[1].Join, []uint64{6}) ||
		d.Plan[2].Group != MetaGroupID || !slices.Equal(d.Plan[2].Members, []uint64{1, 2, 6}) {
		return fmt.Errorf("zones: node 3's plan %+v, want node 6 (zone c) in group 1, chain group 2 and the metadata group", d.Plan)
	}
	for _, ch := range d.Plan {
		if note := ZoneNote(cm, ch); note != "" {
			return fmt.Errorf("zones: %s's change %+v shares a zone: %s", GroupName(ch.Group), ch, note)
		}
	}
	return nil
}

// checkRepairDeadChainJoiner: a node a chain wants in (the map's Joining)
// that died before it was linked in, and is in no other group, is due once
// silent for --repair-after — a growth's (chain [2 3], joining 5) and a
// replace's (chain [2 3 4] replacing 4 by 5: 4 waits in Leaving for 5's
// join, for ever). The repair withdraws the join (5 leaves: the map's
// Joining loses it, Leaving keeps it out) and places a live node outside
// the chain in its stead; with that wish recorded, the map names 5 joining
// no more, the chain waits for the new node, and a rerun plans the same
// wish (a no-op, then the wait).
func checkRepairDeadChainJoiner() error {
	const after = time.Second
	t0 := time.Unix(1000, 0)
	for _, replace := range []bool{false, true} {
		chainG := kv.MapGroup{ID: 2, Members: []uint64{2, 3}, Joining: []uint64{5}, Engine: kv.EngineChain}
		if replace {
			chainG.Members, chainG.Leaving = []uint64{2, 3, 4}, []uint64{4}
		}
		cm := repairMap(kv.MapGroup{ID: 1, Members: []uint64{1, 2, 3}, Slots: []kv.SlotRange{{Start: 0, End: kv.NumSlots - 1}}}, chainG)
		for _, id := range []uint64{4, 5, 6} {
			if !slices.ContainsFunc(cm.Nodes, func(n kv.MapNode) bool { return n.ID == id }) {
				cm.Nodes = append(cm.Nodes, kv.MapNode{ID: id, ClientAddr: "c", PeerAddr: "p"})
			}
		}
		var w RepairWatch
		probe(&w, t0, cm, 5)
		d, ok, stuck := w.Due(t0.Add(after), cm, after)
		if !ok || d.Node != 5 {
			return fmt.Errorf("replace %v: node 5, a dead joiner of chain group 2, not due: %+v %v (stuck %+v)", replace, d, ok, stuck)
		}
		if len(d.Plan) != 1 || d.Plan[0].Group != 2 || !d.Plan[0].Chain || len(d.Plan[0].Join) != 1 ||
			slices.Contains(slices.Concat(chainG.Members, chainG.Joining), d.Plan[0].Join[0]) || !slices.Equal(d.Plan[0].Leave, []uint64{5}) {
			return fmt.Errorf("replace %v: node 5's plan %+v, want chain group 2 joining a live node outside it and leaving 5", replace, d.Plan)
		}
		ch := d.Plan[0]
		wish := kv.MapChainWant{Group: 2, Epoch: cm.Epoch, Join: ch.Join, Leave: ch.Leave}
		next, err := applyChainWant(cm, wish)
		if err != nil {
			return fmt.Errorf("replace %v: the repair's wish %+v: %v", replace, wish, err)
		}
		g, _ := next.Group(2)
		if slices.Contains(g.Joining, 5) || !slices.Equal(g.Joining, ch.Join) || !slices.Contains(g.Leaving, 5) {
			return fmt.Errorf("replace %v: after the repair's wish the chain joins %v and leaves %v: want joining %v, 5 kept out", replace, g.Joining, g.Leaving, ch.Join)
		}
		if ChainChangeDone(next, ch) {
			return fmt.Errorf("replace %v: the repair is done before its node joined: %+v", replace, g)
		}
		again, err := PlanReplacePlaced(next, 5, func(id uint64) bool { return id != 5 })
		if err != nil || len(again) != 1 || !slices.Equal(again[0].Join, ch.Join) || !slices.Equal(again[0].Leave, ch.Leave) {
			return fmt.Errorf("replace %v: a rerun plans %+v (%v), want the same wish %+v", replace, again, err, ch)
		}
	}
	return nil
}

// applyChainWant is w applied to cm, as the metadata group applies
// KindMapChainWant: the map that results.
func applyChainWant(cm *kv.ClusterMap, w kv.MapChainWant) (*kv.ClusterMap, error) {
	cur := kv.AppendClusterMap(nil, cm)
	get := func(key []byte) ([]byte, []byte, uint64, bool, error) {
		if string(key) == string(kv.ClusterMapKey) {
			return cur, nil, 1, true, nil
		}
		return nil, nil, 0, false, nil
	}
	var out *kv.ClusterMap
	op := kv.Op{Kind: kv.KindMapChainWant, Key: kv.AppendMapChainWant(nil, w)}
	_, err := kv.Apply(get, 2, &op, 0, func(key, value, _ []byte, _ bool) {
		if string(key) == string(kv.ClusterMapKey) {
			out, _ = kv.DecodeClusterMap(value)
		}
	})
	if err == nil && out == nil {
		err = fmt.Errorf("the wish changed nothing")
	}
	return out, err
}

// checkRepairDroppedChainMember: a dead node its chain's master already
// dropped (the map's Dropped, within --fail-after) and that is in no
// other group is still due once silent for --repair-after: the chain runs
// one short until its place is re-created, on a live node outside it.
func checkRepairDroppedChainMember() error {
	const after = time.Second
	t0 := time.Unix(1000, 0)
	cm := repairMap(kv.MapGroup{ID: 1, Members: []uint64{1, 2, 3}},
		kv.MapGroup{ID: 2, Members: []uint64{2, 3}, Dropped: []uint64{5}, Engine: kv.EngineChain})
	for _, id := range []uint64{4, 5} {
		cm.Nodes = append(cm.Nodes, kv.MapNode{ID: id, ClientAddr: "c", PeerAddr: "p"})
	}
	var w RepairWatch
	probe(&w, t0, cm, 5)
	d, ok, stuck := w.Due(t0.Add(after), cm, after)
	if !ok || d.Node != 5 {
		return fmt.Errorf("node 5, dropped by its chain, not due: %+v %v (stuck %+v)", d, ok, stuck)
	}
	if len(d.Plan) != 1 || d.Plan[0].Group != 2 || !d.Plan[0].Chain || len(d.Plan[0].Join) != 1 || slices.Contains([]uint64{2, 3, 5}, d.Plan[0].Join[0]) {
		return fmt.Errorf("node 5's plan %+v, want chain group 2 joining a live node outside it", d.Plan)
	}
	return nil
}

// Each deliberate bug of the decision is caught by its check.
func TestRepairWatchMutationsCaught(t *testing.T) {
	mutation.Require(t)
	for _, c := range []struct {
		name  string
		set   *bool
		check func() error
	}{
		{"IgnoresAfter", &RepairMut.IgnoresAfter, checkRepairAfter},
		{"IgnoresQuorum", &RepairMut.IgnoresQuorum, checkRepairQuorum},
		{"Concurrent", &RepairMut.Concurrent, checkRepairerOneAtATime},
		{"IgnoresDeposition", &RepairMut.IgnoresDeposition, checkRepairerOneAtATime},
		{"IgnoresDeposition/before its start", &RepairMut.IgnoresDeposition, checkRepairerLostBeforeStart},
	} {
		*c.set = true
		err := c.check()
		*c.set = false
		if err == nil {
			t.Errorf("mutation %s not caught", c.name)
		} else {
			t.Logf("mutation %s caught: %v", c.name, err)
		}
	}
}

// BenchmarkRepairWatchDue is the leader's decision at each FollowMap tick
// (every 50 ms) on a map of 1,000 nodes and 1,000 groups of three, every
// node answering: the common case, which must not cost the leader much.
func BenchmarkRepairWatchDue(b *testing.B) {
	cm := &kv.ClusterMap{Epoch: 3}
	const nodes = 1000
	for id := uint64(1); id <= nodes; id++ {
		cm.Nodes = append(cm.Nodes, kv.MapNode{ID: id, ClientAddr: "c", PeerAddr: "p"})
	}
	for g := uint64(1); g <= nodes; g++ {
		cm.Groups = append(cm.Groups, kv.MapGroup{ID: g, Members: []uint64{g, g%nodes + 1, (g+1)%nodes + 1}})
	}
	var w RepairWatch
	t0 := time.Unix(1000, 0)
	probe(&w, t0, cm)
	b.ResetTimer()
	for b.Loop() {
		if _, ok, _ := w.Due(t0.Add(time.Second), cm, time.Minute); ok {
			b.Fatal("due with every node answering")
		}
	}
}
