package vrshard

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/core"
)

// Review finding (chaincore.go heartbeatAnswer and the chain member's
// repair orders; chainmaster "a restarted master starts from the
// configuration it is given"): the members take a master's answers and
// orders whatever its epoch, so a master restarted from its --members after
// a repair and a rejoin (the chain is [1 3 2], the master believes [1 2 3])
// repairs the wrong chain when the head fails: it makes 2 — really the tail
// — the head, whose writes commit at once (it has no successor), while 3,
// still in the restarted master's chain and so under its lease, keeps
// serving linearizable reads from the history 1 gave it. A write answered
// before the read began is missing from the read.
func TestReviewRestartedMasterRepairsTheWrongChain(t *testing.T) {
	reviewFinding(t)
	b := newChainBed(t, 1, 2, 3)
	if err := b.propose(1, 7, 1, "w1"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	// The tail 3 fails and comes back from its disk; the master joins it
	// before the tail (chainmaster: Join at len(members)): the chain is
	// [1 3 2].
	b.crash(3)
	b.pump()
	c, err := openChain(chainConfig{Self: 3, Master: bedMaster, Members: []uint64{1, 2, 3}}, core.Boot{HardState: b.hs[3], Entries: b.disk[3]})
	if err != nil {
		t.Fatal(err)
	}
	b.cores[3], b.applied[3] = c, nil
	if err := b.master.Join(3, 2); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if got := b.master.Members(); !slices.Equal(got, []chain.NodeID{1, 3, 2}) {
		t.Fatalf("chain %v after the rejoin, want [1 3 2]", got)
	}
	// The master restarts from its command line.
	b.master = chain.NewMaster(bedMaster, []chain.NodeID{1, 2, 3}, 3)
	// The head fails; the restarted master repairs its idea of the chain.
	b.crash(1)
	b.pump()
	head := uint64(0)
	for id, c := range b.cores {
		if c.isHead() {
			head = id
		}
	}
	if head == 0 {
		t.Skip("no head after the repair: the stale master's orders were refused (the fence this test asks for)")
	}
	before := len(b.replies[head])
	if err := b.propose(head, 8, 1, "w2"); err != nil {
		t.Fatal(err)
	}
	b.pump()
	if len(b.replies[head]) == before {
		t.Skipf("the write at the new head %d was not answered", head)
	}
	// A linearizable read, after w2 was answered, at every active member
	// in the restarted master's chain (each under its lease in a real run:
	// the master answers the heartbeats of its members).
	for _, id := range []uint64{2, 3} {
		c := b.cores[id]
		if c.status().State != chain.Active {
			continue
		}
		b.reads[id] = nil
		if err := c.Read(0, core.ReadRequest{Ctx: 1, Kind: core.ReadLinearizable}); err != nil {
			continue
		}
		b.pump()
		rs := b.reads[id]
		if len(rs) != 1 {
			continue
		}
		// What the member serves at the read's index: the applied entries up
		// to it.
		var seen []string
		for _, cm := range b.applied[id] {
			if cm.Op <= rs[0].Index {
				seen = append(seen, string(cm.Data))
			}
		}
		if !slices.Contains(seen, "w2") {
			t.Fatalf("member %d serves a linearizable read at index %d with %v: the answered write w2 (at head %d) is missing (chain as the restarted master sees it: %v)",
				id, rs[0].Index, seen, head, fmt.Sprint(b.master.Members()))
		}
	}
}
