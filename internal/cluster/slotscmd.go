package cluster

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
)

// The one translation of KEFIR.SLOTS (a move's steps, mover.go) into calls
// on a group's leader: the front door (internal/server) runs it against a
// node's Multi, the deterministic simulation of moves (internal/vrshard's
// move_sim_test.go) against the stepped replica that leads the group, so
// that the simulated mover exercises the same parsing and replies as a real
// one.
//
//	KEFIR.SLOTS TABLE g                          the group's slot table: [start end state peer epoch]...
//	KEFIR.SLOTS INIT g epoch [ranges]            its first table: owns ranges (default: its slots in this
//	                                             node's map) at epoch; a no-op if it has one
//	KEFIR.SLOTS SET g state peer epoch ranges [beat]
//	                                             a transition (migrating, importing, none, owned);
//	                                             with beat, fenced by the driver's lease (kv.SlotFenceKey)
//	KEFIR.SLOTS DUMP g ranges cursor limit since frozen
//	                                             up to limit keys of ranges from cursor on: [next-cursor,
//	                                             [key meta payload version]... of those above version since,
//	                                             [key]... of all, the engine's version before the page];
//	                                             frozen 1: only once the group handed the ranges over
//	                                             (its fence froze them), else -TRYAGAIN
//	KEFIR.SLOTS LOAD g key meta payload ...      an import (or, deletions only, a purge)
//	KEFIR.SLOTS LOADF g epoch beat [key meta payload ...]
//	                                             LOAD fenced by the driver's lease (no entries:
//	                                             the fence raised, nothing else: Mover.fence)
//	KEFIR.SLOTS CLIENTS g at                     the group's client-table rows as of version at,
//	                                             or the marks it imported if later (ClientRows):
//	                                             [id (8 bytes) row]... (a move's request marks)
//	KEFIR.SLOTS VIEWS g at                       the group's view history (its applied ops', once they
//	                                             reach version at, else -TRYAGAIN) and the view copies it
//	                                             imported: [group top rows]... (rows: kv.AppendViewCopy's;
//	                                             a move's view copies, kv/viewcopy.go)
//	KEFIR.SLOTS STATS g cursor limit since [until]
//	                                             per-slot counts over up to limit keys from cursor on:
//	                                             [next-cursor, the engine's version before the page,
//	                                             [slot keys bytes written-in-(since,until]]...] (rebalance;
//	                                             until 0 or absent: no upper bound)
//	KEFIR.SLOTS READS                            the reads this node served since it started, per
//	                                             slot: [slot count]... of the slots with any (not a
//	                                             group's: any node answers, for itself; rebalance --by load)
//
// INIT and SET answer the op's version (0: the group was already there, a
// retried step).
//
// ranges are START-END[,START-END...]. At a node whose replica of g does
// not lead it, the answer is -MOVED <leader's address> (or -UNAVAILABLE no
// leader): the mover follows it, as the steps are not forwarded.

// SlotAdmin is what KEFIR.SLOTS reads at a group's leader: a node's groups
// (Multi), or in the simulator one replica. Each method fails with a
// *NotLeaderError where the group is not led.
type SlotAdmin interface {
	SlotTable(id GroupID) (*kv.SlotTable, error)
	SlotDump(id GroupID, slots func(uint16) bool, cursor []byte, limit int, since uint64) (Dump, error)
	SlotClients(id GroupID, at uint64) (ids []uint64, rows [][]byte, err error)
	SlotViews(id GroupID, at uint64) ([]kv.GroupViews, error)
	SlotStats(id GroupID, cursor []byte, limit int, since, until uint64) (SlotStatsPage, error)
	// Slots is the map INIT without ranges takes the group's slots from.
	Slots() *SlotMap
}

// maxSlotsPage caps DUMP's and STATS's limit: a page is held in memory
// (and STATS's hashes' rows are read after it) while the connection waits,
// so a huge limit would make one command hold the node; the caller pages on
// with the cursor either way.
const maxSlotsPage = 1 << 16

// SlotsCmd is one KEFIR.SLOTS subcommand (not META) translated: a read
// already answered (Reply), or a write (Write: Op to propose in group
// Group's log at its leader, durable on a majority before the answer,
// WriteReply).
type SlotsCmd struct {
	Group GroupID
	Write bool
	Op    kv.Op
	Reply resp.Value
	sub   string
}

// WriteReply is a write's answer once its op applied with res: INIT and
// SET answer the op's version, LOAD the entries it wrote.
func (c SlotsCmd) WriteReply(res kv.Result) resp.Value {
	if c.sub == "LOAD" || c.sub == "LOADF" {
		return resp.Value{Kind: resp.Int, Int: res.Int}
	}
	return resp.Value{Kind: resp.Int, Int: int64(res.Version)}
}

func slotsErrf(format string, args ...any) error {
	return &ReplyError{fmt.Sprintf(format, args...)}
}

func respInt(n int64) resp.Value   { return resp.Value{Kind: resp.Int, Int: n} }
func respBulk(b []byte) resp.Value { return resp.Value{Kind: resp.Bulk, Str: b} }
func respArray(es []resp.Value) resp.Value {
	return resp.Value{Kind: resp.Array, Elems: es}
}

// SlotsCommand translates KEFIR.SLOTS args (args[0] the command name,
// args[1] the subcommand, not META) at a, answering reads at once.
func SlotsCommand(a SlotAdmin, args [][]byte) (SlotsCmd, error) {
	if len(args) == 2 && strings.EqualFold(string(args[1]), "READS") {
		// A node's own counters (Multi.SlotReads), not a group's.
		r, ok := a.(interface{ SlotReads() ([]uint16, []uint64) })
		if !ok {
			return SlotsCmd{}, slotsErrf("ERR KEFIR.SLOTS READS: this node counts no reads (not a node of a cluster)")
		}
		slots, counts := r.SlotReads()
		es := make([]resp.Value, 0, 2*len(slots))
		for i, sl := range slots {
			es = append(es, respInt(int64(sl)), respInt(int64(counts[i])))
		}
		return SlotsCmd{Reply: respArray(es)}, nil
	}
	if len(args) < 3 {
		return SlotsCmd{}, slotsErrf("ERR wrong number of arguments for 'kefir.slots' command")
	}
	sub := strings.ToUpper(string(args[1]))
	g, err := strconv.ParseUint(string(args[2]), 10, 64)
	if err != nil || g == 0 {
		return SlotsCmd{}, slotsErrf("ERR KEFIR.SLOTS: group %q is not a group id", args[2])
	}
	id := GroupID(g)
	c := SlotsCmd{Group: id, sub: sub}
	// Each subcommand's argument count, least and most (an optional last
	// argument: INIT's ranges, SET's beat, STATS's until).
	nargs := map[string][2]int{"TABLE": {3, 3}, "INIT": {4, 5}, "SET": {7, 8}, "DUMP": {8, 8}, "CLIENTS": {4, 4}, "VIEWS": {4, 4}, "STATS": {6, 7}}
	if n, ok := nargs[sub]; ok && (len(args) < n[0] || len(args) > n[1]) {
		return c, slotsErrf("ERR wrong number of arguments for 'kefir.slots|%s' command", strings.ToLower(sub))
	}
	switch sub {
	case "TABLE":
		t, err := a.SlotTable(id)
		if err != nil {
			return c, err
		}
		if t == nil {
			c.Reply = respArray(nil)
			return c, nil
		}
		runs := t.Runs()
		es := make([]resp.Value, 0, len(runs))
		for _, r := range runs {
			es = append(es, respArray([]resp.Value{respInt(int64(r.Start)), respInt(int64(r.End)),
				respBulk([]byte(r.State.String())), respInt(int64(r.Peer)), respInt(int64(r.Epoch))}))
		}
		c.Reply = respArray(es)
		return c, nil
	case "INIT", "SET":
		op := kv.Op{Kind: kv.KindSlotInit}
		epochArg, rangesArg := args[3], []byte(nil)
		if len(args) == 5 {
			rangesArg = args[4]
		} else {
			spec, _ := a.Slots().Group(id)
			for _, r := range spec.Slots {
				rangesArg = fmt.Appendf(rangesArg, "%d-%d,", r.Start, r.End)
			}
			rangesArg = bytes.TrimSuffix(rangesArg, []byte(","))
		}
		if sub == "SET" {
			st, ok := kv.ParseSlotState(string(args[3]))
			if !ok {
				return c, slotsErrf("ERR KEFIR.SLOTS SET: unknown state %q (migrating, importing, none, owned)", args[3])
			}
			peer, err := strconv.ParseUint(string(args[4]), 10, 64)
			if err != nil {
				return c, slotsErrf("ERR KEFIR.SLOTS SET: peer %q is not a group id", args[4])
			}
			op = kv.Op{Kind: kv.KindSlotSet, Cond: kv.Cond(st), Value: []byte(strconv.FormatUint(peer, 10))}
			epochArg, rangesArg = args[5], args[6]
			if len(args) == 8 {
				e, err1 := strconv.ParseUint(string(epochArg), 10, 64)
				beat, err2 := strconv.ParseUint(string(args[7]), 10, 64)
				if err1 != nil || err2 != nil {
					return c, slotsErrf("ERR KEFIR.SLOTS SET: epoch %q and beat %q are integers", epochArg, args[7])
				}
				op.Expected = kv.AppendDriverFence(nil, e, beat)
			}
		}
		epoch, err := strconv.ParseInt(string(epochArg), 10, 64)
		if err != nil || epoch <= 0 {
			return c, slotsErrf("ERR KEFIR.SLOTS: epoch %q is not a positive integer", epochArg)
		}
		rs, err := ParseSlotRanges(string(rangesArg))
		if err != nil && len(rangesArg) > 0 {
			return c, slotsErrf("ERR KEFIR.SLOTS: %v", err)
		}
		if len(rangesArg) == 0 {
			rs = nil // a group that owns no slot
		}
		op.Delta, op.Key = epoch, kv.EncodeSlotRanges(rs)
		c.Write, c.Op = true, op
		return c, nil
	case "DUMP":
		rs, err := ParseSlotRanges(string(args[3]))
		if err != nil {
			return c, slotsErrf("ERR KEFIR.SLOTS: %v", err)
		}
		limit, err1 := strconv.Atoi(string(args[5]))
		since, err2 := strconv.ParseUint(string(args[6]), 10, 64)
		if err1 != nil || err2 != nil || limit <= 0 {
			return c, slotsErrf("ERR KEFIR.SLOTS DUMP: limit and since are integers")
		}
		limit = min(limit, maxSlotsPage)
		if string(args[7]) == "1" {
			if err := SlotsHandedOver(a, id, rs); err != nil {
				return c, err
			}
		}
		d, err := a.SlotDump(id, InRanges(rs), args[4], limit, since)
		if err != nil {
			return c, err
		}
		entries := make([]resp.Value, 0, 4*len(d.Versions))
		for i, v := range d.Versions {
			entries = append(entries, respBulk(d.Entries[3*i]), respBulk(d.Entries[3*i+1]), respBulk(d.Entries[3*i+2]), respInt(int64(v)))
		}
		keys := make([]resp.Value, 0, len(d.Keys))
		for _, k := range d.Keys {
			keys = append(keys, respBulk(k))
		}
		c.Reply = respArray([]resp.Value{respBulk(d.Next), respArray(entries), respArray(keys), respInt(int64(d.At))})
		return c, nil
	case "CLIENTS":
		at, err := strconv.ParseUint(string(args[3]), 10, 64)
		if err != nil {
			return c, slotsErrf("ERR KEFIR.SLOTS CLIENTS: version %q is not an integer", args[3])
		}
		ids, rows, err := a.SlotClients(id, at)
		if err != nil {
			return c, err
		}
		es := make([]resp.Value, 0, 2*len(ids))
		for i, cl := range ids {
			es = append(es, respBulk(binary.BigEndian.AppendUint64(nil, cl)), respBulk(rows[i]))
		}
		c.Reply = respArray(es)
		return c, nil
	case "VIEWS":
		at, err := strconv.ParseUint(string(args[3]), 10, 64)
		if err != nil {
			return c, slotsErrf("ERR KEFIR.SLOTS VIEWS: version %q is not an integer", args[3])
		}
		vs, err := a.SlotViews(id, at)
		if err != nil {
			return c, err
		}
		es := make([]resp.Value, 0, 3*len(vs))
		for _, v := range vs {
			es = append(es, respInt(int64(v.Group)), respInt(int64(v.Top)), respBulk(kv.AppendViewCopy(nil, v.ViewCopy)))
		}
		c.Reply = respArray(es)
		return c, nil
	case "STATS":
		limit, err1 := strconv.Atoi(string(args[4]))
		since, err2 := strconv.ParseUint(string(args[5]), 10, 64)
		var until uint64
		var err3 error
		if len(args) == 7 {
			until, err3 = strconv.ParseUint(string(args[6]), 10, 64)
		}
		if err1 != nil || err2 != nil || err3 != nil || limit <= 0 {
			return c, slotsErrf("ERR KEFIR.SLOTS STATS: limit, since and until are integers")
		}
		limit = min(limit, maxSlotsPage)
		st, err := a.SlotStats(id, args[3], limit, since, until)
		if err != nil {
			return c, err
		}
		slots := make([]int, 0, len(st.Slots))
		for s := range st.Slots {
			slots = append(slots, int(s))
		}
		sort.Ints(slots)
		es := make([]resp.Value, 0, 4*len(slots))
		for _, s := range slots {
			e := st.Slots[uint16(s)]
			es = append(es, respInt(int64(s)), respInt(e.Keys), respInt(e.Bytes), respInt(e.Written))
		}
		c.Reply = respArray([]resp.Value{respBulk(st.Next), respInt(int64(st.At)), respArray(es)})
		return c, nil
	case "LOAD", "LOADF":
		op := kv.Op{Kind: kv.KindSlotImport, Keys: args[3:]}
		if sub == "LOADF" {
			if len(args) < 5 {
				return c, slotsErrf("ERR wrong number of arguments for 'kefir.slots|loadf' command")
			}
			e, err1 := strconv.ParseUint(string(args[3]), 10, 64)
			beat, err2 := strconv.ParseUint(string(args[4]), 10, 64)
			if err1 != nil || err2 != nil {
				return c, slotsErrf("ERR KEFIR.SLOTS LOADF: epoch %q and beat %q are integers", args[3], args[4])
			}
			op.Expected, op.Keys = kv.AppendDriverFence(nil, e, beat), args[5:]
		}
		// LOADF without entries only raises the group's driver fence: a
		// driver that took a move over fences a group whatever state its
		// table is in (Mover.fence), where a no-op SET would carry the
		// entry's own epoch, below the move's while the move has not
		// reached the group.
		if len(op.Keys)%3 != 0 || (len(op.Keys) == 0 && sub != "LOADF") {
			return c, slotsErrf("ERR wrong number of arguments for 'kefir.slots|%s' command", strings.ToLower(sub))
		}
		c.Write, c.Op = true, op
		return c, nil
	}
	return c, slotsErrf("ERR unknown subcommand '%s' of KEFIR.SLOTS (TABLE, INIT, SET, DUMP, LOAD, CLIENTS, VIEWS, STATS)", strings.ToLower(sub))
}
