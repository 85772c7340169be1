package vrshard

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/vr"
)

// chainCore is the chain engine's core as the host drives it: the pure
// chain member (internal/chain) behind the engine-neutral contract
// (core.Core), as vrCore is VR's. docs/design/chain.md, "On the replica
// host", has the mapping; in short:
//
//   - Op numbers are positions in the member's history (1, 2, ...): every
//     member's history is a prefix of its predecessor's, so a position names
//     the same update on every member. The chain's own sequence numbers
//     (sparse: epoch<<40 | n) travel in the host's log inside each entry's
//     Data (chainEntry), so a restart recovers them.
//   - Committed is the history up to the member's LA: acknowledged by its
//     successor, hence at the tail (and, under SU with log members, on
//     every member's disk). The host's state machine only ever holds
//     committed state.
//   - The head takes proposals (Info.Leader names it) and replies once a
//     write is committed and applied; the tail's update-acks, which a
//     master acting as the clients' front end would take, are dropped.
//   - A linearizable read at any active member is served once applied
//     reaches the member's LU at the time of the read: every update
//     answered before the read began passed this member (it was
//     acknowledged at the head, after every member), and nothing it
//     returns is uncommitted.
//   - The chain runs the update mode of ChainOptions.Mode (SU by default;
//     AUSI: nothing waits for a disk; AU: the head answers an async blind
//     write as soon as it took it, Ready.Acks, and commits it as any other;
//     docs/design/chain.md, "Update modes on the host"; the master refuses a
//     member whose mode is not the chain's). Each member has its datastore
//     (ChainStore, chainstore.go). A log (chain.Log, the default): the
//     host's log is its disk, Ready.Entries/PersistSeq and Persisted are the
//     core's persist/persisted, and under SU a member passes on and
//     acknowledges only what it persisted (nothing acknowledged is lost
//     while one log member's disk survives). A buffered log (chain.Buffered) or a memory member
//     (chain.Memory, its replica on an in-memory file system) acknowledges
//     what it holds; the host flushes it on an interval.
//   - Membership is the master's (chain.Master, elsewhere): its orders come
//     in through Step like any peer message; the member never decides it.
type chainCore struct {
	m      *chain.Member
	mcfg   chain.Config // the member's configuration (Members and Log as at open)
	self   uint64
	master uint64
	// chain is the configuration as last known (head first), for
	// Info.Leader on a member that is not the head, and what its
	// heartbeats report to a restarting master; chainEpoch is the epoch of
	// the master's message that named it (a repair's order, a join's
	// FLUSH, a heartbeat answer; 0: the configuration it was opened with).
	// The member's own epoch can be ahead of it (a CR_MID_REPAIR from a
	// new predecessor moves it without naming the chain), so the heartbeat
	// reports both (chainmaster.Learner).
	chain      []uint64
	chainEpoch uint64

	written int // history entries handed out in Ready.Entries
	handed  int // history entries handed out in Committed
	// bootCommit: entries of a restart's durable prefix, committed before
	// the member rejoined (its LA starts again from 0).
	bootCommit int
	truncate   *uint64 // a pending Truncate (a restart's or a rejoin's uncommitted suffix)
	// tentative is that suffix while the member waits to be joined: its
	// durable log past its commit point, kept on its disk (the Truncate
	// waits for the member's first write) and counted in its heartbeat's
	// history, so that a whole-chain restart may carry on from it (adopt):
	// the last tail may have committed it — and served reads of it — with
	// no log member's commit point saying so.
	tentative      []chain.Entry
	truncateAtBoot bool // -tags mutations: keep no tentative suffix (chainConfig)

	batches [][2]uint64 // {PersistSeq, last chain seq} written, not yet durable
	seq     uint64      // the last PersistSeq issued

	// savedCommit: the commit point the hard state last recorded. Every
	// Ready that advances it records it (Ready says why).
	savedCommit int

	// clients is kv's client table, under VR's count rule (vr.MaxClients):
	// every member drops the same records at the same op.
	clients *kv.ClientTable
	// inflight: this head's proposals with a client identity, until
	// committed, and their chain request ids (a redirect names the id).
	inflight map[idKey]uint64
	byID     map[uint64]idKey
	nextID   uint64
	lastHand []core.Committed

	// The master's lease (chainmaster): heartbeats sent (seq, when) and
	// not yet answered, and until when the last answer lets this member
	// serve. Zero Lease: no lease (tests without a master).
	beat, lease int64
	beatSeq     uint64
	beats       [][2]int64
	leaseUntil  int64
	lastBeat    int64

	rejoins int // times a lost update made this member rejoin (tests)

	// modeErr: the master's answer named another update mode than this
	// member's (ModeMismatchError); it serves and steps nothing since.
	modeErr error
	// early: this head's proposals to answer as soon as the head took them
	// (AU, async blind writes: Propose with an early AckPoint), by chain
	// request id; the core's update-ack at the head answers them
	// (Ready.Acks), the reply at commit finds no waiter.
	early map[uint64]idKey
	// auAtCommit (-tags mutations): an AU head answers its async writes at
	// commit, as SU does (the mode ignored for the answer).
	auAtCommit bool

	// outside: the master's last heartbeat answer named a chain without
	// this member (Info: removed, if it is still active: outsideStays).
	outside bool

	// Link numbering (linkGap): this incarnation's id, the last number
	// sent to each member, and what each member's link delivered.
	inc     uint64
	sendSeq map[uint64]uint64
	recv    map[uint64]*linkIn
	// linkGapOff (-tags mutations): a gap on a link is not acted on, the
	// code before the numbering.
	linkGapOff bool
	// epochGapOff (-tags mutations): an update of a newer numbering epoch
	// than the member's LU is taken whatever its number (lostUpdate), the
	// code before the host simulation ran chains.
	epochGapOff bool
	// orderConfigOff (-tags mutations): a repair or restart order's
	// configuration is not taken (orderedChain), the code before.
	orderConfigOff bool
	// posGapOff (-tags mutations): an update's position (chain.Msg.Pos)
	// is not checked against the member's history (lostUpdate), the code
	// before.
	posGapOff bool
	// mergeGapOff (-tags mutations): a joiner merges what its predecessor
	// sent during the join without checking it follows the log flush
	// (mergeGap), the code before.
	mergeGapOff bool
	// readLeaseForever (-tags mutations): the head's read lease
	// (readLease) ignores the master's lease.
	readLeaseForever bool
	// tailCommitLags (-tags mutations): a tail saves its commit point as
	// every other member does (its LA, in the Ready after the one that
	// wrote the entry: no longer fsynced with it), the code before.
	tailCommitLags bool
	// outsideStays (-tags mutations): a member the master's answer leaves
	// out stays as it is, reporting itself removed until its process
	// restarts (the code before session 25).
	outsideStays bool
	// commitLazy (-tags mutations): a member below the tail saves an
	// advanced commit point only with its next batch of entries (a log
	// member's rule before session 25, less its save after 100 ms idle).
	commitLazy bool

	// headed: this member was the head at the last Info, since the epoch
	// headSince (Info.View). viewIsEpoch (-tags mutations): Info.View is
	// the current epoch, the code before.
	headed      bool
	headSince   uint64
	viewIsEpoch atomic.Bool

	out core.Ready[chain.Msg]
}

var _ core.Core[chain.Msg] = (*chainCore)(nil)

// chainPinTimeout is how long a pre-copying joiner's position holds the
// tail's compaction back after its last request (chain.Config.PinTimeout):
// a joiner asks for chunk after chunk at once, so a silent one is dead, or
// between its pre-copy's end and FLUSH, whose log flush then carries a
// snapshot.
const chainPinTimeout = 10 * time.Second

// chainSeqBits is the chain's sequence-number split (chain.Config.SeqBits):
// the epoch a head numbered under is seq>>chainSeqBits, the host's
// Entry.View.
const chainSeqBits = 40

// chainOp is a client request as the chain replicates it: client, request
// number, then the host's operation bytes. Every member rebuilds the client
// table from it.
func appendChainOp(b []byte, req core.Request) []byte {
	b = slices.Grow(b, kv.UvarintLen(req.Client)+kv.UvarintLen(req.ReqNum)+len(req.Data))
	b = binary.AppendUvarint(b, req.Client)
	b = binary.AppendUvarint(b, req.ReqNum)
	return append(b, req.Data...)
}

func decodeChainOp(op []byte) (core.Request, error) {
	d := kv.Decoder{B: op}
	client, reqNum := d.Uvarint(), d.Uvarint()
	if d.Err != nil {
		return core.Request{}, fmt.Errorf("chain core: undecodable op (%d bytes): %w", len(op), d.Err)
	}
	return core.Request{Client: client, ReqNum: reqNum, Data: d.B}, nil
}

// chainEntry is a history entry as the host's log holds it: Data is the
// chain sequence number, then the chain op.
func chainEntry(op uint64, e chain.Entry) (core.Entry, error) {
	req, err := decodeChainOp(e.Op)
	if err != nil {
		return core.Entry{}, err
	}
	req.Data = binary.AppendUvarint(make([]byte, 0, len(e.Op)+binary.MaxVarintLen64), e.Seq)
	req.Data = append(req.Data, e.Op...)
	return core.Entry{View: e.Seq >> chainSeqBits, Op: op, Request: req}, nil
}

func fromLogEntry(e core.Entry) (chain.Entry, error) {
	d := kv.Decoder{B: e.Data}
	seq := d.Uvarint()
	if d.Err != nil || seq == 0 {
		return chain.Entry{}, fmt.Errorf("chain core: log entry %d holds no chain sequence number", e.Op)
	}
	return chain.Entry{Seq: seq, Op: d.B}, nil
}

// nopSM is the chain member's state machine: the host applies committed
// entries itself (Ready.Committed), so the member's own apply, which runs
// at receipt, only records that it happened. Reads never reach it: the
// host serves them (ReadStates).
type nopSM struct{}

func (nopSM) Apply(uint64, []byte) []byte { return nil }
func (nopSM) Read([]byte) []byte          { return nil }

// ChainOptions makes a replica a chain member (Options.Chain).
type ChainOptions struct {
	// Master is the chain master's node id (internal/chainmaster), outside
	// the chain and a peer on the transport — or, with Masters, an id
	// outside the chain that stands for whichever of them acts.
	Master uint64
	// Masters, if set, are the nodes of the metadata group, each running a
	// hosted master of which only the metadata leader's acts
	// (chainmaster.Config.Meta). The member sends what it sends Master to
	// every one of them (the others drop it: heartbeats, order answers —
	// a few small messages each Heartbeat) and takes what any of them
	// sends as Master's: no redirect to follow, and a new leader's master
	// hears the members at once.
	Masters []uint64
	// MastersFollowMap: Masters is only where the member starts; the
	// node replaces the list (Replica.SetChainMasters) whenever its map of
	// the cluster names other metadata members (kefir cluster replace-node
	// or remove-node of one), and a master's message from a node not on
	// the list — one the member's map does not know as a metadata member
	// yet — is dropped rather than refused (a chain group of a cluster of
	// several groups; docs/design/chain.md "A chain in a cluster of
	// groups").
	MastersFollowMap bool
	// LocalMaster, if set, is this node's own hosted master (the node is
	// one of Masters): what the member sends the master is handed to it
	// directly, and the other members' messages for the master that reach
	// this node's chain group are passed to it.
	LocalMaster func([]chain.Msg)
	// Heartbeat is how often the member tells the master it is alive,
	// Lease how long after one the master's answer lets it serve (defaults
	// chainmaster's: 50 ms, 500 ms). The master's FailAfter must exceed
	// Lease.
	Heartbeat, Lease time.Duration
	// Store is this member's datastore (default: a log, fsynced before it
	// acknowledges); Flush a buffered or memory member's fsync interval
	// (default DefaultChainFlush). Each member has its own: a chain may mix
	// them (M-D, D-M-D, ...).
	Store ChainStore
	Flush time.Duration
	// NoLogMember: the chain has no log member by configuration (memory and
	// buffered members only; kefir server --chain-log-member=false), so a
	// `sync` write is answered once every member's store holds it (a
	// vacuous durable point, the loss table's rows for such chains). Zero,
	// the default: some configured member is a log, and this member — a
	// memory or buffered one too — knows it from the start
	// (chain.Config.HadLog): it answers no `sync` write before a log
	// member's disk holds it, even if it never heard from one (design/
	// chain.md, "A sync answer needs a disk").
	NoLogMember bool
	// PrecopyRate paces this member's pre-copy when it joins, in bytes a
	// second of snapshot pages and log entries (chain.Config.PrecopyRate;
	// 0: DefaultPrecopyRate, negative: unpaced): the tail serving it and
	// this member's disk keep most of their capacity for the chain's
	// traffic. SnapshotPage is the size of a snapshot page it is served
	// by this member as a tail (0: DefaultSnapshotPage).
	PrecopyRate  int64
	SnapshotPage int
	// Mode is the chain's update mode (chain.Mode: SU, the default, AUSI or
	// AU; docs/design/chain.md, "Update modes on the host"), the same on
	// every member and on the master (chainmaster.Config.Mode), which
	// refuses a member whose heartbeats name another.
	Mode chain.Mode
}

// DefaultPrecopyRate paces a joiner's pre-copy (ChainOptions.PrecopyRate):
// 16 MiB/s, a 200 MB state in about 13 s; docs/design/chain.md, "Joins
// under load", has what it costs at which rate.
const DefaultPrecopyRate = 16 << 20

func (o *ChainOptions) precopyRate() int64 {
	switch {
	case o == nil || o.PrecopyRate == 0:
		return DefaultPrecopyRate
	case o.PrecopyRate < 0:
		return 0
	}
	return o.PrecopyRate
}

func (o *ChainOptions) snapshotPage() int {
	if o == nil || o.SnapshotPage <= 0 {
		return DefaultSnapshotPage
	}
	return o.SnapshotPage
}

// DefaultSnapshotPage is a snapshot page's size (ChainOptions.SnapshotPage):
// a few milliseconds of the joiner's driver to write, and of the tail's
// reader to scan.
const DefaultSnapshotPage = 1 << 20

// chainConfig is how a chain member is configured on the host.
type chainConfig struct {
	Self, Master uint64
	// Members is the chain at its creation, head first.
	Members []uint64
	// Heartbeat is how often the member tells the master it is alive;
	// Lease how long after sending one the master's answer lets it serve
	// (nanoseconds; zero: no heartbeats and no lease, for tests that drive
	// the master by hand). The master's FailAfter must exceed Lease.
	Heartbeat, Lease int64
	// Inc is this incarnation's id on its links to the other members
	// (zero: a random one).
	Inc uint64
	// Store is the member's datastore (chain.Config.Store; zero: a log).
	Store ChainStore
	// HadLog: the chain has a log member by configuration
	// (chain.Config.HadLog; ChainOptions.NoLogMember's negation).
	HadLog bool
	// PrecopyRate is chain.Config.PrecopyRate (bytes a second; 0: none).
	PrecopyRate int64
	// Mode is the chain's update mode (chain.Config.Mode).
	Mode chain.Mode
	// commitIgnoresEngine (-tags mutations): a restart's committed prefix
	// is the saved commit point alone, the code before (core.Boot.Applied
	// ignored).
	commitIgnoresEngine bool
	// truncateAtBoot (-tags mutations): no tentative suffix is kept
	// (chainCore.tentative), the code before.
	truncateAtBoot bool
	// lostStateReplays (-tags mutations): a lost state pre-copies the log
	// after its checkpoint (or from the start) over what its engine holds
	// (openChain), the code before review34a.
	lostStateReplays bool
}

// openChain starts a chain core from what the host's disk holds. The
// group's first start (Bootstrap) is a member of the initial chain. Any
// later start rejoins as a joiner holding the committed prefix of its log
// (entries up to the hard state's commit point, perhaps none; the rest is
// truncated: it may never have reached the tail); the master orders its
// join when it hears from it. A disk that lost state rejoins the same way
// holding none of its log (its checkpoint, if any, is committed state).
func openChain(cfg chainConfig, st core.Boot) (*chainCore, error) {
	if cfg.Master == 0 || slices.Contains(cfg.Members, cfg.Master) {
		return nil, fmt.Errorf("chain core: master %d must be a node outside the chain %v", cfg.Master, cfg.Members)
	}
	// A lost state (a new or wiped disk, or a member killed during its
	// rejoin, whose recovery mark is still on disk) promises nothing:
	// every update it acknowledged is on the members it passed it to. It
	// joins holding nothing of its log (below) — never Active on its own —
	// its pre-copy starting from the tail's first entry or a snapshot. A
	// checkpoint it holds is kept: a member checkpoints only committed
	// state, which no repair takes back.
	inc := cfg.Inc
	for inc == 0 {
		inc = rand.Uint64()
	}
	c := &chainCore{self: cfg.Self, master: cfg.Master, chain: slices.Clone(cfg.Members),
		beat: cfg.Heartbeat, lease: cfg.Lease,
		clients: kv.NewClientTable(vr.MaxClients), inflight: map[idKey]uint64{}, byID: map[uint64]idKey{},
		inc: inc, sendSeq: map[uint64]uint64{}, recv: map[uint64]*linkIn{}, early: map[uint64]idKey{},
		truncateAtBoot: mutation.On && cfg.truncateAtBoot}
	ccfg := chain.Config{ID: chain.NodeID(cfg.Self), Master: chain.NodeID(cfg.Master), SeqBits: chainSeqBits,
		Mode: cfg.Mode, Store: cfg.Store.core(), PinTimeout: int64(chainPinTimeout), PrecopyRate: cfg.PrecopyRate,
		HadLog: cfg.HadLog}
	if st.Bootstrap {
		if !slices.Contains(cfg.Members, cfg.Self) {
			return nil, fmt.Errorf("chain core: %d is not in the chain %v", cfg.Self, cfg.Members)
		}
		for _, id := range cfg.Members {
			ccfg.Members = append(ccfg.Members, chain.NodeID(id))
		}
		c.m, c.mcfg = chain.NewMember(ccfg, nopSM{}), ccfg
		return c, nil
	}
	// A checkpoint (the host's snapshot) holds the history's first snap
	// entries; the log goes on after it.
	snap := 0
	if st.Snapshot != nil {
		snap = int(st.Snapshot.Op)
		c.clients.Load(st.Snapshot.Clients)
	}
	// Committed: up to the saved commit point, or as far as the engine
	// applied, if further — the host applies only committed entries. A
	// member below the tail writes its commit point before it applies
	// (Ready), but only the next batch's fsync makes the write durable:
	// after a power cut the engine's files may hold appends past it (the
	// OS flushes them in its own order). Without this such a member would
	// restart with an engine holding versions its log dropped, which no
	// read could wait out.
	commit := st.HardState.Commit
	if !(mutation.On && cfg.commitIgnoresEngine) {
		commit = max(commit, st.Applied)
	}
	n := int(min(commit-min(commit, uint64(snap)), uint64(len(st.Entries))))
	if st.LostState {
		n = 0 // nothing of the log is known to be committed
	}
	for i, e := range st.Entries[:n] {
		if e.Op != uint64(snap+i+1) {
			return nil, fmt.Errorf("chain core: log entry %d at position %d", e.Op, snap+i+1)
		}
		ce, err := fromLogEntry(e)
		if err != nil {
			return nil, err
		}
		ccfg.Log = append(ccfg.Log, ce)
	}
	if n < len(st.Entries) {
		t := uint64(snap + n)
		c.truncate = &t
		if !st.LostState && !(mutation.On && c.truncateAtBoot) {
			for i, e := range st.Entries[n:] {
				ce, err := fromLogEntry(e)
				if e.Op != uint64(snap+n+i+1) || err != nil {
					break // only what follows the committed prefix in order (the truncation drops it all)
				}
				c.tentative = append(c.tentative, ce)
			}
		}
	}
	if snap > 0 {
		// The sequence number at the snapshot: kept with it on disk
		// (core.Snapshot.Number, chainCore.NumberAt). A checkpoint written
		// by a build before the number lacks it: the entry after it tells
		// it closely enough (no history entry lies between the two);
		// without one it is unknown (0): the member reports lu 0, which a
		// whole-chain restart compares by length (chain.Master's
		// upToDate), and as a joiner asks its tail for a snapshot.
		ccfg.BaseN = snap
		switch {
		case st.Snapshot.Number != 0:
			ccfg.BaseSeq = st.Snapshot.Number
		case len(ccfg.Log) > 0:
			ccfg.BaseSeq = ccfg.Log[0].Seq - 1
		}
	}
	c.mcfg = ccfg
	if st.LostState && st.StateTop > 0 && !(mutation.On && cfg.lostStateReplays) {
		// A lost state whose engine holds records: pages of a snapshot a
		// crash cut short (the recovery mark of a crash mid-pages: over a
		// checkpoint, or on a disk it started empty), or what a lost
		// engine kept. Its state is no history's: a prefix of the pages
		// over the checkpoint. A pre-copy of the log after the checkpoint
		// (or from the start) would replay over the pages — the applier
		// takes every op below the engine's newest version as already
		// there (replayTo), and the writes since the checkpoint to keys
		// outside the pages would never reach the engine — so it asks for
		// a snapshot (chain.Config.Paged: precopyReq's Any), which
		// replaces that state (TestChainRestartMidPagesAsksForASnapshot).
		// Until then it takes no RESTART, and its heartbeats say so (Any):
		// a whole-chain restart never starts from it (chain.Master's
		// Restarted; TestChainRestartNeverFromAMemberMidPages). Only this
		// member: a later rejoin's holds its history's state (c.mcfg).
		ccfg.Paged = true
	}
	c.m = chain.NewMember(ccfg, nopSM{})
	c.written, c.bootCommit, c.handed, c.savedCommit = snap+n, snap+n, snap, snap+n
	return c, nil
}

func (c *chainCore) status() chain.Status { return c.m.Status() }

// isHead: this member takes proposals (an active or joining member without
// a predecessor: a joining head takes updates into its temporary store).
func (c *chainCore) isHead() bool {
	s := c.status()
	return s.Pred == 0 && (s.State == chain.Active || s.State == chain.Joining)
}

func (c *chainCore) Step(_ int64, m chain.Msg) {
	switch m.Type {
	case chain.MsgPersist, chain.MsgPersisted:
		return // between a member and its own host only (Persisted)
	case chain.MsgHeartbeat:
		if uint64(m.From) == c.master {
			c.heartbeatAnswer(m)
		}
		return
	}
	if c.modeErr != nil {
		return // refused by the master: takes no part in the chain
	}
	if uint64(m.From) != c.master && m.LinkSeq != 0 {
		gapped, stale := c.linkGap(m)
		if stale {
			return
		}
		if gapped && c.carriesUpdates(m) {
			c.recv[uint64(m.From)].gapped = false
			c.rejoin(fmt.Sprintf("%s from %d: a message before it on the link (number %d) was lost", m.Type, m.From, m.LinkSeq))
			return
		}
	}
	switch m.Type {
	case chain.MsgRestart:
		c.adopt()
		c.orderedChain(m)
	case chain.MsgUpdate:
		if c.lostUpdate(m) {
			c.rejoin(fmt.Sprintf("update %s (position %d) from %d after %s (position %d): an update was lost on the link",
				chain.FormatSeq(m.Seq), m.Pos, m.From, chain.FormatSeq(c.status().LU), c.total()))
			return
		}
	case chain.MsgCRHead, chain.MsgCRMid, chain.MsgCRTail:
		// A repair's new configuration, which its order names (a master of
		// a build before names none: learnt from the heartbeat answers).
		c.orderedChain(m)
	case chain.MsgTruncate:
		c.orderedChain(m)
		c.m.Step(m)
		c.truncated()
		return
	case chain.MsgFlush:
		// A join's new configuration, before the master's next heartbeat
		// answer says so (Info.Leader).
		c.orderedChain(m)
		if c.status().State == chain.Joining {
			n := len(c.m.History())
			c.m.Step(m)
			if c.status().State == chain.Active {
				if why := c.mergeGap(n); why != "" {
					c.rejoin(why)
				}
			}
			return
		}
	}
	c.m.Step(m)
}

// restartReport is what a member waiting to be joined reports to a master
// restarting the whole chain (chain.Master.Restarted): the number of its
// history's last update and its length, its tentative suffix included.
func (c *chainCore) restartReport() (lu uint64, length int) {
	s := c.status()
	lu, length = s.LU, s.Base+s.Log+len(c.tentative)
	if n := len(c.tentative); n > 0 {
		lu = c.tentative[n-1].Seq
	}
	return lu, length
}

// adopt makes a member ordered to restart the whole chain (RESTART) take
// its tentative suffix as history before it does: the master chose it for
// the history its heartbeats reported, suffix included (chain.Master's
// upToDate), and the suffix may hold updates the last tail committed and
// served reads of before every member failed — a memory tail's commit dies
// with it, and its acknowledgements may not have reached a log member's
// commit point (D-D-M). Taking an update nobody was answered for as
// committed is a valid outcome of it; dropping one a read returned is not.
// Only a member that has not started a pre-copy has a suffix left (its
// first write truncated it), which is the member the core's restart takes.
func (c *chainCore) adopt() {
	if len(c.tentative) == 0 || c.status().State != chain.Inactive {
		return
	}
	hist := c.m.History()
	bn, bseq := c.m.Base()
	cfg := c.mcfg
	cfg.Members, cfg.Log = nil, append(slices.Clone(hist), c.tentative...)
	cfg.BaseN, cfg.BaseSeq = bn, bseq
	if bn > 0 && bseq == 0 && len(hist) == 0 {
		cfg.BaseSeq = cfg.Log[0].Seq - 1 // as openChain: the entry after the checkpoint tells its number
	}
	c.m = chain.NewMember(cfg, nopSM{})
	// The disk may hold more than the suffix (a rejoin kept only what was
	// fsynced): the log ends where the history does.
	c.written = bn + len(cfg.Log)
	t := uint64(c.written)
	c.truncate, c.tentative = &t, nil
}

// mergeGap checks the entries a joiner's merge (its FLUSH's second
// arrival) appended after the n it held: what its new predecessor sent
// while it joined must follow the log flush without a hole, by lostUpdate's
// rule (the next number in the same numbering epoch, else the first of a
// newer one). The link numbering cannot see a loss there: the joiner may
// never have heard from its new predecessor before, so the first update it
// gets from it sets the link's baseline, and it is not active yet, so
// lostUpdate does not look; a lost first update would be merged over
// (its successor rejoins on the relay, but the joiner, the tail once the
// master repairs around it, holds neither it nor — for its reads — its
// write, which the head answers when the tail acknowledges the next).
func (c *chainCore) mergeGap(n int) string {
	if mutation.On && c.mergeGapOff {
		return ""
	}
	hist := c.m.History()
	_, prev := c.m.Base()
	if n > 0 {
		prev = hist[n-1].Seq
	}
	for _, e := range hist[min(n, len(hist)):] {
		if prev != 0 && !seqFollows(prev, e.Seq) {
			return fmt.Sprintf("update %s merged after %s: an update from the predecessor was lost during the join",
				chain.FormatSeq(e.Seq), chain.FormatSeq(prev))
		}
		prev = e.Seq
	}
	return ""
}

// linkIn is what a member's link to this one delivered: the sender's
// incarnation, the last number taken, and whether a number was skipped
// since this member last rejoined over it.
type linkIn struct {
	inc, seq uint64
	gapped   bool
}

// linkGap checks m's place on its sender's link (chain.Msg.LinkSeq). The
// node transport does not give the chain the reliable FIFO links it
// assumes: it drops a message when a peer's queue overflows, loses what was
// in flight when a connection breaks and is re-dialled, and the host drops
// a message queued behind a large one past maxHeld (snapshot.go). lostUpdate
// catches a lost update within a head's numbering epoch, but not one across
// a head change (the first of a new epoch) nor a lost log-flush entry
// (MsgFlushedUpdate) to a joiner, which would then merge with a gap. The
// sender's host numbers its messages to each member from 1 per incarnation
// (Ready), so any loss shows as a skipped number: gapped. A number at or
// below the last one taken from the same incarnation is stale — sent before
// one already taken (a late delivery from a broken connection) — and is
// dropped: taking it now would break the link's order. A new incarnation
// (the sender restarted) starts over at 1, and the first message ever heard
// from a sender sets the baseline (this member may be the one that
// restarted): a loss among those first messages is not seen here.
func (c *chainCore) linkGap(m chain.Msg) (gapped, stale bool) {
	from := uint64(m.From)
	l := c.recv[from]
	switch {
	case l == nil:
		c.recv[from] = &linkIn{inc: m.LinkInc, seq: m.LinkSeq}
		return false, false
	case l.inc != m.LinkInc:
		*l = linkIn{inc: m.LinkInc, seq: m.LinkSeq, gapped: m.LinkSeq != 1}
	case m.LinkSeq <= l.seq:
		return l.gapped, true
	default:
		l.gapped = l.gapped || m.LinkSeq != l.seq+1
		l.seq = m.LinkSeq
	}
	return l.gapped, false
}

// carriesUpdates reports whether taking m after a gap on its link could
// leave this member's history with a hole: an update from its predecessor
// (or a joiner's relay) or a log-flush entry, and at a joiner also the FLUSH
// coming back round from the old tail, which merges what the joiner holds
// (the log-flush entries that went before it on the same link may be what
// was lost). And a FLUSH from this member's predecessor: a join just before
// it, whose joiner takes from this member's log what the predecessor sent
// before the FLUSH; an update lost on the way would never reach the joiner,
// and the predecessor's next update, to the joiner on a link with no
// history, is the first of a numbering epoch when a head change came
// between (lostUpdate cannot tell), so the joiner would take it over the
// hole (the host simulation found it, chain_host_sim_test.go:
// TestChainLinkNumberingFindsLostMessages "flush after a lost update").
// What else a member sends another is cumulative
// (acknowledgements) or re-sent by the master until answered (orders and
// their answers), and a pre-copy chunk answers a request that resumes after
// what the joiner holds.
func (c *chainCore) carriesUpdates(m chain.Msg) bool {
	if mutation.On && c.linkGapOff {
		return false
	}
	switch m.Type {
	case chain.MsgUpdate, chain.MsgFlushedUpdate:
		return true
	case chain.MsgFlush:
		st := c.status()
		return st.State != chain.Active || m.From == st.Pred
	}
	return false
}

// lostUpdate reports whether update m from the predecessor shows that one
// before it never arrived. A head numbers its updates one after another
// within its numbering epoch (seq>>chainSeqBits), every member passes them
// on in order, and a repair re-sends from what the successor holds, so an
// active member's next update from its predecessor in the same epoch is
// always LU+1. The chain assumes reliable links; the node transport drops a
// message when a peer's queue overflows or a connection is re-dialled.
// Across numbering epochs (a new head) the next update is the first the
// new head numbered (n = 1): a head numbers from its epoch's base, and every
// member passes on, and a repair re-sends, in order, so a member that holds
// nothing of a newer epoch takes its first update first; any other number
// is a gap. The link numbering (linkGap) cannot see that one when the link
// is new to the receiver — a joiner's first update from its new
// predecessor, or a restarted member's — and the first update is what was
// lost (the host simulation found both, chain_host_sim_test.go). An active
// member holding nothing (LU 0) has been in the chain since before its
// first update, so its first is n = 1 too; any other is a gap — also what
// a wiped disk started as a member (--bootstrap) sees, which must not
// serve from an empty history.
//
// The numbers alone miss every update of a whole numbering epoch lost, the
// next epoch's first arriving — and the link numbering misses it too when
// those were the first messages the link ever carried to this member (the
// first sets the baseline: linkGap). The host simulation's seeds 491 and
// 634 of KEFIR_SIM_SEEDS=800: a partition took an old head's first four
// updates between the middle and the tail, the head failed, the middle
// became the head and numbered 1.1 at position 5, and the tail, holding
// nothing, took it at position 1 — the head then committed its four over
// the tail's acknowledgement. So the sender's host says where an update
// sits in its history (chain.Msg.Pos: every member's history is a prefix
// of its predecessor's, so a position names the same update everywhere),
// and an active member takes an update from its predecessor only right
// after its own history's end: a check per update, on no link's state,
// so a restarted receiver or sender changes nothing in it.
func (c *chainCore) lostUpdate(m chain.Msg) bool {
	s := c.status()
	if s.State != chain.Active || m.From != s.Pred || m.From == chain.NodeID(c.master) || m.Seq <= s.LU {
		return false
	}
	if m.Pos != 0 && m.Pos != uint64(c.total())+1 && !(mutation.On && c.posGapOff) {
		return true
	}
	if mutation.On && c.epochGapOff && s.LU != 0 && m.Seq>>chainSeqBits != s.LU>>chainSeqBits {
		return false
	}
	return !seqFollows(s.LU, m.Seq)
}

// seqFollows reports whether an update numbered seq comes right after one
// numbered prev (0: none yet) in a member's history: the next number in
// prev's numbering epoch, or the first of a newer one (a new head numbers
// from its epoch's base; lostUpdate).
func seqFollows(prev, seq uint64) bool {
	if seq>>chainSeqBits != prev>>chainSeqBits {
		return seq&(1<<chainSeqBits-1) == 1
	}
	return seq == prev+1
}

// rejoin makes this member a joiner again after a lost update: it keeps
// its committed history (the host applied it; it is a prefix of every
// replica's), truncates the rest from its log, and stops serving; its next
// heartbeat says it is not a replica, so the master repairs the chain
// around it and joins it again (chainmaster), its pre-copy resuming after
// what it kept. Waiting writes end with the configuration change.
func (c *chainCore) rejoin(why string) {
	c.out.Errors = append(c.out.Errors, fmt.Errorf("chain member %d: %s; rejoining the chain", c.self, why))
	hist := c.m.History()
	bn, bseq := c.m.Base()
	n := c.handed
	persisted := c.status().Persisted
	cfg := c.mcfg
	cfg.Members, cfg.Log = nil, slices.Clone(hist[:n-bn])
	cfg.BaseN, cfg.BaseSeq = bn, bseq
	c.m = chain.NewMember(cfg, nopSM{})
	if bn+len(hist) > n && c.truncate == nil {
		t := uint64(n)
		c.truncate = &t
		// The rest, as far as its store holds it (a log's: what it
		// persisted; a memory member's: what it holds), is tentative, as
		// at a restart: the chain may have committed it. (A truncation
		// still pending means nothing was written since the last one:
		// its suffix is the one on the disk.)
		keep := hist[n-bn:]
		if c.mcfg.Store != chain.Memory {
			keep = keep[:sort.Search(len(keep), func(i int) bool { return keep[i].Seq > persisted })]
		}
		if !(mutation.On && c.truncateAtBoot) {
			c.tentative = slices.Clone(keep)
		}
	}
	c.written, c.bootCommit, c.savedCommit = n, n, n
	c.batches = nil // the old member's persistence reports mean nothing to the new one
	// Unanswered heartbeats of the old incarnation would otherwise let a
	// late answer to one restore the lease (and eventual reads) of a member
	// that is no longer a replica.
	c.leaseUntil, c.beats = 0, nil
	clear(c.early) // no longer the head: answered at commit, if at all
	c.rejoins++
}

func (c *chainCore) chainIDs() []chain.NodeID {
	ids := make([]chain.NodeID, len(c.chain))
	for i, id := range c.chain {
		ids[i] = chain.NodeID(id)
	}
	return ids
}

// orderedChain takes the configuration a master's order m names (its
// Members, at its epoch: chain.Master puts it on every CR_HEAD, CR_MID,
// CR_TAIL and RESTART; a FLUSH's as the members pass it on) if it is news:
// not older than the member's epoch nor than the configuration it holds.
// Learnt only from the master's heartbeat answers, the configuration lagged
// the epoch whenever those answers were lost: the host simulation's AUSI
// D-D-D seed 501 (a CR_TAIL at epoch 2 made member 1 the tail alone, its
// answers were cut off, the master restarted, learnt "[1 3] at epoch 2"
// from member 1's heartbeats and let member 3, cut off since epoch 1 and
// nine updates behind, serve linearizable reads) and AUSI D-Mb-D seed 299.
func (c *chainCore) orderedChain(m chain.Msg) {
	if len(m.Members) == 0 || m.Epoch < c.status().Epoch || m.Epoch < c.chainEpoch {
		return
	}
	if mutation.On && c.orderConfigOff && m.Type != chain.MsgFlush {
		return // the code before: a repair's configuration learnt from the answers only
	}
	c.setChain(m.Members)
	c.chainEpoch = m.Epoch
}

// truncated: a TRUNCATE made this member, the old tail, stop (Removed:
// only a truncation does, for good). A configuration that lists it last —
// the TRUNCATE's own, or a heartbeat answer's sent before the master's
// TRUNCATE_ACK, which may come after the TRUNCATE — loses it at that ack,
// at the same epoch: it reports that one. Otherwise a master restarting
// before it answered any heartbeat since learnt the chain with the old tail
// in it — which serves nothing and never fails — and repaired the chain
// towards it once the real tail failed, a repair it never answers. Only a
// configuration known at the member's epoch (the truncation's, or later)
// is cut so: an older one need not be the master's at that epoch.
func (c *chainCore) truncated() {
	n := len(c.chain)
	if c.status().State != chain.Removed || c.chainEpoch < c.status().Epoch || n < 2 || c.chain[n-1] != c.self {
		return
	}
	c.chain = c.chain[:n-1]
}

func (c *chainCore) setChain(ms []chain.NodeID) {
	c.chain = c.chain[:0]
	for _, id := range ms {
		c.chain = append(c.chain, uint64(id))
	}
}

// EventualUntil is until when this member may serve eventual reads (the
// host's clock; Ready.EventualUntil): its lease. A member in the chain receives every update
// soon after the head; one the master gave up on stops at its lease's end.
func (c *chainCore) EventualUntil() int64 {
	if c.lease == 0 {
		return math.MaxInt64
	}
	return c.leaseUntil
}

// heartbeatAnswer: the master counts this member in the chain m.Members:
// the lease runs from when the answered heartbeat was sent.
//
// An answer from an epoch below this member's is refused (no lease, no
// configuration): it comes from a master that restarted from a stale
// configuration and has not yet learnt the current one from the members'
// heartbeats (chainmaster), and its idea of the chain — a member it
// believes is in it — is not the chain's.
func (c *chainCore) heartbeatAnswer(m chain.Msg) {
	if c.modeErr != nil {
		return
	}
	if mode, ok := chain.ModeFromWire(m.Token); ok && mode != c.mcfg.Mode {
		// The chain runs another mode (the master's, the chain's
		// configuration): this member's answers and acknowledgements would
		// follow another rule than its neighbours'. It stops taking part —
		// no lease, no chain message stepped — until restarted with the
		// chain's mode; the master no longer counts it alive and repairs
		// the chain around it.
		c.modeErr = &ModeMismatchError{Member: c.self, Mode: c.mcfg.Mode, Chain: mode}
		c.out.Errors = append(c.out.Errors, c.modeErr)
		c.leaseUntil, c.beats = 0, nil
		return
	}
	if m.Epoch < c.status().Epoch {
		return
	}
	// An answer that does not list this member grants nothing: the master
	// repaired the chain around it (it failed it while it was alive: slow,
	// paused, cut off — or it counts every member failed and waits for them
	// to restart) and tells it so. An active member then rejoins as a new
	// member, as after a lost update: a joiner holding its committed
	// history, which its heartbeats report, so the master joins it again —
	// or, with the chain down, counts it as restarted (chain.Master.Restarted)
	// — with no process restart. A truncated old tail (Removed) stays out:
	// the chain is at its length without it, and joining it again would
	// truncate another. So does a joiner whose flush a failure aborted
	// (Joining: it saw the FLUSH, which the master's configuration listed
	// it in; one at that epoch or later without it says the master fenced
	// it): without this it stayed out until its process restarted — a
	// replace-node of a chain's head that was SIGKILLed while the new node
	// flushed never finished.
	in := slices.Contains(m.Members, chain.NodeID(c.self))
	c.outside = !in
	if st := c.status().State; !in && (st == chain.Active || st == chain.Joining) && !(mutation.On && c.outsideStays) {
		c.rejoin(fmt.Sprintf("the master's configuration %v (epoch %d) leaves it out: it was failed while alive (or its join aborted)", m.Members, m.Epoch))
		return
	}
	for len(c.beats) > 0 && uint64(c.beats[0][0]) <= m.Seq {
		if uint64(c.beats[0][0]) == m.Seq && in {
			c.leaseUntil = max(c.leaseUntil, c.beats[0][1]+c.lease)
		}
		c.beats = c.beats[1:]
	}
	if m.Epoch >= c.chainEpoch {
		c.setChain(m.Members)
		c.chainEpoch = m.Epoch
		c.truncated()
	}
}

// readLease is the lease under which the host serves a member's
// linearizable reads off its driver (Replica.TryRead, chainRead): what Read
// grants a read one at a time — an active member under the master's lease,
// answering once it applied its whole history (Index: every update it has
// passed on, committed) — as one standing grant, so that a read with
// nothing in flight is served at once, with no hand-off to the driver and
// back (A6: a chain of one's GETs ran at 0.61 of PING at -P 1 and 0.13 at
// -P 16 that way). The host checks Until against its clock at each read,
// as Read checks leased(now). Every active member holds one, not only the
// head: under SU and AUSI the host serves a strong read of a key that is
// clean at the member (no update to it held and not yet committed there)
// at once, CRAQ's rule (Replica.chainRead).
func (c *chainCore) readLease() core.Lease {
	if c.modeErr != nil || c.status().State != chain.Active || (c.lease != 0 && c.leaseUntil == 0) {
		return core.Lease{}
	}
	until := c.EventualUntil()
	if mutation.On && c.readLeaseForever {
		until = math.MaxInt64 // past the master's lease: a deposed head serves on
	}
	return core.Lease{Held: true, Until: until, Index: uint64(c.total())}
}

// leased reports whether the master's lease lets this member serve now.
func (c *chainCore) leased(now int64) bool { return c.lease == 0 || now < c.leaseUntil }

func (c *chainCore) Heard(int64, uint64) {}

func (c *chainCore) Tick(now int64) {
	c.m.Tick(now)
	if c.beat > 0 && now-c.lastBeat >= c.beat {
		c.lastBeat = now
		c.beatSeq++
		if len(c.beats) >= 64 {
			c.beats = c.beats[1:] // unanswered for long: the master is away
		}
		c.beats = append(c.beats, [2]int64{int64(c.beatSeq), now})
		s := c.status()
		la := s.LA
		lu := s.LU
		if s.State == chain.Inactive {
			// Not a replica: its history instead, what a master
			// restarting the whole chain compares (chain.Master.Restarted).
			var n int
			lu, n = c.restartReport()
			la = uint64(n)
		}
		c.out.Messages = append(c.out.Messages, chain.Msg{Type: chain.MsgHeartbeat, From: chain.NodeID(c.self),
			To: chain.NodeID(c.master), Seq: c.beatSeq, LA: la, LU: lu, Refused: s.State == chain.Inactive,
			// A joiner holding pages of a snapshot: its state is not the
			// history it reports, never a whole-chain restart's source.
			Any: s.State == chain.Inactive && s.Paged,
			// What a restarted master learns the chain from: this member's
			// epoch and the configuration it last heard of, with that
			// configuration's epoch (+1; 0: not said, a build before).
			Epoch: s.Epoch, Members: c.chainIDs(), ID: c.chainEpoch + 1,
			// The mode it runs: the master refuses a member of another.
			Token: c.mcfg.Mode.Wire()})
	}
}

func (c *chainCore) Propose(now int64, req core.Request, ack core.AckPoint) error {
	if c.modeErr != nil {
		return c.modeErr
	}
	// An early acknowledgement is AU's answer (the head's, on taking the
	// write); under SU and AUSI the answer is the commit (the host asks
	// for none other: Replica.ackPointFor).
	early := ack != core.AckApplied
	if early && (c.mcfg.Mode != chain.AU || req.Client == 0) {
		return fmt.Errorf("chain core: no early acknowledgement (%v) in mode %v", ack, c.mcfg.Mode)
	}
	if !c.isHead() {
		return core.ErrNotLeader
	}
	if !c.leased(now) {
		return core.ErrNotNormal // the master may have replaced this head
	}
	if req.Client != 0 {
		switch d, rec := c.clients.Check(req.Client, req.ReqNum); d {
		case kv.Stale:
			return core.ErrStaleRequest
		case kv.Duplicate:
			c.out.Replies = append(c.out.Replies, core.Reply{Client: rec.Client, ReqNum: rec.ReqNum, Op: rec.Op, Result: rec.Result})
			return nil
		}
		if _, ok := c.inflight[idKey{req.Client, req.ReqNum}]; ok {
			return nil // in flight: its reply comes at apply
		}
	}
	c.nextID++
	if req.Client != 0 {
		// (A retry of a request an earlier head ordered and this one holds
		// uncommitted gets a second entry: the client table makes it a
		// Duplicate at apply, answered with the first one's result.)
		k := idKey{req.Client, req.ReqNum}
		c.inflight[k], c.byID[c.nextID] = c.nextID, k
		if early && !(mutation.On && c.auAtCommit) {
			c.early[c.nextID] = k
		}
	}
	c.m.Step(chain.Msg{Type: chain.MsgUpdate, From: chain.NodeID(c.master), To: chain.NodeID(c.self),
		ID: c.nextID, Op: appendChainOp(nil, req)})
	return nil
}

func (c *chainCore) Persisted(seq uint64) {
	var to uint64
	for len(c.batches) > 0 && c.batches[0][0] <= seq {
		to = max(to, c.batches[0][1])
		c.batches = c.batches[1:]
	}
	if to > 0 {
		c.m.Step(chain.Msg{Type: chain.MsgPersisted, From: chain.NodeID(c.self), To: chain.NodeID(c.self), Seq: to})
	}
}

// Read: a linearizable read at an active member waits for the member's LU
// at this moment to be applied (chainCore's doc comment says why that is
// linearizable).
//
// Under the master's lease only: a member the master gave up on (and
// repaired the chain around) stops serving once its lease lapses, before
// the master declares it failed, so it never answers from a history the
// chain has moved past.
func (c *chainCore) Read(now int64, req core.ReadRequest) error {
	if c.modeErr != nil {
		return c.modeErr
	}
	if req.Kind != core.ReadLinearizable {
		return fmt.Errorf("chain core: no %v reads", req.Kind)
	}
	if c.status().State != chain.Active || !c.leased(now) {
		return core.ErrNotNormal
	}
	c.out.ReadStates = append(c.out.ReadStates, core.ReadState{Ctx: req.Ctx, Index: uint64(c.total())})
	return nil
}

// position is the op number (history position) of the update numbered seq
// in this member's history; 0 if it holds none (a joining head keeps its
// updates in its temporary store until the merge).
func (c *chainCore) position(seq uint64) uint64 {
	hist := c.m.History()
	i := sort.Search(len(hist), func(i int) bool { return hist[i].Seq >= seq })
	if i == len(hist) || hist[i].Seq != seq {
		return 0
	}
	return uint64(c.base() + i + 1)
}

// committedLen is how many history entries are committed: those up to LA,
// and a restart's durable prefix.
func (c *chainCore) committedLen(hist []chain.Entry) int {
	la := c.status().LA
	bn, _ := c.m.Base()
	n := sort.Search(len(hist), func(i int) bool { return hist[i].Seq > la })
	return max(bn+n, c.bootCommit)
}

// durableLen is how many history entries every log member from here to the
// tail persisted (the core's DA), at most those committed.
func (c *chainCore) durableLen(hist []chain.Entry) int {
	s := c.status()
	bn, _ := c.m.Base()
	n := sort.Search(len(hist), func(i int) bool { return hist[i].Seq > s.DA })
	return min(bn+n, c.committedLen(hist))
}

// total is the member's history length (op numbers: positions), its
// compacted prefix included.
func (c *chainCore) total() int {
	bn, _ := c.m.Base()
	return bn + len(c.m.History())
}

func (c *chainCore) Ready() core.Ready[chain.Msg] {
	if len(c.lastHand) > 0 {
		panic("chain core: Ready before Advance")
	}
	for _, m := range c.m.ReadyReuse() {
		switch {
		case m.Type == chain.MsgPersist:
			// The host persists every entry it is handed (below).
		case m.Type == chain.MsgSnapshotNeeded && m.Done:
			// A held FLUSH's log flush: the snapshot goes whole.
			c.out.SnapshotNeeded = append(c.out.SnapshotNeeded, uint64(m.Target))
		case m.Type == chain.MsgSnapshotNeeded:
			// A joiner's pre-copy reached below this tail's compacted
			// prefix: the host sends its state a page at a time
			// (SendSnapshot answers with each), the joiner pulling the
			// next after the last (Snap: its position and cursor).
			req := core.PageRequest{To: uint64(m.Target)}
			if p := m.Snap; p != nil {
				req.Op, req.After = uint64(p.N), p.Next
			}
			c.out.SnapshotPages = append(c.out.SnapshotPages, req)
		case m.Type == chain.MsgUpdateAck && uint64(m.To) == c.master:
			// The head answers its clients at commit — but under AU the
			// core's update-ack at the head, on taking the update, is the
			// answer of a write proposed for it (early): the host
			// acknowledges it now (Acks) and its reply at commit finds no
			// waiter.
			if k, ok := c.early[m.ID]; ok {
				delete(c.early, m.ID)
				c.out.Acks = append(c.out.Acks, core.Reply{Client: k.client, ReqNum: k.seq, Op: c.position(m.Seq)})
			}
		case m.Type == chain.MsgRedirect && uint64(m.To) == c.master && !m.Query:
			// The head refused an update (no longer the head, or out of
			// numbers until the master renews its range): not ordered.
			// (A request without a client identity has no waiter the
			// core can name: it times out, its outcome unknown.)
			if k, ok := c.byID[m.ID]; ok {
				delete(c.byID, m.ID)
				delete(c.inflight, k)
				delete(c.early, m.ID)
				c.out.Replies = append(c.out.Replies, core.Reply{Client: k.client, ReqNum: k.seq, Err: core.ErrNotLeader})
			}
		default:
			if to := uint64(m.To); to != c.master && to != 0 {
				c.sendSeq[to]++
				m.LinkInc, m.LinkSeq = c.inc, c.sendSeq[to]
				if m.Type == chain.MsgUpdate {
					// Where it sits in this member's history, which the
					// receiver's must end just before (lostUpdate); 0 for a
					// joiner's relay from its temporary store.
					m.Pos = c.position(m.Seq)
				}
			}
			c.out.Messages = append(c.out.Messages, m)
		}
	}
	if s := c.m.TakeSnapshot(); s != nil {
		c.installed(s)
	}
	hist := c.m.History()
	bn, _ := c.m.Base()
	if c.truncate != nil && (len(c.tentative) == 0 || bn+len(hist) > c.written) {
		// A tentative suffix stays on the disk until the member writes
		// after its commit point (a pre-copy, its first update): then it
		// is no longer what the member may restart the chain from.
		c.out.HasTruncate, c.out.Truncate = true, *c.truncate
		c.truncate, c.tentative = nil, nil
	}
	if bn+len(hist) > c.written {
		c.out.Entries = slices.Grow(c.out.Entries, bn+len(hist)-c.written)
		for i := c.written - bn; i < len(hist); i++ {
			e, err := chainEntry(uint64(bn+i+1), hist[i])
			if err != nil {
				c.out.Errors = append(c.out.Errors, err)
				break
			}
			c.out.Entries = append(c.out.Entries, e)
		}
		c.written = bn + len(hist)
	}
	committed := c.committedLen(hist)
	// What the hard state records as committed. A tail's host records
	// every entry it writes, with the write: at the tail an entry is
	// committed once it is on its disk, and the tail acknowledges it only
	// then — so the tail's durable prefix holds every update the chain
	// acknowledged, after a power cut too (the record is fsynced with the
	// entry), which a restart of the whole chain needs (it carries on from
	// the longest: chain.Master.Restarted). A member that just became the
	// tail (CR_TAIL, a truncation) saves at once.
	//
	// Every other member, whatever its store, saves an advanced commit
	// point (LA) with the Ready that advances it (eager). The save costs a
	// write and no fsync (a Ready with only a hard state starts none; the
	// next batch's fsync makes it durable), and it reaches the OS before the
	// replies this Ready releases (the host writes, then applies, then
	// answers): after a kill -9 of every member the head's durable prefix
	// holds every write it answered. A chain whose tail keeps no record —
	// a memory tail, D-M, D-D-M, Mb-Mb-M — has no other (the engine's
	// applied mark, counted at a restart, may lose its last appends, which
	// it buffers in the process). Chosen for every member rather than only
	// above a non-log member: a member knows nothing of the stores below
	// it (neither does the master), a repair changes what is below, and it
	// is one rule with no timer; the cost on D-D-D is a small write per
	// acknowledgement round a member takes apart from a batch, and no
	// fsync (docs/design/chain.md, "The loss table on the host").
	saved, tail := committed, false
	if s := c.status(); s.State == chain.Active && s.Succ == 0 && !(mutation.On && c.tailCommitLags) {
		saved, tail = max(committed, c.written), true
	}
	eager := !(mutation.On && c.commitLazy)
	if len(c.out.Entries) > 0 || c.out.HasTruncate || c.out.Snapshot != nil || (tail || eager) && saved > c.savedCommit {
		hs := core.HardState{View: c.status().Epoch, Commit: uint64(saved)}
		c.out.HardState = &hs
		c.savedCommit = saved
	}
	if len(c.out.Entries) > 0 || c.out.HasTruncate || c.out.Snapshot != nil {
		// A batch: its fsync covers the hard state written before it.
		c.seq++
		c.out.PersistSeq = c.seq
		_, last := c.m.Base()
		if n := len(hist); n > 0 {
			last = hist[n-1].Seq
		}
		c.batches = append(c.batches, [2]uint64{c.seq, last})
	}
	if committed > c.handed {
		c.out.Committed = slices.Grow(c.out.Committed, committed-c.handed)
	}
	for i := c.handed; i < committed; i++ {
		// The host applies its operation, not the log's encoding of it.
		h := hist[i-bn]
		req, err := decodeChainOp(h.Op)
		if err != nil {
			c.out.Errors = append(c.out.Errors, err)
			break
		}
		e := core.Entry{View: h.Seq >> chainSeqBits, Op: uint64(i + 1), Request: req}
		cm := core.Committed{Entry: e}
		if e.Client != 0 {
			k := idKey{e.Client, e.ReqNum}
			if id, ok := c.inflight[k]; ok {
				delete(c.inflight, k)
				delete(c.byID, id)
				delete(c.early, id)
			}
			if c.clients.Executed(e.Client, e.ReqNum) {
				cm.Duplicate = true
			} else {
				c.clients.Put(core.ClientRecord{Client: e.Client, ReqNum: e.ReqNum, Op: e.Op})
			}
		}
		c.out.Committed = append(c.out.Committed, cm)
		c.handed = i + 1
	}
	c.lastHand = c.out.Committed
	rd := c.out
	c.out = core.Ready[chain.Msg]{}
	// Nothing is acknowledged before it is committed: R is the commit
	// point; eventual reads run until the master's lease ends. Under AUSI
	// a commit is every member holding the update, before any disk has
	// it, so a strong read may serve only what is at the durable point
	// (CAD's read rule; docs/design/chain.md, "Strong reads at the durable
	// point"): R is DA, and a key with a committed update above it is not
	// clean. Under SU DA moves with LA; AU serves no strong read.
	rd.Durable = uint64(c.durableLen(hist))
	rd.Readable, rd.EventualUntil = uint64(committed), c.EventualUntil()
	if c.mcfg.Mode == chain.AUSI {
		rd.Readable = rd.Durable
	}
	rd.Lease = c.readLease()
	return rd
}

func (c *chainCore) Advance(results [][]byte) {
	head := c.isHead()
	if head {
		c.out.Replies = slices.Grow(c.out.Replies, len(c.lastHand))
	}
	for i, cm := range c.lastHand {
		if cm.Client == 0 {
			continue
		}
		// Every committed write is answered, not only the one the client
		// table's record names: a client with several writes in flight
		// can have two commit in one Ready (as VR's Advance does).
		res := results[i]
		rec := c.clients.Get(cm.Client)
		if !cm.Duplicate && rec != nil && rec.Op == cm.Op {
			rec.Result = res
		}
		if !head {
			continue
		}
		if cm.Duplicate {
			if rec == nil || rec.ReqNum != cm.ReqNum {
				continue // a retry of an older request: its result is gone
			}
			res = rec.Result
		}
		c.out.Replies = append(c.out.Replies, core.Reply{Client: cm.Client, ReqNum: cm.ReqNum, Op: cm.Op, Result: res})
	}
	c.lastHand = nil
}

func (c *chainCore) Info() core.Info {
	s := c.status()
	st := core.Normal
	switch {
	case c.modeErr != nil:
		st = core.Removed // refused by the master: serves nothing
	case s.State == chain.Removed || s.State == chain.Active && c.outside:
		// A truncated old tail, or a member the master's configuration
		// left out (its answers say so): serves nothing; /status says
		// "removed", so a script restarts it (bench/chain-join.sh heal).
		st = core.Removed
	case s.State != chain.Active:
		st = core.Recovering // a joiner: serves nothing yet
	}
	leader := uint64(0)
	if len(c.chain) > 0 {
		leader = c.chain[0]
	}
	head := c.isHead()
	view := s.Epoch
	if head {
		leader = c.self
		// The host reads a change of View at its leader as a lost
		// leadership and fails the writes it waits for (outcome unknown).
		// A chain's epoch moves with every reconfiguration — a join's
		// FLUSH, a repair elsewhere, a truncation, a renewed numbering
		// range — while its head goes on: its updates in flight are still
		// passed on and answered at commit. So a head reports the epoch
		// it became the head at (chain-join.sh saw every join fail the
		// head's writes in flight with "leader changed").
		if !c.headed || (mutation.On && c.viewIsEpoch.Load()) {
			c.headed, c.headSince = true, s.Epoch
		}
		view = c.headSince
	} else {
		c.headed = false
	}
	tail := uint64(0)
	if len(c.chain) > 0 {
		tail = c.chain[len(c.chain)-1]
	}
	if s.State == chain.Active && s.Succ == 0 {
		tail = c.self // by its own links: it passes nothing on
	}
	return core.Info{Self: c.self, Status: st, View: view, Leader: leader, IsLeader: head,
		FirstOp: uint64(c.base() + 1), LastOp: uint64(c.total()), Commit: uint64(c.handed), Tail: tail, Epoch: s.Epoch}
}

func (c *chainCore) ClientTable() []core.ClientRecord { return c.clients.Entries() }

// NumberAt is the sequence number of the history's entry at position op
// (core.Numberer), which the host keeps with a checkpoint at op: a member
// restarting from a checkpoint with no entry after it then knows its last
// update's number, and so its numbering epoch, which a whole-chain restart
// compares (chain.Master's upToDate). 0: unknown (op outside the history,
// or its compacted prefix's number unknown: a restart from a checkpoint of
// a build before the number). At the compacted prefix's end the number may
// be one its history took without an entry (openChain's and a restart's:
// the base of the epoch whose first update follows), which stands for the
// history's end as well: no update lies between the two.
func (c *chainCore) NumberAt(op uint64) uint64 {
	bn, bseq := c.m.Base()
	hist := c.m.History()
	switch {
	case op == uint64(bn):
		return bseq
	case op > uint64(bn) && op <= uint64(bn+len(hist)):
		return hist[op-uint64(bn)-1].Seq
	}
	return 0
}

func (c *chainCore) ClientTableMinOp() (op uint64, ok bool) { return c.clients.MinOp() }

// CompactPoint is where Compact should cut after a checkpoint at op: keep
// keepEntries entries up to op, and of those only as many as hold
// keepBytes (at least one), as VR's; never past what the member may drop
// (chain.Member.CompactBound: its LA and its joiners' pre-copy positions).
// 0: nothing to drop.
func (c *chainCore) CompactPoint(op, keepEntries uint64, keepBytes int) uint64 {
	hist := c.m.History()
	bn := uint64(c.base())
	if op <= bn || op > bn+uint64(len(hist)) {
		return 0
	}
	cut := uint64(0)
	if op > keepEntries {
		cut = op - keepEntries
	}
	size := 0
	for k := op; k > cut && k > bn; k-- {
		size += len(hist[k-bn-1].Op)
		if size > keepBytes && k < op {
			cut = k
			break
		}
	}
	bound := c.m.CompactBound()
	cut = min(cut, bn+uint64(sort.Search(len(hist), func(i int) bool { return hist[i].Seq > bound })))
	if cut <= bn {
		return 0
	}
	return cut
}

// Compact drops the member's history up to op, which the host holds in a
// durable checkpoint (op <= applied). A joiner whose pre-copy starts below
// it then gets a snapshot (SendSnapshot).
func (c *chainCore) Compact(op uint64) error {
	if op > uint64(c.handed) {
		return fmt.Errorf("chain core: compact to %d beyond applied %d", op, c.handed)
	}
	bn := uint64(c.base())
	if op <= bn {
		return nil
	}
	c.m.Compact(c.m.History()[op-bn-1].Seq)
	return nil
}

func (c *chainCore) base() int {
	bn, _ := c.m.Base()
	return bn
}

// SendSnapshot answers Ready.SnapshotNeeded: a joiner's pre-copy starts
// from s, the host's state at op s.Op, in a pre-copy chunk (the client
// table, then the host's state, as Snap.Data).
func (c *chainCore) SendSnapshot(to uint64, s core.Snapshot) error {
	data := kv.AppendClientEntries(nil, s.Clients)
	data = append(data, s.Data...)
	if !c.m.SendSnapshotPage(chain.NodeID(to), chain.Snap{N: int(s.Op), Data: data, From: s.From, Next: s.Next, More: s.More}) {
		bn, _ := c.m.Base()
		return fmt.Errorf("chain core: no snapshot at %d for %d (not the tail, or outside history %d..%d)", s.Op, to, bn, c.total())
	}
	return nil
}

// installed: the member took a snapshot in its pre-copy (chain.Snap): the
// host stores it and restores its state from it; the history before it is
// gone, positions continue after it.
func (c *chainCore) installed(s *chain.Snap) {
	d := kv.Decoder{B: s.Data}
	clients := kv.DecodeClientEntries(&d)
	if d.Err != nil {
		c.out.Errors = append(c.out.Errors, fmt.Errorf("chain core: undecodable snapshot at %d from the pre-copy: %w", s.N, d.Err))
		return
	}
	c.out.Snapshot = &core.Snapshot{Op: uint64(s.N), Clients: clients, Data: d.B, From: s.From, Next: s.Next, More: s.More, Number: s.Seq}
	if s.More {
		// A page: its host writes it into the engine; nothing is installed
		// yet. The pre-copy has begun: the tentative suffix is no longer
		// what this member may restart the chain from (its host's state is
		// part of a snapshot now, which chain.Member.restart refuses — an
		// adopt would make a new member that knows nothing of the pages).
		c.tentative = nil
		return
	}
	c.out.HasTruncate, c.truncate, c.tentative = false, nil, nil // the snapshot replaces the whole log
	c.clients = kv.NewClientTable(vr.MaxClients)
	c.clients.Load(clients)
	c.written, c.handed, c.bootCommit = s.N, s.N, s.N
}

// ModeMismatchError: the master's answer named another update mode than
// this member's (kefir server --chain-mode differs from the chain's). The
// member serves nothing until restarted with the chain's mode.
type ModeMismatchError struct {
	Member      uint64
	Mode, Chain chain.Mode
}

func (e *ModeMismatchError) Error() string {
	return fmt.Sprintf("chain member %d runs update mode %v but its chain runs %v: refused by the master; restart it with --chain-mode %s",
		e.Member, e.Mode, e.Chain, strings.ToLower(e.Chain.String()))
}
