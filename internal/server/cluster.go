package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
)

// The Redis Cluster surface (issue 28, first part; docs/cluster.md): CLUSTER
// SLOTS, SHARDS, NODES, INFO, KEYSLOT, MYID, COUNTKEYSINSLOT, GETKEYSINSLOT,
// and ASKING, READONLY, READWRITE, in Redis 7's reply shapes, over the slot
// map the node routes by (a node of one group: that group owns every slot).
//
// Redirects. A connection is cluster-aware once it asked for the topology
// (CLUSTER SLOTS, SHARDS or NODES) or sent READONLY, READWRITE or ASKING —
// what only a Redis Cluster client does. A request of a cluster-aware
// connection for a slot whose group this node cannot serve (it does not
// lead it, or does not host it) is answered "-MOVED <slot> <ip:port>" of the
// group's leader, as Redis Cluster's; every other connection is forwarded to
// that leader, as before, so plain clients (redis-cli without -c) keep
// working against any node. While no leader is known (a view change) both
// are forwarded, which waits for one.

// ClusterEngineField is the key of CLUSTER SLOTS' node metadata that names
// a chain group's engine ("chain"); a VR group's nodes carry no metadata.
const ClusterEngineField = "kefir-engine"

// clusterGroup is one group as the CLUSTER replies describe it: its slots,
// its members' client addresses and which member leads (0: none known).
type clusterGroup struct {
	spec   cluster.GroupSpec
	leader uint64
}

// clusterView returns the node's groups: the slot map's on a node of several
// groups, else the one group (or single node) owning every slot.
func (s *Server) clusterView() (groups []clusterGroup, addrs map[uint64]string) {
	addrs = map[uint64]string{}
	members := s.groupMembers() // a reconfigured group's, membership.go
	for _, m := range members {
		addrs[m.ID] = m.ClientAddr
	}
	all := []cluster.SlotRange{{Start: 0, End: cluster.Slots - 1}}
	switch {
	case s.multi != nil:
		// The nodes of the map (a node added after this one started
		// included), those that are members of a group.
		addrs = map[uint64]string{}
		for _, g := range s.multi.Slots().Groups {
			cg := clusterGroup{spec: g}
			cg.leader, _, _ = s.multi.Leader(g.ID)
			groups = append(groups, cg)
			for _, id := range g.Members {
				if n, ok := s.multi.Node(id); ok {
					addrs[id] = n.ClientAddr
				}
			}
		}
		if n, ok := s.multi.Node(s.selfID()); ok {
			addrs[n.ID] = n.ClientAddr // CLUSTER MYID is in CLUSTER NODES
		}
	case s.grp != nil:
		ids := cluster.MemberIDs(members)
		cg := clusterGroup{spec: cluster.GroupSpec{ID: 1, Members: ids, Slots: all}}
		if s.cfg.Chain {
			cg.spec.Engine = kv.EngineChain // kefir server --engine chain
		}
		if st := s.grp.State(); st.Normal {
			cg.leader = st.Leader
		}
		groups = append(groups, cg)
	default:
		self := max(s.cfg.ReplicaID, 1)
		addrs[self] = s.ClientAddr().String()
		groups = append(groups, clusterGroup{spec: cluster.GroupSpec{ID: 1, Members: []uint64{self}, Slots: all}, leader: self})
	}
	return groups, addrs
}

// selfID is this node's id in the cluster replies (a single node: 1).
func (s *Server) selfID() uint64 { return max(s.cfg.ReplicaID, 1) }

// nodeName is Redis Cluster's 40-hex-digit name of node id.
func (s *Server) nodeName(id uint64) string { return cluster.NodeName(s.cfg.ClusterID, id) }

// ordered returns g's members leader first (the leader Redis Cluster calls
// master; the rest are its replicas).
func (g clusterGroup) ordered() []uint64 {
	ms := make([]uint64, 0, len(g.spec.Members))
	if g.leader != 0 {
		ms = append(ms, g.leader)
	}
	for _, m := range g.spec.Members {
		if m != g.leader {
			ms = append(ms, m)
		}
	}
	return ms
}

func splitAddr(addr string) (string, int64) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 0
	}
	p, _ := strconv.ParseInt(port, 10, 64)
	return host, p
}

// crossSlot refuses a command whose keys hash to different slots, before it
// is parsed or proposed (a node of several groups only: a single group
// serves any set of keys, as it always has).
func crossSlot(spec *command.Spec, args [][]byte) error {
	first, cross := true, false
	var slot uint16
	forSpecKeys(spec, args, func(k []byte) bool {
		s := cluster.Slot(k)
		if first {
			first, slot = false, s
		}
		cross = s != slot
		return !cross
	})
	if cross {
		return cluster.ErrCrossSlot
	}
	return nil
}

// forSpecKeys calls f with each key args names by spec's key positions
// (COMMAND's FirstKey, LastKey, KeyStep) until f returns false.
func forSpecKeys(spec *command.Spec, args [][]byte, f func(key []byte) bool) {
	if spec.FirstKey <= 0 || spec.FirstKey >= len(args) {
		return
	}
	last := spec.LastKey
	if last < 0 {
		last += len(args)
	}
	last = min(last, len(args)-1)
	for i := spec.FirstKey; i <= last && f(args[i]); i += max(spec.KeyStep, 1) {
	}
}

// clusterCmd runs CLUSTER, ASKING, READONLY and READWRITE.
func (c *conn) clusterCmd(spec *command.Spec, args [][]byte) error {
	w := c.w
	switch spec.Name {
	case "ASKING":
		// A move hands slots over whole (docs/design/cluster.md): no
		// node sends -ASK and an importing group serves no key of the
		// slot, so ASKING changes nothing but marks a cluster client.
		c.clusterAware = true
		return w.WriteSimple("OK")
	case "READONLY":
		// Reads from replicas: this connection's reads default to the
		// follower-served level eventual (docs/cluster.md), unless it chose
		// a level itself.
		c.clusterAware = true
		c.cons = level.ConsEventual
		return w.WriteSimple("OK")
	case "READWRITE":
		c.clusterAware = true
		c.cons = c.srv.cfg.Consistency
		return w.WriteSimple("OK")
	}
	sub := strings.ToUpper(string(args[1]))
	switch sub {
	case "SLOTS", "SHARDS", "NODES", "INFO", "MYID", "HELP":
		// Redis checks each subcommand's arity (Redis 7: cluster|info).
		if len(args) != 2 {
			return errf("ERR wrong number of arguments for 'cluster|%s' command", strings.ToLower(sub))
		}
	}
	s := c.srv
	groups, addrs := s.clusterView()
	switch sub {
	case "HELP":
		lines := []string{"CLUSTER <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
			"COUNTKEYSINSLOT <slot>", "    Return the number of keys in <slot>.",
			"GETKEYSINSLOT <slot> <count>", "    Return key names stored in a slot.",
			"INFO", "    Return information about the cluster.",
			"KEYSLOT <key>", "    Return the hash slot for <key>.",
			"MYID", "    Return the node id.",
			"NODES", "    Return cluster configuration seen by node. Output format:",
			"    <id> <ip:port> <flags> <master> <pings> <pongs> <epoch> <link> <slot> ...",
			"SLOTS", "    Return information about slots range mappings. Each range is made of:",
			"    start, end, master and replicas IP addresses, ports and ids",
			"SHARDS", "    Return information about slot range mappings and the nodes associated with them.",
			"REPLICAS <node-id>", "    Return <node-id> replicas.",
			"HELP", "    Prints this help.",
			"Kefir moves slots with kefir cluster move-slots, not SETSLOT (docs/cluster.md)."}
		_ = w.WriteArrayHeader(len(lines))
		for _, l := range lines {
			_ = w.WriteSimple(l)
		}
		return nil
	case "SLOTS":
		c.clusterAware = true
		n := 0
		for _, g := range groups {
			n += len(g.spec.Slots)
		}
		_ = w.WriteArrayHeader(n)
		for _, g := range groups {
			ms := g.ordered()
			// A chain group's members say so in the node's metadata map
			// (Redis 7's fourth element, which Redis Cluster clients read
			// for "hostname" and otherwise ignore): every member of a chain
			// under SU or AUSI serves strong reads, and the Go client's
			// WithChainReads spreads them over the group's members
			// (client/route.go). The chain's head is listed first, as a
			// VR group's leader is.
			chain := g.spec.Engine == kv.EngineChain
			for _, r := range g.spec.Slots {
				_ = w.WriteArrayHeader(2 + len(ms))
				_ = w.WriteInt(int64(r.Start))
				_ = w.WriteInt(int64(r.End))
				for _, m := range ms {
					host, port := splitAddr(addrs[m])
					_ = w.WriteArrayHeader(4)
					_ = w.WriteBulkString(host)
					_ = w.WriteInt(port)
					_ = w.WriteBulkString(s.nodeName(m))
					if chain {
						_ = w.WriteMapHeader(1)
						_ = w.WriteBulkString(ClusterEngineField)
						_ = w.WriteBulkString(kv.EngineChain)
					} else {
						_ = w.WriteMapHeader(0)
					}
				}
			}
		}
		return nil
	case "SHARDS":
		c.clusterAware = true
		_ = w.WriteArrayHeader(len(groups))
		for _, g := range groups {
			_ = w.WriteMapHeader(2)
			_ = w.WriteBulkString("slots")
			_ = w.WriteArrayHeader(2 * len(g.spec.Slots))
			for _, r := range g.spec.Slots {
				_ = w.WriteInt(int64(r.Start))
				_ = w.WriteInt(int64(r.End))
			}
			_ = w.WriteBulkString("nodes")
			ms := g.ordered()
			_ = w.WriteArrayHeader(len(ms))
			for _, m := range ms {
				host, port := splitAddr(addrs[m])
				role := "replica"
				if m == g.leader {
					role = "master"
				}
				_ = w.WriteMapHeader(7)
				for _, kv := range [][2]string{{"id", s.nodeName(m)}, {"port", ""}, {"ip", host}, {"endpoint", host}, {"role", role}, {"replication-offset", ""}, {"health", "online"}} {
					_ = w.WriteBulkString(kv[0])
					switch kv[0] {
					case "port":
						_ = w.WriteInt(port)
					case "replication-offset":
						_ = w.WriteInt(0)
					default:
						_ = w.WriteBulkString(kv[1])
					}
				}
			}
		}
		return nil
	case "NODES":
		c.clusterAware = true
		return w.WriteBulkString(s.clusterNodes(groups, addrs))
	case "INFO":
		// cluster_size is Redis's "master nodes serving at least one slot":
		// the distinct nodes that lead a group owning slots (a node leading
		// two groups is one master in CLUSTER NODES, and counts once).
		leaders, masters := 0, map[uint64]bool{}
		for _, g := range groups {
			if g.leader != 0 {
				leaders++
				if len(g.spec.Slots) > 0 {
					masters[g.leader] = true
				}
			}
		}
		state := "ok"
		if leaders < len(groups) {
			state = "fail" // a group without a known leader serves no writes
		}
		return w.WriteBulkString(fmt.Sprintf("cluster_state:%s\r\ncluster_slots_assigned:%d\r\ncluster_slots_ok:%d\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:%d\r\ncluster_size:%d\r\ncluster_current_epoch:%d\r\ncluster_my_epoch:%d\r\n",
			state, cluster.Slots, cluster.Slots, len(addrs), len(masters), s.slotEpoch(), s.slotEpoch()) + s.metaInfo())
	case "MYID":
		return w.WriteBulkString(s.nodeName(s.selfID()))
	case "KEYSLOT":
		if len(args) != 3 {
			return errf("ERR wrong number of arguments for 'cluster|keyslot' command")
		}
		return w.WriteInt(int64(cluster.Slot(args[2])))
	case "COUNTKEYSINSLOT", "GETKEYSINSLOT":
		return c.keysInSlot(sub, args)
	case "REPLICAS", "SLAVES":
		if len(args) != 3 {
			return errf("ERR wrong number of arguments for 'cluster|%s' command", strings.ToLower(sub))
		}
		lines, err := clusterReplicas(s.clusterNodes(groups, addrs), string(args[2]))
		if err != nil {
			return err
		}
		_ = w.WriteArrayHeader(len(lines))
		for _, l := range lines {
			_ = w.WriteBulkString(l)
		}
		return nil
	}
	return errf("ERR unknown subcommand '%s'. Try CLUSTER HELP.", clip(args[1]))
}

// clusterReplicas answers CLUSTER REPLICAS id (and SLAVES) from the
// CLUSTER NODES text: the lines of the nodes listed as replicas of id, each
// without its newline (Redis's clusterGenNodeDescription), with Redis's
// errors for a node it does not know or one listed as a replica. A Kefir
// node's role is the one CLUSTER NODES gives it (clusterNodes): a node that
// leads no group is a replica of its first group's leader.
func clusterReplicas(nodes, id string) ([]string, error) {
	known, master := false, false
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(nodes, "\n"), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		if f[0] == id {
			known = true
			master = !strings.Contains(f[2], "slave")
		}
		if f[3] == id {
			out = append(out, l)
		}
	}
	switch {
	case !known:
		// Whole, as Redis names it (the writer turns a CR or LF into a
		// space, as Redis's addReplyErrorFormat does).
		return nil, errf("ERR Unknown node %s", id)
	case !master:
		return nil, errf("ERR The specified node is not a master")
	}
	return out, nil
}

// slotEpoch is the slot map's epoch (a static map: 1).
func (s *Server) slotEpoch() uint64 {
	if s.multi != nil {
		return s.multi.Slots().Epoch
	}
	return 1
}

// clusterNodes renders CLUSTER NODES. Redis Cluster has one role per node;
// a Kefir node leads some groups and follows others, so a node is listed
// as master of the slots of the groups it leads, and a node that leads none
// as a replica of its first group's leader (docs/cluster.md).
func (s *Server) clusterNodes(groups []clusterGroup, addrs map[uint64]string) string {
	ids := make([]uint64, 0, len(addrs))
	for id := range addrs {
		ids = append(ids, id)
	}
	sortU64(ids)
	var b strings.Builder
	for _, id := range ids {
		var slots []string
		master := ""
		for _, g := range groups {
			if g.leader == id {
				for _, r := range g.spec.Slots {
					if r.Start == r.End {
						slots = append(slots, strconv.Itoa(int(r.Start)))
					} else {
						slots = append(slots, fmt.Sprintf("%d-%d", r.Start, r.End))
					}
				}
			} else if master == "" && g.leader != 0 && containsU64(g.spec.Members, id) {
				master = s.nodeName(g.leader)
			}
		}
		flags := "master"
		if len(slots) == 0 && master != "" {
			flags = "slave"
		} else {
			master = "-"
		}
		if id == s.selfID() {
			flags = "myself," + flags
		}
		host, port := splitAddr(addrs[id])
		fmt.Fprintf(&b, "%s %s:%d@0 %s %s 0 0 %d connected", s.nodeName(id), host, port, flags, master, s.slotEpoch())
		for _, sl := range slots {
			b.WriteString(" " + sl)
		}
		b.WriteString("\n")
	}
	return b.String()
}

func sortU64(a []uint64) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func containsU64(a []uint64, x uint64) bool {
	for _, v := range a {
		if v == x {
			return true
		}
	}
	return false
}

// keysInSlot answers CLUSTER COUNTKEYSINSLOT slot and GETKEYSINSLOT slot
// count by reading every key of the slot's group (keys are stored by key,
// not by slot: O(the group's keys) per call), at the connection's level. A
// slot this node cannot serve is redirected as a request would be.
func (c *conn) keysInSlot(sub string, args [][]byte) error {
	want := 3
	if sub == "GETKEYSINSLOT" {
		want = 4
	}
	if len(args) != want {
		return errf("ERR wrong number of arguments for 'cluster|%s' command", strings.ToLower(sub))
	}
	// Redis's checks and texts: both arguments integers, then the slot
	// in range (and for GETKEYSINSLOT the count not negative).
	slot, err := command.ParseInt(args[2])
	if err != nil {
		return errNotInt
	}
	limit := int64(-1)
	if want == 4 {
		if limit, err = command.ParseInt(args[3]); err != nil {
			return errNotInt
		}
		if slot < 0 || slot >= cluster.Slots || limit < 0 {
			return errf("ERR Invalid slot or number of keys")
		}
	} else if slot < 0 || slot >= cluster.Slots {
		return errf("ERR Invalid slot")
	}
	var keys [][]byte
	count := int64(0)
	visit := func(k []byte) bool {
		if limit >= 0 && count >= limit {
			return false
		}
		count++
		if want == 4 {
			keys = append(keys, append([]byte(nil), k...))
		}
		return true
	}
	if c.srv.multi != nil {
		err = c.srv.multi.ScanSlot(context.Background(), uint16(slot), c.cons, c.sess, visit)
	} else {
		err = cluster.ScanSlot(context.Background(), c.srv.shard, uint16(slot), c.cons, c.sess, visit)
	}
	if errors.Is(err, cluster.ErrNotLeader) {
		// The slot's group is led elsewhere: its leader counts (or a
		// cluster client is redirected there; a forward is answered MOVED,
		// never forwarded again).
		return c.forwardRead(args, c.cons, c.sess, callOpts{redirect: c.callRedirect}, err)
	}
	if err != nil {
		return err
	}
	if want == 3 {
		return c.w.WriteInt(count)
	}
	_ = c.w.WriteArrayHeader(len(keys))
	for _, k := range keys {
		_ = c.w.WriteBulk(k)
	}
	return nil
}

// GroupStatus is one group of the slot map in /status: its slots, members
// and leader, and this node's replica of it (none: not hosted here).
type GroupStatus struct {
	ID        uint64   `json:"id"`
	Slots     []string `json:"slots"`
	SlotCount int      `json:"slot_count"`
	Members   []uint64 `json:"members"`
	Leader    uint64   `json:"leader"`
	// Engine is "chain" for a chain group (empty: VR).
	Engine string `json:"engine,omitempty"`
	Role   string `json:"role,omitempty"`
	// Normal: this node's replica is in a normal view (not changing views
	// or recovering); kefir up waits for it on every replica.
	Normal  bool   `json:"normal,omitempty"`
	View    uint64 `json:"view,omitempty"`
	Commit  uint64 `json:"commit_op,omitempty"`
	Applied uint64 `json:"applied_op,omitempty"`
	// Lag: this replica's commit point less what it applied (lag.go);
	// Followers: at the group's leader, each follower's lag.
	Lag       uint64        `json:"lag_ops"`
	Followers []FollowerLag `json:"followers,omitempty"`
}

// groupStatus reports the slot map's groups at a node of several groups
// (nil otherwise).
func (s *Server) groupStatus() []GroupStatus {
	if s.multi == nil {
		return nil
	}
	var out []GroupStatus
	for _, g := range s.multi.Slots().Groups {
		gs := GroupStatus{ID: uint64(g.ID), Members: g.Members, Engine: g.Engine}
		for _, r := range g.Slots {
			gs.Slots = append(gs.Slots, fmt.Sprintf("%d-%d", r.Start, r.End))
			gs.SlotCount += int(r.End) - int(r.Start) + 1
		}
		gs.Leader, _, _ = s.multi.Leader(g.ID)
		if st, ok := s.multi.GroupState(g.ID); ok {
			gs.Role, gs.Normal, gs.View, gs.Commit, gs.Applied = st.Role, st.Normal, st.View, st.Commit, st.Applied
			gs.Lag, gs.Followers = opsBehind(st.Commit, st.Applied), followerLags(st)
		}
		out = append(out, gs)
	}
	return out
}
