package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
)

// A move recorded in the metadata group (Mover.Meta; docs/design/cluster.md
// §4): KEFIR.SLOTS META PLAN before the first step, KEFIR.SLOTS META DONE (or ABORT)
// after the last, and between them a lease: the driver renews the record's
// beat (KEFIR.SLOTS META CLAIM, a compare-and-set on the beat) every quarter of
// its lease, before the next command to a group, and stops if it could not
// renew it for a whole lease or the claim was refused (another driver took
// the move over). A driver takes over a recorded move only after watching
// its beat stand still for two leases (or, at the metadata leader's
// resumer, after the resumer watched it), so a live driver is never
// displaced by a take-over, and a displaced one sends no further step once
// its next renewal fails. The exception is an abort (move-slots --abort,
// Mover.Abort): it claims at once, marking the record for abort, and relies
// on the groups' driver fence, which it raises first (Mover.settle).

// moveLease is the lease a Mover holds on a recorded move (epoch 0: none);
// abort: the record is marked for abort (kv.MapMove.AbortWanted), so every
// claim of this driver carries the mark (the record refuses one without).
type moveLease struct {
	epoch, beat uint64
	last        time.Time
	abort       bool
}

// errNoRecord: the metadata group records no such move.
var errNoRecord = errors.New("move-slots: the metadata group records no such move")

// errLeaseLost: the driver no longer holds the move's lease.
var errLeaseLost = errors.New("move-slots: this driver lost the move's lease in the metadata group (another driver took the move over, or the metadata group did not answer for a whole lease)")

func (mv *Mover) leaseDur() time.Duration {
	if mv.Lease > 0 {
		return mv.Lease
	}
	return DefaultLease
}

// MetaMap returns the map at the metadata group's leader.
func (mv *Mover) MetaMap(ctx context.Context) (*kv.ClusterMap, error) {
	return mv.MetaMapSince(ctx, 0)
}

// MetaMapWait is MetaMapSince held at the leader until its map is newer
// than since or wait passes (then nil). A leader that does not hold polls
// (an older version: "wrong number of arguments") is asked MetaMapSince,
// now and from then on (mv.noWait).
func (mv *Mover) MetaMapWait(ctx context.Context, since uint64, wait time.Duration) (*kv.ClusterMap, error) {
	if mv.noWait || since == 0 || wait <= 0 {
		return mv.MetaMapSince(ctx, since)
	}
	v, err := mv.do(ctx, "KEFIR.SLOTS", "META", "MAP", "SINCE", strconv.FormatUint(since, 10), "WAIT", strconv.FormatInt(wait.Milliseconds(), 10))
	if err != nil && strings.Contains(err.Error(), "wrong number of arguments") {
		mv.noWait = true
		return mv.MetaMapSince(ctx, since)
	}
	return decodeMetaMap(v, err)
}

// MetaMapSince is MetaMap, or nil (and no error) when the leader's map is
// at epoch since or older (since 0: always the map): a poller that has the
// map at since is answered a null, not the whole map again. A node of an
// older version that does not know SINCE is asked for the whole map.
func (mv *Mover) MetaMapSince(ctx context.Context, since uint64) (*kv.ClusterMap, error) {
	args := []string{"KEFIR.SLOTS", "META", "MAP"}
	if since > 0 {
		args = append(args, "SINCE", strconv.FormatUint(since, 10))
	}
	v, err := mv.do(ctx, args...)
	if err != nil && since > 0 && strings.Contains(err.Error(), "wrong number of arguments") {
		v, err = mv.do(ctx, args[:3]...)
	}
	return decodeMetaMap(v, err)
}

// decodeMetaMap is the answer to KEFIR.SLOTS META MAP: the map, or nil for
// a null (no newer map).
func decodeMetaMap(v resp.Value, err error) (*kv.ClusterMap, error) {
	if err != nil {
		return nil, fmt.Errorf("move-slots: the metadata group's map: %w", err)
	}
	if v.IsNull() {
		return nil, nil
	}
	var cm kv.ClusterMap
	if err := json.Unmarshal(v.Str, &cm); err != nil {
		return nil, fmt.Errorf("move-slots: the metadata group's map: %w", err)
	}
	return &cm, nil
}

// plan records the move of rs from group from to group to in the metadata
// group, or takes over its record, and returns its epoch. stage and epoch
// are what the groups' tables say (stage 0: not started; epoch then is the
// next above the tables').
func (mv *Mover) plan(ctx context.Context, from, to GroupID, rs []kv.SlotRange, stage int, epoch uint64) (uint64, error) {
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return 0, err
	}
	mv.identify()
	ranges := FormatSlotRanges(rs)
	// The map records at most one move in flight (KindMapMovePlan).
	if len(cm.Moves) > 0 {
		rec := cm.Moves[0]
		if rec.From != uint64(from) || rec.To != uint64(to) || !slices.Equal(rec.Slots, rs) {
			return 0, fmt.Errorf("move-slots: another move is in flight (slots %s from group %d to group %d at epoch %d, driver %q): finish or abort it first",
				FormatSlotRanges(rec.Slots), rec.From, rec.To, rec.Epoch, rec.Driver)
		}
		if stage >= 1 && rec.Epoch != epoch {
			return 0, fmt.Errorf("move-slots: the metadata group records the move at epoch %d, the groups' tables at %d", rec.Epoch, epoch)
		}
		return rec.Epoch, mv.takeOver(ctx, rec)
	}
	if stage >= 1 && epoch <= cm.Epoch {
		// Recorded and done (or aborted) already: what is left (a purge)
		// needs no record.
		return 0, errNoRecord
	}
	if stage == 0 {
		epoch = max(epoch, cm.Epoch+1)
	}
	v, err := mv.do(ctx, "KEFIR.SLOTS", "META", "PLAN", strconv.FormatUint(uint64(from), 10), strconv.FormatUint(uint64(to), 10),
		ranges, strconv.FormatUint(epoch, 10), mv.Driver)
	if err != nil {
		return 0, fmt.Errorf("move-slots: record the move in the metadata group: %w", err)
	}
	mv.lease = moveLease{epoch: epoch, beat: uint64(v.Int), last: mv.clock().Now()}
	mv.logf("recorded the move of %s from group %d to group %d at epoch %d in the metadata group (driver %q)", ranges, from, to, epoch, mv.Driver)
	return epoch, nil
}

// identify makes Driver this driver's own name in the metadata group's
// record: the name given (default "kefir cluster move-slots") and a random
// token. Two drivers of one move that both read the map before either's
// plan landed send the same plan; the map answers the beat only to the
// driver the record names (a retry) and refuses the other, so the two must
// never share a name — with the same name both would drive at beat 1, and
// the groups' driver fence (epoch, beat) would admit the steps of both.
func (mv *Mover) identify() {
	if mv.identified {
		return
	}
	if mv.Driver == "" {
		mv.Driver = "kefir cluster move-slots"
	}
	token := randomToken()[:12] // 48 random bits
	if mv.Rand != nil {
		token = fmt.Sprintf("%012x", mv.Rand()&(1<<48-1))
	}
	mv.Driver = fmt.Sprintf("%s #%s", mv.Driver, token)
	mv.identified = true
}

// takeOver claims the lease of recorded move rec, once its beat stood
// still for two leases (at once if it is at mv.TakeOver).
func (mv *Mover) takeOver(ctx context.Context, rec kv.MapMove) error {
	if mv.lease.epoch == rec.Epoch && mv.lease.beat == rec.Beat {
		// Held already (settle finishing a marked move forward): renewed.
		return mv.claim(ctx)
	}
	if rec.Beat != mv.TakeOver {
		mv.logf("the move at epoch %d is recorded with driver %q: taking it over if its lease does not move for %v", rec.Epoch, rec.Driver, 2*mv.leaseDur())
		// On the Mover's clock (the simulation's, under it).
		if err := mv.clock().Sleep(ctx, 2*mv.leaseDur()); err != nil {
			return err
		}
		cm, err := mv.MetaMap(ctx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(cm.Moves, func(x kv.MapMove) bool { return x.Epoch == rec.Epoch })
		if i < 0 {
			return fmt.Errorf("move-slots: the move at epoch %d was finished meanwhile", rec.Epoch)
		}
		if cm.Moves[i].Beat != rec.Beat {
			return fmt.Errorf("move-slots: the move at epoch %d is being driven by %q (its lease was renewed)", rec.Epoch, cm.Moves[i].Driver)
		}
	}
	// A record marked for abort is taken with the mark (and then settled,
	// never driven forward before its hand-over: Mover.settle).
	mv.lease = moveLease{epoch: rec.Epoch, beat: rec.Beat, abort: rec.AbortWanted && !(mutation.On && MultiMut.IgnoreAbortMark.Load())}
	if err := mv.claim(ctx); err != nil {
		mv.lease = moveLease{}
		return err
	}
	mv.logf("took over the move at epoch %d from driver %q", rec.Epoch, rec.Driver)
	return nil
}

// claim renews the lease: the record's beat goes up if it is still the
// one this driver last set.
func (mv *Mover) claim(ctx context.Context) error {
	l := &mv.lease
	// A claim is retried for a lease at most (on the Mover's clock); with
	// the real clock a hung round trip is cut at the lease too (a
	// simulated transport times out on its own: a context's timer would
	// tie the run to the real time it takes).
	if mv.Clock == nil {
		cctx, cancel := context.WithTimeout(ctx, mv.leaseDur())
		defer cancel()
		ctx = cctx
	}
	args := strArgs("KEFIR.SLOTS", "META", "CLAIM", strconv.FormatUint(l.epoch, 10), mv.Driver, strconv.FormatUint(l.beat, 10))
	if l.abort {
		args = append(args, []byte("ABORT"))
	}
	v, err := mv.doFor(ctx, min(mv.retryFor(), mv.leaseDur()), args)
	if err != nil {
		return fmt.Errorf("%w: %v", errLeaseLost, err)
	}
	l.beat, l.last = uint64(v.Int), mv.clock().Now()
	return nil
}

// renew keeps the lease before a command to a group: a claim once a
// quarter of the lease passed since the last; a driver that cannot renew
// sends nothing more.
func (mv *Mover) renew(ctx context.Context, args [][]byte) error {
	l := &mv.lease
	if l.epoch == 0 || (len(args) > 1 && strings.EqualFold(string(args[1]), "META")) {
		return nil
	}
	if mv.since(l.last) < mv.leaseDur()/4 {
		return nil
	}
	if err := mv.claim(ctx); err != nil {
		l.epoch = 0
		return err
	}
	return nil
}

// recordEnd records the move's end (DONE or ABORT) in the metadata group.
func (mv *Mover) recordEnd(ctx context.Context, what string) error {
	if mv.lease.epoch == 0 {
		return nil
	}
	// A last renewal: a driver that lost the move does not end it.
	if err := mv.claim(ctx); err != nil {
		return err
	}
	e := mv.lease.epoch
	// The end of a move marked for abort is a compare-and-set on the lease
	// just renewed (kv.KindMapMoveDone: a marked move refuses an end that
	// does not name its holder); an unmarked one's is by epoch, as before
	// the mark, so that without marks every build applies it alike.
	args := []string{"KEFIR.SLOTS", "META", what, strconv.FormatUint(e, 10)}
	if mv.lease.abort {
		args = append(args, mv.Driver, strconv.FormatUint(mv.lease.beat, 10))
	}
	if _, err := mv.do(ctx, args...); err != nil {
		return fmt.Errorf("move-slots: record the move's end (%s) in the metadata group: %w", strings.ToLower(what), err)
	}
	mv.lease = moveLease{}
	mv.logf("recorded the move at epoch %d %s in the metadata group", e, map[string]string{"DONE": "done", "ABORT": "rolled back"}[what])
	return nil
}

// ClusterStatus is what kefir cluster status prints.
type ClusterStatus struct {
	Map *kv.ClusterMap `json:"map"`
	// MetaLeader is the client address of the metadata group's leader.
	MetaLeader string `json:"meta_leader"`
	// Leaders are the data groups' leaders' client addresses, by group id,
	// as CLUSTER SLOTS at a node reports them ("": none known).
	Leaders map[uint64]string `json:"leaders"`
	// SharedZones are the groups (by id; the metadata group's too) whose
	// members share a zone, each with SharedZones' account of it: a group
	// that one zone's loss takes several replicas of (placement's
	// fallback, or zones given after its placement).
	SharedZones map[uint64]string `json:"shared_zones,omitempty"`
}

// GroupsSharingZones is ClusterStatus.SharedZones of cm (nil: no group
// shares a zone); the HTTP status's cluster_map has it too.
func GroupsSharingZones(cm *kv.ClusterMap) map[uint64]string {
	var out map[uint64]string
	for _, g := range mapGroups(cm) {
		if s := SharedZones(cm, ChainWanted(g)); s != "" {
			if out == nil {
				out = map[uint64]string{}
			}
			out[g.ID] = s
		}
	}
	return out
}

// Status returns the metadata group's map and each group's leader.
func (mv *Mover) Status(ctx context.Context) (ClusterStatus, error) {
	defer mv.close()
	cm, err := mv.MetaMap(ctx)
	if err != nil {
		return ClusterStatus{}, err
	}
	st := ClusterStatus{Map: cm, MetaLeader: mv.answeredBy, Leaders: map[uint64]string{}, SharedZones: GroupsSharingZones(cm)}
	v, err := mv.do(ctx, "CLUSTER", "SLOTS")
	if err != nil {
		return st, fmt.Errorf("cluster status: CLUSTER SLOTS: %w", err)
	}
	for _, g := range cm.Groups {
		st.Leaders[g.ID] = ""
		if len(g.Slots) == 0 {
			// A group of no slots (just added) is not in CLUSTER SLOTS:
			// ask its members for its configuration, which names the
			// leader they know.
			st.Leaders[g.ID] = mv.leaderOf(ctx, cm, g)
			continue
		}
		s := int64(g.Slots[0].Start)
		for _, r := range v.Elems {
			if len(r.Elems) >= 3 && r.Elems[0].Int <= s && s <= r.Elems[1].Int && len(r.Elems[2].Elems) >= 2 {
				st.Leaders[g.ID] = fmt.Sprintf("%s:%d", r.Elems[2].Elems[0].Str, r.Elems[2].Elems[1].Int)
			}
		}
	}
	return st, nil
}

// leaderOf returns the client address of group g's leader as its members
// answer KEFIR.GROUP CONFIG GROUP g ("": none known, or none answered).
func (mv *Mover) leaderOf(ctx context.Context, cm *kv.ClusterMap, g kv.MapGroup) string {
	var seeds []string
	for _, n := range cm.Nodes {
		if slices.Contains(g.Members, n.ID) {
			seeds = append(seeds, n.ClientAddr)
		}
	}
	gmv := mv.like(seeds, time.Second)
	defer gmv.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	gc, err := gmv.GroupConfigOf(cctx, GroupID(g.ID))
	if err != nil || gc.Leader == 0 {
		return ""
	}
	if m, ok := gc.Addr(gc.Leader); ok {
		return m.ClientAddr
	}
	return ""
}

// String renders st for a terminal.
func (st ClusterStatus) String() string {
	var b strings.Builder
	cm := st.Map
	fmt.Fprintf(&b, "map epoch %d (metadata group led by %s)\n", cm.Epoch, st.MetaLeader)
	fmt.Fprintf(&b, "nodes:\n")
	for _, n := range cm.Nodes {
		zone := ""
		if n.Zone != "" {
			zone = "  zone " + n.Zone
		}
		fmt.Fprintf(&b, "  %d  client %s  peer %s%s  %s\n", n.ID, n.ClientAddr, n.PeerAddr, zone, nodeGroups(cm, n.ID))
	}
	shared := GroupsSharingZones(cm)
	fmt.Fprintf(&b, "groups:\n")
	for _, g := range cm.Groups {
		n := 0
		for _, r := range g.Slots {
			n += int(r.End) - int(r.Start) + 1
		}
		leader := st.Leaders[g.ID]
		if leader == "" {
			leader = "none known"
		}
		slots := FormatSlotRanges(g.Slots)
		if slots == "" {
			slots = "none"
		}
		engine := ""
		if g.IsChain() {
			engine = " (a chain, head first)"
			// A change under way (KindMapChainWant): the master joins these
			// and then takes those out.
			leaving := slices.DeleteFunc(slices.Clone(g.Leaving), func(id uint64) bool { return !slices.Contains(g.Members, id) })
			if len(g.Joining) > 0 || len(leaving) > 0 {
				engine += fmt.Sprintf(" (changing: joining %v, leaving %v)", g.Joining, leaving)
			}
			// Members its master failed, their places still theirs: a
			// restart rejoins them, replace-node re-creates them elsewhere.
			if len(g.Dropped) > 0 {
				engine += fmt.Sprintf(" (dropped by failure: %v; kefir cluster replace-node --old N re-creates one elsewhere)", g.Dropped)
			}
		}
		zones := ""
		if s := shared[g.ID]; s != "" {
			zones = "  REPLICAS SHARE A ZONE (" + s + ")"
		}
		fmt.Fprintf(&b, "  %d  members %v%s  leader %s  slots %s (%d)%s\n", g.ID, g.Members, engine, leader, slots, n, zones)
	}
	if s := shared[uint64(MetaGroupID)]; s != "" {
		fmt.Fprintf(&b, "  the metadata group (members %v): REPLICAS SHARE A ZONE (%s)\n", cm.MetaMembers(), s)
	}
	if len(cm.Moves) == 0 {
		fmt.Fprintf(&b, "moves in flight: none\n")
	}
	for _, m := range cm.Moves {
		mark := ""
		if m.AbortWanted {
			mark = ", marked for abort (move-slots --abort: rolled back unless handed over)"
		}
		fmt.Fprintf(&b, "move in flight: slots %s from group %d to group %d at epoch %d, driver %q (lease beat %d)%s\n",
			FormatSlotRanges(m.Slots), m.From, m.To, m.Epoch, m.Driver, m.Beat, mark)
	}
	return b.String()
}

// nodeGroups says which of cm's groups node id is a member of, for
// kefir cluster status: "groups [1 3]", with "and the metadata group", or
// "no groups (empty ...)" for a node of the map that hosts none (added,
// not given a group yet, or its groups were removed): it serves by
// forwarding, and add-group --members or replace-node can place replicas
// on it.
func nodeGroups(cm *kv.ClusterMap, id uint64) string {
	var in []uint64
	for _, g := range cm.Groups {
		if slices.Contains(g.Members, id) {
			in = append(in, g.ID)
		}
	}
	meta := slices.Contains(cm.MetaMembers(), id)
	switch {
	case len(in) == 0 && meta:
		return "no data groups (the metadata group only)"
	case len(in) == 0:
		return "no groups (empty: add-group --members or replace-node can place replicas on it)"
	case meta:
		return fmt.Sprintf("groups %v and the metadata group", in)
	}
	return fmt.Sprintf("groups %v", in)
}

// AddNode records node id (client and peer addresses; zone, "" for none)
// in the metadata group's map and returns the map's epoch after it. A
// zone is sent only when given: an add without one is the command builds
// before zones know.
func (mv *Mover) AddNode(ctx context.Context, id uint64, clientAddr, peerAddr, zone string) (uint64, error) {
	defer mv.close()
	args := []string{"KEFIR.SLOTS", "META", "ADDNODE", strconv.FormatUint(id, 10), clientAddr, peerAddr}
	if zone != "" {
		args = append(args, "ZONE", zone)
	}
	v, err := mv.do(ctx, args...)
	if err != nil {
		return 0, fmt.Errorf("add-node: %w", err)
	}
	return uint64(v.Int), nil
}

// RemoveNode takes node id, which no group has, out of the metadata
// group's map (KEFIR.SLOTS META REMOVENODE, kv.MapNodeRemove) and returns
// the map's epoch after it; a node the map does not have is a no-op. The
// node, seeing a map without itself, retires.
func (mv *Mover) RemoveNode(ctx context.Context, id uint64) (uint64, error) {
	defer mv.close()
	v, err := mv.do(ctx, "KEFIR.SLOTS", "META", "REMOVENODE", strconv.FormatUint(id, 10))
	if err != nil {
		return 0, fmt.Errorf("remove node %d from the map: %w", id, err)
	}
	return uint64(v.Int), nil
}

// AddGroup records data group g with members (node ids of the map, leader
// order) and no slots in the metadata group's map (KEFIR.SLOTS META
// ADDGROUP, kv.KindMapAddGroup) and returns the map's epoch after it. The
// members start the group's replicas when they see it in the map.
//
// engine is kv.EngineVR or kv.EngineChain (sent as ENGINE chain after the
// id; a VR group's command is as before engines).
func (mv *Mover) AddGroup(ctx context.Context, g GroupID, members []uint64, engine string) (uint64, error) {
	defer mv.close()
	args := []string{"KEFIR.SLOTS", "META", "ADDGROUP", strconv.FormatUint(uint64(g), 10)}
	if engine != kv.EngineVR {
		args = append(args, "ENGINE", engine)
	}
	for _, id := range members {
		args = append(args, strconv.FormatUint(id, 10))
	}
	v, err := mv.do(ctx, args...)
	if err != nil {
		return 0, fmt.Errorf("add-group: %w", err)
	}
	return uint64(v.Int), nil
}

// RemoveGroup takes data group g, which must own no slots and be named by
// no move in flight, out of the metadata group's map (KEFIR.SLOTS META
// REMOVEGROUP, kv.KindMapRemoveGroup), compare-and-set by the map's epoch
// the caller checked it at; it returns the map's epoch after it (a retry
// once removed: the map's, unchanged). Its members retire their replicas
// when they see it.
func (mv *Mover) RemoveGroup(ctx context.Context, g GroupID, epoch uint64) (uint64, error) {
	defer mv.close()
	v, err := mv.do(ctx, "KEFIR.SLOTS", "META", "REMOVEGROUP", strconv.FormatUint(uint64(g), 10), strconv.FormatUint(epoch, 10))
	if err != nil {
		return 0, fmt.Errorf("remove-group: %w", err)
	}
	return uint64(v.Int), nil
}

// fenced returns a step (KEFIR.SLOTS SET, LOAD) with the driver fence of
// the lease this driver holds (kv.AppendDriverFence): a group refuses it
// once a driver with a higher beat sent it a step. Other commands, and
// every command of a driver without a lease, go as they are.
func (mv *Mover) fenced(args [][]byte) [][]byte {
	l := mv.lease
	if l.epoch == 0 || len(args) < 3 || !strings.EqualFold(string(args[0]), "KEFIR.SLOTS") {
		return args
	}
	beat := []byte(strconv.FormatUint(l.beat, 10))
	switch strings.ToUpper(string(args[1])) {
	case "SET":
		if len(args) == 7 {
			return append(args[:7:7], beat)
		}
	case "LOAD":
		out := make([][]byte, 0, len(args)+2)
		out = append(out, args[0], []byte("LOADF"), args[2], []byte(strconv.FormatUint(l.epoch, 10)), beat)
		return append(out, args[3:]...)
	}
	return args
}
