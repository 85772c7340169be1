package vrshard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// What the engine records about itself, beside the state: how far it has
// applied (the applied mark) and which view each op it applied was ordered
// in (the view history). Both are reserved keys, written in the same engine
// Append as the ops they describe, so they are exactly as durable as those
// ops, travel inside snapshots (captureData copies every engine key) and
// need nothing new from the storage engine.
//
// The applied mark: the replication log's snapshot point says "the engine
// holds every op up to here" — true when the checkpoint wrote it, false once
// the engine directory is deleted or one of its devices is lost while the
// log survives. Open compares the two (engineBehind) and a replica whose
// engine is below its log's snapshot point restarts as a wiped one: VR
// recovery, then state transfer (issue 24, item 2).
//
// The view history: a session token names the op of a write and the view
// that op's log entry was ordered in. A cad or async write is acknowledged
// before it commits, and a view change can drop it and give its op number
// to another write; a replica whose applied op at that number has another
// view then knows the session saw a lost write (shard.ErrSessionLost)
// instead of serving state without it.

// appliedKey holds the engine's applied mark: version = the last op of the
// latest apply batch (or snapshot) the engine holds. It is the last record
// of every batch, so an engine that recovered it recovered the batch (the
// engine recovers a prefix of what was appended).
var appliedKey = kv.ReservedKey("vrapplied")

// viewPrefix keys the view history: one row per op at which the views of
// applied ops change, viewPrefix + op (big-endian), value the view (uvarint),
// version the op.
var viewPrefix = kv.ReservedKey("vrview/")

// viewEnd ends the range of view rows (viewPrefix with '/' incremented).
var viewEnd = kv.ReservedKey("vrview0")

func viewKey(op uint64) []byte {
	k := make([]byte, len(viewPrefix)+8)
	copy(k, viewPrefix)
	binary.BigEndian.PutUint64(k[len(viewPrefix):], op)
	return k
}

// viewStart says that the applied ops from Op on (up to the next start)
// were ordered in View: kv's, which a move's view copy carries too.
type viewStart = kv.ViewStart

// viewHist is the published view history: starts covers the applied ops up
// to top (and the ops the engine may show ahead of applied: it is published
// before each apply batch is written).
type viewHist struct {
	starts []viewStart
	top    uint64
}

// opView returns the view op v was ordered in if the history knows it: v is
// covered (<= top) and not older than the history (ops applied before the
// engine recorded views).
func (h *viewHist) opView(v uint64) (uint64, bool) {
	if h == nil || v == 0 || v > h.top {
		return 0, false
	}
	return viewOf(h.starts, v)
}

// viewOf returns the view applied op v was ordered in, from history h
// (sorted by op); ok false if h does not reach back to v (ops applied
// before the history existed).
func viewOf(h []viewStart, v uint64) (view uint64, ok bool) { return kv.ViewAt(h, v) }

// loadMarks reads the applied mark and the view history from the engine: at
// start, and after a snapshot changed the engine.
func (a *applier) loadMarks() error {
	a.mark = 0
	v, err := a.db.Get(appliedKey)
	switch {
	case err == nil:
		a.mark = v.Version
	case !errors.Is(err, storage.ErrNotFound):
		return fmt.Errorf("vrshard: read the engine's applied mark: %w", err)
	}
	// A later mark must be newer than any version of the key, a deleted
	// one's too (the engine orders each key's versions).
	if a.markTop, err = latestVersion(a.db, appliedKey); err != nil {
		return fmt.Errorf("vrshard: read the engine's applied mark: %w", err)
	}
	var h []viewStart
	err = a.db.Scan(viewPrefix, viewEnd, 0, 0, func(k []byte, v storage.Value) bool {
		if len(k) != len(viewPrefix)+8 {
			return true
		}
		view, n := binary.Uvarint(v.Data)
		if n <= 0 {
			return true
		}
		h = append(h, viewStart{Op: binary.BigEndian.Uint64(k[len(viewPrefix):]), View: view})
		return true
	})
	if err != nil {
		return fmt.Errorf("vrshard: load view history: %w", err)
	}
	a.views = h
	a.viewTop = a.mark // the rows were written with the ops they describe
	a.viewsChanged = true
	return nil
}

// noteView records that committed op v was ordered in view: a new history
// row when the view differs from the last applied op's. Called for every
// committed entry, in op order, before flush.
func (a *applier) noteView(v, view uint64) {
	if v > a.viewTop {
		a.viewTop = v
		a.viewsChanged = true
	}
	if n := len(a.views); n > 0 && (a.views[n-1].View == view || a.views[n-1].Op >= v) {
		return
	}
	// Copy on write: readers hold the published slice (Replica.views).
	a.views = append(slices.Clip(a.views), viewStart{Op: v, View: view})
	k := viewKey(v)
	if v <= a.replayTo {
		if vs, err := a.db.Versions(k); err == nil && len(vs) > 0 {
			return // the engine kept it
		}
	}
	a.recs = append(a.recs, storage.Record{Key: k, Value: binary.AppendUvarint(nil, view), Version: v})
}

// markApplied stages the applied mark for a batch ending at op last: the
// batch's last record.
func (a *applier) markApplied(last uint64) {
	if last <= a.markTop {
		return // a replay of ops the engine holds
	}
	a.mark, a.markTop = last, last
	a.recs = append(a.recs, storage.Record{Key: appliedKey, Value: binary.BigEndian.AppendUint64(nil, last), Version: last})
}

// reservedRows counts the engine keys of this file (DBSIZE subtracts them).
func (a *applier) reservedRows() int {
	n := len(a.views)
	if a.mark > 0 {
		n++
	}
	return n
}

// engineBehind reports whether the engine lacks ops the replication log
// counts on: its applied mark is below the log's snapshot point. An engine
// without a mark is lost if the log says it had one (ws.engineMarked) or if
// it holds nothing at all while the log has a snapshot point; otherwise it
// was written before the mark existed and is trusted, as before.
func engineBehind(a *applier, ws *walState) (behind bool, have uint64) {
	if ws.empty || ws.snap.Op == 0 {
		return false, a.mark
	}
	if a.mark == 0 && !ws.engineMarked && a.db.LastVersion() > 0 {
		return false, 0 // a legacy engine
	}
	return a.mark < ws.snap.Op, a.mark
}

// stampView fills in the view of res's version when the view history knows it:
// any version this replica applied (or its engine shows). A version above
// that — a cad or async write read from the overlay, acknowledged before
// commit — stays without a view unless its writer set it (markAppended).
func (r *Replica) stampView(res *kv.Result) {
	if res.ViewKnown {
		return
	}
	if v, ok := r.views.Load().opView(res.Version); ok {
		res.View, res.ViewKnown = v, true
	}
}

// SessionViews fails s (a one-log session of this replica's group) if it
// names, at a version this replica has applied, a view other than its op's
// there: the check a session read here makes once it waited for the token
// (sessionViews), without waiting — versions not applied yet are not
// judged. A node of several groups asks it of its other groups' replicas on
// a session read of one group (cluster.Multi): a session whose write a view
// change dropped in group A is lost everywhere, in particular at the group
// the write's key moved to, which cannot judge A's part itself.
func (r *Replica) SessionViews(s shard.Session) error { return r.sessionViews(s) }

// writeSessionCheck fails a session write at the leader (driver only, before
// the write is proposed) whose session saw a write a view change dropped:
// the write's token would otherwise rise past the lost version, and the
// session's next read would check only the new write's (version, view) —
// committed, so the read would be served without the session's own lost
// write, silently (docs/consistency.md, "Session tokens"). Each version the
// token names with its view is judged against this leader's log:
//   - an entry at that op, applied or not, of another view: its op number
//     went to another write;
//   - no entry at that op, the op past the log's end, from an earlier view:
//     the view change that made this leader chose a log without it (VR's
//     new view starts from a log holding every committed op), and the ops
//     past that log's end are numbered afresh.
//
// A version from this view past the log is not judged (the token is ahead:
// reads say so, writes go on), nor one of a later view than this leader's at
// an op it has not committed (a stale leader's log says nothing of it); a
// version without a view (v1 tokens, versions applied before the views were
// recorded) neither. Views start again at 0 in each epoch, so a committed op
// is judged whatever the order of the views.
func (r *Replica) writeSessionCheck(s shard.Session) error {
	if mutation.On && r.mut.writeSessionUnchecked {
		return nil
	}
	if !r.isLeader.Load() || core.Status(r.status.Load()) != core.Normal {
		return nil // the core refuses the proposal; no judgement from a log that is not the view's
	}
	view, last, commit := r.lastHS.View, r.lastOp.Load(), r.commit.Load()
	for _, p := range tokenParts(s) {
		if p.v == 0 || !p.known {
			continue
		}
		// A committed op's view is final, whatever the order of the two
		// views: views start again at 0 in each epoch (vr switchConfig),
		// so a version dropped in an earlier epoch's view 2 is judged by
		// epoch 2's leader in view 0 too (TestWriteSessionCheckAcrossAReconfiguration).
		// An uncommitted entry is this view's log: it says nothing of a
		// token of a later view (this leader may be stale).
		if p.view > view && p.v > commit {
			continue
		}
		at, ok := r.logView(p.v)
		if ok && at == p.view {
			continue
		}
		// What is not committed is judged only by a leader that knows its
		// view is the group's: under its lease no other view (nor, since a
		// reconfiguration commits through the leader, another epoch) has
		// begun. A partitioned leader of an older epoch would otherwise
		// compare an epoch's view numbers with another's (they restart at
		// 0) and tell a session it lost a write it has not — a final error.
		// Without the lease (a leader just elected, or a stale one) the
		// write is refused as retryable: by the retry the leader holds its
		// lease and judges, or the client has found the group's leader.
		// Nilext groups hold no lease: unjudged there, as before.
		if p.v > commit && !r.leaderLeased() {
			if r.opts.Nilext {
				continue
			}
			return fmt.Errorf("%w: the session %s version %d of view %d, which this leader (view %d, log to %d, committed to %d) cannot judge before it holds its lease; retry",
				shard.ErrSessionAhead, p.what, p.v, p.view, view, last, commit)
		}
		if ok {
			return fmt.Errorf("%w: the session %s version %d of view %d, but op %d is of view %d here (a view change dropped the write before a majority held it); start a new session",
				shard.ErrSessionLost, p.what, p.v, p.view, p.v, at)
		}
		if p.v > last && p.view < view {
			return fmt.Errorf("%w: the session %s version %d of view %d, but the log of view %d ends at %d (a view change dropped the write before a majority held it); start a new session",
				shard.ErrSessionLost, p.what, p.v, p.view, view, last)
		}
	}
	return nil
}

// tokenPart is one position a session token names: the version the
// session wrote (what "wrote") or read ("read") up to, with its view if
// known. The session checks judge each (writeSessionCheck,
// sessionViewsIn, chainSessionCheck).
type tokenPart struct {
	what  string
	v     uint64
	view  uint64
	known bool
}

// tokenParts is s's two positions, written then read.
func tokenParts(s shard.Session) [2]tokenPart {
	return [2]tokenPart{{"wrote", s.LastWrite, s.WriteView, s.WriteViewKnown}, {"read", s.MaxRead, s.ReadView, s.ReadViewKnown}}
}

// leaderLeased reports whether this replica leads under a current leader
// lease: its view is the group's latest.
func (r *Replica) leaderLeased() bool {
	ls := r.lease.Load()
	return ls != nil && !ls.follower && r.now() < ls.until
}

// checkSessionViews fails a session whose token names, at a version this
// replica has applied, a view other than the one its op there was ordered
// in: the write or read the session saw was dropped by a view change (an
// acknowledged cad or async write that no majority held when the view
// changed) and its op number went to another write. Serving the session
// would return state without its own write. Only applied ops are compared:
// they are committed, so a mismatch is final. Call it once applied >= the
// token's versions (waitSession).
func (r *Replica) checkSessionViews(s shard.Session) error {
	return sessionViewsIn(r.views.Load().opView, s, nil, r.opts.Chain != nil)
}

// sessionViewsIn fails s if it names, at an op view knows, another view
// than view's; by says whose history judged it (nil: this replica's), called
// only for the error: a session read makes this check per part of the token
// and per hosted group, and the words would cost more than the check;
// chain: the history is a chain member's, its views the head's epochs.
func sessionViewsIn(view func(uint64) (uint64, bool), s shard.Session, by func() string, chain bool) error {
	for _, p := range tokenParts(s) {
		if !p.known {
			continue
		}
		if view, ok := view(p.v); ok && view != p.view {
			if chain {
				// A chain's view is the epoch its head numbered the
				// update in (chainsession.go).
				return chainViewLost(p.what, p.v, p.view, view)
			}
			whose := ""
			if by != nil {
				whose = by()
			}
			return fmt.Errorf("%w: the session %s version %d of view %d, but op %d was committed in view %d%s (a view change dropped the write before a majority held it); start a new session",
				shard.ErrSessionLost, p.what, p.v, p.view, p.v, view, whose)
		}
	}
	return nil
}

// View copies (kv/viewcopy.go): the view histories of other groups that
// this replica's group imported with slots it took over. A session read at
// a node of several groups judges the token's parts of other groups against
// them (cluster.Multi.sessionAt), so that the group a key moved to reports a
// write the key's old group lost even where that group is not hosted, has
// not applied that far, or no longer exists.

// loadViewCopies reads the copies from the engine and publishes them: at
// start, after a snapshot, and after each batch that applied a slot op (an
// import may carry one).
func (a *applier) loadViewCopies() error {
	cs := map[uint32]kv.ViewCopy{}
	err := a.db.Scan(kv.SlotViewsPrefix, kv.SlotViewsEnd, 0, 0, func(k []byte, v storage.Value) bool {
		g, ok := kv.SlotViewsGroup(k)
		if !ok {
			return true
		}
		// The import decoded it before writing it: a copy that does not
		// decode was not written by an op, and judges nothing.
		if c, err := kv.DecodeViewCopy(v.Data); err == nil {
			cs[g] = c
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("vrshard: load view copies: %w", err)
	}
	a.copies.Store(&cs)
	return nil
}

// CopiedSessionViews fails s (a one-log session of group gid, another group
// than this replica's) if the copy of gid's view history this replica's
// group imported with a move names, at an op it covers, another view than
// s's: a write or read the session saw there was dropped by a view change.
// Without a copy of gid, or for versions above its top, it judges nothing.
// Every row of a copy describes committed ops of gid, so a mismatch is
// final. The cost is a binary search over gid's view changes.
func (r *Replica) CopiedSessionViews(gid uint32, s shard.Session) error {
	cs := r.app.copies.Load()
	if cs == nil {
		return nil
	}
	c, ok := (*cs)[gid]
	if !ok {
		return nil
	}
	return sessionViewsIn(c.View, s, func() string {
		return fmt.Sprintf(" (by the copy of group %d's view history a move brought to this group, up to op %d)", gid, c.Top)
	}, false)
}

// MoveViews returns what a move of this group's slots takes to the
// destination with its final copy (KEFIR.SLOTS VIEWS): this replica's view
// history as group gid's copy — its published history, whose rows describe
// committed ops and which reaches the last applied op (top) — then the
// copies of other groups its group imported itself, so that they travel on
// with a later move (a slot moved A→B→C leaves C able to judge A's part).
// A copy of gid itself (a slot that came back) is left out: the history
// of gid is the longer.
func (r *Replica) MoveViews(gid uint32) (views []kv.GroupViews, top uint64) {
	if h := r.views.Load(); h != nil {
		own := kv.GroupViews{Group: gid, ViewCopy: kv.ViewCopy{Top: h.top, Starts: make([]kv.ViewStart, 0, len(h.starts))}}
		for _, s := range h.starts {
			if s.Op <= h.top {
				own.Starts = append(own.Starts, s)
			}
		}
		views, top = append(views, own), h.top
	}
	if cs := r.app.copies.Load(); cs != nil {
		for _, g := range slices.Sorted(maps.Keys(*cs)) {
			if g != gid {
				views = append(views, kv.GroupViews{Group: g, ViewCopy: (*cs)[g]})
			}
		}
	}
	return views, top
}
