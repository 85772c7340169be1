package chain

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// The test harness shared by the interaction scripts and the simulator: a
// master, members each with a tiny key-value state machine, and the network
// between them modelled as TCP: one FIFO queue per directed link, links to
// and from a failed member broken (their queues dropped). Which link delivers
// next is the caller's choice (a script's order or the simulator's seeded
// random one), so messages on different links overtake each other freely.

const masterID NodeID = 100

// kvSM is the state machine the tests replicate: "k=v" sets k; a read of "k"
// answers "1:v" or "0:" when k is absent.
type kvSM struct{ m map[string]string }

func newKV() *kvSM { return &kvSM{m: map[string]string{}} }

func (s *kvSM) Apply(_ uint64, op []byte) []byte {
	k, v, _ := strings.Cut(string(op), "=")
	s.m[k] = v
	return []byte("OK")
}

func (s *kvSM) Read(q []byte) []byte {
	v, ok := s.m[string(q)]
	if !ok {
		return []byte("0:")
	}
	return []byte("1:" + v)
}

func (s *kvSM) Keys(op []byte) []string {
	k, _, _ := strings.Cut(string(op), "=")
	return []string{k}
}

func (s *kvSM) QueryKey(q []byte) string { return string(q) }

// Snapshot and Restore let a compacted tail hand a joiner its state
// (Snapshotter): "k=v" lines in key order.
func (s *kvSM) Snapshot() []byte {
	ks := make([]string, 0, len(s.m))
	for k := range s.m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	var b []byte
	for _, k := range ks {
		b = append(b, k+"="+s.m[k]+"\n"...)
	}
	return b
}

func (s *kvSM) Restore(data []byte) {
	s.m = map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			s.m[k] = v
		}
	}
}

// hostSM is kvSM without its Snapshotter: a member asks its "host" (the
// harness) for snapshots, as on the replica host (snapshot-needed,
// SendSnapshot, TakeSnapshot).
type hostSM struct{ kv *kvSM }

func (s hostSM) Apply(seq uint64, op []byte) []byte { return s.kv.Apply(seq, op) }
func (s hostSM) Read(q []byte) []byte               { return s.kv.Read(q) }
func (s hostSM) Keys(op []byte) []string            { return s.kv.Keys(op) }
func (s hostSM) QueryKey(q []byte) string           { return s.kv.QueryKey(q) }

type link struct{ from, to NodeID }

type harness struct {
	master  *Master
	members map[NodeID]*Member // up
	all     map[NodeID]*Member // every member ever created (for status)
	queues  map[link][]Msg
	replies []Reply
	chunk   int
	rate    int64 // joiners' PrecopyRate
	seqBits uint  // members' SeqBits
	now     int64 // the members' clock (Tick)
	snaps   int   // messages that carried a snapshot (pre-copy chunks, log flushes)
	// hostSnaps: members' state machines are hostSM (newSM).
	hostSnaps bool
	// pinTimeout: members' Config.PinTimeout.
	pinTimeout int64
	// pageLines: with hostSnaps, the "host" sends a snapshot in pages of
	// this many "k=v" lines (0: whole), as the replica host does: read at
	// one position per capture (pageSrc), pulled page by page, applied by
	// the joiner's host (staged) and restored with the last page.
	pageLines int
	pageSrc   map[[2]*Member]*pageCapture
	staged    map[*Member][]byte
	pages     int // pages sent
	// hurried, outrun: pre-copies that ended (precopy-done) after their
	// joiner dropped its pace, and that ended before the tail's end,
	// outrun unpaced (Member.outrun).
	hurried, outrun int
	// mut is applied to every member created.
	mut mutations
	// log receives one line per event when set.
	log func(string)
	// err is the first invariant violation.
	err error
	// offTail counts reads answered by a member other than the tail (CRAQ).
	offTail int
	// exhausted counts updates a head refused for want of numbers.
	exhausted int
	// writes counts the writes resend_test.go made during a
	// reconfiguration (ids 1001 on).
	writes uint64
	// restarted: the incarnations sim_test.go restarted (opts.restart).
	restarted map[NodeID]*Member
	// noCheck turns the invariant check off, to show what the clients'
	// history alone reveals.
	noCheck bool
	// mode is the chain's update mode; store gives each member's datastore
	// kind (nil: memory for all).
	mode  Mode
	store func(NodeID) Store
	// hadLog: some member of the initial chain is a log (setup), which
	// every member's configuration says (Config.HadLog), as a host's
	// deployment does.
	hadLog bool
	// syncPersist: a member's persistence requests are done at once, in
	// the step that made them, before anything it sent is delivered. The
	// whole-chain restarts need it: the core's tail answers a read from
	// what it applied, before its disk has it, so a value read there could
	// be taken back by a crash of every member; the replica host serves
	// only what is committed, which at the tail is what it persisted.
	syncPersist bool
	// disks, if set, is what each member's host holds on disk — the
	// entries it persisted, and the point up to which it saved them as
	// committed (its LA; at the tail, everything) — kept past a member's
	// removal, which frees only its memory.
	disks map[NodeID]*disk
}

type disk struct {
	log    []Entry
	commit uint64 // the last committed entry's seq
	tail   bool   // it was the tail when last saved
}

// recordDisks brings every running member's disk up to date.
func (h *harness) recordDisks() {
	for _, id := range h.ids() {
		m := h.members[id]
		st := m.Status()
		if st.State == Removed {
			continue
		}
		d := h.disks[id]
		if d == nil {
			d = &disk{}
			h.disks[id] = d
		}
		hist := m.History()
		for len(d.log) < len(hist) && hist[len(d.log)].Seq <= st.Persisted {
			e := hist[len(d.log)]
			d.log = append(d.log, Entry{Seq: e.Seq, ID: e.ID, Op: e.Op, Result: e.Result})
		}
		d.tail = st.State == Active && st.Succ == 0
		d.commit = max(d.commit, st.LA)
		if d.tail {
			d.commit = max(d.commit, st.Persisted)
		}
	}
}

// config is the configuration every member of the harness gets.
func (h *harness) config(id NodeID) Config {
	c := Config{ID: id, Master: masterID, PrecopyChunk: h.chunk, SeqBits: h.seqBits, Mode: h.mode, PersistBatch: 4,
		PinTimeout: h.pinTimeout, HadLog: h.hadLog}
	if h.store != nil {
		c.Store = h.store(id)
	}
	return c
}

// setup sets the update mode and the datastores and recreates the initial
// members with them (before anything happened).
func (h *harness) setup(mode Mode, store func(NodeID) Store) {
	h.mode, h.store = mode, store
	h.master.SetMode(mode)
	ids := h.master.Members()
	h.hadLog = false
	for _, id := range ids {
		h.hadLog = h.hadLog || store != nil && store(id) == Log
	}
	for _, id := range ids {
		c := h.config(id)
		c.Members = ids
		m := NewMember(c, h.newSM())
		h.members[id], h.all[id] = m, m
	}
}

// newSM is a new member's state machine.
func (h *harness) newSM() StateMachine {
	if h.hostSnaps {
		return hostSM{newKV()}
	}
	return newKV()
}

func newHarness(ids []NodeID, r, chunk int, seqBits uint) *harness {
	h := &harness{members: map[NodeID]*Member{}, all: map[NodeID]*Member{}, queues: map[link][]Msg{}, chunk: chunk, seqBits: seqBits}
	h.master = NewMaster(masterID, ids, r)
	for _, id := range ids {
		m := NewMember(Config{ID: id, Master: masterID, Members: ids, PrecopyChunk: chunk, SeqBits: seqBits}, newKV())
		h.members[id], h.all[id] = m, m
	}
	return h
}

// addJoiner creates an inactive member id and asks the master to join it.
func (h *harness) addJoiner(id NodeID, pos int) error {
	if err := h.master.Join(id, pos); err != nil {
		return err
	}
	c := h.config(id)
	c.PrecopyRate = h.rate
	m := NewMember(c, h.newSM())
	m.Tick(h.now)
	m.mut = h.mut
	h.members[id], h.all[id] = m, m
	h.collect()
	return nil
}

func (h *harness) logf(format string, args ...any) {
	if h.log != nil {
		h.log(fmt.Sprintf(format, args...))
	}
}

// collect moves every node's output onto the links and checks the invariants.
func (h *harness) collect() {
	for {
		moved := false
		out := h.master.Ready()
		for _, msg := range out.Msgs {
			h.enqueue(msg)
			moved = true
		}
		for _, r := range out.Replies {
			if r.Lost {
				h.logf("reply id=%d lost", r.ID)
			} else {
				h.logf("reply id=%d %q", r.ID, r.Result)
			}
			h.replies = append(h.replies, r)
		}
		for _, id := range out.Fenced {
			h.logf("fence %d", id)
			h.crash(id, false)
			moved = true
		}
		for _, id := range h.ids() {
			m := h.members[id]
			if s := m.TakeSnapshot(); s != nil {
				if hs, ok := m.sm.(hostSM); ok {
					h.restore(m, hs, s)
				}
			}
			for _, msg := range m.Ready() {
				moved = true
				if h.syncPersist && msg.Type == MsgPersist {
					m.Step(Msg{Type: MsgPersisted, From: id, To: id, Seq: msg.Seq})
					continue
				}
				h.enqueue(msg)
			}
		}
		if !moved {
			break
		}
	}
	if h.disks != nil {
		h.recordDisks()
	}
	if h.noCheck {
		return
	}
	all, up := h.all, func(id NodeID) bool { return h.members[id] != nil }
	if len(h.restarted) > 0 {
		// A restarted incarnation still inactive is, to the chain, its old
		// incarnation failed: that one's frozen state is what is checked.
		all = maps.Clone(h.all)
		for id, m := range h.restarted {
			if h.members[id] == m && m.state != Inactive {
				all[id] = m
			}
		}
		up = func(id NodeID) bool {
			m := h.members[id]
			return m != nil && (h.restarted[id] != m || m.state != Inactive)
		}
	}
	if err := Check(h.master, all, up); err != nil && h.err == nil {
		h.err = err
		h.logf("INVARIANT: %v", err)
	}
}

func (h *harness) enqueue(msg Msg) {
	if msg.To != masterID && h.members[msg.To] == nil {
		return // the link is broken
	}
	l := link{msg.From, msg.To}
	h.queues[l] = append(h.queues[l], msg)
}

// ids returns the members that are up, sorted.
func (h *harness) ids() []NodeID {
	ids := make([]NodeID, 0, len(h.members))
	for id := range h.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// links returns the links with messages queued, sorted.
func (h *harness) links() []link {
	var ls []link
	for l, q := range h.queues {
		if len(q) > 0 {
			ls = append(ls, l)
		}
	}
	slices.SortFunc(ls, func(a, b link) int {
		if a.from != b.from {
			return int(a.from) - int(b.from)
		}
		return int(a.to) - int(b.to)
	})
	return ls
}

// deliver steps the first message queued on l.
func (h *harness) deliver(l link) {
	q := h.queues[l]
	msg := q[0]
	h.queues[l] = q[1:]
	h.logf("%v", msg)
	if msg.Type == MsgQueryResp && msg.From != h.master.Tail() {
		h.offTail++
	}
	if msg.Exhausted {
		h.exhausted++
	}
	if msg.Snap != nil {
		h.snaps++
	}
	if m := h.all[msg.From]; m != nil && msg.Type == MsgPrecopyDone && !msg.Refused {
		if m.race.hurry {
			h.hurried++
		}
		if m.race.stale >= raceSlack {
			h.outrun++
		}
	}
	if msg.To == masterID {
		h.master.Step(msg)
	} else if m := h.members[msg.To]; m != nil && msg.Type == MsgSnapshotNeeded {
		// The host captures its state (at its history's end here) and
		// hands it to the member, whole or a page of it.
		h.snapshot(m, msg)
	} else if m := h.members[msg.To]; m != nil && msg.Type == MsgPersist {
		// The host's disk: the write is durable once delivered here (the
		// link models its latency); the member learns it.
		m.Step(Msg{Type: MsgPersisted, From: msg.To, To: msg.To, Seq: msg.Seq})
	} else if m := h.members[msg.To]; m != nil {
		m.Step(msg)
	}
	h.collect()
}

// drop loses the first message queued on l, as the host's transport may
// (a full queue, a re-dialled connection).
func (h *harness) drop(l link) {
	q := h.queues[l]
	h.logf("drop %v", q[0])
	h.queues[l] = q[1:]
}

// dup delivers the first message queued on l and queues a copy of it at the
// end of l: it comes again later, as a re-sent order or a repeated answer.
func (h *harness) dup(l link) {
	msg := h.queues[l][0]
	h.deliver(l)
	if msg.To == masterID || h.members[msg.To] != nil {
		h.queues[l] = append(h.queues[l], msg)
	}
}

// mtick ticks the master n times (its re-sends).
func (h *harness) mtick(n int) {
	for range n {
		h.master.Tick()
		h.collect()
	}
}

// crash stops id: its links break; report tells the master (a fenced member
// is one the master already counts as gone).
func (h *harness) crash(id NodeID, report bool) {
	if h.members[id] == nil {
		return
	}
	delete(h.members, id)
	for l := range h.queues {
		if l.from == id || l.to == id {
			delete(h.queues, l)
		}
	}
	if report {
		h.master.Fail(id)
	}
}

// tick advances the members' clock by d nanoseconds.
func (h *harness) tick(d int64) {
	h.now += d
	for _, id := range h.ids() {
		h.members[id].Tick(h.now)
	}
	h.collect()
}

// stabilize delivers messages, round-robin over the links in order, until
// none is left.
func (h *harness) stabilize() {
	for {
		ls := h.links()
		if len(ls) == 0 {
			return
		}
		for _, l := range ls {
			if len(h.queues[l]) > 0 {
				h.deliver(l)
			}
		}
	}
}

// pageCapture is a source host's snapshot being paged to one joiner: its
// state's lines at history position n.
type pageCapture struct {
	n     int
	lines []string
}

// snapshot answers a member's snapshot-needed as its host: whole, or (with
// pageLines) the page asked for, from the capture of that position; a
// request for a position the capture does not hold starts a new capture.
func (h *harness) snapshot(m *Member, msg Msg) {
	data := m.sm.(hostSM).kv.Snapshot()
	if h.pageLines == 0 || msg.Done {
		m.SendSnapshot(msg.Target, m.total(), data)
		return
	}
	key := [2]*Member{m, h.members[msg.Target]}
	c, i := h.pageSrc[key], 0
	if p := msg.Snap; p != nil && c != nil && c.n == p.N {
		i, _ = strconv.Atoi(string(p.Next))
	} else {
		lines := strings.SplitAfter(string(data), "\n")
		if lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		c = &pageCapture{n: m.total(), lines: lines}
		if h.pageSrc == nil {
			h.pageSrc = map[[2]*Member]*pageCapture{}
		}
		h.pageSrc[key] = c
	}
	j := min(i+h.pageLines, len(c.lines))
	p := Snap{N: c.n, Data: []byte(strings.Join(c.lines[i:j], "")), Next: []byte(strconv.Itoa(j)), More: j < len(c.lines)}
	if i > 0 {
		p.From = []byte(strconv.Itoa(i))
	}
	h.pages++
	if !m.SendSnapshotPage(msg.Target, p) {
		delete(h.pageSrc, key)
	}
}

// restore is a joiner's host taking what TakeSnapshot handed it: a page is
// staged, the last page (or a whole snapshot) restores the state.
func (h *harness) restore(m *Member, hs hostSM, s *Snap) {
	if h.staged == nil {
		h.staged = map[*Member][]byte{}
	}
	if s.From == nil {
		delete(h.staged, m) // a snapshot's first page, or a whole one
	}
	if s.More {
		h.staged[m] = append(h.staged[m], s.Data...)
		return
	}
	hs.kv.Restore(append(h.staged[m], s.Data...))
	delete(h.staged, m)
	// The entries that came with it, which the member applied in the same
	// step, before this host's restore (the replica host restores first).
	for _, e := range m.log {
		hs.kv.Apply(e.Seq, e.Op)
	}
}
