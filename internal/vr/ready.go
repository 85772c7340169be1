package vr

// Ready is the batch of actions the core produced since the last Ready. The
// driver performs them in field order; doc.go states the obligations.
type Ready struct {
	// PersistSeq, when non-zero, numbers this batch's disk writes (Snapshot,
	// Truncate, Entries, HardState, in that order). After they are written *and fsynced*, the
	// driver calls Persisted(PersistSeq). Batches are synced in order: one
	// fsync may cover several, reported as the highest.
	PersistSeq uint64
	// Snapshot, if set, replaces the state machine and the whole log: the
	// driver stores it durably, discards every log entry, and restores the
	// application state from Snapshot.Data before applying anything later.
	Snapshot *Snapshot
	// Truncate, if HasTruncate, discards every log entry with op > Truncate.
	HasTruncate bool
	Truncate    uint64
	// Entries are appended to the log, contiguous after the log's last op.
	Entries []Entry
	// HardState, if set, is written last: it may claim a last-normal view
	// whose start log is in Entries, so a torn batch must never keep the
	// claim without the entries (a prefix of Truncate, Entries, HardState
	// is always consistent).
	HardState *HardState

	// Messages may be sent at once, before the fsync of this batch: the core
	// itself withholds every message that promises durability (prepare-ok,
	// do-view-change, start-view) until Persisted covers what it promises.
	Messages []Message

	// Committed are entries to apply to the state machine, in op order, after
	// everything before them. The driver executes each one that is not a
	// Duplicate and passes the results to Advance.
	Committed []Committed

	// Replies to clients (from the leader): results of applied requests and
	// duplicates answered from the client table.
	Replies []Reply
	// ReadStates: read-index reads that may be served once applied >= Index.
	ReadStates []ReadState
	// SnapshotNeeded lists peers that need a snapshot (their log is behind
	// this replica's first entry). The driver answers with SendSnapshot.
	SnapshotNeeded []uint64
	// Errors are things an operator must see (configuration mismatches, peers
	// refusing us). They change nothing; log them (rate-limited).
	Errors []error

	// DLog are nilext d-log entries to append to the disk in the same batch
	// (before the fsync that PersistSeq reports): a restart passes them back
	// in State.DLog. Entries that later show up in the client table may be
	// dropped from the disk at a checkpoint (Replica.DLog is the live set).
	DLog []NilextRequest
	// NilextAcks answer nilext updates: send each to its client.
	NilextAcks []NilextAck
	// Acks are early acknowledgements of writes proposed with
	// AckReplicated or AckAppended (ProposeAck): Client, ReqNum and Op, no
	// Result. The write's normal Reply still comes when it is applied.
	Acks []Reply
}

// Committed is an entry ready to apply. Duplicate entries (a client's request
// that was already executed: a retry ordered twice across a view change) must
// not be executed; their result is the client table's.
type Committed struct {
	Entry
	Duplicate bool
}

// Empty reports whether rd holds nothing to do.
func (rd *Ready) Empty() bool {
	return rd.PersistSeq == 0 && len(rd.Messages) == 0 && len(rd.Committed) == 0 &&
		len(rd.Replies) == 0 && len(rd.ReadStates) == 0 && len(rd.SnapshotNeeded) == 0 && len(rd.Errors) == 0 &&
		len(rd.DLog) == 0 && len(rd.NilextAcks) == 0 && len(rd.Acks) == 0
}

// HasWrite reports whether rd carries disk writes.
func (rd *Ready) HasWrite() bool {
	return rd.Snapshot != nil || rd.HasTruncate || rd.HardState != nil || len(rd.Entries) > 0 || len(rd.DLog) > 0
}
