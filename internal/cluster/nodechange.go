package cluster

import (
	"context"
	"errors"
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
//
// Whatever the change, a group's own configuration decides what it is
// asked for (rebaseChange: the plan's difference from the map applied to
// it), so that a rerun changes it once and a change of another member made
// meanwhile (by the repairer, or an operator) is kept, not undone; the
// request names the configuration's epoch, and a group that moved on
// before it arrives refuses it (EpochMovedError): the step is planned
// again.
type NodeChange struct {
	// Cmd names the change in errors and logs ("replace-node", ...).
	Cmd string
	// Meta reaches the metadata group (and is the seeds and credentials
	// each group's own Mover is made with).
	Meta *Mover
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
		if _, err := mv.AddNode(ctx, n.ID, n.ClientAddr, n.PeerAddr, ""); err != nil {
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
		gmv := mv.like(seeds, 30*time.Second)
		res, err := c.reconfigure(ctx, gmv, GroupMembersOf(cm, step.Group), step)
		gmv.Close()
		if err != nil {
			return err
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

// reconfigAttempts bounds how often a step reads its group's configuration
// again because the group changed under it (during the catch-up wait, or
// between the read and the request: -EPOCHMOVED) before it gives up.
const reconfigAttempts = 3

// reconfigure carries out VR step (planned from the map's members was)
// through gmv: it reads the group's own configuration, applies the plan's
// change to it (rebaseChange), waits for the members its last change added
// to catch up (not --force), and asks for the change from that
// configuration's epoch. A group that changed meanwhile — during the wait,
// which can last CatchUp, or just before the request — is planned against
// again (the request is refused, EpochMovedError, never applied to a
// newer configuration it was not planned for); one that keeps changing
// stops the step, unchanged, for a rerun.
func (c *NodeChange) reconfigure(ctx context.Context, gmv *Mover, was []uint64, step GroupChange) (GroupConfig, error) {
	cmd, name := c.Cmd, GroupName(step.Group)
	var cur GroupConfig
	var seen uint64 // the epoch the leader's last refusal named
	for attempt := 0; attempt < reconfigAttempts; attempt++ {
		var err error
		if cur, err = configAtLeast(ctx, gmv, step.Group, seen); err != nil {
			return GroupConfig{}, fmt.Errorf("%s: %w; nothing changed for group %d (rerun the command)", cmd, err, step.Group)
		}
		members, err := rebaseChange(was, step.Members, cur.Members, step.Size)
		if err != nil {
			return GroupConfig{}, fmt.Errorf("%s: group %d: %w (rerun the command; nothing changed for it)", cmd, step.Group, err)
		}
		// A rerun whose change the group already made (the map did not
		// record it) changes nothing: no wait, no request.
		if SameIDs(cur.Members, members) {
			return cur, nil
		}
		// The members the group's last change added must have pulled its
		// state first (not --force): changing it again while one still
		// does can leave the new epoch without a working majority.
		if c.CatchUp >= 0 {
			if err := gmv.WaitCaughtUp(ctx, step.Group, cur.Members, cur.Previous, c.Leaving, c.CatchUp, c.Logf); err != nil {
				return GroupConfig{}, fmt.Errorf("%s: %w; nothing changed for group %d", cmd, err, step.Group)
			}
		}
		c.logf("%s: %v -> %v (from its epoch %d)", name, cur.Members, members, cur.Epoch)
		res, err := gmv.ReconfigureGroup(ctx, step.Group, cur.Epoch, members)
		var moved *EpochMovedError
		if errors.As(err, &moved) {
			c.logf("%s changed meanwhile (epoch %d, members %v): planning against it again", name, moved.Epoch, moved.Members)
			cur.Epoch, cur.Members = moved.Epoch, moved.Members // the latest seen, for the error below
			seen = moved.Epoch
			continue
		}
		if err != nil {
			return GroupConfig{}, fmt.Errorf("%s: group %d: %w (rerun the command to finish)", cmd, step.Group, err)
		}
		return res, nil
	}
	return GroupConfig{}, fmt.Errorf("%s: %s keeps changing under the command (%d times; last seen at epoch %d, members %v): rerun the command once it settles; nothing changed for it",
		cmd, name, reconfigAttempts, cur.Epoch, cur.Members)
}

// configAtLeast reads group g's configuration through gmv, at epoch
// atLeast or later: the epoch its leader named refusing a request. A
// member answers with its own durable configuration, and one that has not
// learned of the change yet (a follower that lags, or is cut off from the
// leader) answers an older one; planned against it again, the request
// would be refused again, at every attempt and every rerun while that
// member lags. So the next member (gmv's next seed) is asked. A refusal
// can also name a change the leader has ordered and not committed yet
// (vr.EpochMovedError.Pending): no member has its epoch until it commits,
// in a round trip and an fsync, or it is lost in a view change. So once
// every member was asked, they are asked again every configPoll until
// configWait has passed; then the last answer.
func configAtLeast(ctx context.Context, gmv *Mover, g GroupID, atLeast uint64) (GroupConfig, error) {
	clock := gmv.clock()
	deadline := clock.Now().Add(configWait)
	for asked := 1; ; asked++ {
		cur, err := gmv.GroupConfigOf(ctx, g)
		if err != nil || cur.Epoch >= atLeast {
			return cur, err
		}
		if asked%len(gmv.Seeds) == 0 {
			if !clock.Now().Before(deadline) {
				return cur, nil
			}
			if err := clock.Sleep(ctx, configPoll); err != nil {
				return cur, err
			}
		}
		gmv.Seeds = append(gmv.Seeds[1:], gmv.Seeds[0])
	}
}

// configAtLeast's bound and pace: a pending change commits in
// milliseconds; a member cut off from its leader may never catch up.
const (
	configWait = 2 * time.Second
	configPoll = 50 * time.Millisecond
)

// rebaseChange is the members a group whose configuration is cur is asked
// for by a change planned from the map's members was to planned: the
// plan's difference — the nodes it takes out, and those it adds (in a
// replacement, at the place of the one it takes out) — applied to cur.
// That is planned when the group is as the map said, and it keeps a change
// that landed since the map was read (an operator's replace-node of
// another member while the repairer replaces old, the repairer's while an
// operator removes or adds members), which planned would undo. A group
// that has none of the nodes the change takes out (a rerun after it
// changed but before the map said so, or another change that came first),
// or, for a change that only adds, all it adds, keeps cur: it changes once.
// A node to add that became a member by another change meanwhile, or a
// result that is not an odd, non-empty group, is an error: the change is
// to be planned again (a rerun's).
//
// size, when not 0, is a growth's target (add-members --replicas: the
// group to that many members, not these nodes in): a group another
// change grew meanwhile (a concurrent run's, which placed other nodes)
// gets only what it lacks — nothing once it has size members — instead of
// both runs' nodes (an overshoot: 7 members for --replicas 5).
func rebaseChange(was, planned, cur []uint64, size int) ([]uint64, error) {
	removed := slices.DeleteFunc(slices.Clone(was), func(id uint64) bool { return slices.Contains(planned, id) })
	added := slices.DeleteFunc(slices.Clone(planned), func(id uint64) bool { return slices.Contains(was, id) })
	in := func(id uint64) bool { return slices.Contains(cur, id) }
	if size > 0 && len(removed) == 0 {
		if len(cur) >= size {
			return cur, nil
		}
		// The nodes not taken by the other change, as many as lack.
		added = slices.DeleteFunc(added, in)
		added = added[:min(len(added), size-len(cur))]
	}
	switch {
	case len(removed) > 0 && !slices.ContainsFunc(removed, in),
		len(removed) == 0 && !slices.ContainsFunc(added, func(id uint64) bool { return !in(id) }):
		return cur, nil
	}
	if i := slices.IndexFunc(added, in); i >= 0 {
		return nil, fmt.Errorf("node %d, which the change adds, became a member by another change meanwhile (members %v; planned %v from %v): plan again", added[i], cur, planned, was)
	}
	out := slices.Clone(cur)
	k := 0
	for _, id := range removed {
		i := slices.Index(out, id)
		switch {
		case i < 0:
		case k < len(added):
			out[i] = added[k]
			k++
		default:
			out = slices.Delete(out, i, i+1)
		}
	}
	out = append(out, added[k:]...)
	if len(out) == 0 || len(out)%2 == 0 {
		return nil, fmt.Errorf("the change (%v -> %v) would leave the group, now %v, with %d members %v: it changed meanwhile, and a VR group needs an odd number; plan again", was, planned, cur, len(out), out)
	}
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
			p := mv.like([]string{n.ClientAddr}, 2*time.Second)
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
