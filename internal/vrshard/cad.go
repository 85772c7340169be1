package vrshard

import (
	"bytes"
	"cmp"
	"errors"
	"slices"
	"sync"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
	"github.com/kefirdb/kefir/internal/vr"
)

// Consistency-aware durability (docs/design/cad.md). With cad and async
// writes the leader acknowledges an entry before it is committed, so a
// replica's log can hold writes that are not (yet) visible anywhere, and a
// replica's engine can hold writes that some other active-set member has
// not applied. A read must never return either: anything it returns must
// be at most the readable index R (durable and applied on every replica that
// may serve a cross-client-monotonic read). Two structures make that check
// one map lookup per key:
//
//   - updates: for each key, the highest op writing it that a read could
//     return or must see: every applied op (indexed just before the engine
//     shows it), and at the leader every early-acknowledged (cad, async)
//     write from its append on, with the unapplied writes ordered before it
//     (indexLate). Other unapplied ops — state-dependent writes and sync
//     blind writes (even those Apply answers at their ordered point, §12)
//     ordered after every early one — are left out: a read concurrent with
//     a write nobody acknowledged may miss it (the front door makes a read
//     on the writer's own connection wait for its sync write). An entry
//     leaves when its op is at most min(applied, R): from then on every
//     reader may see it. Pruning at R and not at apply (as the design first
//     said) is deliberate: the engine's compaction drops a key's tombstone
//     when it is the key's sole version, so "latest version including
//     tombstones" is not always answerable from the engine; the index
//     answers it for every op above R instead.
//   - overlay: at the leader, the pending early-acknowledged blind writes
//     (key → value, op). A read of a key whose latest update is an async
//     write is served from here at once — the async level's documented
//     weakness. One whose latest update is a cad write may take its value
//     from here too, but only as a deferred read (ReadDeferred): the reply
//     is held until R covers the write (docs/design/cad.md §11).
//
// Both are written by the driver goroutine and read by reader goroutines
// after they read the engine (validate), so a write applied concurrently
// with a read is always seen by the check: it enters updates when it is
// appended, long before it is applied.

// keyUpdates is the per-key update index and the async overlay.
type keyUpdates struct {
	mu    sync.Mutex
	last  map[string]uint64 // key → highest op writing it, for ops > pruned
	queue []updBatch        // ops in log order, for pruning and truncation
	// floor: the index holds every write of an op > floor that is in the log
	// or the engine. At start the engine may hold ops after the log's
	// snapshot point that the index never saw, so floor starts at the
	// engine's last version; a read checked against R < floor cannot rely
	// on the index alone.
	floor   uint64
	pruned  uint64 // ops up to here have left the index
	overlay map[string]overlayEntry
}

type updBatch struct {
	op   uint64
	keys []string
	// held (a chain member's, indexChain; nil otherwise): the op is a
	// blind write, and held[i] is what it leaves keys[i] holding — the
	// value CRAQ answers a dirty read with once the tail's version covers
	// op (chainHeldRead).
	held []overlayEntry
}

// overlayEntry is a pending early-acknowledged blind write of one key.
type overlayEntry struct {
	op    uint64
	value []byte
	meta  []byte // the write's meta (a SET EX's expiry: kv.EncodeMeta)
	tomb  bool
	// cad: a cad write, which a read may return only once R >= op (a
	// deferred read); else an async one, served at once. view: the view
	// whose leader appended it — a deferred read's wait must be registered
	// in that view, or op may name another view's entry.
	cad  bool
	view uint64
}

func newKeyUpdates(floor uint64) *keyUpdates {
	return &keyUpdates{last: map[string]uint64{}, overlay: map[string]overlayEntry{}, floor: floor, pruned: floor}
}

// add records that op (appended to the log now) writes keys. Ops arrive in
// increasing order, except after a truncation.
func (u *keyUpdates) add(op uint64, keys [][]byte) { u.addHeld(op, keys, nil) }

// addHeld is add for a chain member's blind write at op: vals[i] is what
// it leaves keys[i] holding (heldAtMost; nil: add, no values held).
func (u *keyUpdates) addHeld(op uint64, keys [][]byte, vals []overlayEntry) {
	if len(keys) == 0 {
		return
	}
	b := updBatch{op: op, keys: make([]string, len(keys)), held: vals}
	u.mu.Lock()
	for i, k := range keys {
		s := string(k)
		b.keys[i] = s
		if u.last[s] < op {
			u.last[s] = op
		}
	}
	u.queue = append(u.queue, b)
	u.mu.Unlock()
}

// truncate forgets the ops after op (a new leader's log replaced them). The
// keys they wrote fall back to their previous op still in the index.
func (u *keyUpdates) truncate(op uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := len(u.queue)
	for n > 0 && u.queue[n-1].op > op {
		n--
	}
	if n == len(u.queue) {
		return
	}
	gone := u.queue[n:]
	u.queue = u.queue[:n]
	for _, b := range gone {
		for _, k := range b.keys {
			delete(u.last, k)
		}
	}
	// The keys the dropped ops wrote fall back to their previous op still
	// in the index (for the others this changes nothing).
	for _, b := range u.queue {
		for _, k := range b.keys {
			u.last[k] = max(u.last[k], b.op)
		}
	}
	for k, e := range u.overlay {
		if e.op > op {
			delete(u.overlay, k)
		}
	}
}

// prune drops the ops up to op (the caller passes min(applied, R)), and the
// overlay entries they made redundant.
func (u *keyUpdates) prune(op uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if op <= u.pruned {
		return
	}
	u.pruned = op
	i := 0
	for i < len(u.queue) && u.queue[i].op <= op {
		for _, k := range u.queue[i].keys {
			if u.last[k] <= op {
				delete(u.last, k)
			}
		}
		i++
	}
	if i > 0 {
		clear(u.queue[:i])
		u.queue = u.queue[i:]
	}
	if len(u.overlay) > 0 {
		for k, e := range u.overlay {
			if e.op <= op {
				delete(u.overlay, k)
			}
		}
	}
}

// setOverlay records a pending blind write at op (cad: a cad write,
// appended by the leader of view).
func (u *keyUpdates) setOverlay(op uint64, keys [][]byte, values [][]byte, meta []byte, tomb, cad bool, view uint64) {
	u.mu.Lock()
	for i, k := range keys {
		if old, ok := u.overlay[string(k)]; ok && old.op > op {
			continue // a later write of the key is there already
		}
		e := overlayEntry{op: op, tomb: tomb, cad: cad, view: view, meta: meta}
		if !tomb {
			e.value = bytes.Clone(values[i])
			if e.value == nil {
				e.value = []byte{}
			}
		}
		u.overlay[string(k)] = e
	}
	u.mu.Unlock()
}

// dropOverlay forgets every pending async write (leader change: their fate
// is the new leader's log's).
func (u *keyUpdates) dropOverlay() {
	u.mu.Lock()
	clear(u.overlay)
	u.mu.Unlock()
}

// need1 returns the highest op writing key (0: none above the pruned
// point).
func (u *keyUpdates) need1(key []byte) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last[string(key)]
}

// needAtMost returns the highest op up to v writing key (0: none above
// the pruned point, which the engine holds applied): the update of key a
// chain member must have applied to answer a read at the tail's version v
// (chainVersionRead). The queue holds the ops above the pruned point, not
// in order — apply indexes an op again (Replica.apply), after the later
// ops the driver indexed when they arrived — so every batch is looked at;
// only the ops in flight here, and only when the key's latest update is
// above v.
func (u *keyUpdates) needAtMost(key []byte, v uint64) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := string(key)
	if n := u.last[s]; n <= v {
		return n
	}
	var n uint64
	for i := range u.queue {
		if b := &u.queue[i]; b.op <= v && b.op > n && slices.Contains(b.keys, s) {
			n = b.op
		}
	}
	return n
}

// heldAtMost returns, like needAtMost, the highest op up to v writing key
// (0: none above the pruned point), and if that op was indexed as a blind
// write (addHeld), the value it leaves key holding (ok). The same op may
// be in the queue twice — as it arrived, with its value, and again at
// apply, without — so an equal op with a value wins. A batch found here
// is the key's latest at most v: the driver's batches are in log order and
// pruned from the front, so a later one of the key, at most v, cannot have
// left the queue while this one stayed.
func (u *keyUpdates) heldAtMost(key []byte, v uint64) (n uint64, e overlayEntry, ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := string(key)
	if u.last[s] == 0 {
		return 0, overlayEntry{}, false
	}
	for i := range u.queue {
		b := &u.queue[i]
		if b.op > v || b.op < n || (b.op == n && ok) {
			continue
		}
		j := len(b.keys) - 1 // the last: MSET k a k b leaves k holding b
		for j >= 0 && b.keys[j] != s {
			j--
		}
		if j < 0 {
			continue
		}
		n, ok = b.op, b.held != nil
		if ok {
			e = b.held[j]
		}
	}
	if !ok {
		e = overlayEntry{}
	}
	return n, e, ok
}

func (u *keyUpdates) floorOp() uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.floor
}

// overlayFor returns the pending async writes (and with withCad the cad
// writes) that are the latest update of some of keys (nil: none, the common
// case).
func (u *keyUpdates) overlayFor(keys [][]byte, withCad bool) map[string]overlayEntry {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.overlay) == 0 {
		return nil
	}
	var m map[string]overlayEntry
	for _, k := range keys {
		e, ok := u.overlay[string(k)]
		if !ok || u.last[string(k)] != e.op || (e.cad && !withCad) {
			continue
		}
		if m == nil {
			m = map[string]overlayEntry{}
		}
		m[string(k)] = e
	}
	return m
}

// needRange returns the highest op writing a key in [start, end) (end nil:
// no upper bound). It walks the whole index, which holds only the ops not
// yet readable.
func (u *keyUpdates) needRange(start, end []byte) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	var n uint64
	for k, op := range u.last {
		if op > n && k >= string(start) && (len(end) == 0 || k < string(end)) {
			n = op
		}
	}
	return n
}

// readKeysOf is readKeys as this replica's read checks ask it: with the
// ttlNoReadKey mutation an expiry read names no key, the bug the host
// simulator's expiry reads must catch (TestHostSimCatchesMutations).
func (r *Replica) readKeysOf(op *kv.Op) [][]byte {
	if mutation.On && r.mut.ttlNoReadKey && op.Kind == kv.KindTTL {
		return nil
	}
	return readKeys(op)
}

// readKeys returns the keys a point read depends on (nil for a scan).
func readKeys(op *kv.Op) [][]byte {
	switch op.Kind {
	case kv.KindGet, kv.KindStrlen, kv.KindTTL:
		// TTL, PTTL, EXPIRETIME, PEXPIRETIME read the key's metadata
		// record, which its writes rewrite: without the key here the read
		// waited for none of them and saw no overlay — a VR leader's TTL
		// after the connection's own cad or async write, and a chain
		// member's (the tail's too) after a write the head answered,
		// answered the key's older expiry (TestExpiryReadsTheWriteBefore,
		// TestExpiryCommandsChain).
		return [][]byte{op.Key}
	case kv.KindMGet, kv.KindExists, kv.KindWatch, kv.KindExecRO:
		return op.Keys
	case kv.KindHGet, kv.KindHLen, kv.KindHGetAll, kv.KindHScan:
		// Every hash write rewrites the hash's metadata record at its
		// user key (the applier does not ask kv.ApplyOptions'
		// SparseHashMeta), so the key stands for its field rows too.
		return [][]byte{op.Key}
	}
	return nil
}

// latestVersion is the engine's latest version of key, tombstones included
// (0: the engine holds none — never written, or a sole tombstone that
// compaction reclaimed).
func latestVersion(db *storage.DB, key []byte) (uint64, error) {
	vs, err := db.Versions(key)
	if errors.Is(err, storage.ErrNotFound) || (err == nil && len(vs) == 0) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return vs[0].Version, nil
}

// indexEarly indexes the early-acknowledged writes among the entries the
// leader just appended (before their acks go out: they come later in the
// same Ready), each after the unapplied writes ordered before it
// (indexLate); the others wait in r.late. Both before markAppended puts the
// Ready's cad writes in the overlay: a deferred read that finds a cad write
// there finds every write below it indexed or applied.
func (r *Replica) indexEarly(es []vr.Entry) {
	if len(es) == 0 {
		return
	}
	if len(r.early) == 0 && len(r.ordEarly) == 0 {
		r.late = append(r.late, es...)
		return
	}
	for i := range es {
		e := &es[i]
		k := idKey{e.Client, e.ReqNum}
		if _, ok := r.ordEarly[k]; ok {
			// A sync blind write: marked ordered (markAppended) but not
			// indexed, like any write acknowledged at apply (§12).
			delete(r.ordEarly, k)
			r.late = append(r.late, *e)
			r.appended = append(r.appended, appendedWrite{k, e.Op, e.View})
			continue
		}
		if ks, ok := r.early[k]; ok {
			delete(r.early, k)
			r.indexLate(e.Op)
			if !(mutation.On && r.mut.noEarlyIndex) {
				r.upd.add(e.Op, ks)
			}
			r.appended = append(r.appended, appendedWrite{k, e.Op, e.View})
		} else {
			r.late = append(r.late, *e)
		}
	}
}

// indexLate indexes, before an early-acknowledged op is, the writes ordered
// before it that are not applied and were not indexed at their append (sync
// and state-dependent writes; r.late). Without this a read that starts after
// the early op's acknowledgement could miss such a write ordered before it
// (the key's latest indexed op is older), while another read sees that write
// and not the early op's — together the two reads order the writes both ways
// (docs/design/cad.md §11, "sync writes ordered before a cad write"). Indexed,
// such a write makes a read of its keys wait until it is readable, as a cad
// write does; writes ordered after every early op are still left out, so a
// workload without early acknowledgements pays nothing but this list.
func (r *Replica) indexLate(before uint64) {
	applied := r.applied.Load()
	n := 0
	for n < len(r.late) && r.late[n].Op < before {
		e := &r.late[n]
		n++
		if e.Op <= applied || (mutation.On && r.mut.noLateIndex) {
			continue
		}
		_, op, err := decodeOp(e.Data)
		if err != nil {
			continue // apply reports a corrupt entry
		}
		if ks := op.WrittenKeys(); len(ks) > 0 {
			r.upd.add(e.Op, ks)
		}
		if op.WritesAll() {
			r.upd.flushed(e.Op) // as at apply (replica.go)
		}
	}
	r.dropLate(n)
}

// trimLate forgets the r.late entries up to applied (indexed at apply).
func (r *Replica) trimLate(applied uint64) {
	n := 0
	for n < len(r.late) && r.late[n].Op <= applied {
		n++
	}
	r.dropLate(n)
}

// truncateLate forgets the r.late entries after op (a new leader's log
// replaced them).
func (r *Replica) truncateLate(op uint64) {
	for len(r.late) > 0 && r.late[len(r.late)-1].Op > op {
		r.late[len(r.late)-1] = vr.Entry{}
		r.late = r.late[:len(r.late)-1]
	}
}

func (r *Replica) dropLate(n int) {
	if n == 0 {
		return
	}
	clear(r.late[:n]) // drop references to entry data
	r.late = r.late[n:]
	if len(r.late) == 0 {
		r.late = r.late[:0:0] // release the backing array's spent front
	}
}

// appendedWrite is an early-acknowledged write the leader just appended.
type appendedWrite struct {
	id   idKey
	op   uint64
	view uint64 // the view its entry was ordered in
}

// markAppended answers, at their ordered point, the writes indexEarly saw
// appended that are still waiting for their acknowledgement (cad and
// async): Apply returns with their
// reply, OK at their op, and Wait awaits the acknowledgement
// (docs/design/cad.md §10). Called after the Ready's acks, so that a write
// acknowledged in it is simply finished.
func (r *Replica) markAppended() {
	for _, a := range r.appended {
		for _, p := range r.waitID[a.id] {
			if !p.ordered {
				if p.op != nil {
					// Before Apply returns: the connection's next read of
					// the key must find the value (ReadDeferred). (A sync
					// write has no op here: it is not overlaid, §12.)
					r.overlay(a.op, p.op, !p.async)
				}
				p.early = true
				// The view goes into the session token: if a view change
				// drops the write and gives op a.op to another one, a
				// session read can tell (checkSessionViews).
				p.markOrdered(kv.Result{Kind: kv.ResOK, Version: a.op, View: a.view, ViewKnown: true}, nil)
			}
		}
	}
	clear(r.appended)
	r.appended = r.appended[:0]
}

// raiseFloor records that the engine now holds ops up to op that the index
// may never have seen (a snapshot was installed).
// forget drops the ops up to op and raises the floor to op: the index no
// longer vouches for them, so a read checked against an R below op falls
// back to the engine's versions (complete, cadNeed).
func (u *keyUpdates) forget(op uint64) {
	u.raiseFloor(op)
	u.prune(op)
}

func (u *keyUpdates) raiseFloor(op uint64) {
	u.mu.Lock()
	u.floor = max(u.floor, op)
	u.mu.Unlock()
}

// flushed records a flush at op: an update of every key that names none.
// No read may trust the per-key index below it (the floor), and no pending
// write before it is any key's latest update any more: its overlay entry
// would otherwise still answer reads of its key (overlayFor compares with
// the per-key index, which the flush does not touch).
func (u *keyUpdates) flushed(op uint64) {
	u.mu.Lock()
	u.floor = max(u.floor, op)
	for k, e := range u.overlay {
		if e.op < op {
			delete(u.overlay, k)
		}
	}
	u.mu.Unlock()
}

// complete reports whether the index alone knows every op above r: not if
// r is below the floor, nor below the pruned point — R restarts from 0 in a
// new view (a follower can hold a grant before it learns an R covering the
// view's start), and ops pruned under an earlier, higher R are no longer
// indexed although they are above r.
func (u *keyUpdates) complete(r uint64) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return r >= u.floor && r >= u.pruned
}

// ---- the write path (driver goroutine) ----

// ackPoint says where a write is acknowledged (docs/design/cad.md §1, §19):
// a blind write (the command table's nilext class: its reply depends on no
// state) at cad or async once a majority holds it in memory — the two share
// the write path, as ARCHITECTURE §2 defines async ("as cad, with no
// durability check on reads"); they differ in the overlay, which serves an
// async write to reads from its append on; everything else — sync, and
// every write whose reply reports state (INCR, SET NX/GET, DEL's count...) —
// once committed and applied.
//
// early says whether q may be answered before it is applied at all
// (answerableEarly).
func ackPoint(q *shard.WriteReq, early bool) vr.AckPoint {
	if !early {
		return vr.AckApplied
	}
	switch q.Durability {
	case level.CAD, level.Async:
		return vr.AckReplicated
	}
	return vr.AckApplied
}

// ackPointFor is ackPoint on this replica's engine. A chain answers a write
// before its commit only in AU mode, and only an async blind write: at the
// head, as soon as the head took it (the mode's rule, chain.AU). Every other
// write on a chain — sync, cad, and async under SU or AUSI — is answered at
// commit, and the chain's mode and its members' stores say what that answer
// means (docs/design/chain.md, "Kefir's levels on a chain": cad's read rule
// is not built on a chain, so cad is answered as sync).
func (r *Replica) ackPointFor(q *shard.WriteReq, early bool) vr.AckPoint {
	ack := ackPoint(q, early)
	if c := r.opts.Chain; c != nil && ack != vr.AckApplied && !(c.Mode == chain.AU && q.Durability == level.Async) {
		return vr.AckApplied
	}
	return ack
}

// answerableEarly reports whether op may be answered before it is applied
// (acknowledged early at cad or async, or ordered early at sync, §12): a
// blind write that apply will not reject. One with an empty or reserved key
// (kv.CheckKey) fails at apply and writes nothing — an MSET none of its keys —
// so its reply is that error, known only at apply, and none of its values
// may enter the overlay, where a read could return them. The
// earlyRejectable mutation skips the key check.
func (r *Replica) answerableEarly(op *kv.Op) bool {
	if !NilextEligible(op) {
		return false
	}
	if mutation.On && r.mut.earlyRejectable {
		return true
	}
	t := r.app.pubSlots.Load()
	for _, k := range op.WrittenKeys() {
		if kv.CheckKey(k) != nil {
			return false
		}
		// The slot fence decides at apply (kv/slots.go): a write of a slot
		// that is moving, or not owned, waits for it. A slot owned now can
		// be handed over only after a migrating step this group applies
		// first and a copy, so a write proposed while it is owned is
		// ordered before the hand-over.
		if t != nil && t.Entry(kv.KeySlot(k)).State != kv.SlotOwned {
			return false
		}
	}
	return true
}

// earlyAcks answers the writes the core acknowledged before commit. The
// write enters the overlay first, so a read that follows the reply finds
// its value (async: served at once; cad: deferred). The write's Reply at
// apply then finds no waiter.
func (r *Replica) earlyAcks(acks []vr.Reply) {
	for _, a := range acks {
		k := idKey{a.Client, a.ReqNum}
		ps := r.waitID[k]
		delete(r.waitID, k)
		for _, p := range ps {
			if p.op != nil && !p.early && a.Op > r.applied.Load() {
				r.overlay(a.Op, p.op, !p.async)
			}
			r.st.earlyAcks.Add(1)
			res := kv.Result{Kind: kv.ResOK, Version: a.Op}
			// The view goes into the session token, as markAppended's
			// does: a chain's AU head acknowledges in the Ready that
			// appends the write, before markAppended, and its entry's view
			// (the epoch its head numbered it in) is what tells a later
			// write at that position apart (chainSessionCheck).
			if v, ok := r.logView(a.Op); ok && !(mutation.On && r.mut.chainSessionUnchecked) {
				res.View, res.ViewKnown = v, true
			}
			p.finish(res, nil)
		}
	}
}

// logView is the view of the log entry at op (driver only): from the
// entries after the applied op (r.tail), else the applied view history.
func (r *Replica) logView(op uint64) (uint64, bool) {
	i, ok := slices.BinarySearchFunc(r.tail, op, func(e vr.Entry, op uint64) int { return cmp.Compare(e.Op, op) })
	if ok {
		return r.tail[i].View, true
	}
	return r.views.Load().opView(op)
}

// overlay records a pending blind write (cad: a cad write) the leader
// appended in the current view.
func (r *Replica) overlay(op uint64, w *kv.Op, cad bool) {
	view := r.lastHS.View
	switch w.Kind {
	case kv.KindSet:
		// NilextEligible admits only SETs whose meta the op alone decides.
		r.upd.setOverlay(op, [][]byte{w.Key}, [][]byte{w.Value}, kv.EncodeMeta(kv.TypeString, w.ExpireAt), false, cad, view)
	case kv.KindMSet:
		ks := make([][]byte, 0, len(w.Keys)/2)
		vs := make([][]byte, 0, len(w.Keys)/2)
		for i := 0; i+1 < len(w.Keys); i += 2 {
			ks, vs = append(ks, w.Keys[i]), append(vs, w.Keys[i+1])
		}
		r.upd.setOverlay(op, ks, vs, nil, false, cad, view)
	}
}

// mustPark reports whether a state-dependent reply at op must wait for R:
// with follower reads, a leader applies ops before every active-set member
// did, and the reply (INCR's value, a failed SET NX) is a read of that
// state, which a member must not be able to contradict afterwards.
func (r *Replica) mustPark(op uint64) bool {
	return r.opts.FollowerReads && op > r.readable.Load()
}

// chainDurableWrite reports whether q, acknowledged at ack, is a write that
// asks for durability (sync, the default) on a chain: its reply waits for
// the chain's durable point (parkDurable) — under AUSI and AU, which answer
// without waiting for a disk, the disks of every log member; under every
// mode, some log member's at least: a chain repaired down to memory members
// holds DA where the last log member left it, and its sync writes wait for
// a log member to (re)join and persist them, or fail at the request timeout
// (docs/design/chain.md, "A sync answer needs a disk"). Under SU with a log
// member DA moves with the commit point, so nothing more is waited for. An
// AU async write answered early, and cad and async writes answered at
// commit, keep the mode's answer.
func (r *Replica) chainDurableWrite(q *shard.WriteReq, ack vr.AckPoint) bool {
	c := r.opts.Chain
	return c != nil && ack == vr.AckApplied &&
		(q.Durability == level.Sync || q.Durability.IsZero()) && !(mutation.On && r.mut.chainSyncAtCommit)
}

// parkDurable reports whether p's reply at op must wait for the chain's
// durable point (p.durable; r.durable is the latest Ready's, driver only).
func (r *Replica) parkDurable(p *proposal, op uint64) bool {
	return p.durable && op > r.durable
}

// markUndurable notes on p's batch that its reply at op waits for the
// chain's durable point (driver only), so that a timeout says why
// (ErrNotDurable) rather than blaming a leader change.
func (r *Replica) markUndurable(p *proposal, op uint64) {
	if r.parkDurable(p, op) && p.wait != nil {
		p.wait.undurable.Store(true)
	}
}

// timeoutErr is the error of a wait for bw that ran out (err, else
// ErrNotDurable when a reply of it waits for the chain's durable point).
func (bw *batchWait) timeoutErr(err error) error {
	if err == ErrOutcomeUnknown && bw.undurable.Load() {
		return ErrNotDurable
	}
	return err
}

// releaseParked sends the parked replies R (and, for a write asking for
// durability on a chain, the durable point) now covers.
func (r *Replica) releaseParked() {
	if len(r.parked) == 0 {
		return
	}
	R := r.readable.Load()
	n := 0
	for _, pr := range r.parked {
		if pr.op <= R && (!pr.durable || pr.op <= r.durable) {
			pr.fin()
			continue
		}
		r.parked[n] = pr
		n++
	}
	clear(r.parked[n:])
	r.parked = r.parked[:n]
}

// cloneOp copies a write's bytes (the caller reuses its buffers).
func cloneOp(op *kv.Op) *kv.Op {
	c := *op
	c.Key, c.Value = bytes.Clone(op.Key), bytes.Clone(op.Value)
	c.Keys = make([][]byte, len(op.Keys))
	for i, k := range op.Keys {
		c.Keys[i] = bytes.Clone(k)
	}
	return &c
}
