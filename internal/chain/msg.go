package chain

import (
	"fmt"
	"strings"
)

// NodeID names a chain member or the master. 0 is "none" (a head's
// predecessor, a tail's successor).
type NodeID uint64

// MsgType is the kind of a Msg. The names follow the dissertation's
// Listings 1 and 2 (digest 002 §3.7, §3.8); docs/design/chain.md lists who
// sends each one to whom.
type MsgType uint8

const (
	// MsgUpdate: master → head (Seq 0: the head assigns it), or a member →
	// its successor (Seq set). ID is the client request it answers.
	MsgUpdate MsgType = iota + 1
	// MsgAck: successor → predecessor, cumulative: every update up to Seq
	// reached the tail (LA with Done: the sender's durable point; NoLog: it
	// counts no log member). With Down, predecessor → successor: the
	// sender's durable point LA, for a successor with no log member from it
	// down (Member.passDown).
	MsgAck
	// MsgUpdateAck: tail → master: update ID (at Seq) succeeded; Result is
	// what the state machine returned.
	MsgUpdateAck
	// MsgQuery: master → tail, a strong read (Op is the query). With Any,
	// master → any member: a version-checked read (CRAQ) that a member
	// answers itself when the key's latest version is clean, and otherwise
	// passes down the chain towards the tail.
	MsgQuery
	// MsgQueryResp: tail → master, the answer to query ID.
	MsgQueryResp
	// MsgRedirect: member → master: request ID (Query says which kind) was
	// not applied because the member is not the head (or tail) for it; the
	// master re-routes it.
	MsgRedirect
	// MsgPrecopy: master → joiner: pull the log from Target (the tail),
	// resuming after what the joiner already holds.
	MsgPrecopy
	// MsgPrecopyReq: joiner → tail: the next chunk after Seq.
	MsgPrecopyReq
	// MsgPrecopyChunk: tail → joiner: Entries; Done when they reach the end of
	// the tail's log; Refused when the sender is not (or no longer) the tail.
	MsgPrecopyChunk
	// MsgPrecopyDone: joiner → master: pre-copy reached the tail's end at
	// Seq (Refused: the source refused; the master re-issues it).
	MsgPrecopyDone
	// MsgFlush: master → J → head … tail → J. Members is the new chain,
	// Path the forwarding path, Joiner J, Seq J's pre-copy end (J fills it).
	MsgFlush
	// MsgFlushedUpdate: old tail → J: log entries after J's pre-copy end,
	// straight into J's main store.
	MsgFlushedUpdate
	// MsgFlushAck: J → master: J merged its temporary store and is active
	// (Refused: J restarted during its flush and never pre-copied since;
	// the master aborts the join).
	MsgFlushAck
	// MsgTruncate: master → the tail's predecessor → the old tail (Members:
	// the configuration at its epoch, the old tail still last, for the
	// members' hosts to report; the core does not read it).
	MsgTruncate
	// MsgTruncateAck: the new tail → master (digest §7.5: the new tail, sent
	// before any of its update acks).
	MsgTruncateAck
	// MsgTruncateDone: the old tail → the new one: it stopped answering; the
	// new tail may take over.
	MsgTruncateDone
	// Repair orders and their answers (CR_HEAD, CR_MID, CR_TAIL). An order
	// (and a RESTART) names the configuration it makes in Members, for the
	// member's host to report (the core does not read it).
	MsgCRHead
	MsgCRHeadDone
	MsgCRMid // Target: the new successor
	MsgCRMidRepair
	MsgRepairInfo // LA, LU of the new successor
	MsgCRMidDone
	MsgCRTail
	MsgCRTailDone
	// MsgPersist: member → its own host: make the log durable up to Seq
	// (a log or buffered-log datastore; the core does no I/O). The host
	// answers with MsgPersisted once it is (fsync), in order.
	MsgPersist
	// MsgPersisted: host → member: the log is durable up to Seq.
	MsgPersisted
	// MsgHeartbeat is between a member's host and the master's, never
	// stepped into either core: member → master every heartbeat interval
	// (Seq names it; LA, LU; Refused when the member is not a replica: a
	// restarted member waiting to be joined, whose LA is then the length
	// of its durable history in entries, what a master restarting a whole
	// chain compares: Master.Restarted; Epoch, and Members with their
	// configuration's epoch in ID, +1: what a restarted master learns the
	// chain from), the master's failure detector; master → member, the answer (the same Seq; Members, head
	// first, and Epoch: the configuration, which the host uses to name the
	// head), which grants the member a lease to serve from.
	MsgHeartbeat
	// MsgSnapshotNeeded (member → its own host, never travels): a joiner
	// (Target) needs a snapshot; the host captures its state machine and
	// calls SendSnapshot, or SendSnapshotPage with its first page (a paged
	// snapshot: Snap's paging fields). With Done the snapshot goes whole
	// (a held FLUSH's log flush). With Snap, the joiner asks for the page
	// of the host's snapshot at Snap.N after the cursor Snap.Next.
	MsgSnapshotNeeded
	// MsgRestart: master → the restarted member it chose to restart a chain
	// whose every member failed (Master.Restarted): the member holding the
	// longest durable history becomes the chain of one, head and tail, at
	// Epoch, its whole history committed. LU and LA: the history's last
	// number and length the member reported, which it must still hold;
	// MsgRestartDone: its answer, Refused if it does not hold them (a new
	// process since it reported: the master chooses again).
	MsgRestart
	MsgRestartDone
)

var msgNames = map[MsgType]string{
	MsgUpdate: "update", MsgAck: "ack", MsgUpdateAck: "update-ack", MsgQuery: "query",
	MsgQueryResp: "query-resp", MsgRedirect: "redirect", MsgPrecopy: "precopy",
	MsgPrecopyReq: "precopy-req", MsgPrecopyChunk: "precopy-chunk", MsgPrecopyDone: "precopy-done",
	MsgFlush: "flush", MsgFlushedUpdate: "flushed-update", MsgFlushAck: "flush-ack",
	MsgTruncate: "truncate", MsgTruncateAck: "truncate-ack", MsgTruncateDone: "truncate-done", MsgCRHead: "cr-head",
	MsgCRHeadDone: "cr-head-done", MsgCRMid: "cr-mid", MsgCRMidRepair: "cr-mid-repair",
	MsgRepairInfo: "repair-info", MsgCRMidDone: "cr-mid-done", MsgCRTail: "cr-tail",
	MsgCRTailDone: "cr-tail-done", MsgPersist: "persist", MsgPersisted: "persisted",
	MsgHeartbeat: "heartbeat", MsgSnapshotNeeded: "snapshot-needed", MsgRestart: "restart",
	MsgRestartDone: "restart-done",
}

func (t MsgType) String() string {
	if s, ok := msgNames[t]; ok {
		return s
	}
	return fmt.Sprintf("msg(%d)", uint8(t))
}

// Entry is one update in a member's history: its sequence number, the
// client request it came from, the opaque operation, and (once applied) the
// state machine's result, which a tail that takes over must still report.
type Entry struct {
	Seq    uint64
	ID     uint64
	Op     []byte
	Result []byte
	// sum is a running digest of the history up to and including this entry,
	// so the invariant check compares histories in O(1) (prefix test).
	sum uint64
}

// Msg is every message of the protocol. Epoch is the configuration epoch
// the sender was at; which other fields matter depends on Type. LA and LU
// are the sender's last update acknowledged and received (repair-info,
// cr-mid-repair); in a precopy-chunk LA is the length of the source's
// history (its compacted prefix included) when it answered, against which
// the joiner measures its pull (Member.outrun; 0: not said, a source of a
// build before), and in a host's heartbeat the sender's history length.
type Msg struct {
	Type     MsgType
	From, To NodeID
	Epoch    uint64
	Seq      uint64
	LA, LU   uint64
	ID       uint64
	Op       []byte
	Result   []byte
	Entries  []Entry
	Members  []NodeID
	Path     []NodeID
	Joiner   NodeID
	Target   NodeID
	Done     bool
	// NoLog (ack, repair-info): no log-datastore member from the sender
	// down, so the durable point it reports (its LA) holds no disk's word:
	// the receiver must not count it as durable (docs/design/chain.md, "A
	// sync answer needs a disk"). An older sender never sets it.
	NoLog bool
	// HadLog (ack, repair-info with NoLog; update; flush: some member on
	// its way round the old chain did): the sender knows the
	// chain had a log member (it is one, heard of one below, or was told of
	// one above), so a member with none from it down must not take its own
	// vacuous durable point as durable; a chain of memory members by
	// configuration never says it.
	HadLog bool
	// Down (ack): a durable-point notice going down the chain, not an
	// acknowledgement (MsgAck).
	Down    bool
	Refused bool
	Query   bool
	Any     bool
	// Exhausted (redirect): the head used up its numbering range; the
	// master renews it (CR_HEAD at a new epoch) and re-sends.
	Exhausted bool
	// Weak (query): a read any member may answer from what it holds
	// (possibly stale), provided it holds the update numbered Seq (the
	// session's token; 0: none); a member behind it passes the read
	// upstream. In the answer (query-resp) Seq is the version read: the
	// number of the latest update to the key the member holds.
	Weak bool
	// Lost (redirect of a weak read or an update): the session's token
	// names an update the chain no longer has (it died with a head that had
	// not passed it on); the master answers the client that its session is
	// lost.
	Lost bool
	// Token (update, master → head): the session's token; the head refuses
	// the update as lost if the session saw an update the chain no longer
	// has (a later update would otherwise hide the loss from the session's
	// reads, which check only its newest token). In a heartbeat and its
	// answer (a host's, not the core's): the sender's update mode,
	// Mode.Wire (0: not said), so that a member whose mode is not its
	// chain's is refused.
	Token uint64
	// Snap (precopy-chunk, tail → joiner): the tail compacted its history
	// past what the joiner holds; the joiner starts from this snapshot and
	// the chunk's entries follow it. A precopy-req with Any asks for one
	// (the joiner does not know the sequence number its durable prefix
	// ends at, or its host holds pages of another). In a host's heartbeat
	// that says it is not a replica (Refused), Any says its host holds
	// pages of a snapshot it has not finished taking (Status.Paged): a
	// whole-chain restart never starts from it (Master.Restarted).
	Snap *Snap
	// LinkInc and LinkSeq number the messages one member's host sends
	// another on their link: the sender's incarnation (random per process
	// start) and a count from 1 per destination. The core neither sets
	// nor reads them; the receiving host finds a message the link lost
	// from a gap (vrshard chaincore.go, linkGap). Zero: not numbered (the
	// master's messages, or an older sender).
	LinkInc, LinkSeq uint64
	// Pos (update, member → member): the update's position in the
	// sender's history (1, 2, ...; its compacted prefix counted), which
	// every member's history shares (each is a prefix of its
	// predecessor's). Set by the sending host beside the link numbering,
	// read by the receiving host (vrshard chaincore.go, lostUpdate): an
	// active member's next update must sit right after its own history,
	// whatever the link or the numbering epoch. Zero: not said (an update
	// outside the sender's history — a joiner's relay from its temporary
	// store — or an older sender). The core neither sets nor reads it.
	Pos uint64
}

func (m Msg) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %d->%d e%d", m.Type, m.From, m.To, m.Epoch)
	switch m.Type {
	case MsgUpdate, MsgUpdateAck:
		fmt.Fprintf(&b, " seq=%s id=%d", FormatSeq(m.Seq), m.ID)
		if m.Pos != 0 {
			fmt.Fprintf(&b, " pos=%d", m.Pos)
		}
		if len(m.Op) > 0 {
			fmt.Fprintf(&b, " %q", m.Op)
		}
		if m.Type == MsgUpdateAck && len(m.Result) > 0 {
			fmt.Fprintf(&b, " -> %q", m.Result)
		}
	case MsgAck:
		fmt.Fprintf(&b, " seq=%s", FormatSeq(m.Seq))
		if m.NoLog {
			b.WriteString(" nolog")
		}
		if m.HadLog {
			b.WriteString(" hadlog")
		}
		if m.Down {
			fmt.Fprintf(&b, " down da=%s", FormatSeq(m.LA))
		}
	case MsgQuery:
		fmt.Fprintf(&b, " id=%d %q", m.ID, m.Op)
		if m.Any {
			b.WriteString(" any")
		}
		if m.Weak {
			fmt.Fprintf(&b, " weak min=%s", FormatSeq(m.Seq))
		}
	case MsgQueryResp:
		fmt.Fprintf(&b, " id=%d -> %q", m.ID, m.Result)
		if m.Seq != 0 {
			fmt.Fprintf(&b, " v=%s", FormatSeq(m.Seq))
		}
	case MsgRedirect:
		fmt.Fprintf(&b, " id=%d query=%t", m.ID, m.Query)
		if m.Exhausted {
			b.WriteString(" exhausted")
		}
		if m.Lost {
			b.WriteString(" lost")
		}
	case MsgPersist, MsgPersisted:
		fmt.Fprintf(&b, " seq=%s", FormatSeq(m.Seq))
	case MsgPrecopy, MsgCRMid:
		fmt.Fprintf(&b, " target=%d", m.Target)
	case MsgPrecopyReq, MsgPrecopyDone:
		fmt.Fprintf(&b, " after=%s", FormatSeq(m.Seq))
		if m.Refused {
			b.WriteString(" refused")
		}
	case MsgFlushAck:
		if m.Refused {
			b.WriteString(" refused")
		}
	case MsgPrecopyChunk, MsgFlushedUpdate:
		if m.Snap != nil {
			fmt.Fprintf(&b, " snapshot@%d(%s)", m.Snap.N, FormatSeq(m.Snap.Seq))
		}
		fmt.Fprintf(&b, " %s", seqs(m.Entries))
		if m.Done {
			b.WriteString(" done")
		}
		if m.Refused {
			b.WriteString(" refused")
		}
	case MsgFlush:
		fmt.Fprintf(&b, " joiner=%d members=%v path=%v precopy-end=%s", m.Joiner, m.Members, m.Path, FormatSeq(m.Seq))
	case MsgCRMidRepair:
		fmt.Fprintf(&b, " la=%s", FormatSeq(m.LA))
	case MsgRepairInfo:
		fmt.Fprintf(&b, " la=%s lu=%s", FormatSeq(m.LA), FormatSeq(m.LU))
	case MsgRestart:
		fmt.Fprintf(&b, " lu=%s len=%d", FormatSeq(m.LU), m.LA)
	case MsgRestartDone:
		if m.Refused {
			b.WriteString(" refused")
		}
	}
	return b.String()
}

// seqs prints the sequence numbers of entries compactly.
func seqs(es []Entry) string {
	if len(es) == 0 {
		return "[]"
	}
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = FormatSeq(e.Seq)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// Sequence numbers: a head that took over at epoch e numbers its updates
// from e<<SeqBits on (above everything an earlier head can have numbered:
// digest 002 §7.2), so seq order is history order across head changes
// without the new head knowing its predecessor's last number. A head numbers
// below the base of the epoch after its current one, which no later head can
// start under; when it gets there it refuses updates and the master renews
// its range with a CR_HEAD at a new epoch (Member.clientUpdate).
const defaultSeqBits = 40

// seqBase is the first sequence number a head that took over at epoch
// numbers above.
func seqBase(epoch uint64, bits uint) uint64 { return epoch << bits }

// FormatSeq prints a sequence number as epoch.n when it carries an epoch
// (with the default SeqBits).
func FormatSeq(s uint64) string {
	if e := s >> defaultSeqBits; e > 0 {
		return fmt.Sprintf("%d.%d", e, s&(1<<defaultSeqBits-1))
	}
	return fmt.Sprint(s)
}
