package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
)

// NodeChange is the loop of `kefir cluster replace-node`, `remove-node` and
// `add-members` in a cluster of several groups (docs/cluster.md,
// "Replacing a failed node (several groups)"), one copy for the command and
// the metadata group leader's repairer (repair.go), as GroupRemoval is
// remove-group's: the plan for every group the node is a member of is
// checked against the metadata group's map before anything changes (the
// caller's: PlanNodeChange, PlanReplacePlaced, PlanRemoveNodes,
// PlanAddMembers); a new node is added to the map (KEFIR.SLOTS META
// ADDNODE); then, one group at a time, the group's leader reconfigures it
// (KEFIR.GROUP RECONFIG GROUP g) and the new members are recorded in the map
// (KEFIR.SLOTS META SETMEMBERS), where the nodes follow them: the new node
// starts its replica of the group and pulls the state, the removed one
// retires. A chain group's step is a wish its master carries out
// (chainStep). Every step is idempotent, so a rerun after a crash (of the
// command, of the repairer's node, or of a group's node) finishes the job.
type NodeChange struct {
	// Cmd names the change in errors and logs ("replace-node", ...).
	Cmd string
	// Meta reaches the metadata group (and is the seeds and credentials
	// each group's own Mover is made with).
	Meta *Mover
	// Old is replace-node's old node (0: another change); Replace, the
	// change is replace-node's (the placement rule's node, or --new's):
	// a group's own configuration then decides what it is asked for
	// (placedMembers), so that a rerun changes it once and a change of
	// another member made meanwhile (by the repairer, or an operator) is
	// kept, not undone.
	Old     uint64
	Replace bool
	// Leaving are the nodes the change takes out (not waited for to catch
	// up: WaitCaughtUp's skip).
	Leaving []uint64
	// NewNodes are recorded in the map first; they are no seed of their
	// groups (a new node knows nothing yet).
	NewNodes []Member
	// CatchUp is how long a group's newest members are waited for to pull
	// its state before it changes again (negative: not waited, --force).
	CatchUp time.Duration
	// Logf says what the loop does (the command: stderr); Done is told each
	// group's result (the command prints it). Both optional.
	Logf func(format string, a ...any)
	Done func(StepDone)
}

// StepDone is one group's result (kefir cluster ... --json's rows; a
// chain's has no VR epoch nor previous members).
type StepDone struct {
	Group    uint64   `json:"group"`
	Epoch    uint64   `json:"epoch"`
	Members  []uint64 `json:"members"`
	Previous []uint64 `json:"previous"`
	MapEpoch uint64   `json:"map_epoch"`
	Chain    bool     `json:"-"`
	// Start is the op the group's epoch started at (a new member's
	// configuration: the simulation opens it from this).
	Start uint64 `json:"-"`
}

func (c *NodeChange) logf(format string, a ...any) {
	if c.Logf != nil {
		c.Logf(format, a...)
	}
}

// Run records c.NewNodes in the map and carries out plan (planned against
// cm), one group at a time.
func (c *NodeChange) Run(ctx context.Context, cm *kv.ClusterMap, plan []GroupChange) error {
	cmd, mv := c.Cmd, c.Meta
	for _, n := range c.NewNodes {
		if _, err := mv.AddNode(ctx, n.ID, n.ClientAddr, n.PeerAddr); err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
	}
	addr := map[uint64]string{}
	for _, n := range cm.Nodes {
		addr[n.ID] = n.ClientAddr
	}
	for _, step := range plan {
		if step.Chain {
			members, mapEpoch, err := c.chainStep(ctx, step)
			if err != nil {
				return err
			}
			if c.Done != nil {
				c.Done(StepDone{Group: uint64(step.Group), Members: members, MapEpoch: mapEpoch, Chain: true})
			}
			continue
		}
		// The group's own members answer for it (the old node may be down;
		// a new one knows nothing yet).
		var seeds []string
		for _, id := range step.Members {
			if a := addr[id]; a != "" && !slices.ContainsFunc(c.NewNodes, func(n Member) bool { return n.ID == id }) && slices.Contains(GroupMembersOf(cm, step.Group), id) {
				seeds = append(seeds, a)
			}
		}
		seeds = append(seeds, mv.Seeds...)
		// On Meta's transport and clock (a simulation's, under it).
		gmv := &Mover{Seeds: seeds, Password: mv.Password, TLS: mv.TLS, RetryFor: 30 * time.Second, Transport: mv.Transport, Clock: mv.Clock}
		name := GroupName(step.Group)
		planned := step.Members
		// The members the group's last change added must have pulled its
		// state first (not --force): changing it again while one still
		// does can leave the new epoch without a working majority. Replace:
		// a rerun after the group changed but before the map said so (its
		// leader records it within a second) may place old's replica
		// elsewhere than the run that changed it, and another change
		// (an operator's replace-node of another member while the repairer
		// replaces old) may land meanwhile; the group's own configuration
		// decides (placedMembers), as it is when the wait is over — the
		// wait can last CatchUp, and a change landed in it that the
		// members asked for were not read after would be undone.
		for range 3 {
			cur, err := gmv.GroupConfigOf(ctx, step.Group)
			if err != nil {
				break // the plan's members; RECONFIG answers for the group
			}
			if c.Replace {
				if step.Members, err = placedMembers(planned, cur.Members, c.Old, PlacedOn(cm, GroupChange{Group: step.Group, Members: planned}, c.Old)); err != nil {
					gmv.Close()
					return fmt.Errorf("%s: group %d: %w (rerun the command; nothing changed for it)", cmd, step.Group, err)
				}
			}
			// A rerun whose change the group already made (the map did not
			// record it) changes nothing: no wait.
			if c.CatchUp < 0 || SameIDs(cur.Members, step.Members) {
				break
			}
			if err := gmv.WaitCaughtUp(ctx, step.Group, cur.Members, cur.Previous, c.Leaving, c.CatchUp, c.Logf); err != nil {
				gmv.Close()
				return fmt.Errorf("%s: %w; nothing changed for group %d", cmd, err, step.Group)
			}
			if again, err := gmv.GroupConfigOf(ctx, step.Group); err != nil || again.Epoch == cur.Epoch {
				break // unchanged while waited for
			}
			// The group changed during the wait: plan against it again.
		}
		c.logf("%s: %v -> %v", name, GroupMembersOf(cm, step.Group), step.Members)
		res, err := gmv.ReconfigureGroup(ctx, step.Group, step.Members)
		gmv.Close()
		if err != nil {
			return fmt.Errorf("%s: group %d: %w (rerun the command to finish)", cmd, step.Group, err)
		}
		mapEpoch, err := mv.SetMembers(ctx, step.Group, res.Epoch, res.Members)
		if err != nil {
			return fmt.Errorf("%s: group %d moved to epoch %d (%v) but the map does not say so yet: %w (rerun the command to finish)", cmd, step.Group, res.Epoch, res.Members, err)
		}
		if c.Done != nil {
			c.Done(StepDone{Group: uint64(step.Group), Epoch: res.Epoch, Members: res.Members, Previous: res.Previous, MapEpoch: mapEpoch, Start: res.Start})
		}
	}
	return nil
}

// chainStep is a chain group's step of replace-node and remove-node
// (docs/design/chain.md, "A chain in a cluster of groups"): the change is
// recorded in the map as a wish (KEFIR.SLOTS META CHAINWANT, compare-and-set
// by the map's epoch, read again just before: adding the new node moved it),
// which the chain's master carries out — the new node, started with
// --join, opens an empty member and is joined before the tail; the old one
// is then failed and retires — and the loop waits until the map's member
// list, which follows the chain's record, has step.Join and not step.Leave
// (a rerun finds it so at once). It returns the chain's members and the
// map's epoch then.
func (c *NodeChange) chainStep(ctx context.Context, step GroupChange) ([]uint64, uint64, error) {
	cmd, mv := c.Cmd, c.Meta
	var cm *kv.ClusterMap
	for attempt := 0; ; attempt++ {
		var err error
		if cm, err = mv.MetaMap(ctx); err != nil {
			return nil, 0, fmt.Errorf("%s: chain group %d: %w (rerun the command to finish)", cmd, step.Group, err)
		}
		if ChainChangeDone(cm, step) {
			break
		}
		_, err = mv.ChainWant(ctx, step, cm.Epoch)
		if err == nil {
			c.logf("chain group %d: %v -> %v (joining %v, leaving %v: the chain's master carries it out)",
				step.Group, GroupMembersOf(cm, step.Group), step.Members, step.Join, step.Leave)
			break
		}
		if !strings.Contains(err.Error(), "plan it again") || attempt >= 5 {
			return nil, 0, fmt.Errorf("%s: %w (rerun the command to finish)", cmd, err)
		}
	}
	last := GroupMembersOf(cm, step.Group)
	for !ChainChangeDone(cm, step) {
		if err := mv.clock().Sleep(ctx, 200*time.Millisecond); err != nil {
			g, _ := cm.Group(uint64(step.Group))
			return nil, 0, fmt.Errorf("%s: chain group %d is %v (joining %v), not yet %v: %w; is every new node running (kefir server --join)? rerun the command to wait again",
				cmd, step.Group, g.Members, g.Joining, step.Members, err)
		}
		n, err := mv.MetaMap(ctx)
		if err != nil {
			continue // a metadata leader change: asked again
		}
		cm = n
		if ms := GroupMembersOf(cm, step.Group); !slices.Equal(ms, last) {
			c.logf("chain group %d is %v", step.Group, ms)
			last = ms
		}
	}
	return GroupMembersOf(cm, step.Group), cm.Epoch, nil
}

// placedMembers is the members a placed replacement of old by on asks a
// group for: its own configuration (cur) with old replaced by on. That is
// the plan's members (planned) when the group is as the map said, and it
// keeps a change that landed since the map was read (an operator's
// replace-node of another member while the repairer replaces old), which
// the plan would undo. A group whose configuration no longer has old — a
// rerun after it changed but before the map said so, or another replacer
// of old that came first — keeps cur, so it changes once. on 0: the plan's.
// on a member of cur beside old (another change put it there meanwhile):
// an error, since the plan would undo that change and placing old's
// replica elsewhere is placement's choice again (a rerun's).
func placedMembers(planned, cur []uint64, old, on uint64) ([]uint64, error) {
	i := slices.Index(cur, old)
	switch {
	case i < 0:
		return cur, nil
	case on == 0:
		return planned, nil
	case slices.Contains(cur, on):
		return nil, fmt.Errorf("node %d, placed in node %d's place, became a member by another change meanwhile (members %v, planned %v): plan again", on, old, cur, planned)
	}
	out := slices.Clone(cur)
	out[i] = on
	return out, nil
}

// GroupName names group g for the operator.
func GroupName(g GroupID) string {
	if g == MetaGroupID {
		return "the metadata group"
	}
	return fmt.Sprintf("group %d", g)
}

// PlacedOn is the node a placed change ch puts in old's place.
func PlacedOn(cm *kv.ClusterMap, ch GroupChange, old uint64) uint64 {
	if ch.Chain {
		if len(ch.Join) > 0 {
			return ch.Join[0]
		}
		return 0 // a rerun after the join: old only leaves
	}
	was := GroupMembersOf(cm, ch.Group)
	if i := slices.Index(was, old); i >= 0 && i < len(ch.Members) {
		return ch.Members[i]
	}
	return 0
}

// LiveNodes asks every node of cm but old for a PING, at once, each for up
// to two seconds: the nodes placement may choose.
func LiveNodes(ctx context.Context, mv *Mover, cm *kv.ClusterMap, old uint64) map[uint64]bool {
	var mu sync.Mutex
	var wg sync.WaitGroup
	live := map[uint64]bool{}
	for _, n := range cm.Nodes {
		if n.ID == old {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &Mover{Seeds: []string{n.ClientAddr}, Password: mv.Password, TLS: mv.TLS, RetryFor: 2 * time.Second}
			defer p.Close()
			if p.Ping(ctx) == nil {
				mu.Lock()
				live[n.ID] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return live
}

// GroupMembersOf is group g's members as cm records them (the metadata
// group's: cm.MetaMembers; nil for a group cm does not have).
func GroupMembersOf(cm *kv.ClusterMap, g GroupID) []uint64 {
	if g == MetaGroupID {
		return cm.MetaMembers()
	}
	if mg, ok := cm.Group(uint64(g)); ok {
		return mg.Members
	}
	return nil
}
