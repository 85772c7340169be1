package chain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// Interaction tests: protocol scenarios written as datadriven scripts
// (testdata/*.txt), in the style of internal/vr's (after etcd raft's). A
// script drives a master and its members by hand through harness_test.go
// and prints every delivered message, every reply to a client and every
// fencing, so the expected output reads as a trace of the protocol. The
// invariants (Check) run after every event; a violation fails the script.
// Regenerate after a deliberate change with
//
//	go test ./internal/chain/ -run TestInteraction -rewrite
//
// and read the diff: it is the protocol's behaviour that changed.
//
// Commands:
//
//	chain ids=1,2,3 [r=3] [chunk=64] [rate=0] [seqbits=40] [mode=su|ausi|au] [stores=m,d,mb]
//	                                  the initial chain, head first; rate:
//	                                  joiners' pre-copy bytes a second;
//	                                  seqbits: a head's numbering range;
//	                                  mode: the update mode; stores: each
//	                                  member's datastore (memory, log,
//	                                  buffered log, batches of 4)
//	tick ms=                          advance the members' clock
//	put id= k= v= [token=]            a client update (id unique), of a
//	                                  session with that token
//	get id= k= [at=] [weak] [token=]  a strong read at the tail, a CRAQ
//	                                  read at member at, or a weak read at
//	                                  member at (0: the tail) carrying a
//	                                  session's token
//	powercut                          every member's durable updates (the
//	                                  request ids its host persisted)
//	join id= pos=                     a new member joins before position pos
//	fail id=                          the member fails; the master repairs
//	crash id=                         the member stops; the master does not
//	                                  know yet (its links break)
//	detect id=                        the master learns of a crash
//	deliver [from=] [to=] [type=a,b] [n=]
//	                                  deliver queued messages whose link and
//	                                  type match, oldest first per link
//	stabilize                         deliver everything until quiet
//	status                            the master's view and every member's state
func TestInteraction(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var h *harness
		var b strings.Builder
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			b.Reset()
			if h == nil && d.Cmd != "chain" {
				d.Fatalf(t, "chain first")
			}
			switch d.Cmd {
			case "chain":
				var ids, mode, stores string
				r, chunk, rate, seqBits := 0, 64, 0, 0
				d.MaybeScanArgs(t, "mode", &mode)
				d.MaybeScanArgs(t, "stores", &stores)
				d.ScanArgs(t, "ids", &ids)
				d.MaybeScanArgs(t, "seqbits", &seqBits)
				d.MaybeScanArgs(t, "r", &r)
				d.MaybeScanArgs(t, "chunk", &chunk)
				d.MaybeScanArgs(t, "rate", &rate)
				list := parseIDs(t, ids)
				if r == 0 {
					r = len(list)
				}
				h = newHarness(list, r, chunk, uint(seqBits))
				h.rate = int64(rate)
				if mode != "" || stores != "" {
					h.setup(parseMode(t, mode), parseStores(t, list, stores))
				}
				h.log = func(s string) { b.WriteString(s + "\n") }
				writeStatus(&b, h)
			case "put":
				var id uint64
				var k, v string
				d.ScanArgs(t, "id", &id)
				d.ScanArgs(t, "k", &k)
				d.ScanArgs(t, "v", &v)
				var token uint64
				d.MaybeScanArgs(t, "token", &token)
				h.master.PutSession(id, []byte(k+"="+v), token)
				h.collect()
			case "get":
				var id, at uint64
				var k string
				d.ScanArgs(t, "id", &id)
				d.ScanArgs(t, "k", &k)
				d.MaybeScanArgs(t, "at", &at)
				if d.HasArg("weak") {
					var token uint64
					d.MaybeScanArgs(t, "token", &token)
					h.master.GetWeak(id, []byte(k), NodeID(at), token)
				} else if at != 0 {
					h.master.GetAt(id, []byte(k), NodeID(at))
				} else {
					h.master.Get(id, []byte(k))
				}
				h.collect()
			case "join":
				var id uint64
				var pos int
				d.ScanArgs(t, "id", &id)
				d.ScanArgs(t, "pos", &pos)
				if err := h.addJoiner(NodeID(id), pos); err != nil {
					fmt.Fprintf(&b, "error: %v\n", err)
				}
			case "fail":
				var id uint64
				d.ScanArgs(t, "id", &id)
				h.logf("fail %d", id)
				h.crash(NodeID(id), true)
				h.collect()
			case "tick":
				var ms int
				d.ScanArgs(t, "ms", &ms)
				h.tick(int64(ms) * 1e6)
				fmt.Fprintf(&b, "now=%dms\n", h.now/1e6)
			case "crash":
				var id uint64
				d.ScanArgs(t, "id", &id)
				h.logf("crash %d", id)
				h.crash(NodeID(id), false)
				h.collect()
			case "detect":
				var id uint64
				d.ScanArgs(t, "id", &id)
				h.master.Fail(NodeID(id))
				h.collect()
			case "deliver":
				deliverMatching(t, d, h)
			case "stabilize":
				h.stabilize()
			case "powercut":
				for _, id := range h.ids() {
					m := h.members[id]
					fmt.Fprintf(&b, "%d (%s): durable ids %v\n", id, m.cfg.Store, m.Durable())
				}
			case "status":
				writeStatus(&b, h)
			default:
				d.Fatalf(t, "unknown command %s", d.Cmd)
			}
			if h.err != nil {
				d.Fatalf(t, "%s\ninvariant violated: %v", b.String(), h.err)
			}
			if b.Len() == 0 {
				return "ok\n"
			}
			return b.String()
		})
	})
}

func parseMode(t *testing.T, s string) Mode {
	switch s {
	case "", "su":
		return SU
	case "ausi":
		return AUSI
	case "au":
		return AU
	}
	t.Fatalf("bad mode %q", s)
	return SU
}

// parseStores maps a list of datastores (m, d, mb) onto the chain's members
// in order; joiners get memory.
func parseStores(t *testing.T, ids []NodeID, s string) func(NodeID) Store {
	kinds := map[NodeID]Store{}
	if s != "" {
		for i, f := range strings.Split(s, ",") {
			k, ok := map[string]Store{"m": Memory, "d": Log, "mb": Buffered}[f]
			if !ok || i >= len(ids) {
				t.Fatalf("bad stores %q", s)
			}
			kinds[ids[i]] = k
		}
	}
	return func(id NodeID) Store { return kinds[id] }
}

func parseIDs(t *testing.T, s string) []NodeID {
	var ids []NodeID
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			t.Fatalf("bad id list %q: %v", s, err)
		}
		ids = append(ids, NodeID(n))
	}
	return ids
}

func deliverMatching(t *testing.T, d *datadriven.TestData, h *harness) {
	var from, to uint64
	var types string
	n := -1
	d.MaybeScanArgs(t, "from", &from)
	d.MaybeScanArgs(t, "to", &to)
	d.MaybeScanArgs(t, "type", &types)
	d.MaybeScanArgs(t, "n", &n)
	want := map[string]bool{}
	for _, ty := range strings.Split(types, ",") {
		if ty != "" {
			want[ty] = true
		}
	}
	for n != 0 {
		delivered := false
		for _, l := range h.links() {
			if from != 0 && l.from != NodeID(from) || to != 0 && l.to != NodeID(to) {
				continue
			}
			q := h.queues[l]
			if len(q) == 0 || len(want) > 0 && !want[q[0].Type.String()] {
				continue
			}
			h.deliver(l)
			delivered = true
			n--
			if n == 0 {
				break
			}
		}
		if !delivered {
			return
		}
	}
}

func writeStatus(b *strings.Builder, h *harness) {
	ms := h.master
	fmt.Fprintf(b, "master: e%d members=%v head=%d tail=%d", ms.Epoch(), ms.Members(), ms.Head(), ms.Tail())
	if j := ms.Joiner(); j != 0 {
		fmt.Fprintf(b, " joiner=%d", j)
	}
	b.WriteString("\n")
	ids := make([]NodeID, 0, len(h.all))
	for id := range h.all {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		m := h.all[id]
		if h.members[id] == nil {
			fmt.Fprintf(b, "%d: down\n", id)
			continue
		}
		s := m.Status()
		fmt.Fprintf(b, "%d: %s e%d pred=%d succ=%d lu=%s la=%s log=%d", id, s.State, s.Epoch, s.Pred, s.Succ,
			FormatSeq(s.LU), FormatSeq(s.LA), s.Log)
		if m.cfg.Store != Memory {
			fmt.Fprintf(b, " %s persisted=%s", m.cfg.Store, FormatSeq(s.Persisted))
		}
		if s.Tmp > 0 {
			fmt.Fprintf(b, " tmp=%d", s.Tmp)
		}
		if s.Repairing {
			b.WriteString(" repairing")
		}
		if sm, ok := m.sm.(*kvSM); ok && len(sm.m) > 0 {
			// The state in key order, as its snapshot lists it.
			fmt.Fprintf(b, " {%s}", strings.ReplaceAll(strings.TrimSuffix(string(sm.Snapshot()), "\n"), "\n", " "))
		}
		b.WriteString("\n")
	}
}
