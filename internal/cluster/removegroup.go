package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
)

// GroupRemoval is `kefir cluster remove-group --id G`'s loop, one copy for
// the command and the deterministic move simulation (vrshard's
// groupop_sim_test.go), so the simulation runs the production steps: every
// slot of data group G moves to the other groups (PlanDrain's plan, run one
// move at a time by the Rebalancer: recorded, leased, paced), then G leaves
// the metadata group's map (kv.KindMapRemoveGroup, a compare-and-set on the
// map's epoch), and its members retire their replicas when they see it
// (server: retireRemoved). Each round starts from the map, so a rerun
// after a crash (of the command or of a node) goes on from where things
// are: a move left in flight is finished first (resumed at its record, or
// taken over once its lease lapsed — the metadata leader may take it
// first: then the loop waits a lease and reads the map again), slots G
// still owns are planned again, and a group already removed is
// ErrRemovedAlready.
type GroupRemoval struct {
	Group GroupID
	// Meta runs f with a mover of the metadata group for one read or write
	// of the map (the command: a fresh Mover each time, closed after; the
	// simulation: its one Mover).
	Meta func(f func(mv *Mover) error) error
	// Rebalancer runs the drain's moves, and its NewMover finishes a move
	// left in flight.
	Rebalancer *Rebalancer
	// Weigh weighs every slot of cm's groups (PlanTables, then
	// SlotWeights by the operator's measure): what the drain is planned
	// from.
	Weigh func(ctx context.Context, cm *kv.ClusterMap) ([]PlanGroup, []int64, error)
	// Pause waits after a move in flight could not be finished (about a
	// lease: its driver may still hold it, or the metadata leader took it).
	Pause func(ctx context.Context) error

	// The observer's hooks, each optional. InFlight is told of a move in
	// flight before the loop finishes it; an error stops the loop (a dry
	// run). Planned is told of the drain's plan while G owns own slots;
	// false stops the loop before any move (a dry run). Moved is told what
	// the plan's run did, before its error is looked at. Empty is told
	// that G owns no slot, before it leaves the map; false stops the loop
	// there (a dry run). Logf says what the loop does between them.
	InFlight func(rec kv.MapMove) error
	Planned  func(cm *kv.ClusterMap, own int, plan Plan) bool
	Moved    func(done []RebalanceMove)
	Empty    func(cm *kv.ClusterMap) bool
	Logf     func(format string, a ...any)
}

// ErrRemovedAlready is GroupRemoval.Run's answer, and CheckRemoveGroup's,
// once the group is in the map's removed list (a rerun).
var ErrRemovedAlready = errors.New("removed already")

// Run drives the removal until G leaves the map and returns the map's epoch
// then and the map read just before (its members, for the operator). A
// hook that stops the loop (a dry run) makes Run return with stopped true
// and the map it read last.
func (r *GroupRemoval) Run(ctx context.Context) (epoch uint64, last *kv.ClusterMap, stopped bool, err error) {
	logf := r.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	for stale := 0; ; {
		var cm *kv.ClusterMap
		if err := r.Meta(func(mv *Mover) (err error) { cm, err = mv.MetaMap(ctx); return err }); err != nil {
			return 0, nil, false, fmt.Errorf("remove-group: the cluster map: %w", err)
		}
		own, err := CheckRemoveGroup(cm, uint64(r.Group))
		if errors.Is(err, ErrRemovedAlready) {
			return 0, cm, false, err
		}
		if err != nil {
			return 0, cm, false, fmt.Errorf("remove-group: %w; nothing changed", err)
		}
		if len(cm.Moves) > 0 {
			// One move at a time: a move left in flight (this command's
			// own before a crash, or another driver's) is finished first.
			rec := cm.Moves[0]
			if r.InFlight != nil {
				if err := r.InFlight(rec); err != nil {
					return 0, cm, true, err
				}
			}
			logf("a move is in flight (slots %s from group %d to group %d at epoch %d): finishing it first", FormatSlotRanges(rec.Slots), rec.From, rec.To, rec.Epoch)
			if _, err := r.Rebalancer.NewMover().Move(ctx, GroupID(rec.From), GroupID(rec.To), rec.Slots); err != nil {
				logf("the move in flight: %v (reading the map again)", err)
				if err := r.Pause(ctx); err != nil {
					return 0, cm, false, fmt.Errorf("remove-group: %w", err)
				}
			}
			continue
		}
		if own > 0 {
			groups, weights, err := r.Weigh(ctx, cm)
			if err != nil {
				return 0, cm, false, fmt.Errorf("remove-group: %w", err)
			}
			plan := PlanDrain(groups, weights, r.Group)
			if r.Planned != nil && !r.Planned(cm, own, plan) {
				return 0, cm, true, nil
			}
			done, err := r.Rebalancer.Run(ctx, plan)
			if r.Moved != nil {
				r.Moved(done)
			}
			if err != nil {
				return 0, cm, false, fmt.Errorf("remove-group: %w (run it again to go on)", err)
			}
			continue // the map again: every slot moved?
		}
		if r.Empty != nil && !r.Empty(cm) {
			return 0, cm, true, nil
		}
		err = r.Meta(func(mv *Mover) (err error) { epoch, err = mv.RemoveGroup(ctx, r.Group, cm.Epoch); return err })
		if err != nil && strings.Contains(err.Error(), kv.MapCheckAgain) && stale < 10 {
			stale++ // the map moved on (an add-node, say) since it was read
			continue
		}
		if err != nil {
			return 0, cm, false, err
		}
		return epoch, cm, false, nil
	}
}

// CheckRemoveGroup checks a removal of group id against cm and returns how
// many slots it owns: refused for the metadata group, a group the map does
// not have, and the last data group; ErrRemovedAlready once it is removed.
func CheckRemoveGroup(cm *kv.ClusterMap, id uint64) (slots int, err error) {
	if id == kv.MetaGroup {
		return 0, fmt.Errorf("group %d is the metadata group: it holds the map and cannot be removed (replace-node moves its members)", id)
	}
	if slices.Contains(cm.Removed, id) {
		return 0, ErrRemovedAlready
	}
	g, ok := cm.Group(id)
	if !ok {
		ids := make([]uint64, len(cm.Groups))
		for i, x := range cm.Groups {
			ids[i] = x.ID
		}
		return 0, fmt.Errorf("no group %d in the cluster map (its data groups: %v)", id, ids)
	}
	if len(cm.Groups) == 1 {
		return 0, fmt.Errorf("group %d is the cluster's last data group: its slots have nowhere to go", id)
	}
	for _, r := range g.Slots {
		slots += int(r.End) - int(r.Start) + 1
	}
	return slots, nil
}

// EmptiedBy returns the members of group id in cm that are members of no
// other data group (nor joining a chain): nodes its removal leaves empty.
// They stay up, serving (docs/design/cluster.md, "An empty node"), and the
// command names them so the operator knows where replicas can go next.
func EmptiedBy(cm *kv.ClusterMap, id uint64) []uint64 {
	g, ok := cm.Group(id)
	if !ok {
		return nil
	}
	var out []uint64
	for _, n := range g.Members {
		if !slices.ContainsFunc(cm.Groups, func(o kv.MapGroup) bool {
			return o.ID != id && (slices.Contains(o.Members, n) || slices.Contains(o.Joining, n))
		}) {
			out = append(out, n)
		}
	}
	return out
}
