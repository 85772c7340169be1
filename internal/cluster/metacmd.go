package cluster

import (
	"bytes"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
)

// The one translation of KEFIR.SLOTS META (the metadata group's records:
// metamove.go's driver, kefir cluster add-node/add-group/remove-group, the
// groups' leaders' SETMEMBERS) into a map read or a metadata op: the front
// door (internal/server's metaCmd) runs it against a node's Multi, the move
// simulation (internal/vrshard, move_sim_test.go) against the stepped
// replica of the metadata group, so that the simulated drivers exercise the
// same parsing and ops as a real one.
//
//	KEFIR.SLOTS META MAP [LOCAL|SINCE e [WAIT ms]]  the map as JSON (LOCAL: this node's replica's; SINCE: null unless newer
//	                                                than epoch e; WAIT: held up to ms, at most 5000, until it is)
//	KEFIR.SLOTS META PLAN from to ranges epoch driver   MovePlanned: the move's beat
//	KEFIR.SLOTS META CLAIM epoch driver beat [ABORT] renew or take over a move's lease: the new beat
//	                                                (ABORT: the claim carries the abort mark, kv.MapMove.AbortWanted)
//	KEFIR.SLOTS META DONE epoch [driver beat]       MoveDone: the map's epoch (with the lease: compare-and-set on it)
//	KEFIR.SLOTS META ABORT epoch [driver beat]      the move rolled back: the map's epoch
//	KEFIR.SLOTS META ADDNODE id client-addr peer-addr [ZONE z]
//	                                                a node joins the map (with ZONE, its failure
//	                                                domain; a node of the map gets the zone): the map's epoch
//	KEFIR.SLOTS META REMOVENODE id                  a node that hosts nothing leaves the map
//	                                                (kv.MapNodeRemove): the map's epoch
//	KEFIR.SLOTS META SETMEMBERS group epoch id...   a group's members after its reconfiguration
//	                                                to VR epoch `epoch` (kv.KindMapSetMembers): the map's epoch
//	KEFIR.SLOTS META ADDGROUP group [ENGINE chain] id...
//	                                                a new data group with these members (leader
//	                                                order) and no slots (kv.KindMapAddGroup): the map's epoch
//	KEFIR.SLOTS META REMOVEGROUP group epoch        a data group of no slots leaves the map, compare-and-set by
//	                                                the map's epoch (kv.KindMapRemoveGroup): the map's epoch
//	KEFIR.SLOTS META CHAINWANT group epoch [JOIN id...] [LEAVE id...]
//	                                                a chain group's nodes to add and to remove, which its master
//	                                                carries out; compare-and-set by the map's epoch
//	                                                (kv.KindMapChainWant): the map's epoch
//
// A write's answer is its result's Int (the beat, or the map's epoch).

// MetaCmd is one KEFIR.SLOTS META subcommand translated: a map read (Map:
// Local, Since, Wait as given) or an op (Op, a kv.KindMap* op to propose at
// the metadata group's leader).
type MetaCmd struct {
	Map   bool
	Local bool
	// Since: answer a null unless the map is newer (0: always the map);
	// Wait: hold the answer up to this many ms until it is (capped at
	// MaxMapWait).
	Since, Wait uint64
	Op          kv.Op
}

// MaxMapWait caps a map poll's WAIT (ms): a poller's read deadline is
// longer.
const MaxMapWait = 5000

// MetaCommand translates KEFIR.SLOTS META args (args[0] the command name,
// args[1] META).
func MetaCommand(args [][]byte) (MetaCmd, error) {
	var c MetaCmd
	if len(args) < 3 {
		return c, slotsErrf("ERR wrong number of arguments for 'kefir.slots|meta' command")
	}
	sub := strings.ToUpper(string(args[2]))
	want := map[string]int{"MAP": 3, "PLAN": 8, "CLAIM": 6, "DONE": 4, "ABORT": 4, "ADDNODE": 6, "REMOVENODE": 4, "SETMEMBERS": 6, "ADDGROUP": 5, "REMOVEGROUP": 5, "CHAINWANT": 5}
	n, ok := want[sub]
	if !ok {
		return c, slotsErrf("ERR unknown subcommand '%s' of KEFIR.SLOTS META (MAP, PLAN, CLAIM, DONE, ABORT, ADDNODE, REMOVENODE, SETMEMBERS, ADDGROUP, REMOVEGROUP, CHAINWANT)", strings.ToLower(sub))
	}
	longer := (sub == "CLAIM" && len(args) == 7) || ((sub == "DONE" || sub == "ABORT") && len(args) == 6) || (sub == "ADDNODE" && len(args) == 8)
	if len(args) != n && !longer && !(sub == "MAP" && len(args) <= 7) && !((sub == "SETMEMBERS" || sub == "ADDGROUP" || sub == "CHAINWANT") && len(args) > n) {
		return c, slotsErrf("ERR wrong number of arguments for 'kefir.slots|meta|%s' command", strings.ToLower(sub))
	}
	u := func(i int) (uint64, error) {
		v, err := strconv.ParseUint(string(args[i]), 10, 64)
		if err != nil {
			return 0, slotsErrf("ERR KEFIR.SLOTS META %s: %q is not a number", sub, args[i])
		}
		return v, nil
	}
	switch sub {
	case "MAP":
		// MAP [LOCAL | SINCE epoch [WAIT ms]]. SINCE is the pollers' form:
		// a null reply when the map is at that epoch or older, so a node
		// without a metadata replica does not fetch the whole map every
		// poll; WAIT holds the reply until the map is newer (a long poll:
		// the node learns a change when the leader does, not a poll later).
		c.Map = true
		switch {
		case len(args) == 4 && strings.EqualFold(string(args[3]), "LOCAL"):
			c.Local = true
		case (len(args) == 5 || len(args) == 7 && strings.EqualFold(string(args[5]), "WAIT")) && strings.EqualFold(string(args[3]), "SINCE"):
			e, err := u(4)
			if err != nil {
				return c, err
			}
			c.Since = e
			if len(args) == 7 {
				w, err := u(6)
				if err != nil {
					return c, err
				}
				c.Wait = min(w, MaxMapWait)
			}
		case len(args) != 3:
			return c, slotsErrf("ERR KEFIR.SLOTS META MAP takes LOCAL or SINCE epoch [WAIT ms], not %q", bytes.Join(args[3:], []byte(" ")))
		}
		return c, nil
	case "PLAN":
		from, err1 := u(3)
		to, err2 := u(4)
		epoch, err3 := u(6)
		for _, err := range []error{err1, err2, err3} {
			if err != nil {
				return c, err
			}
		}
		rs, err := ParseSlotRanges(string(args[5]))
		if err != nil {
			return c, slotsErrf("ERR KEFIR.SLOTS META PLAN: %v", err)
		}
		c.Op = kv.Op{Kind: kv.KindMapMovePlan, Key: kv.AppendMapMove(nil, kv.MapMove{From: from, To: to, Slots: rs, Epoch: epoch, Driver: string(args[7])})}
	case "CLAIM":
		epoch, err := u(3)
		if err != nil {
			return c, err
		}
		beat, err := u(5)
		if err != nil {
			return c, err
		}
		mark := len(args) == 7
		if mark && !strings.EqualFold(string(args[6]), "ABORT") {
			return c, slotsErrf("ERR KEFIR.SLOTS META CLAIM: %q after the beat (ABORT or nothing)", args[6])
		}
		c.Op = kv.Op{Kind: kv.KindMapMoveClaim, Key: kv.AppendMapMove(nil, kv.MapMove{Epoch: epoch, Driver: string(args[4]), Beat: beat, AbortWanted: mark})}
	case "DONE", "ABORT":
		epoch, err := u(3)
		if err != nil {
			return c, err
		}
		end := kv.MapMove{Epoch: epoch}
		if len(args) == 6 {
			// The driver's end: compare-and-set on its lease.
			if end.Beat, err = u(5); err != nil {
				return c, err
			}
			end.Driver = string(args[4])
			if end.Driver == "" {
				return c, slotsErrf("ERR KEFIR.SLOTS META %s: an empty driver", sub)
			}
		}
		c.Op = kv.Op{Kind: kv.KindMapMoveDone, Key: kv.AppendMapMove(nil, end)}
		if sub == "ABORT" {
			c.Op.Kind = kv.KindMapMoveAbort
		}
	case "ADDNODE":
		id, err := u(3)
		if err != nil || id == 0 {
			return c, slotsErrf("ERR KEFIR.SLOTS META ADDNODE: the node id must be a positive integer")
		}
		nd := kv.MapNode{ID: id, ClientAddr: string(args[4]), PeerAddr: string(args[5])}
		if len(args) == 8 {
			if !strings.EqualFold(string(args[6]), "ZONE") {
				return c, slotsErrf("ERR KEFIR.SLOTS META ADDNODE: %q where ZONE was expected", args[6])
			}
			// An empty zone would be no zone: sent without ZONE.
			if nd.Zone = string(args[7]); nd.Zone == "" {
				return c, slotsErrf("ERR KEFIR.SLOTS META ADDNODE: an empty zone (leave ZONE out for none)")
			}
			if err := kv.ValidZone(nd.Zone); err != nil {
				return c, slotsErrf("ERR KEFIR.SLOTS META ADDNODE: %v", err)
			}
		}
		c.Op = kv.Op{Kind: kv.KindMapAddNode, Key: kv.AppendMapAddNode(nil, nd)}
	case "REMOVENODE":
		id, err := u(3)
		if err != nil || id == 0 {
			return c, slotsErrf("ERR KEFIR.SLOTS META REMOVENODE: the node id must be a positive integer")
		}
		c.Op = kv.Op{Kind: kv.KindMapAddNode, Cond: kv.MapNodeRemove, Key: kv.AppendMapNode(nil, kv.MapNode{ID: id})}
	case "SETMEMBERS":
		mm := kv.MapMembers{}
		var err error
		if mm.Group, err = u(3); err != nil {
			return c, err
		}
		if mm.Epoch, err = u(4); err != nil {
			return c, err
		}
		for i := 5; i < len(args); i++ {
			id, err := u(i)
			if err != nil {
				return c, err
			}
			mm.Members = append(mm.Members, id)
		}
		c.Op = kv.Op{Kind: kv.KindMapSetMembers, Key: kv.AppendMapMembers(nil, mm)}
	case "ADDGROUP":
		ag := kv.MapAddGroup{}
		mm := &ag.MapMembers
		var err error
		if mm.Group, err = u(3); err != nil {
			return c, err
		}
		first := 4
		if len(args) > 5 && strings.EqualFold(string(args[4]), "ENGINE") {
			// KEFIR.SLOTS META ADDGROUP g ENGINE chain ids...
			ag.Engine, first = strings.ToLower(string(args[5])), 6
			if ag.Engine == "vr" {
				ag.Engine = kv.EngineVR
			}
		}
		for i := first; i < len(args); i++ {
			id, err := u(i)
			if err != nil {
				return c, err
			}
			mm.Members = append(mm.Members, id)
		}
		c.Op = kv.Op{Kind: kv.KindMapAddGroup, Key: kv.AppendMapAddGroup(nil, ag)}
	case "REMOVEGROUP":
		g, err := u(3)
		if err != nil {
			return c, err
		}
		epoch, err := u(4)
		if err != nil {
			return c, err
		}
		c.Op = kv.Op{Kind: kv.KindMapRemoveGroup, Key: kv.AppendMapMembers(nil, kv.MapMembers{Group: g, Epoch: epoch})}
	case "CHAINWANT":
		g, err := u(3)
		if err != nil {
			return c, err
		}
		epoch, err := u(4)
		if err != nil {
			return c, err
		}
		w := kv.MapChainWant{Group: g, Epoch: epoch}
		var to *[]uint64
		for i := 5; i < len(args); i++ {
			switch strings.ToUpper(string(args[i])) {
			case "JOIN":
				to = &w.Join
				continue
			case "LEAVE":
				to = &w.Leave
				continue
			}
			id, err := u(i)
			if err != nil || to == nil {
				return c, slotsErrf("ERR syntax error: KEFIR.SLOTS META CHAINWANT group epoch [JOIN id...] [LEAVE id...]")
			}
			*to = append(*to, id)
		}
		c.Op = kv.Op{Kind: kv.KindMapChainWant, Key: kv.AppendMapChainWant(nil, w)}
	}
	return c, nil
}
