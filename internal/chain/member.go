package chain

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kefirdb/kefir/internal/mutation"
)

// State is a member's place in the join protocol (digest 002 §3.2,
// Def. 3.10), plus Removed for the tail a TRUNCATE dropped.
type State uint8

const (
	// Inactive: a joiner pre-copying the tail's log; not linked into the chain.
	Inactive State = iota
	// Joining: the joiner saw FLUSH once; it logs new updates to its
	// temporary store and relays them to its successor.
	Joining
	// Active: a replica of the chain.
	Active
	// Removed: truncated away; it answers nothing but redirects.
	Removed
)

func (s State) String() string {
	return [...]string{"inactive", "joining", "active", "removed"}[s]
}

// StateMachine is what the chain replicates. Apply runs updates in history
// order (seq increases) and returns the result the client gets; Read answers
// a strong read at the tail. Both must be deterministic: every member applies
// the same history and a new tail reports results it computed itself.
type StateMachine interface {
	Apply(seq uint64, op []byte) []byte
	Read(query []byte) []byte
}

// Keyed is implemented by a StateMachine whose operations name the keys
// they write and whose queries name the key they read. Version-checked reads
// at any member (CRAQ) need it: a member answers a read itself only when the
// latest update to the key it holds has been acknowledged (is clean).
type Keyed interface {
	Keys(op []byte) []string
	QueryKey(query []byte) string
}

// Mode is a chain's update mode (Ouroboros+, digest 002 §4.3): which
// member answers an update, and when. docs/design/chain.md states what each
// guarantees.
type Mode uint8

const (
	// SU, synchronous updates: the tail answers once the whole chain applied
	// the update (and every log-datastore member persisted it).
	SU Mode = iota
	// AUSI, asynchronous updates with synchronous invalidations: the head
	// answers once the acknowledgement comes back, i.e. every member holds
	// the update and has marked the key dirty (invalid for clean reads)
	// until the acknowledgement passes it; no member's persistence is
	// waited for.
	AUSI
	// AU, asynchronous updates: the head answers once it applied the update.
	AU
)

func (m Mode) String() string { return [...]string{"SU", "AUSI", "AU"}[m] }

// ParseMode reads a mode's name (su, ausi, au; any case), as the flags
// spell it.
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "su", "":
		return SU, nil
	case "ausi":
		return AUSI, nil
	case "au":
		return AU, nil
	}
	return SU, fmt.Errorf("chain mode %q: want su, ausi or au", s)
}

// Wire is the mode as a heartbeat and its answer carry it (Msg.Token):
// one more than the mode, so that 0 says "not said" (a sender that does not
// know modes, which ran SU only).
func (m Mode) Wire() uint64 { return uint64(m) + 1 }

// ModeFromWire reads Wire's encoding; ok is false for 0 (not said) or a
// value no mode has.
func ModeFromWire(w uint64) (m Mode, ok bool) {
	if w == 0 || w > uint64(AU)+1 {
		return SU, false
	}
	return Mode(w - 1), true
}

// Store is a member's datastore kind (Flex-KV, digest 002 §4.6). The core
// does no I/O: a member asks its host to make the log durable (MsgPersist)
// and learns that it is (MsgPersisted).
type Store uint8

const (
	// Memory: nothing is persisted; a crash loses the member's state.
	Memory Store = iota
	// Log: every update is persisted (fsync) as it is logged; under SU the
	// member passes an update on, and acknowledges it, only once it is
	// persisted.
	Log
	// Buffered: updates are persisted in batches of PersistBatch (and on
	// Tick), in the background; nothing waits for them.
	Buffered
)

func (s Store) String() string { return [...]string{"M", "D", "Mb"}[s] }

// Config is what a member is created with.
type Config struct {
	ID, Master NodeID
	// Members is the initial chain (head first) for a member of it, at
	// epoch 0; nil for a joiner, which starts Inactive.
	Members []NodeID
	// PrecopyChunk is how many entries one pre-copy or log-flush message
	// carries (0: 64). The joiner pulls one chunk at a time.
	PrecopyChunk int
	// PrecopyRate throttles pre-copy to about this many bytes a second of
	// entries (0: no limit): after a chunk of b bytes the joiner asks for
	// the next one b/PrecopyRate later, on its clock (Tick), so the tail
	// that serves it keeps most of its capacity for traffic (digest §3.6).
	PrecopyRate int64
	// SeqBits is how many low bits of a sequence number a head numbers in
	// within one epoch (0: 40, 10^12 updates); tests lower it to exercise
	// the renewal of a head's range.
	SeqBits uint
	// Mode is the chain's update mode (the master's configuration; every
	// member of a chain has the same).
	Mode Mode
	// Store is this member's datastore kind; PersistBatch is a buffered
	// log's batch (0: 8 entries).
	Store        Store
	PersistBatch int
	// PinTimeout: a joiner's pin (compact.go) stops holding compaction back
	// this long after its last pre-copy request, on the member's clock
	// (0: never). A dead joiner's pin then costs nothing; a live one's
	// log flush may need a snapshot.
	PinTimeout int64
	// Log is a restarting member's durable history, as far as its host
	// knows it committed (acknowledged by its successor, hence at the tail
	// of its chain then): a prefix of every later replica's history, since
	// a chain never drops an acknowledged update. A member given one starts
	// as a joiner (Members must be nil) holding it, applied and persisted,
	// so its pre-copy resumes after it rather than from the start. Whatever
	// its disk held beyond it may never have reached the tail (a head's
	// persisted but unforwarded updates): the host drops that.
	Log []Entry
	// BaseN, BaseSeq: a restarting member's history before Log is a
	// snapshot its host restored: BaseN entries, the last numbered BaseSeq
	// (kept with the snapshot on the host's disk; 0 if the host does not
	// know: a snapshot written before hosts kept it, with no entry after).
	BaseN   int
	BaseSeq uint64
	// Paged: a joiner's host holds state no history accounts for (after a
	// lost state: pages of a snapshot a crash cut short): as after a page
	// of its own (Member.paged), its pre-copy asks for a snapshot, which
	// replaces that state, and it takes no RESTART or FLUSH before one.
	Paged bool
	// HadLog: the chain has a log member by configuration — its host's
	// deployment names every member's store (kefir server
	// --chain-log-member, which kefir up sets from --chain-stores). The
	// member knows it from the start (knowsLog) and never takes a vacuous
	// durable point — its own knowledge: its messages say only what it
	// learnt (Member.hadLog), so a member misconfigured misleads no other
	// (TestConfiguredLogMemberDoesNotSpread). A memory or
	// buffered member that never heard from a log member (the log tail of
	// an M-D chain failed before its first acknowledgement reached the
	// head; a chain restarted from a memory or buffered member) answers no
	// `sync` write no disk holds. False: learnt from messages only (a chain
	// of memory and buffered members by configuration keeps its vacuous
	// durable point, as before).
	HadLog bool
}

// mutations are deliberate bugs the tests switch on to show that the
// invariant check and the simulator catch them (internal/mutation).
type mutations struct {
	// inactiveRepairs: an inactive member (a joiner, a restarted member)
	// takes repair orders as an active one does (the code before).
	inactiveRepairs bool
	// ackBeforeTail: a middle member acknowledges an update upstream when it
	// receives it, before the tail has it.
	ackBeforeTail bool
	// skipFlush: the old tail forwards FLUSH to the joiner without the log
	// flush (the entries after the joiner's pre-copy end).
	skipFlush bool
	// ausiEarly: under AUSI the head answers an update when it applies it,
	// before the invalidations are acknowledged (AU's rule under AUSI's
	// read rule).
	ausiEarly bool
	// ignoreToken: a weak read is answered by a member that lacks the
	// session's token.
	ignoreToken bool
	// ackUnpersisted: a log-datastore member acknowledges under SU before
	// its host persisted the update.
	ackUnpersisted bool
	// compactPastLA: Compact drops the history up to LU, ignoring LA and
	// the joiners' pins: entries a new successor (CR_MID) or a joiner (log
	// flush) may still need.
	compactPastLA bool
	// precopyToEnd: a pre-copy ends only at the tail's end, paced
	// throughout (the code before outrun): under writes that outrun the
	// pull it never ends, and the join with it.
	precopyToEnd bool
	// restartUnchecked: a member takes a RESTART whatever it reported
	// (the code before the order carried the report).
	restartUnchecked bool
	// durableUnpersisted: a log member's durable point (DA) ignores its own
	// persistence: a host answers a write asking for durability before
	// every log member persisted it.
	durableUnpersisted bool
	// hadLogFromTraffic: the member ignores Config.HadLog and learns that
	// the chain had a log member from messages only (the code before).
	hadLogFromTraffic bool
}

// Member is one chain member's protocol state for one chain (one key range):
// a pure core. Step feeds it a message; Ready returns the messages it wants
// sent. It never reads a clock, draws random numbers or does I/O; the host
// delivers messages over per-neighbour FIFO links (TCP) and tells the master
// about failures.
type Member struct {
	cfg   Config
	sm    StateMachine
	state State
	epoch uint64

	pred, succ NodeID
	// predEpoch, succEpoch: the epoch at which the current link was made.
	// Chain messages on a link carry the sender's epoch; one older than the
	// link's is from a superseded link and is ignored.
	predEpoch, succEpoch uint64

	log []Entry // the history after base, applied to sm (H = H_acked ∪ H_unacked)
	// base is the compacted prefix of the history (compact.go): how many
	// entries, the last one's sequence number and the running digest there.
	base base
	// pins: the pre-copy positions of joiners this tail serves (the seq each
	// last asked after, and when on the member's clock); Compact keeps the
	// log after the lowest recent one, so the log flush can send what the
	// joiner's pre-copy missed as entries rather than a snapshot.
	pins map[NodeID]pin
	// installed: a snapshot a joiner took in its pre-copy that its host has
	// not collected yet (TakeSnapshot), or a page of one.
	installed *Snap
	// paging: the paged snapshot this joiner is pulling (N, and Next: the
	// cursor its next page starts after); nil: none. paged: its host holds
	// pages of a snapshot not installed yet (its state is no history's
	// until the last page comes), so its pre-copy must end in a snapshot.
	paging *Snap
	paged  bool
	// flushWait: a FLUSH this old tail holds until its host's snapshot for
	// the joiner comes (SendSnapshot): it compacted past the joiner's
	// pre-copy end.
	flushWait *Msg
	tmp       []Entry // a joiner's temporary store (not applied until the merge)
	lu        uint64  // last update received (LU)
	la        uint64  // last update acknowledged by the successor (LA)
	// acked is the highest update the successor acknowledged (at the tail:
	// the highest received); LA follows it once this member persisted that
	// far, when its acknowledgement must wait for its log (advance).
	acked uint64
	// dacked is the highest update the successor reported durable (its
	// DA; at the tail unused), da this member's: every log-datastore
	// member from here to the tail persisted it (durPoint). Acknowledgements
	// carry it up the chain (MsgAck's LA, with Done) beside LA, whatever the
	// mode: under SU it moves with LA (every log member's LA waits for its
	// disk), under AUSI and AU it is the point at
	// which a write asking for durability (Kefir's `sync`) is answered by
	// the host of the head — the answer SU gives every update, given per
	// request ("Per-request durability" in docs/design/chain.md).
	//
	// DA counts a disk only where some log member holds one: in a chain
	// that had a log member (hadLog), over none (repaired down to memory
	// members) it does not move ("A sync answer needs a disk"). succLogged
	// says the successor's last report counted a log member (dacked takes
	// only such reports; otherwise the successor's LA stands in, vacuously:
	// nothing below to wait for; succNoLog: the last report said so); said
	// is what this member last told its predecessor (saidAny: once it told
	// one anything). A member with no log from it down learns DA from its
	// predecessor's notices (passDown; downSaid, downTo: the last one it
	// sent).
	dacked, da            uint64
	succLogged, succNoLog bool
	succHeard             NodeID // the successor the last report came from
	hadLog, saidAny       bool
	said                  durSaid
	downSaid              uint64
	downTo                NodeID

	// persistReq is the highest sequence number the host was asked to
	// persist, persisted the highest it confirmed; unbatched counts the
	// entries a buffered log holds beyond persistReq.
	persistReq, persisted uint64
	unbatched             int
	// held: updates a log member under SU logged but has not passed on yet:
	// it forwards an update only once its host persisted it, so the tail
	// answers only what every log member upstream has on disk.
	held []Entry
	// deferredFlush is a FLUSH that came while updates were held: it goes on
	// only behind them, as it would have had they not waited for the disk
	// (an update passed on after FLUSH would reach the old tail after it,
	// missing both the log flush and the joiner).
	deferredFlush *Msg

	nextSeq uint64 // as head: the last sequence number assigned
	// restartedAt: the epoch of the RESTART that made this member the
	// chain of one (0: none), so that a repeat is answered again.
	restartedAt uint64

	// keyed is sm's Keyed, if it has one; lastWrite is then the sequence
	// number of the latest update to each key in the log (the key's
	// version), for CRAQ reads.
	keyed     Keyed
	lastWrite map[string]uint64

	// pending holds updates from a member that is not (yet) the
	// predecessor, per sender, until a FLUSH makes it one (digest §7.4).
	pending map[NodeID][]Msg

	// repairing: CR_MID made succ a new successor whose REPAIR_INFO has not
	// come back; updates are logged but not forwarded until it does (the
	// blocking getRepairInfo of Listing 1, made asynchronous).
	repairing   bool
	repairEpoch uint64

	precopySrc NodeID
	// pulling: a pre-copy request is out (or a throttled one due) and
	// pre-copy has not ended; chunks counts the chunks received, and
	// chunksAtOrder its value at the last PRECOPY: a repeated PRECOPY
	// tells a live pull from a lost one by them.
	pulling               bool
	chunks, chunksAtOrder uint64
	// flushEnd is the joiner's pre-copy end, written into FLUSH when it
	// first forwarded it: a FLUSH the master repeats goes round again with it.
	flushEnd uint64
	// race: how this joiner's pull of the log fares against the writes at
	// its source (outrun).
	race race

	// truncating: TRUNCATE went on to the old tail; this member becomes the
	// tail when the old tail's TRUNCATE_DONE comes back.
	truncating bool

	// now is the member's clock, from Tick (nanoseconds); nextPull is when
	// a throttled joiner may ask for its next chunk, and pullDue says it
	// owes that request.
	now, nextPull int64
	pullDue       bool

	out []Msg
	// spare: the slice ReadyReuse handed out last, whose storage the next
	// ReadyReuse takes for the messages after it.
	spare []Msg
	mut   mutations
}

// NewMember returns a member: Active in the initial chain cfg.Members, or an
// Inactive joiner when cfg.Members is nil.
func NewMember(cfg Config, sm StateMachine) *Member {
	if cfg.PrecopyChunk <= 0 {
		cfg.PrecopyChunk = 64
	}
	if cfg.SeqBits == 0 {
		cfg.SeqBits = defaultSeqBits
	}
	if cfg.PersistBatch <= 0 {
		cfg.PersistBatch = 8
	}
	m := &Member{cfg: cfg, sm: sm, pending: map[NodeID][]Msg{}, hadLog: cfg.Store == Log}
	if k, ok := sm.(Keyed); ok {
		m.keyed, m.lastWrite = k, map[string]uint64{}
	}
	if cfg.Members != nil {
		m.state = Active
		m.pred, m.succ = neighbours(cfg.Members, cfg.ID)
	} else if len(cfg.Log) > 0 || cfg.BaseN > 0 {
		// BaseSeq may be unknown (0) to a host that restored a snapshot
		// with no entries after it: precopyReq asks for a snapshot then.
		m.base = base{n: cfg.BaseN, seq: cfg.BaseSeq}
		m.lu = cfg.BaseSeq
		m.appendMain(cfg.Log)
		// On its host's disk already: nothing to ask for.
		m.persistReq, m.persisted, m.unbatched = m.lu, m.lu, 0
		m.out = nil
	}
	m.paged = cfg.Members == nil && cfg.Paged
	return m
}

// neighbours returns id's predecessor and successor in list (0 at the ends).
func neighbours(list []NodeID, id NodeID) (pred, succ NodeID) {
	for i, n := range list {
		if n == id {
			if i > 0 {
				pred = list[i-1]
			}
			if i+1 < len(list) {
				succ = list[i+1]
			}
		}
	}
	return pred, succ
}

// Ready returns and clears the messages to send, in order.
func (m *Member) Ready() []Msg {
	out := m.out
	m.out = nil
	return out
}

// ReadyReuse is Ready for a caller done with the messages it returns
// before its next call of ReadyReuse: the member collects the messages
// after them in the storage of the ones the previous call returned (two
// buffers, in turn). A host driving the member takes one batch per round,
// and at a head every client update adds a message (its update-ack to the
// master): the outbox grew from nothing, copying, every round.
func (m *Member) ReadyReuse() []Msg {
	out := m.out
	clear(m.spare) // the caller is done with them: keep no payloads alive
	m.out, m.spare = m.spare[:0], out
	return out
}

func (m *Member) send(to NodeID, msg Msg) {
	msg.From, msg.To = m.cfg.ID, to
	if (msg.Type == MsgUpdate || msg.Type == MsgFlush) && m.hadLog {
		// The successor learns that the chain has a log member before it
		// holds anything (raiseDA); a joiner, from the FLUSH that went round
		// the old chain, before it merges — with no update relayed during
		// its join, and under SU no acknowledgement from its successor
		// either, it would otherwise take a vacuous DA once it is the tail.
		// What it learnt only (hadLog), never its configuration
		// (Config.HadLog, knowsLog): that is the member's own, and said
		// on it would spread for good — hadLog only grows — from one
		// member misconfigured to a chain of memory members by
		// configuration (TestConfiguredLogMemberDoesNotSpread).
		msg.HadLog = true
	}
	if msg.Epoch == 0 {
		msg.Epoch = m.epoch
	}
	m.out = append(m.out, msg)
}

func (m *Member) toMaster(msg Msg) { m.send(m.cfg.Master, msg) }

// raise adopts a configuration epoch learnt from the master or in-band.
func (m *Member) raise(e uint64) {
	if e > m.epoch {
		m.epoch = e
	}
}

// Step processes one message.
func (m *Member) Step(msg Msg) {
	if m.state == Removed {
		if msg.From == m.cfg.Master && (msg.Type == MsgUpdate || msg.Type == MsgQuery) {
			m.toMaster(Msg{Type: MsgRedirect, ID: msg.ID, Query: msg.Type == MsgQuery})
		}
		if msg.Type == MsgTruncate && msg.From == m.pred {
			// A repeated TRUNCATE (the master re-sent it: this
			// TRUNCATE_DONE may have been lost): answer it again.
			m.send(m.pred, Msg{Type: MsgTruncateDone, Epoch: msg.Epoch})
		}
		return
	}
	if (msg.Type == MsgCRHead || msg.Type == MsgCRMid || msg.Type == MsgCRTail || msg.Type == MsgRestart) && msg.Epoch < m.epoch {
		// A repair order from an epoch this member has moved past: from a
		// master that restarted from a stale configuration (or overtaken
		// by a newer one). Obeying it would rewire the chain the master
		// does not know (FLUSH has the same rule).
		return
	}
	if (msg.Type == MsgCRHead || msg.Type == MsgCRMid || msg.Type == MsgCRTail) && m.state == Inactive && !(mutation.On && m.mut.inactiveRepairs) {
		// An inactive member is not linked into the chain: a pre-copying
		// joiner, or a member that restarted before the master noticed,
		// getting its old incarnation's order. Taking a CR_MID would leave
		// it "repairing" towards a successor that never answers, and once
		// joined (as the head, say) it would hold back every update. The
		// master fails it on its "not a replica" heartbeat and drops the
		// order. (RESTART is for an inactive member.)
		return
	}
	switch msg.Type {
	case MsgUpdate:
		if msg.From == m.cfg.Master {
			m.clientUpdate(msg)
			return
		}
		if msg.From != m.pred || m.state == Inactive {
			m.pending[msg.From] = append(m.pending[msg.From], msg)
			return
		}
		if msg.Epoch < m.predEpoch {
			return
		}
		m.hadLog = m.hadLog || msg.HadLog
		m.receive(Entry{Seq: msg.Seq, ID: msg.ID, Op: msg.Op})
	case MsgAck:
		if msg.Down {
			if msg.From == m.pred && msg.Epoch >= m.predEpoch {
				m.noticed(msg.LA)
			}
			return
		}
		if msg.From != m.succ || msg.Epoch < m.succEpoch {
			return
		}
		m.acked = max(m.acked, msg.Seq)
		m.succReport(msg.Done, msg.NoLog, msg.HadLog, msg.LA, msg.Seq)
		m.advance()
	case MsgPersisted:
		m.persisted = max(m.persisted, msg.Seq)
		m.advance()
		m.release()
	case MsgQuery:
		if msg.Weak {
			m.weakRead(msg)
			return
		}
		if m.state == Active && (m.succ == 0 || msg.Any && m.clean(msg.Op)) {
			m.answerRead(msg)
			return
		}
		if msg.Any && m.succ != 0 && (m.state == Active || m.state == Joining) {
			// Dirty here: the tail, or a member on the way, has the
			// committed version.
			m.send(m.succ, Msg{Type: MsgQuery, ID: msg.ID, Op: msg.Op, Any: true})
			return
		}
		m.toMaster(Msg{Type: MsgRedirect, ID: msg.ID, Query: true})
	case MsgPrecopy:
		if m.state != Inactive {
			return
		}
		m.raise(msg.Epoch)
		if msg.Target == m.precopySrc && m.pulling && (m.pullDue || m.chunks != m.chunksAtOrder) {
			// The master re-sent PRECOPY (it has no PRECOPY_DONE yet) while
			// a pull from this source is alive: a chunk came since the last
			// PRECOPY, or a throttled request is due. Another request would
			// start a second stream of pulls.
			m.chunksAtOrder = m.chunks
			return
		}
		// A new source (ask it at once), or a repeated PRECOPY with no
		// pull under way (pre-copy ended: its PRECOPY_DONE or REFUSED may
		// have been lost, and the answer to this request says it again) or
		// none heard of for a whole re-send interval (the request or its
		// chunk was lost). A request resumes after what the joiner holds.
		if msg.Target != m.precopySrc {
			m.paging = nil // another source: its snapshot starts over
			m.race = race{}
		}
		m.precopySrc = msg.Target
		m.pullDue = false
		m.chunksAtOrder = m.chunks
		m.pulling = true
		m.send(m.precopySrc, m.precopyReq())
	case MsgPrecopyReq:
		if m.state != Active || m.succ != 0 {
			m.send(msg.From, Msg{Type: MsgPrecopyChunk, Refused: true})
			return
		}
		if msg.Snap != nil {
			m.pageFor(msg.From, msg.Snap) // the next page of a snapshot
			return
		}
		m.pin(msg.From, msg.Seq)
		if msg.Seq < m.base.seq || msg.Any || !m.holds(msg.Seq) {
			// Compacted past what the joiner holds — or the joiner's last
			// update is not in this history: it holds updates the chain
			// never committed (numbered by a head that failed, or by a
			// master that reissued epochs it did not know were used), and
			// entries "after" it would continue a history that diverges
			// from the chain's; an empty answer would say "done" over it
			// (the host simulation's AUSI D-D-M seed 548). A snapshot
			// replaces the joiner's history (install).
			m.snapshotFor(msg.From)
			return
		}
		es, done := m.after(msg.Seq, m.cfg.PrecopyChunk)
		m.send(msg.From, Msg{Type: MsgPrecopyChunk, Entries: es, Done: done, LA: uint64(m.total())})
	case MsgPrecopyChunk:
		if m.state != Inactive || msg.From != m.precopySrc {
			return
		}
		m.chunks++
		if msg.Refused {
			m.pulling = false
			m.toMaster(Msg{Type: MsgPrecopyDone, Seq: m.lu, Refused: true})
			return
		}
		before := m.total()
		if s := msg.Snap; s != nil && (s.More || s.From != nil) && !m.takePage(s) {
			return // not the next page: stale, or repeated
		}
		if s := msg.Snap; s != nil && s.More {
			// A page: its host applies it; the next is asked for, paced.
			m.pace(int64(len(s.Data)))
			return
		}
		if msg.Snap != nil {
			m.install(msg.Snap, msg.LU == m.lu)
		}
		m.appendMain(msg.Entries)
		if msg.Done {
			m.pulling = false
			m.toMaster(Msg{Type: MsgPrecopyDone, Seq: m.lu})
			return
		}
		if m.total() == before && msg.Snap == nil {
			// Nothing new, and not the end: the answer to a request made
			// twice (a repeated PRECOPY), whose other answer already moved
			// the pull on and asked for the next chunk. Asking again would
			// keep two streams of pulls going.
			return
		}
		if m.outrun(msg.LA) {
			// The writes outrun even an unpaced pull: the pre-copy ends
			// here, and the old tail's log flush sends the rest at FLUSH,
			// as it sends whatever a pre-copy missed.
			m.pulling = false
			m.toMaster(Msg{Type: MsgPrecopyDone, Seq: m.lu})
			return
		}
		var n int64
		for _, e := range msg.Entries {
			n += int64(len(e.Op)) + entryOverhead
		}
		if msg.Snap != nil {
			n += int64(len(msg.Snap.Data))
		}
		m.pace(n)
	case MsgFlush:
		m.flush(msg)
	case MsgFlushedUpdate:
		if m.state == Joining {
			if msg.Snap != nil {
				m.install(msg.Snap, false)
			}
			m.appendMain(msg.Entries)
		}
	case MsgTruncate:
		if msg.From == m.cfg.Master {
			// The new tail-to-be (the tail's predecessor).
			m.raise(msg.Epoch)
			switch {
			case m.succ != 0:
				// Pass it on, and stay a non-tail until the old tail
				// confirms: until then the old tail still answers as the
				// tail (it is the master's), and acknowledging anything it
				// has not would let a CRAQ read upstream return a version
				// that a read at the old tail then misses, if this member
				// failed now. A repeat (the first, or the old tail's
				// TRUNCATE_DONE, may have been lost) goes on again: the old
				// tail answers it again.
				m.send(m.succ, Msg{Type: MsgTruncate, Epoch: msg.Epoch, Members: msg.Members})
				m.truncating = true
			case !m.truncating:
				// A repeat after the truncation ended here: the master did
				// not get the TRUNCATE_ACK. This member is the tail now, not
				// the old tail: answer again.
				m.toMaster(Msg{Type: MsgTruncateAck})
			}
			return
		}
		if msg.From != m.pred {
			return
		}
		m.raise(msg.Epoch)
		if m.succ == 0 {
			// The old tail: it has answered everything its predecessor
			// sent before TRUNCATE (FIFO); it stops serving, hands over and
			// frees the range.
			m.state = Removed
			m.log, m.tmp, m.pending, m.lastWrite, m.pins = nil, nil, nil, nil, nil
			m.send(m.pred, Msg{Type: MsgTruncateDone, Epoch: msg.Epoch})
		}
	case MsgTruncateDone:
		if !m.truncating || msg.From != m.succ {
			return
		}
		m.succ, m.repairing, m.truncating = 0, false, false
		// Digest §7.5: the new tail reports first, so the master makes it
		// the tail before any of its update acks arrive (same FIFO link).
		m.toMaster(Msg{Type: MsgTruncateAck})
		m.ackPending()
	case MsgCRHead:
		m.raise(msg.Epoch)
		if m.pred != 0 {
			// Updates queued from others are from replaced or failed
			// members. A head's queue is kept: a repeated CR_HEAD may come
			// after the answer to the first let a head join start, whose
			// joiner's relayed updates wait here for its FLUSH.
			m.pred = 0
			m.pending = map[NodeID][]Msg{}
		}
		m.becomeHead()
		m.toMaster(Msg{Type: MsgCRHeadDone, Epoch: msg.Epoch})
	case MsgCRMid:
		if msg.Epoch == m.repairEpoch && msg.Target == m.succ {
			// The same order again (the master re-sent it): no second
			// repair round. Still repairing, CR_MID_REPAIR or REPAIR_INFO
			// may have been lost: ask again (the successor answers a
			// repeat); done, CR_MID_DONE may have been lost: answer again.
			if m.repairing {
				m.send(m.succ, Msg{Type: MsgCRMidRepair, LA: m.la, Epoch: msg.Epoch})
			} else {
				m.toMaster(Msg{Type: MsgCRMidDone, Epoch: msg.Epoch})
			}
			return
		}
		m.raise(msg.Epoch)
		m.succ, m.succEpoch = msg.Target, msg.Epoch
		m.repairing, m.repairEpoch = true, msg.Epoch
		m.send(m.succ, Msg{Type: MsgCRMidRepair, LA: m.la, Epoch: msg.Epoch})
	case MsgCRMidRepair:
		if msg.Epoch < m.predEpoch {
			return // a newer repair already chose my predecessor
		}
		if msg.From == m.pred && msg.Epoch == m.predEpoch {
			// A repeat of the repair that linked us: answer again, keeping
			// the queues (a joiner's relayed updates may wait there for a
			// FLUSH that started since the first).
			m.send(msg.From, m.repairInfo(msg.Epoch))
			return
		}
		m.raise(msg.Epoch)
		m.pred, m.predEpoch = msg.From, msg.Epoch
		m.pending = map[NodeID][]Msg{}
		m.send(msg.From, m.repairInfo(msg.Epoch))
	case MsgRepairInfo:
		if !m.repairing || msg.From != m.succ || msg.Epoch != m.repairEpoch {
			return
		}
		m.repairing = false
		m.acked = max(m.acked, msg.LA)
		m.succReport(msg.Done, msg.NoLog, msg.HadLog, msg.Seq, msg.LA)
		m.advance()
		// Re-send what the new successor may never have got (Listing 1's
		// CR_MID), including what arrived while repairing — what a log
		// member persisted: the rest stays held until it is.
		es, _ := m.after(msg.LU, len(m.log))
		bound := m.ackBound()
		for _, e := range es {
			if e.Seq <= bound {
				m.send(m.succ, Msg{Type: MsgUpdate, Seq: e.Seq, ID: e.ID, Op: e.Op})
			}
		}
		m.held = slices.DeleteFunc(m.held, func(e Entry) bool { return e.Seq <= bound })
		m.toMaster(Msg{Type: MsgCRMidDone, Epoch: m.repairEpoch})
	case MsgCRTail:
		m.raise(msg.Epoch)
		m.succ, m.repairing, m.truncating = 0, false, false
		m.toMaster(Msg{Type: MsgCRTailDone, Epoch: msg.Epoch}) // before the acks, as TRUNCATE_ACK
		m.ackPending()
	case MsgRestart:
		m.restart(msg)
	}
}

// restart handles RESTART: every member of the chain failed, and the master
// chose this one, a restarted member holding the longest durable history of
// them all, to carry the chain on alone (Master.Restarted). Its history —
// the committed prefix its host kept — becomes the chain's: it is head and
// tail, everything it holds is acknowledged, and it numbers new updates
// from the order's epoch, above every number an earlier head gave (the
// master chose the epoch above its history's). Only a joiner that has not
// started a pre-copy takes it (a member with a place in a chain has one
// already); a repeat at the epoch it restarted at is answered again.
func (m *Member) restart(msg Msg) {
	if m.state == Active && m.pred == 0 && m.succ == 0 && m.epoch == msg.Epoch && m.restartedAt == msg.Epoch {
		m.toMaster(Msg{Type: MsgRestartDone, Epoch: msg.Epoch})
		return
	}
	if m.state != Inactive || len(m.tmp) > 0 || m.paged {
		// (paged: its host's state is part of a snapshot, no history's.)
		return
	}
	if (msg.LU != 0 || msg.LA != 0) && (msg.LU != m.lu || msg.LA != uint64(m.total())) && !(mutation.On && m.mut.restartUnchecked) {
		// The master chose it for a history it reported (LU, and the
		// length in LA; none from a master of a build before) and it holds
		// another: the report was an earlier process's, which crashed
		// since (a memory member restarts empty). Carrying the chain on
		// from this history would drop what the master counted on, and
		// members that hold it would then pre-copy from a source that
		// never held their updates. The master chooses again
		// (Master.restartRefused) once it hears what it holds now.
		m.toMaster(Msg{Type: MsgRestartDone, Epoch: msg.Epoch, Refused: true})
		return
	}
	m.raise(msg.Epoch)
	m.state, m.pred, m.succ, m.restartedAt = Active, 0, 0, msg.Epoch
	// A pre-copy it began before the chain went down (from a tail that
	// failed since) is over: what it copied is the chain's history.
	m.precopySrc, m.pulling, m.pullDue = 0, false, false
	m.pending = map[NodeID][]Msg{}
	if m.base.n > 0 && m.base.seq == 0 && len(m.log) == 0 {
		// A checkpoint with no entry after it whose last update's number
		// its host does not know (written by a build before hosts kept
		// it: vrshard's openChain). The history's numbers go on from the
		// epoch's base, above all of them; a joiner holding any of it
		// asks after a number below, and gets a snapshot.
		m.base.seq = seqBase(m.epoch, m.cfg.SeqBits)
		m.lu = m.base.seq
	}
	// Durable on its host, and the whole chain now: acknowledged. No
	// update-ack goes out for it (its clients' answers died with the
	// chain; a retry finds it in the client table).
	m.acked, m.la = m.lu, m.lu
	m.persistReq, m.persisted = max(m.persistReq, m.lu), max(m.persisted, m.lu)
	// And at the durable point: no acknowledgement will come to move DA
	// over it, and under AUSI a strong read serves only what DA covers
	// (vrshard's chainCore.Ready), so without this every key of the history
	// would wait for the next write.
	m.raiseDA()
	m.becomeHead()
	m.toMaster(Msg{Type: MsgRestartDone, Epoch: msg.Epoch})
}

// entryOverhead is what an entry costs beyond its operation in the pre-copy
// throttle's count (sequence number, request id, framing).
const entryOverhead = 24

// Tick tells the member the time on its clock (nanoseconds); a throttled
// joiner sends its next pre-copy request when it is due.
func (m *Member) Tick(now int64) {
	m.now = now
	m.pull()
	if m.cfg.Store == Buffered && m.unbatched > 0 {
		m.requestPersist()
	}
}

// pace asks for the next pre-copy chunk after one of n bytes: at once, or,
// throttled (PrecopyRate), n/PrecopyRate later on the member's clock —
// unless the pace lost against the writes (outrun): then at once.
func (m *Member) pace(n int64) {
	if r := m.cfg.PrecopyRate; r > 0 && !m.race.hurry {
		m.nextPull = m.now + n*1e9/r
		m.pullDue = true
		m.pull()
		return
	}
	m.send(m.precopySrc, m.precopyReq())
}

// A pre-copy ends at the tail's end, and the writes at the head move that
// end on. A pull slower than the writes — paced (PrecopyRate) below the
// rate the log grows at, or, unpaced, answered more slowly than updates
// arrive — never reaches it: the join never completes (issue 30: the chain
// stayed [1 3] for as long as the writes went on, in the hours the box was
// quiet enough for the writes to be fast). So the joiner watches the race:
// each chunk says how long the tail's history was when it answered (LA),
// and the joiner keeps the smallest gap it has seen between that and its
// own. When raceSlack chunks in a row leave it no closer than that, it is
// being outrun: a paced pull drops its pace for the rest of the pre-copy
// (the pace keeps the tail's capacity for traffic, which the join cannot
// give back if it never ends), and a pull already unpaced ends the
// pre-copy where it is: the old tail's log flush sends the rest at FLUSH
// (the pins keep it), as it sends whatever any pre-copy missed, while the
// joiner's temporary store takes the new updates. Either way the pull
// terminates: but for the one change of pace the smallest gap falls at
// least every raceSlack chunks, and a chunk that reaches the end is Done. The slack keeps a burst
// of writes within a chunk or two from costing the pace. Pages of a
// snapshot are not raced: there is a fixed number of them (the capture is
// pinned at one position). From a tail of a build before this, which
// sends no length (0), the joiner pulls, paced, to the end, as before.

// raceSlack is how many chunks in a row may leave a joiner no closer to
// the tail's end before it counts as outrun.
const raceSlack = 3

// race is a joiner's pull against the writes at its source (outrun).
type race struct {
	best  int  // the smallest gap to the source's end seen, in entries
	seen  bool // best holds a gap: one was measured since the pull began
	stale int  // chunks since best last fell
	hurry bool // outrun once: unpaced for the rest of the pre-copy
}

// outrun takes a pre-copy chunk's length of the source's history (0: not
// said), after the joiner applied the chunk, and reports whether the pull
// is outrun unpaced: the pre-copy ends. Outrun while paced, it drops the
// pace (pace asks at once from then on).
func (m *Member) outrun(end uint64) bool {
	if end == 0 || mutation.On && m.mut.precopyToEnd {
		return false
	}
	gap := max(int(end)-m.total(), 0)
	r := &m.race
	if !r.seen || gap < r.best {
		r.best, r.seen, r.stale = gap, true, 0
		return false
	}
	if r.stale++; r.stale < raceSlack {
		return false
	}
	if !r.hurry && m.cfg.PrecopyRate > 0 {
		// The unpaced pull is measured from where it starts.
		r.hurry, r.best, r.stale = true, gap, 0
		return false
	}
	// (stale stays: a chunk answering a re-sent PRECOPY that brings the
	// joiner no closer reports the end again at once.)
	return true
}

// pull sends a throttled joiner's owed pre-copy request once it is due.
func (m *Member) pull() {
	if m.pullDue && m.state == Inactive && m.now >= m.nextPull {
		m.pullDue = false
		m.send(m.precopySrc, m.precopyReq())
	}
}

// clientUpdate handles an update from the master: the head numbers it and
// replicates it; anyone else refuses it (the master re-routes it). A member
// that stopped being the head refuses updates still in flight from the
// previous configuration rather than queueing them (digest §7.6).
func (m *Member) clientUpdate(msg Msg) {
	if m.pred != 0 || (m.state != Active && m.state != Joining) {
		m.toMaster(Msg{Type: MsgRedirect, ID: msg.ID})
		return
	}
	if t := msg.Token; t != 0 && !m.holds(t) {
		// The head's history contains every member's: lacking the token, the
		// update it names is gone (lost). A joining head may still be
		// waiting for it in the log flush, or hold it in its temporary
		// store.
		if m.state == Joining && !slices.ContainsFunc(m.tmp, func(e Entry) bool { return e.Seq == t }) {
			m.toMaster(Msg{Type: MsgRedirect, ID: msg.ID})
			return
		}
		if m.state == Active {
			m.toMaster(Msg{Type: MsgRedirect, ID: msg.ID, Lost: m.knows(t)})
			return
		}
	}
	if m.nextSeq+1 >= seqBase(m.epoch+1, m.cfg.SeqBits) {
		// A later head (a head join's FLUSH, at an epoch above mine) may
		// start numbering there: refuse rather than collide.
		m.toMaster(Msg{Type: MsgRedirect, ID: msg.ID, Exhausted: true})
		return
	}
	m.nextSeq++
	m.receive(Entry{Seq: m.nextSeq, ID: msg.ID, Op: msg.Op})
	if m.cfg.Mode == AU || mutation.On && m.mut.ausiEarly && m.cfg.Mode == AUSI {
		// AU: the head's apply is the answer (a joining head's is its
		// temporary store: it logged the update and relays it).
		var res []byte
		if n := len(m.log); n > 0 && m.log[n-1].Seq == m.nextSeq {
			res = m.log[n-1].Result
		}
		m.toMaster(Msg{Type: MsgUpdateAck, Seq: m.nextSeq, ID: msg.ID, Result: res})
	}
}

// becomeHead continues numbering above everything this member has seen and
// above every number an earlier head can have given (seqBase).
func (m *Member) becomeHead() {
	m.nextSeq = max(m.lu, seqBase(m.epoch, m.cfg.SeqBits), m.nextSeq)
}

// receive logs an update from the predecessor (or numbered by this head) and
// passes it on: to the successor, or, at the tail, as the answer to the
// master and an acknowledgement upstream. A joiner keeps it in its temporary
// store and relays it (digest §7.3).
func (m *Member) receive(e Entry) {
	if e.Seq <= m.lu {
		return // a re-send after repair that overlaps what arrived
	}
	if m.state == Joining {
		m.tmp = append(m.tmp, e)
	} else {
		e.Result = m.sm.Apply(e.Seq, e.Op)
		m.appendLog(e)
	}
	m.lu = e.Seq
	if m.succ == 0 {
		m.acked = e.Seq
		m.advance()
		return
	}
	if mutation.On && m.mut.ackBeforeTail && m.pred != 0 {
		m.send(m.pred, Msg{Type: MsgAck, Seq: e.Seq})
	}
	if m.state == Active && m.ackBound() != ^uint64(0) {
		m.held = append(m.held, e)
		m.release()
		return
	}
	if !m.repairing {
		m.send(m.succ, Msg{Type: MsgUpdate, Seq: e.Seq, ID: e.ID, Op: e.Op})
	}
}

// release passes on the held updates the host has persisted (a log member
// under SU), unless a repair holds forwarding back; REPAIR_INFO re-sends
// them then.
func (m *Member) release() {
	if m.succ == 0 {
		m.held = nil // the tail: acknowledgements answer for them (advance)
		return
	}
	if m.repairing {
		return
	}
	i := 0
	for ; i < len(m.held) && m.held[i].Seq <= m.persisted; i++ {
		e := m.held[i]
		m.send(m.succ, Msg{Type: MsgUpdate, Seq: e.Seq, ID: e.ID, Op: e.Op})
	}
	m.held = m.held[i:]
	if len(m.held) == 0 && m.deferredFlush != nil {
		f := *m.deferredFlush
		m.deferredFlush = nil
		m.flush(f)
	}
}

// appendLog appends an applied entry, extending the running digest.
func (m *Member) appendLog(e Entry) {
	e.sum = digest(m.lastSum(), e.Seq, e.Op)
	m.log = append(m.log, e)
	if m.keyed != nil {
		for _, k := range m.keyed.Keys(e.Op) {
			m.lastWrite[k] = e.Seq
		}
	}
	if e.Seq > m.lu {
		m.lu = e.Seq
	}
	switch m.cfg.Store {
	case Log:
		m.unbatched++
		m.requestPersist()
	case Buffered:
		if m.unbatched++; m.unbatched >= m.cfg.PersistBatch {
			m.requestPersist()
		}
	}
}

// requestPersist asks the host to make the log durable up to its end.
func (m *Member) requestPersist() {
	n := len(m.log)
	if n == 0 || m.log[n-1].Seq <= m.persistReq {
		return
	}
	m.persistReq, m.unbatched = m.log[n-1].Seq, 0
	m.send(m.cfg.ID, Msg{Type: MsgPersist, Seq: m.persistReq})
}

// ackBound is how far this member may acknowledge, and pass updates on:
// under SU a log datastore does both only for what its host persisted, so an
// answered update is on the disk of every log member (digest 002 Table 6.2:
// D-D and M-D under SU lose nothing acknowledged). Otherwise nothing waits.
func (m *Member) ackBound() uint64 {
	if m.cfg.Store == Log && m.cfg.Mode == SU && !(mutation.On && m.mut.ackUnpersisted) {
		return m.persisted
	}
	return ^uint64(0)
}

// answersOnAck reports whether this member answers updates as their
// acknowledgement reaches it: the tail under SU, the head under AUSI (once
// the acknowledgement came back, every member holds the update and marked
// the key dirty).
func (m *Member) answersOnAck() bool {
	switch m.cfg.Mode {
	case SU:
		return m.succ == 0
	case AUSI:
		return m.pred == 0 && m.state != Inactive && !(mutation.On && m.mut.ausiEarly)
	}
	return false
}

// advance raises LA to what the successor acknowledged (at the tail: what
// it received), as far as ackBound allows; it answers the updates that
// became acknowledged if this member answers on acknowledgements, and
// passes the acknowledgement upstream.
func (m *Member) advance() {
	to := min(m.acked, m.ackBound())
	old := m.la
	if to > old && m.answersOnAck() {
		i := sort.Search(len(m.log), func(i int) bool { return m.log[i].Seq > old })
		for _, es := range [][]Entry{m.log[i:], m.tmp} {
			for _, e := range es { // each in seq order
				if e.Seq > to {
					break
				}
				if e.Seq > old {
					m.toMaster(Msg{Type: MsgUpdateAck, Seq: e.Seq, ID: e.ID, Result: e.Result})
				}
			}
		}
	}
	m.la = max(old, to)
	daMoved := m.raiseDA()
	// An acknowledgement goes up when LA or DA moved, or when what it says
	// of the log members below changed (durSaid).
	if m.pred != 0 && (m.la > old || daMoved || m.saidAny && m.said != m.durSay()) {
		m.sendAck()
	}
	m.passDown()
}

// raiseDA moves DA to durPoint where a disk backs it: over a log member, or
// in a chain that never had one (hadLog false: memory and buffered members
// by configuration, whose `sync` means every member's store holds it, as
// the loss table's rows say). A member learns that the chain had one from
// its own store, its successor's reports, its predecessor's updates and
// notices (HadLog, Down). It reports whether DA moved.
func (m *Member) raiseDA() bool {
	d, logged := m.durPoint()
	m.hadLog = m.hadLog || logged
	// Vacuously only on what it knows: as the tail, or once the successor
	// it has now reported (a joiner merging has heard nothing from its
	// successor yet, which may know of a log member).
	vacuous := !m.knowsLog() && (m.succ == 0 || m.succHeard == m.succ)
	if (logged || vacuous) && d > m.da {
		m.da = d
		return true
	}
	return false
}

// durSaid is what a member's durable point report says of the log members
// from it down: none (noLog), and whether it knows the chain had one
// (hadLog, beside noLog).
type durSaid struct{ noLog, hadLog bool }

// durSay is what this member's report says now.
func (m *Member) durSay() durSaid {
	if _, logged := m.durPoint(); logged {
		return durSaid{}
	}
	return durSaid{noLog: true, hadLog: m.hadLog} // what it learnt only, as send
}

// knowsLog: the member knows that the chain had a log member — from its own
// store, a message (hadLog), or its configuration (Config.HadLog). It
// decides the member's own durable point only (raiseDA); its messages say
// hadLog (send, durSay, passDown).
func (m *Member) knowsLog() bool {
	return m.hadLog || m.cfg.HadLog && !(mutation.On && m.mut.hadLogFromTraffic)
}

// sendAck acknowledges LA and DA to the predecessor (Done: the ack says DA;
// NoLog, HadLog: durReport).
func (m *Member) sendAck() {
	d, s := m.durReport()
	m.send(m.pred, Msg{Type: MsgAck, Seq: m.la, LA: d, Done: true, NoLog: s.noLog, HadLog: s.hadLog})
}

// repairInfo is the REPAIR_INFO this member answers a new predecessor's
// CR_MID_REPAIR with (at epoch e): its LA, LU and durable point.
func (m *Member) repairInfo(e uint64) Msg {
	d, s := m.durReport()
	return Msg{Type: MsgRepairInfo, LA: m.la, LU: m.lu, Epoch: e, Seq: d, Done: true, NoLog: s.noLog, HadLog: s.hadLog}
}

// durReport is the durable point this member reports upstream: DA, or, with
// no log member from here down, LA with noLog — the value an older
// predecessor (which ignores NoLog) took before, while a current one takes
// nothing from it as durable — and hadLog. It records what it said.
func (m *Member) durReport() (uint64, durSaid) {
	s := m.durSay()
	m.said, m.saidAny = s, true
	if s.noLog {
		return m.la, s
	}
	return m.da, s
}

// succReport takes a successor's durable point d (said: the report carries
// one; noLog: it counts no log member; hadLog: it knows the chain had one)
// beside its LA la.
func (m *Member) succReport(said, noLog, hadLog bool, d, la uint64) {
	m.succLogged, m.succNoLog, m.succHeard = !noLog, noLog, m.succ
	m.hadLog = m.hadLog || hadLog || !noLog
	if !noLog {
		m.dacked = max(m.dacked, succDurable(said, d, la))
	}
}

// durPoint is how far every log-datastore member from here to the tail
// persisted — the successor's report (at the tail: what it acknowledges),
// and, on a log member, its own persisted prefix — and whether any log
// member counts in it (logged). Memory and buffered-log members wait for
// nothing here, as under SU (ackBound); over them alone the point is
// vacuous (raiseDA). A successor that counts no log member stands in by its
// LA (acked): nothing from it down persists anything; one not heard from
// yet by dacked, counting none.
func (m *Member) durPoint() (d uint64, logged bool) {
	d = m.dacked
	switch {
	case m.succ == 0:
		d = m.acked // the tail: what it received and acknowledges
	case m.succHeard != m.succ:
		// Nothing heard from this successor yet (a joiner merging, a
		// relink): what the reports said before, and no log member known
		// below — not none known, which would make its LA durable.
	case m.succNoLog:
		d = m.acked
	default:
		logged = m.succLogged
	}
	if m.cfg.Store == Log {
		logged = true
		if !(mutation.On && m.mut.durableUnpersisted) {
			d = min(d, m.persisted)
		}
	}
	return d, logged
}

// noticed takes the predecessor's durable point d (MsgAck with Down): the
// chain has a log member above this one. With none from here down, this
// member's own DA cannot move, yet every log member that holds an update is
// above it, and the predecessor's DA says how far they persisted it — what
// a strong read here may serve under AUSI (vrshard's chainCore.Ready: R is
// DA), and where DA stands should this member become head.
func (m *Member) noticed(d uint64) {
	m.hadLog = true
	if _, logged := m.durPoint(); logged {
		return // its own DA counts a log member below: it needs no notice
	}
	if d = min(d, m.la); d > m.da {
		m.da = d
		m.passDown()
	}
}

// passDown sends a disk-backed DA down to a successor that counts no log
// member from it down (its last report said NoLog), whose own DA could not
// move otherwise (noticed), once per change of DA or successor.
func (m *Member) passDown() {
	if m.succ == 0 || !m.succNoLog || !m.hadLog || m.state != Active || m.da == 0 || (m.da <= m.downSaid && m.succ == m.downTo) {
		return
	}
	m.downSaid, m.downTo = m.da, m.succ
	m.send(m.succ, Msg{Type: MsgAck, LA: m.da, Down: true})
}

// succDurable is the durable point a successor's acknowledgement (or
// REPAIR_INFO) reports: d if it says one (said), else its LA la — an
// older successor that carries no durable point, whose acknowledgement is
// taken as durable as before (a request's durability is then the mode's).
func succDurable(said bool, d, la uint64) uint64 {
	if said {
		return d
	}
	return la
}

// appendMain applies entries that come straight into the main store
// (pre-copy, log flush), skipping any it already holds.
func (m *Member) appendMain(es []Entry) {
	for _, e := range es {
		if e.Seq <= m.lastSeq() {
			continue
		}
		e.Result = m.sm.Apply(e.Seq, e.Op)
		m.appendLog(e)
	}
}

// clean reports whether the latest update this member holds to the query's
// key has been acknowledged, i.e. reached the tail. Every update the tail
// holds passed through this member first (history containment), so the
// member then holds the key's latest committed version and may answer a
// strong read itself (CRAQ). Without Keyed nothing is clean.
func (m *Member) clean(query []byte) bool {
	if m.keyed == nil {
		return false
	}
	return m.lastWrite[m.keyed.QueryKey(query)] <= m.la
}

// answerRead answers a read from this member's state machine, with the
// version it read (the key's latest update here; 0 without Keyed or when
// no update to the key is held), which a session carries as its token.
func (m *Member) answerRead(msg Msg) {
	var v uint64
	if m.keyed != nil {
		v = m.lastWrite[m.keyed.QueryKey(msg.Op)]
	}
	m.toMaster(Msg{Type: MsgQueryResp, ID: msg.ID, Result: m.sm.Read(msg.Op), Seq: v})
}

// weakRead serves a read at any member (session, bounded, eventual levels):
// an active member that holds the session's token — the update numbered
// msg.Seq, the newest the session wrote or read — answers from what it has
// applied, which may be stale but includes everything the session saw
// (histories are prefixes of one another, so holding the token means
// holding all before it). A member behind the token passes the read to its
// predecessor, which holds a superset of its history (a joining head, to the
// old head behind it). A member past the token that does not hold it, or a
// head behind it, knows the update is gone: it died with a head that had not
// passed it on (AU, or a dirty read at the head), and the session is lost.
func (m *Member) weakRead(msg Msg) {
	t := msg.Seq
	if m.state == Active && (t == 0 || m.holds(t) || mutation.On && m.mut.ignoreToken) {
		if m.cfg.Mode == AU || m.succ == 0 || m.clean(msg.Op) {
			m.answerRead(msg)
			return
		}
		// SU, AUSI: the key is dirty here (invalid, under AUSI): its
		// latest update is not committed, and a session that saw it could
		// see it vanish (a tail read, or the head's crash). The committed
		// version is downstream, which holds the token too (it is committed).
		m.send(m.succ, Msg{Type: MsgQuery, ID: msg.ID, Op: msg.Op, Weak: true, Seq: t})
		return
	}
	if (m.state == Active || m.state == Joining) && m.lu < t {
		next := m.pred
		if next == 0 && m.state == Joining {
			next = m.succ
		}
		if next != 0 {
			m.send(next, Msg{Type: MsgQuery, ID: msg.ID, Op: msg.Op, Weak: true, Seq: t})
			return
		}
	}
	lost := m.state == Active && (m.lu >= t || m.pred == 0) && m.knows(t)
	m.toMaster(Msg{Type: MsgRedirect, ID: msg.ID, Query: true, Lost: lost})
}

// knows reports whether seq was numbered in a configuration this member has
// heard of. A head that has not yet seen a head join's FLUSH (deferred behind
// held updates, or still on its way) may be asked about an update the joiner
// numbered since, above the FLUSH's epoch: not lost, just not here yet.
func (m *Member) knows(seq uint64) bool { return seq>>m.cfg.SeqBits <= m.epoch }

// holds reports whether the log holds the update numbered seq.
func (m *Member) holds(seq uint64) bool {
	if seq <= m.base.seq {
		// Compacted: numbered below an entry held, so held unless it was
		// lost with a head — which SU, the mode a compacting host runs,
		// never acknowledges (docs/design/chain.md, "Bounded history").
		return true
	}
	i := sort.Search(len(m.log), func(i int) bool { return m.log[i].Seq >= seq })
	return i < len(m.log) && m.log[i].Seq == seq
}

// after returns up to n log entries with a sequence number above seq, and
// whether they reach the end of the log.
func (m *Member) after(seq uint64, n int) ([]Entry, bool) {
	i := sort.Search(len(m.log), func(i int) bool { return m.log[i].Seq > seq })
	j := min(len(m.log), i+n)
	return append([]Entry(nil), m.log[i:j]...), j == len(m.log)
}

// ackPending makes this member the tail's answer for every update it holds
// that its old successor never acknowledged (CR_TAIL, TRUNCATE): Invariant
// 3.13, the tail holds nothing unacknowledged.
func (m *Member) ackPending() {
	m.held, m.deferredFlush = nil, nil
	m.acked = max(m.acked, m.lu)
	m.advance()
}

// flush handles FLUSH (digest §3.4 Phase 2, Listing 1 with the §7 fixes).
func (m *Member) flush(msg Msg) {
	if msg.Epoch < m.epoch {
		return // cancelled: a later configuration (a repair) reached me first
	}
	me := m.cfg.ID
	if msg.Joiner == me && m.state == Inactive && m.precopySrc == 0 {
		// Never told to pre-copy: a new incarnation of the joiner, which
		// restarted during its flush before the master heard of it and got
		// the master's repeated FLUSH or the old one's coming back. Its
		// predecessor may have relinked to the old incarnation already
		// and sent it updates that died with it: taking FLUSH would make
		// this member a replica without them. Refuse; the master aborts
		// the join and repairs around it (the old incarnation is gone), and
		// this one is joined afresh.
		m.toMaster(Msg{Type: MsgFlushAck, Refused: true, Epoch: msg.Epoch})
		return
	}
	if msg.Joiner == me && m.state == Inactive && m.paged {
		// Its host holds pages of a snapshot whose last page has not
		// come (a FLUSH after a PRECOPY_DONE from an earlier source while
		// a new one pages): that state is no history's, and the log
		// flush would go on from its LU below it. Refused: the master
		// aborts the join and joins it again, from a snapshot.
		m.toMaster(Msg{Type: MsgFlushAck, Refused: true, Epoch: msg.Epoch})
		return
	}
	if msg.Joiner == me && msg.From == m.cfg.Master && m.state != Inactive {
		// The master repeated FLUSH: it has no FLUSH_ACK.
		if m.state == Joining {
			// Still waiting for it to come round: it may have been lost
			// on the way. Send it round again, with the same pre-copy
			// end: every member takes a repeat as a no-op but the old
			// tail, whose log flush again is what this member may lack
			// (whatever it holds already is skipped, in the main store and
			// at the merge).
			fwd := msg
			fwd.Seq = m.flushEnd
			m.send(msg.Path[1], fwd)
		} else if m.state == Active {
			// Merged: the FLUSH_ACK was lost; answer again.
			m.toMaster(Msg{Type: MsgFlushAck, Epoch: msg.Epoch})
		}
		return
	}
	if msg.Joiner == me && m.state == Active {
		return // a repeat's second arrival, after the merge
	}
	if msg.Joiner == me && m.state == Joining {
		// Second arrival: the log flush is complete; merge the temporary
		// store behind it and become a replica.
		// Every member of the old chain passed this FLUSH on, each saying
		// whether it knows the chain had a log member (send).
		m.hadLog = m.hadLog || msg.HadLog
		mainLU := m.lastSeq()
		tmp := m.tmp
		m.tmp = nil
		for _, e := range tmp {
			if e.Seq > mainLU {
				e.Result = m.sm.Apply(e.Seq, e.Op)
				m.appendLog(e)
			}
		}
		// Everything pre-copied or flushed was at the old tail: it is
		// acknowledged, and upstream may have lost the old tail's acks
		// for it (they stopped being accepted when FLUSH relinked it).
		m.acked = max(m.acked, mainLU)
		if m.cfg.Mode == SU {
			// And durable: under SU the old tail acknowledged them only
			// once persisted. Under AUSI and AU its durable
			// point comes with its next acknowledgement (it says it again
			// when FLUSH relinks it to me).
			m.dacked = max(m.dacked, mainLU)
		}
		m.state = Active
		m.advance()
		m.toMaster(Msg{Type: MsgFlushAck, Epoch: msg.Epoch})
		return
	}
	if msg.Joiner != me && m.state != Active {
		return
	}
	if msg.Joiner != me && len(m.held) > 0 {
		m.deferredFlush = &msg
		return
	}
	m.raise(msg.Epoch)
	pred, succ := neighbours(msg.Members, me)
	predChanged := pred != m.pred
	if predChanged {
		m.pred, m.predEpoch = pred, m.epoch
	}
	if succ != m.succ {
		m.succ, m.succEpoch = succ, m.epoch
	}
	if msg.Joiner == me {
		// First arrival: start the temporary store, forward FLUSH to the
		// head of the old chain with my pre-copy end, which the old tail's
		// log flush starts after (digest §7.7).
		m.state = Joining
		if m.pred == 0 {
			m.becomeHead()
		}
		fwd := msg
		fwd.Seq = m.lu
		m.flushEnd = m.lu
		m.send(msg.Path[1], fwd)
		return
	}
	i := 1
	for i < len(msg.Path)-1 && msg.Path[i] != me {
		i++
	}
	if i == len(msg.Path)-2 && !(mutation.On && m.mut.skipFlush) {
		// The old tail: push what the joiner's pre-copy missed, then FLUSH.
		// If this member compacted past the joiner's pre-copy end (it became
		// the tail after the joiner last asked it, or never served it), a
		// snapshot goes first (compact.go).
		if msg.Seq < m.base.seq {
			if _, ok := m.sm.(Snapshotter); !ok {
				// FLUSH waits for the host's capture (SendSnapshot); the new
				// predecessor's queue is replayed now, before anything it sends
				// next (whatever it adds goes into the log flush too).
				m.flushWait = &msg
				m.send(m.cfg.ID, Msg{Type: MsgSnapshotNeeded, Target: msg.Joiner, Done: true})
				m.replayPending(pred, predChanged)
				return
			}
		}
		m.logFlush(msg, nil)
	}
	m.send(msg.Path[i+1], msg)
	m.replayPending(pred, predChanged)
	if predChanged && m.pred != 0 && m.cfg.Mode != SU {
		// The new predecessor has neither LA nor DA from me: what I
		// acknowledged before went to the old one. Say both again, or a
		// durable point reached before the relink would reach the head
		// only with the next update's acknowledgement. (Under SU DA is LA
		// at every member — each log member's LA waits for its disk — and
		// the FLUSH's own rules carry LA.)
		m.sendAck()
	}
}

// logFlush sends the joiner what its pre-copy missed: the entries after its
// pre-copy end, after a snapshot if the history was compacted past it (data:
// the host's capture, at history position n; nil: the state machine's own).
func (m *Member) logFlush(msg Msg, snap *Snap) {
	from := msg.Seq
	if from < m.base.seq {
		if snap == nil {
			snap = m.snapAt(m.total(), m.sm.(Snapshotter).Snapshot())
		}
		m.send(msg.Joiner, Msg{Type: MsgFlushedUpdate, Snap: snap})
		from = snap.Seq
	}
	es, _ := m.after(from, len(m.log))
	for len(es) > 0 {
		k := min(len(es), m.cfg.PrecopyChunk)
		m.send(msg.Joiner, Msg{Type: MsgFlushedUpdate, Entries: es[:k]})
		es = es[k:]
	}
	// The join's pre-copy is over (the master runs one join at a time): the
	// log after its end went out above.
	m.pins = nil
}

// replayPending replays the queue of updates from pred, a new predecessor.
func (m *Member) replayPending(pred NodeID, predChanged bool) {
	if predChanged {
		// Digest §7.4: the queue of the *new* predecessor, replayed after
		// FLUSH went on, so the old tail's log flush holds only updates that
		// came the old way.
		q := m.pending[pred]
		m.pending = map[NodeID][]Msg{}
		for _, u := range q {
			m.Step(u)
		}
	}
}

// digest extends a running history digest (FNV-1a) by one entry.
func digest(prev, seq uint64, op []byte) uint64 {
	const prime = 1099511628211
	h := prev ^ 14695981039346656037
	for i := 0; i < 8; i++ {
		h ^= (seq >> (8 * i)) & 0xff
		h *= prime
	}
	for _, c := range op {
		h ^= uint64(c)
		h *= prime
	}
	return h
}

// Status is a member's protocol state, for tests, the invariant check and
// operators.
type Status struct {
	ID         NodeID
	State      State
	Epoch      uint64
	Pred, Succ NodeID
	LA, LU     uint64
	Log, Tmp   int
	Repairing  bool
	// Persisted is how far the host made the log durable.
	Persisted uint64
	// DA is how far every log-datastore member from here to the tail
	// persisted (at the head: how far a write asking for durability may be
	// answered; docs/design/chain.md, "Per-request durability").
	DA uint64
	// Base is how many history entries were compacted away (the log holds
	// the entries after them: Log of them).
	Base int
	// Paged: the member's host holds pages of a snapshot not yet installed
	// (Config.Paged, or a page taken since): its state is no history's,
	// whatever Base and Log say. A whole-chain restart never starts from it
	// (Master.Restarted).
	Paged bool
}

// Status returns the member's protocol state.
func (m *Member) Status() Status {
	return Status{ID: m.cfg.ID, State: m.state, Epoch: m.epoch, Pred: m.pred, Succ: m.succ,
		LA: m.la, LU: m.lu, Log: len(m.log), Tmp: len(m.tmp), Repairing: m.repairing, Persisted: m.persisted,
		Base: m.base.n, DA: m.da, Paged: m.paged}
}

// History is the member's log, the updates it applied in order after the
// compacted prefix (Base; a joiner's temporary store not included), for its
// host: entries up to LA are committed. The caller must not modify it; it is valid until the next
// Step or Tick.
func (m *Member) History() []Entry { return m.log }

// Durable returns the client request ids of the updates this member's host
// has made durable, in history order: what a crash of it leaves (nothing for
// a memory datastore).
func (m *Member) Durable() []uint64 {
	var ids []uint64
	for _, e := range m.log {
		if e.Seq > m.persisted {
			break
		}
		ids = append(ids, e.ID)
	}
	return ids
}

// sumAtN is the digest of the first n entries of the history (0 for
// none); n must be at least the compacted prefix and at most the history.
func (m *Member) sumAtN(n int) uint64 {
	if n == m.base.n {
		return m.base.sum
	}
	return m.log[n-m.base.n-1].sum
}
