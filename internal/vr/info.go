package vr

// Introspection: the replica's state for drivers, metrics and tests.

// Info is a snapshot of a replica's protocol state.
type Info struct {
	Self           uint64
	Status         Status
	View           uint64
	LastNormalView uint64
	Leader         uint64
	IsLeader       bool
	FirstOp        uint64
	LastOp         uint64
	Commit         uint64
	Applied        uint64
	Durable        uint64
	// Nilext fast path: d-log length, reads that had to order pending
	// updates first, and view changes that met a d-log cycle. DLogStale:
	// this replica restarted and its d-log may lack updates it acknowledged
	// (it does not count in d-log recovery until it is normal in a later
	// view); NilextStaleWaits counts view changes that waited for more
	// fresh d-logs than were at hand (nilext_recover.go, nxRecover).
	DLogLen          int
	NilextSlowReads  uint64
	NilextCycles     uint64
	DLogStale        bool
	NilextStaleWaits uint64
	// CAD (cad.go). Persisted: this replica's fsynced log prefix. Acked
	// (leader): highest op held in memory by a majority. Readable: the
	// readable index R (Replica.Readable). ReadLeaseUntil (follower): local
	// time its read lease ends (0: none). Members (leader): how many
	// followers are in each active-set state, indexed by MemberState
	// (Replica.Peers has the details; Info stays comparable).
	Persisted      uint64
	Acked          uint64
	Readable       uint64
	ReadLeaseUntil int64
	Members        [4]int
	// Clients is the client table's size; ClientsEvicted counts records
	// dropped to keep it within MaxClients (clients.go).
	Clients        int
	ClientsEvicted uint64
	// Reconfiguration (reconfig.go): the configuration's epoch; Joining: a
	// member still pulling the epoch's start state; Leaving: not a member
	// of the epoch, still answering state transfer; Retired: leaving, and
	// f'+1 members hold the start state: the host may stop the replica.
	Epoch                     uint64
	Joining, Leaving, Retired bool
}

// Info reports the replica's state. Followers serve session and bounded reads
// from Commit/Applied: everything up to Commit is final.
func (r *Replica) Info() Info {
	return Info{Self: r.cfg.Self, Status: r.status, View: r.view, LastNormalView: r.lnv,
		Leader: r.cfg.LeaderOf(r.view), IsLeader: r.status == Normal && r.isLeader(),
		FirstOp: r.first, LastOp: r.lastOp(), Commit: r.commit, Applied: r.applied, Durable: r.durable,
		DLogLen: r.nx.live, NilextSlowReads: r.nx.slowReads, NilextCycles: r.nx.cycles,
		DLogStale: r.cfg.Nilext && r.nxStale(), NilextStaleWaits: r.nx.staleWaits,
		Persisted: r.durable, Acked: r.cad.acked, Readable: r.Readable(), ReadLeaseUntil: r.readLeaseUntil(),
		Members: r.memberCounts(), Clients: r.clients.Len(), ClientsEvicted: r.clients.Evicted,
		Epoch: r.cfg.Epoch, Joining: r.ep.joining, Leaving: r.ep.leaving, Retired: r.retired()}
}

func (r *Replica) memberCounts() (n [4]int) {
	for _, p := range r.Peers() {
		n[p.State]++
	}
	return n
}

func (r *Replica) readLeaseUntil() int64 {
	if r.status != Normal || r.isLeader() || r.cad.leaseView != r.view {
		return 0
	}
	return r.cad.leaseUntil
}

// CommitPoint is the highest op this replica knows to be committed.
func (r *Replica) CommitPoint() uint64 { return r.commit }
