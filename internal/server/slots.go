package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
)

// maxSlotsPage caps DUMP's and STATS's limit: a page is held in memory
// (and STATS's hashes' rows are read after it) while the connection waits,
// so a huge limit would make one command hold the node; the caller pages on
// with the cursor either way.
const maxSlotsPage = 1 << 16

// KEFIR.SLOTS: the steps of a slot move, each at one group's leader
// (docs/design/cluster.md; the mover, cluster.Mover, drives them):
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
//	KEFIR.SLOTS LOADF g epoch beat key meta payload ...
//	                                             LOAD fenced by the driver's lease
//	KEFIR.SLOTS CLIENTS g at                     the group's client-table rows as of version at:
//	                                             [id (8 bytes) row]... (a move's request marks)
//	KEFIR.SLOTS STATS g cursor limit since [until]
//	                                             per-slot counts over up to limit keys from cursor on:
//	                                             [next-cursor, the engine's version before the page,
//	                                             [slot keys bytes written-in-(since,until]]...] (rebalance;
//	                                             until 0 or absent: no upper bound)
//
// INIT and SET answer the op's version (0: the group was already there, a
// retried step).
//
// ranges are START-END[,START-END...]. At a node whose replica of g does
// not lead it, the answer is -MOVED <leader's address> (or -UNAVAILABLE no
// leader): the mover follows it, as the steps are not forwarded.
func (c *conn) slotsCmd(args [][]byte) error {
	m := c.srv.multi
	if m == nil {
		return errf("ERR KEFIR.SLOTS needs a node of several groups (--groups)")
	}
	sub := strings.ToUpper(string(args[1]))
	if sub == "META" {
		return c.metaCmd(args) // meta.go
	}
	g, err := strconv.ParseUint(string(args[2]), 10, 64)
	if err != nil || g == 0 {
		return errf("ERR KEFIR.SLOTS: group %q is not a group id", args[2])
	}
	id := cluster.GroupID(g)
	ctx := context.Background()
	w := c.w
	// Each subcommand's argument count, least and most (an optional last
	// argument: INIT's ranges, SET's beat, STATS's until).
	nargs := map[string][2]int{"TABLE": {3, 3}, "INIT": {4, 5}, "SET": {7, 8}, "DUMP": {8, 8}, "CLIENTS": {4, 4}, "STATS": {6, 7}}
	if n, ok := nargs[sub]; ok && (len(args) < n[0] || len(args) > n[1]) {
		return errf("ERR wrong number of arguments for 'kefir.slots|%s' command", strings.ToLower(sub))
	}
	switch sub {
	case "TABLE":
		t, err := m.SlotTable(id)
		if err != nil {
			return err
		}
		if t == nil {
			return w.WriteArrayHeader(0)
		}
		runs := t.Runs()
		_ = w.WriteArrayHeader(len(runs))
		for _, r := range runs {
			_ = w.WriteArrayHeader(5)
			_ = w.WriteInt(int64(r.Start))
			_ = w.WriteInt(int64(r.End))
			_ = w.WriteBulkString(r.State.String())
			_ = w.WriteInt(int64(r.Peer))
			_ = w.WriteInt(int64(r.Epoch))
		}
		return nil
	case "INIT", "SET":
		op := kv.Op{Kind: kv.KindSlotInit}
		epochArg, rangesArg := args[3], []byte(nil)
		if len(args) == 5 {
			rangesArg = args[4]
		} else {
			spec, _ := m.Slots().Group(id)
			for _, r := range spec.Slots {
				rangesArg = fmt.Appendf(rangesArg, "%d-%d,", r.Start, r.End)
			}
			rangesArg = bytes.TrimSuffix(rangesArg, []byte(","))
		}
		if sub == "SET" {
			st, ok := kv.ParseSlotState(string(args[3]))
			if !ok {
				return errf("ERR KEFIR.SLOTS SET: unknown state %q (migrating, importing, none, owned)", args[3])
			}
			peer, err := strconv.ParseUint(string(args[4]), 10, 64)
			if err != nil {
				return errf("ERR KEFIR.SLOTS SET: peer %q is not a group id", args[4])
			}
			op = kv.Op{Kind: kv.KindSlotSet, Cond: kv.Cond(st), Value: []byte(strconv.FormatUint(peer, 10))}
			epochArg, rangesArg = args[5], args[6]
			if len(args) == 8 {
				e, err1 := strconv.ParseUint(string(epochArg), 10, 64)
				beat, err2 := strconv.ParseUint(string(args[7]), 10, 64)
				if err1 != nil || err2 != nil {
					return errf("ERR KEFIR.SLOTS SET: epoch %q and beat %q are integers", epochArg, args[7])
				}
				op.Expected = kv.AppendDriverFence(nil, e, beat)
			}
		}
		epoch, err := strconv.ParseInt(string(epochArg), 10, 64)
		if err != nil || epoch <= 0 {
			return errf("ERR KEFIR.SLOTS: epoch %q is not a positive integer", epochArg)
		}
		rs, err := cluster.ParseSlotRanges(string(rangesArg))
		if err != nil && len(rangesArg) > 0 {
			return errf("ERR KEFIR.SLOTS: %v", err)
		}
		if len(rangesArg) == 0 {
			rs = nil // a group that owns no slot
		}
		op.Delta, op.Key = epoch, kv.EncodeSlotRanges(rs)
		res, err := m.SlotWrite(ctx, id, op)
		if err != nil {
			return err
		}
		return w.WriteInt(int64(res.Version))
	case "DUMP":
		rs, err := cluster.ParseSlotRanges(string(args[3]))
		if err != nil {
			return errf("ERR KEFIR.SLOTS: %v", err)
		}
		limit, err1 := strconv.Atoi(string(args[5]))
		since, err2 := strconv.ParseUint(string(args[6]), 10, 64)
		if err1 != nil || err2 != nil || limit <= 0 {
			return errf("ERR KEFIR.SLOTS DUMP: limit and since are integers")
		}
		limit = min(limit, maxSlotsPage)
		frozen := string(args[7]) == "1"
		if frozen {
			if err := m.SlotsHandedOver(id, rs); err != nil {
				return err
			}
		}
		d, err := m.SlotDump(id, cluster.InRanges(rs), args[4], limit, since)
		if err != nil {
			return err
		}
		_ = w.WriteArrayHeader(4)
		_ = w.WriteBulk(d.Next)
		_ = w.WriteArrayHeader(len(d.Versions) * 4)
		for i, v := range d.Versions {
			_ = w.WriteBulk(d.Entries[3*i])
			_ = w.WriteBulk(d.Entries[3*i+1])
			_ = w.WriteBulk(d.Entries[3*i+2])
			_ = w.WriteInt(int64(v))
		}
		_ = w.WriteArrayHeader(len(d.Keys))
		for _, k := range d.Keys {
			_ = w.WriteBulk(k)
		}
		return w.WriteInt(int64(d.At))
	case "CLIENTS":
		at, err := strconv.ParseUint(string(args[3]), 10, 64)
		if err != nil {
			return errf("ERR KEFIR.SLOTS CLIENTS: version %q is not an integer", args[3])
		}
		ids, rows, err := m.SlotClients(id, at)
		if err != nil {
			return err
		}
		_ = w.WriteArrayHeader(2 * len(ids))
		for i, c := range ids {
			_ = w.WriteBulk(binary.BigEndian.AppendUint64(nil, c))
			_ = w.WriteBulk(rows[i])
		}
		return nil
	case "STATS":
		limit, err1 := strconv.Atoi(string(args[4]))
		since, err2 := strconv.ParseUint(string(args[5]), 10, 64)
		var until uint64
		var err3 error
		if len(args) == 7 {
			until, err3 = strconv.ParseUint(string(args[6]), 10, 64)
		}
		if err1 != nil || err2 != nil || err3 != nil || limit <= 0 {
			return errf("ERR KEFIR.SLOTS STATS: limit, since and until are integers")
		}
		limit = min(limit, maxSlotsPage)
		st, err := m.SlotStats(id, args[3], limit, since, until)
		if err != nil {
			return err
		}
		slots := make([]int, 0, len(st.Slots))
		for s := range st.Slots {
			slots = append(slots, int(s))
		}
		sort.Ints(slots)
		_ = w.WriteArrayHeader(3)
		_ = w.WriteBulk(st.Next)
		_ = w.WriteInt(int64(st.At))
		_ = w.WriteArrayHeader(4 * len(slots))
		for _, s := range slots {
			e := st.Slots[uint16(s)]
			_ = w.WriteInt(int64(s))
			_ = w.WriteInt(e.Keys)
			_ = w.WriteInt(e.Bytes)
			_ = w.WriteInt(e.Written)
		}
		return nil
	case "LOAD", "LOADF":
		op := kv.Op{Kind: kv.KindSlotImport, Keys: args[3:]}
		if sub == "LOADF" {
			if len(args) < 5 {
				return errf("ERR wrong number of arguments for 'kefir.slots|loadf' command")
			}
			e, err1 := strconv.ParseUint(string(args[3]), 10, 64)
			beat, err2 := strconv.ParseUint(string(args[4]), 10, 64)
			if err1 != nil || err2 != nil {
				return errf("ERR KEFIR.SLOTS LOADF: epoch %q and beat %q are integers", args[3], args[4])
			}
			op.Expected, op.Keys = kv.AppendDriverFence(nil, e, beat), args[5:]
		}
		if len(op.Keys)%3 != 0 || len(op.Keys) == 0 {
			return errf("ERR wrong number of arguments for 'kefir.slots|%s' command", strings.ToLower(sub))
		}
		res, err := m.SlotWrite(ctx, id, op)
		if err != nil {
			return err
		}
		return w.WriteInt(res.Int)
	}
	return errf("ERR unknown subcommand '%s' of KEFIR.SLOTS (TABLE, INIT, SET, DUMP, LOAD, CLIENTS, STATS)", strings.ToLower(sub))
}
