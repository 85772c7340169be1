// Package simtoy holds toy replicated registers that exercise the simulator
// and prove the checkers can catch real bugs: a correct one (fixed primary,
// writes acknowledged after a majority persisted them, reads at the primary)
// and a deliberately unsafe one (acknowledges writes before replicating or
// persisting them, serves reads from any replica).
//
// They are test fixtures, not a protocol: the primary never changes, so a
// crashed primary means unavailability, not failover. They follow the
// sim.Node contract exactly as a real core must (no clocks, no randomness, no
// I/O), which also makes them the reference example of that contract.
// Imports: internal/sim and internal/check only.
package simtoy

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/sim"
)

// Mode selects the toy's bugs (a bit set; Safe has none).
type Mode uint8

const (
	// Safe: writes are acknowledged once a majority (the primary included)
	// has persisted them; reads are served by the primary.
	Safe Mode = 0
	// StaleReads: clients send reads to any replica, round-robin; followers
	// answer from whatever they have applied.
	StaleReads Mode = 1 << 0
	// EarlyAck: the primary acknowledges a write on arrival, before any
	// replication or fsync.
	EarlyAck Mode = 1 << 1
	// Unsafe has both bugs.
	Unsafe = StaleReads | EarlyAck
)

const primary sim.Addr = 0

// Messages. They are plain values; the simulator never encodes them.
type (
	// Request is a client operation sent to a replica.
	Request struct {
		Seq uint64
		Op  check.Op
	}
	// Reply answers a Request.
	Reply struct {
		Seq    uint64
		Result check.Result
	}
	// Prepare replicates an entry of the primary's epoch. PrevEpoch is the
	// epoch of the entry before it (Raft's log-matching check), so a follower
	// never acks a prefix that differs from the primary's.
	Prepare struct {
		Epoch     uint64
		PrevEpoch uint64
		Entry     Entry
		Commit    uint64
	}
	// PrepareOK: the follower has persisted everything up to Index.
	PrepareOK struct {
		Epoch, Index uint64
	}
	// Commit tells followers how far they may apply.
	Commit struct {
		Epoch, Index uint64
	}
)

func (m Request) String() string {
	return fmt.Sprintf("Request(seq=%d %v %s)", m.Seq, m.Op.Kind, m.Op.Key)
}
func (m Reply) String() string { return fmt.Sprintf("Reply(seq=%d v%d)", m.Seq, m.Result.Version) }
func (m Prepare) String() string {
	return fmt.Sprintf("Prepare(e%d i%d c%d)", m.Epoch, m.Entry.Index, m.Commit)
}
func (m PrepareOK) String() string { return fmt.Sprintf("PrepareOK(e%d i%d)", m.Epoch, m.Index) }
func (m Commit) String() string    { return fmt.Sprintf("Commit(e%d i%d)", m.Epoch, m.Index) }

// Entry is one log entry: a client write at a log index.
type Entry struct {
	Index  uint64
	Epoch  uint64 // the primary's epoch when it created the entry
	Client int
	Seq    uint64
	Kind   check.Kind
	Key    string
	Value  string
	Expect string
	Delta  int64
}

// Log records: an epoch marker (the primary's restarts) or an entry.
const (
	recEpoch byte = 1
	recEntry byte = 2
)

func encodeEntry(e *Entry) []byte {
	b := []byte{recEntry, byte(e.Kind)}
	b = binary.AppendUvarint(b, e.Index)
	b = binary.AppendUvarint(b, e.Epoch)
	b = binary.AppendUvarint(b, uint64(e.Client))
	b = binary.AppendUvarint(b, e.Seq)
	b = binary.AppendVarint(b, e.Delta)
	for _, s := range []string{e.Key, e.Value, e.Expect} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

func decodeEntry(b []byte) (Entry, error) {
	if len(b) < 2 || b[0] != recEntry {
		return Entry{}, fmt.Errorf("simtoy: not an entry record")
	}
	e := Entry{Kind: check.Kind(b[1])}
	b = b[2:]
	uv := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			panic("simtoy: corrupt entry")
		}
		b = b[n:]
		return v
	}
	e.Index = uv()
	e.Epoch = uv()
	e.Client = int(uv())
	e.Seq = uv()
	d, n := binary.Varint(b)
	if n <= 0 {
		return Entry{}, fmt.Errorf("simtoy: corrupt entry delta")
	}
	b = b[n:]
	e.Delta = d
	var ss [3]string
	for i := range ss {
		l := uv()
		if uint64(len(b)) < l {
			return Entry{}, fmt.Errorf("simtoy: corrupt entry string")
		}
		ss[i] = string(b[:l])
		b = b[l:]
	}
	e.Key, e.Value, e.Expect = ss[0], ss[1], ss[2]
	return e, nil
}

type value struct {
	exists  bool
	val     string
	version uint64
}

type waiter struct {
	client sim.Addr
	seq    uint64
}

// Replica is a toy register replica.
type Replica struct {
	id    sim.Addr
	cfg   sim.Config
	mode  Mode
	epoch uint64
	log   []Entry // log[i] has Index i+1
	// durable: entries up to this index are fsynced here.
	durable uint64
	// logLen: records in the on-disk log (epoch markers included); the
	// Persisted event counts records, the core counts entries.
	logLen   int
	recIndex []uint64 // record number -> entry index it ends (0 for markers)
	// matched (followers): log[:matched] is known to equal the primary's
	// log of the current epoch; only that prefix is acked or applied.
	matched   uint64
	commit    uint64
	applied   uint64
	acks      map[uint64]uint64 // follower -> highest index it persisted (this epoch)
	state     map[string]value
	lastSeq   map[int]uint64 // client table: highest seq accepted per client
	waiting   map[uint64]waiter
	out       sim.Ready
	tickCount int
}

// NewReplica returns a sim.ReplicaFactory for the toy in the given mode.
func NewReplica(mode Mode) sim.ReplicaFactory {
	return func(id sim.Addr, cfg sim.Config, recovered [][]byte) sim.Node {
		r := &Replica{id: id, cfg: cfg, mode: mode, acks: map[uint64]uint64{},
			state: map[string]value{}, lastSeq: map[int]uint64{}, waiting: map[uint64]waiter{}}
		for _, rec := range recovered {
			r.recIndex = append(r.recIndex, 0)
			switch rec[0] {
			case recEpoch:
				r.epoch++
			case recEntry:
				e, err := decodeEntry(rec)
				if err != nil {
					panic(err)
				}
				r.store(e)
				r.recIndex[len(r.recIndex)-1] = e.Index
			}
		}
		r.logLen = len(recovered)
		r.durable = uint64(len(r.log))
		if id == primary {
			// Everything the primary recovered counts as committed: it may
			// include writes nobody acknowledged, which is allowed (their
			// clients saw an unknown outcome).
			r.epoch++
			r.appendRecord([]byte{recEpoch}, 0)
			r.out.Sync = true
			r.commit = uint64(len(r.log))
			r.apply()
		}
		return r
	}
}

// store puts e at its index, cutting any conflicting suffix (a follower can
// hold entries a crashed primary lost).
func (r *Replica) store(e Entry) {
	if e.Index == 0 || e.Index > uint64(len(r.log))+1 {
		panic(fmt.Sprintf("simtoy: replica %d: entry %d leaves a gap after %d", r.id, e.Index, len(r.log)))
	}
	if e.Index <= uint64(len(r.log)) && r.log[e.Index-1] == e {
		return
	}
	r.log = append(r.log[:e.Index-1], e)
	if r.durable >= e.Index {
		r.durable = e.Index - 1
	}
	if e.Client >= 0 && e.Seq > r.lastSeq[e.Client] {
		r.lastSeq[e.Client] = e.Seq
	}
}

func (r *Replica) appendRecord(rec []byte, index uint64) {
	r.out.Persist = append(r.out.Persist, rec)
	r.recIndex = append(r.recIndex, index)
	r.logLen++
}

// Ready implements sim.Node.
func (r *Replica) Ready() sim.Ready {
	rd := r.out
	r.out = sim.Ready{}
	return rd
}

// Step implements sim.Node.
func (r *Replica) Step(ev sim.Event) {
	switch ev.Kind {
	case sim.Message:
		switch m := ev.Msg.(type) {
		case Request:
			r.onRequest(ev.From, m)
		case Prepare:
			r.onPrepare(m)
		case PrepareOK:
			r.onPrepareOK(ev.From, m)
		case Commit:
			r.onCommit(m)
		default:
			panic(fmt.Sprintf("simtoy: unexpected message %T", ev.Msg))
		}
	case sim.Persisted:
		r.onPersisted(ev.Persisted)
	case sim.Tick:
		r.tickCount++
		if r.id == primary && r.tickCount%5 == 0 {
			r.broadcast(Commit{Epoch: r.epoch, Index: r.commit})
			r.retransmit()
		}
	}
}

func (r *Replica) broadcast(m any) {
	for i := 0; i < r.cfg.Replicas; i++ {
		if sim.Addr(i) != r.id {
			r.out.Messages = append(r.out.Messages, sim.Envelope{To: sim.Addr(i), Msg: m})
		}
	}
}

func (r *Replica) reply(to sim.Addr, seq uint64, res check.Result) {
	res.Node = int(r.id)
	r.out.Messages = append(r.out.Messages, sim.Envelope{To: to, Msg: Reply{Seq: seq, Result: res}})
}

func (r *Replica) onRequest(from sim.Addr, m Request) {
	if m.Op.Kind == check.Get {
		v := r.state[m.Op.Key]
		r.reply(from, m.Seq, check.Result{Found: v.exists, Value: v.val, Version: v.version})
		return
	}
	if r.id != primary {
		return // writes go to the primary; the client will time out
	}
	if m.Seq <= r.lastSeq[m.Op.Client] {
		return // duplicate delivery
	}
	e := Entry{Index: uint64(len(r.log)) + 1, Epoch: r.epoch, Client: m.Op.Client, Seq: m.Seq, Kind: m.Op.Kind,
		Key: m.Op.Key, Value: m.Op.Value, Expect: m.Op.Expect, Delta: m.Op.Delta}
	r.store(e)
	r.appendRecord(encodeEntry(&e), e.Index)
	r.out.Sync = true
	r.waiting[e.Index] = waiter{client: from, seq: m.Seq}
	r.broadcast(r.prepare(e.Index))
	if r.mode&EarlyAck != 0 {
		// The bug under test: acknowledge before anyone has the write.
		r.commit = max(r.commit, e.Index)
		r.apply()
	}
}

// prepare builds the Prepare for the primary's entry i.
func (r *Replica) prepare(i uint64) Prepare {
	p := Prepare{Epoch: r.epoch, Entry: r.log[i-1], Commit: r.commit}
	if i > 1 {
		p.PrevEpoch = r.log[i-2].Epoch
	}
	return p
}

func (r *Replica) onPrepare(m Prepare) {
	if r.id == primary || m.Epoch < r.epoch {
		return
	}
	if m.Epoch > r.epoch {
		r.epoch, r.matched = m.Epoch, 0
	}
	i := m.Entry.Index
	if i > uint64(len(r.log))+1 || i > 1 && r.log[i-2].Epoch != m.PrevEpoch {
		return // gap or divergent prefix: the primary retransmits from our last ack
	}
	if i <= uint64(len(r.log)) && r.log[i-1] == m.Entry {
		r.matched = max(r.matched, i)
		r.ack()
	} else {
		r.store(m.Entry)
		r.matched = i
		r.appendRecord(encodeEntry(&m.Entry), i)
		r.out.Sync = true
	}
	r.onCommit(Commit{Epoch: m.Epoch, Index: m.Commit})
}

func (r *Replica) ack() {
	if idx := min(r.durable, r.matched); idx > 0 {
		r.out.Messages = append(r.out.Messages, sim.Envelope{To: primary, Msg: PrepareOK{Epoch: r.epoch, Index: idx}})
	}
}

func (r *Replica) onPersisted(records int) {
	if records > len(r.recIndex) {
		panic(fmt.Sprintf("simtoy: replica %d: persisted %d of %d records", r.id, records, len(r.recIndex)))
	}
	// The durable prefix is the longest run of entries whose records are all
	// synced; a later record can have rewritten an index, so take the max index
	// ended by a synced record but never beyond the in-memory log.
	var hi uint64
	for _, idx := range r.recIndex[:records] {
		hi = max(hi, idx)
	}
	r.durable = min(max(r.durable, hi), uint64(len(r.log)))
	if r.id == primary {
		r.advance()
		return
	}
	r.ack()
}

func (r *Replica) onPrepareOK(from sim.Addr, m PrepareOK) {
	if r.id != primary || m.Epoch != r.epoch {
		return
	}
	if m.Index > r.acks[uint64(from)] {
		r.acks[uint64(from)] = m.Index
	}
	r.advance()
}

// retransmit resends, to each follower, a window of the entries beyond its
// last ack: Prepares and acks get lost, and followers drop what does not fit.
func (r *Replica) retransmit() {
	for f := 1; f < r.cfg.Replicas; f++ {
		from := r.acks[uint64(f)] + 1
		for i := from; i <= uint64(len(r.log)) && i < from+32; i++ {
			r.out.Messages = append(r.out.Messages, sim.Envelope{To: sim.Addr(f), Msg: r.prepare(i)})
		}
	}
}

// advance commits every entry a majority (the primary included) has persisted.
func (r *Replica) advance() {
	for r.commit < uint64(len(r.log)) {
		next := r.commit + 1
		votes := 0
		if r.durable >= next {
			votes++
		}
		for _, idx := range r.acks {
			if idx >= next {
				votes++
			}
		}
		if votes <= r.cfg.Replicas/2 || r.durable < next {
			break
		}
		r.commit = next
	}
	r.apply()
}

func (r *Replica) onCommit(m Commit) {
	if r.id == primary || m.Epoch < r.epoch {
		return
	}
	r.commit = max(r.commit, min(m.Index, r.matched))
	r.apply()
}

func (r *Replica) apply() {
	for r.applied < r.commit {
		r.applied++
		e := &r.log[r.applied-1]
		cur := r.state[e.Key]
		res := check.Result{Found: true, Version: e.Index}
		switch e.Kind {
		case check.Put:
			r.state[e.Key] = value{true, e.Value, e.Index}
		case check.Delete:
			r.state[e.Key] = value{false, "", e.Index}
		case check.CAS:
			res.Found = cur.exists && cur.val == e.Expect
			if res.Found {
				r.state[e.Key] = value{true, e.Value, e.Index}
			} else {
				res.Version = cur.version
			}
		case check.Incr:
			var n int64
			if cur.exists {
				n, _ = strconv.ParseInt(cur.val, 10, 64)
			}
			res.Value = strconv.FormatInt(n+e.Delta, 10)
			r.state[e.Key] = value{true, res.Value, e.Index}
		}
		if w, ok := r.waiting[e.Index]; ok && r.id == primary {
			delete(r.waiting, e.Index)
			r.reply(w.client, w.seq, res)
		}
	}
}

// Client is the toy client library: writes to the primary, reads to the
// primary, or with StaleReads round-robin over all replicas (honouring
// Event.Route), and an unknown outcome after Timeout ticks without a reply.
type Client struct {
	id       sim.Addr
	cfg      sim.Config
	mode     Mode
	timeout  int
	seq      uint64
	inflight bool
	ticks    int
	next     int
	out      sim.Ready
}

// NewClient returns a sim.ClientFactory for the toy's clients.
func NewClient(mode Mode, timeoutTicks int) sim.ClientFactory {
	return func(id sim.Addr, cfg sim.Config) sim.Node {
		return &Client{id: id, cfg: cfg, mode: mode, timeout: timeoutTicks}
	}
}

// Ready implements sim.Node.
func (c *Client) Ready() sim.Ready {
	rd := c.out
	c.out = sim.Ready{}
	return rd
}

// Step implements sim.Node.
func (c *Client) Step(ev sim.Event) {
	switch ev.Kind {
	case sim.Invoke:
		c.seq, c.inflight, c.ticks = ev.Seq, true, 0
		to := primary
		if ev.Op.Kind == check.Get && c.mode&StaleReads != 0 {
			to = sim.Addr(c.next % c.cfg.Replicas)
			c.next++
			if ev.Routed {
				to = ev.Route
			}
		}
		c.out.Messages = append(c.out.Messages, sim.Envelope{To: to, Msg: Request{Seq: ev.Seq, Op: ev.Op}})
	case sim.Message:
		m, ok := ev.Msg.(Reply)
		if !ok || !c.inflight || m.Seq != c.seq {
			return // late or duplicated reply
		}
		c.inflight = false
		c.out.Done = append(c.out.Done, sim.Completion{Seq: m.Seq, Outcome: check.OK, Result: m.Result})
	case sim.Tick:
		if !c.inflight {
			return
		}
		c.ticks++
		if c.ticks > c.timeout {
			c.inflight = false
			c.out.Done = append(c.out.Done, sim.Completion{Seq: c.seq, Outcome: check.Unknown})
		}
	}
}
