package kv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
)

// A chain's configuration as the metadata group records it (issue 30: the
// metadata group is the chain's master; docs/design/chain.md, "The master").
// The master (internal/chainmaster) runs at the metadata group's leader and
// commits every decision that changes the chain — a member failed, a node
// joining, the epoch raised — here before it tells any member, so the
// configuration survives a crash of any metadata member and a change of
// the metadata leader: the next leader's master starts from it.
//
// One reserved record per chain group (ChainConfigKey), changed only by:
//
//	KindMapChainInit  Key: a configuration (AppendChainConfig). The
//	                  group's first one; a no-op once it has one (every
//	                  metadata node proposes the same start). Int: the
//	                  recorded epoch.
//	KindMapChainSet   Key: a configuration; Delta: the epoch the master
//	                  read the record at; Expected (if set): the whole
//	                  record it read (AppendChainConfig). Compare-and-set:
//	                  written only if the record's epoch is Delta — and the
//	                  record is Expected, when given — and the new epoch is
//	                  no lower; otherwise refused (ErrSlotTransition's code,
//	                  the record unchanged) — a master that loaded a stale
//	                  record, or a deposed one, cannot overwrite a newer
//	                  decision, nor can a commit that timed out and lands
//	                  after another decision at the same epoch (a join
//	                  changes the joiner, not the epoch). The same
//	                  configuration again is a no-op (a retry). Int: the
//	                  recorded epoch.
//
// Both also make the cluster map's member list of a chain group of a
// cluster of several groups follow the record (followChain).
//
// Kind 171 (the rest of this block, 169-171) is unused.
//
// A chain group of a cluster changes members by a wish recorded in the map,
// which the chain's master carries out (docs/design/chain.md, "A chain in a
// cluster of groups"): the map asks, the master decides.
//
//	KindMapChainWant  Key: a group, the map epoch the caller read, the
//	                  nodes to add and the nodes to remove
//	                  (AppendMapChainWant). Compare-and-set by the map's
//	                  epoch. The group's Joining gains the nodes to add
//	                  that are not members yet and loses the nodes to
//	                  remove (a join given up); its Leaving gains the nodes
//	                  to remove (and loses the nodes to add: an operator
//	                  taking a node back); its Dropped loses the nodes
//	                  named, and, for a wish with no node to remove, one
//	                  (the oldest) per node it adds that was not dropped
//	                  (one dropped takes its own place back). The same wish again is a no-op
//	                  whatever the epoch (a rerun). Refused for a group
//	                  that is not a chain of the map, a node that is not a
//	                  node of the map, named twice or both added and
//	                  removed, and a wish that would leave the chain no
//	                  member. The map's epoch moves as with
//	                  KindMapAddNode. Int: the map's epoch.

// ChainConfig is a chain's configuration: its members, head first, the
// master's epoch, and the node being joined (0: none).
type ChainConfig struct {
	Group   uint64
	Epoch   uint64
	Members []uint64
	Joiner  uint64
}

// Equal reports whether c and d are the same configuration.
func (c *ChainConfig) Equal(d *ChainConfig) bool {
	return c.Group == d.Group && c.Epoch == d.Epoch && c.Joiner == d.Joiner && slices.Equal(c.Members, d.Members)
}

// ChainConfigKey is the reserved record of chain group's configuration.
func ChainConfigKey(group uint64) []byte {
	return ReservedKey("chain/" + strconv.FormatUint(group, 10))
}

// AppendChainConfig appends c's encoding (the chain ops' Key) to b.
func AppendChainConfig(b []byte, c *ChainConfig) []byte {
	b = binary.AppendUvarint(b, c.Group)
	b = binary.AppendUvarint(b, c.Epoch)
	b = binary.AppendUvarint(b, uint64(len(c.Members)))
	for _, id := range c.Members {
		b = binary.AppendUvarint(b, id)
	}
	return binary.AppendUvarint(b, c.Joiner)
}

// DecodeChainConfig decodes AppendChainConfig's encoding, all of b. A
// configuration names a member at least, none twice or 0 (group 0 is a lone
// chain's, as the host's default group id).
func DecodeChainConfig(b []byte) (*ChainConfig, error) {
	d := Decoder{B: b}
	c := &ChainConfig{Group: d.Uvarint(), Epoch: d.Uvarint()}
	n := d.Uvarint()
	if n > uint64(len(d.B)) {
		d.Err = ErrCorrupt
		n = 0
	}
	for range n {
		c.Members = append(c.Members, d.Uvarint())
	}
	c.Joiner = d.Uvarint()
	if d.Err != nil || len(d.B) != 0 || len(c.Members) == 0 {
		return nil, fmt.Errorf("%w: chain configuration", ErrCorrupt)
	}
	for i, id := range c.Members {
		if id == 0 || slices.Contains(c.Members[i+1:], id) {
			return nil, fmt.Errorf("%w: chain configuration: member %d", ErrCorrupt, id)
		}
	}
	return c, nil
}

// chainGroupOf is the group a chain op's Key names (0 also when none is
// readable: such an op is refused at apply and writes nothing).
func chainGroupOf(op *Op) uint64 {
	g, n := binary.Uvarint(op.Key)
	if n <= 0 {
		return 0
	}
	return g
}

// ReadChainConfig reads chain group's configuration through get (nil, nil:
// none recorded).
func ReadChainConfig(get Getter, group uint64) (*ChainConfig, error) {
	data, _, _, ok, err := get(ChainConfigKey(group))
	if err != nil || !ok {
		return nil, err
	}
	return DecodeChainConfig(data)
}

func applyChainOp(get Getter, version uint64, op *Op, emit Emit) (Result, error) {
	n, err := DecodeChainConfig(op.Key)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %s: %v", ErrInvalidOp, op.Kind, err)
	}
	cur, err := ReadChainConfig(get, n.Group)
	if err != nil {
		return Result{}, err
	}
	switch op.Kind {
	case KindMapChainInit:
		if cur != nil {
			return Result{Kind: ResInt, Int: int64(cur.Epoch)}, nil
		}
	case KindMapChainSet:
		if cur == nil {
			return Result{}, fmt.Errorf("%w: chain %d: no configuration recorded (KindMapChainInit first)", ErrSlotTransition, n.Group)
		}
		if cur.Equal(n) {
			return Result{Kind: ResInt, Int: int64(cur.Epoch)}, nil
		}
		if op.Delta < 0 || cur.Epoch != uint64(op.Delta) || n.Epoch < cur.Epoch ||
			len(op.Expected) > 0 && !bytes.Equal(op.Expected, AppendChainConfig(nil, cur)) {
			return Result{}, fmt.Errorf("%w: chain %d is at epoch %d (members %v, joiner %d), not %d or not the one expected: the master's configuration is stale (it would set epoch %d)",
				ErrSlotTransition, n.Group, cur.Epoch, cur.Members, cur.Joiner, op.Delta, n.Epoch)
		}
	default:
		return Result{}, fmt.Errorf("%w: %s", ErrInvalidOp, op.Kind)
	}
	put(emit, ChainConfigKey(n.Group), AppendChainConfig(nil, n), nil)
	if err := followChain(get, n, emit); err != nil {
		return Result{}, err
	}
	return Result{Kind: ResInt, Int: int64(n.Epoch), Version: version}, nil
}

// followChain makes the cluster map, if the group has one and records the
// chain as one of its groups (a chain group of a cluster of several
// groups), name the chain's members as n has them, head first: the map is
// what a node that is not a member routes by (a request for the group goes
// to its first member) and what CLUSTER SLOTS and kefir cluster status
// show, so after a repair it must not keep naming a failed head. The map's
// epoch moves as with KindMapAddNode (pollers adopt the map), unless a move
// is in flight.
func followChain(get Getter, n *ChainConfig, emit Emit) error {
	if len(n.Members) == 0 {
		return nil
	}
	m, err := ReadClusterMap(get)
	if err != nil || m == nil {
		return err
	}
	g, ok := m.Group(n.Group)
	if !ok || !g.IsChain() {
		return nil
	}
	// A node the chain now has as a member, its join done, joined: it is
	// no longer wanted (KindMapChainWant). Not while it is the record's
	// joiner: a FLUSH puts it in the list, and a failure during the flush
	// aborts the join, after which the master must still join it. A
	// leaving one stays in Leaving (the master never joins it again).
	joining := slices.DeleteFunc(slices.Clone(g.Joining), func(id uint64) bool { return slices.Contains(n.Members, id) && id != n.Joiner })
	// A member the record no longer has, which the map did not want out
	// (nor still wants in: a joiner whose flush a failure aborted), was
	// failed: its place is Dropped until it is a member again.
	dropped := slices.Clone(g.Dropped)
	for _, id := range g.Members {
		if !slices.Contains(n.Members, id) && !slices.Contains(g.Leaving, id) && !slices.Contains(g.Joining, id) && !slices.Contains(dropped, id) {
			dropped = append(dropped, id)
		}
	}
	dropped = dropIDs(dropped, n.Members)
	if slices.Equal(g.Members, n.Members) && len(joining) == len(g.Joining) && slices.Equal(dropped, g.Dropped) {
		return nil
	}
	for _, id := range n.Members {
		if !slices.ContainsFunc(m.Nodes, func(x MapNode) bool { return x.ID == id }) {
			return nil // not a node of the map: the map keeps what it had
		}
	}
	c := m.clone()
	cg, _ := c.Group(n.Group)
	cg.Members = slices.Clone(n.Members)
	cg.Joining = slices.Clip(joining)
	if len(cg.Joining) == 0 {
		cg.Joining = nil
	}
	cg.Dropped = dropped
	if len(c.Moves) == 0 {
		c.Epoch++
	}
	put(emit, ClusterMapKey, AppendClusterMap(nil, c), nil)
	return nil
}

// MapChainWant is KindMapChainWant's payload: chain group Group's nodes to
// add (Join) and to remove (Leave), checked against the map at Epoch.
type MapChainWant struct {
	Group, Epoch uint64
	Join, Leave  []uint64
}

// AppendMapChainWant appends w's encoding (KindMapChainWant's Key) to b.
func AppendMapChainWant(b []byte, w MapChainWant) []byte {
	b = binary.AppendUvarint(b, w.Group)
	b = binary.AppendUvarint(b, w.Epoch)
	b = appendIDs(b, w.Join)
	return appendIDs(b, w.Leave)
}

// DecodeMapChainWant decodes AppendMapChainWant's encoding, all of b.
func DecodeMapChainWant(b []byte) (MapChainWant, error) {
	d := Decoder{B: b}
	w := MapChainWant{Group: d.Uvarint(), Epoch: d.Uvarint()}
	ids := func() []uint64 {
		n := d.Uvarint()
		if n > uint64(len(d.B)) {
			d.Err = ErrCorrupt
			return nil
		}
		var out []uint64
		for range n {
			out = append(out, d.Uvarint())
		}
		return out
	}
	w.Join = ids()
	w.Leave = ids()
	if d.Err != nil || len(d.B) != 0 {
		return MapChainWant{}, fmt.Errorf("%w: chain want", ErrCorrupt)
	}
	return w, nil
}

// chainWant is KindMapChainWant's step. Why the map and not the chain's
// record: the record is the master's alone (commit before announce, a
// compare-and-set on what it last committed), and an operator's wish is not
// a decision — the master decides when each node joins (the existing join,
// pre-copy and FLUSH) and when a leaving one is failed, and records each in
// the record, which the map then follows. Why compare-and-set by the
// map's epoch: the caller planned against the members it read.
func chainWant(m *ClusterMap, op *Op) (*ClusterMap, Result, error) {
	w, err := DecodeMapChainWant(op.Key)
	if err != nil {
		return nil, Result{}, err
	}
	g, ok := m.Group(w.Group)
	if !ok || !g.IsChain() {
		return nil, Result{}, errMap("group %d is not a chain group of the map", w.Group)
	}
	all := slices.Concat(w.Join, w.Leave)
	for i, id := range all {
		if slices.Contains(all[:i], id) {
			return nil, Result{}, errMap("chain %d: node %d named twice (added and removed at once?)", w.Group, id)
		}
		if !slices.ContainsFunc(m.Nodes, func(x MapNode) bool { return x.ID == id }) {
			return nil, Result{}, errMap("chain %d: node %d is not a node of the map (add it first)", w.Group, id)
		}
	}
	// A wish adds to the change under way, as to Leaving: the nodes still
	// wanted in stay (but for those this wish removes: how a join is given
	// up), and this wish's join unless joined already — a member the map
	// no longer wants in (followChain cleared it; one still in Joining may
	// be the record's joiner, whose flush a failure can abort). Replacing
	// Joining instead would let a second command (remove-node of another
	// member) drop the first's new node while its old one stays in
	// Leaving: the chain would lose both.
	join := slices.DeleteFunc(slices.Clone(g.Joining), func(id uint64) bool { return slices.Contains(w.Leave, id) })
	for _, id := range w.Join {
		if !slices.Contains(join, id) && !slices.Contains(g.Members, id) {
			join = append(join, id)
		}
	}
	leave := slices.DeleteFunc(slices.Clone(g.Leaving), func(id uint64) bool { return slices.Contains(w.Join, id) })
	for _, id := range w.Leave {
		if !slices.Contains(leave, id) {
			leave = append(leave, id)
		}
	}
	if len(join) == 0 {
		join = nil
	}
	if len(leave) == 0 {
		leave = nil
	}
	if slices.Equal(join, g.Joining) && slices.Equal(leave, g.Leaving) {
		return nil, Result{Kind: ResInt, Int: int64(m.Epoch)}, nil // a rerun
	}
	if w.Epoch != m.Epoch {
		return nil, Result{}, errMap("the change of chain %d was planned against the map at epoch %d, the map is at %d: plan it again", w.Group, w.Epoch, m.Epoch)
	}
	stay := slices.DeleteFunc(slices.Clone(g.Members), func(id uint64) bool { return slices.Contains(leave, id) })
	if len(stay)+len(join) == 0 {
		return nil, Result{}, errMap("chain %d (members %v): removing %v would leave it no member", w.Group, g.Members, w.Leave)
	}
	n := m.clone()
	ng, _ := n.Group(w.Group)
	ng.Joining, ng.Leaving = join, leave
	// A dropped member the wish names is the wish's now: replaced (it
	// leaves), or wanted back. A growth (no node to remove) takes the
	// places failures left first, the oldest first, as the master counts
	// it (a joiner fills a place below the chain's length): those are
	// re-created, not left for a replace-node to re-create again.
	ng.Dropped = dropIDs(g.Dropped, all)
	if len(w.Leave) == 0 {
		added := 0
		for _, id := range w.Join {
			// A dropped node wanted back takes its own place (cleared
			// above), not another's: the master counts it as one joiner
			// filling one place below the length.
			if !slices.Contains(g.Joining, id) && !slices.Contains(g.Members, id) && !slices.Contains(g.Dropped, id) {
				added++
			}
		}
		ng.Dropped = dropIDs(ng.Dropped, ng.Dropped[:min(added, len(ng.Dropped))])
	}
	// As AddNode: the epoch moves so pollers learn the wish (the joining
	// node opens its member by it), but not while a move is in flight.
	if len(n.Moves) == 0 {
		n.Epoch++
	}
	return n, Result{Kind: ResInt, Int: int64(n.Epoch)}, nil
}
