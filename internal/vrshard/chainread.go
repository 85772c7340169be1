package vrshard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kefirdb/kefir/internal/chain"
	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
)

// Strong reads at any chain member (issue 30's query node choice; CRAQ,
// docs/design/chain.md, "Reads at any member on the host").
//
// Under SU and AUSI a chain member serves linearizable, cross-client-
// monotonic and bounded reads itself, under the master's lease, when every
// key the read returns is clean here: no update to it that this member
// holds is uncommitted (acknowledged by its successor: at the tail). Why
// that is linearizable: every update the tail holds passed through this
// member first, and this member's host indexes an update's keys
// (indexChain, into the per-key update index of cad.go) before the Ready
// that passes it on is sent. So at the read's check, any update already
// committed at the tail — and every write answered before the read began
// — is indexed here or applied; a clean key's latest indexed update is
// applied, so the engine shows the key's latest committed version, and the
// host's engine holds only committed state. The read takes effect at its
// check.
//
// A dirty key: this member does not know whether the tail committed its
// update yet, and the engine's older value may already be overwritten by
// an answered write (the acknowledgement passes a member on its way to the
// head before its host applies it). So the read goes to the tail — the
// front door forwards a *NotLeaderError naming it — where the key is clean
// but for the tail's own unpersisted updates; there (or with no tail
// known) it waits until the key's latest update here is applied, then
// reads: every update committed before the read was at most that one.
// Never a dirty value (the mutation chainReadDirty serves one).
//
// Under AU nothing is linearizable (the head answers async writes alone):
// linearizable reads are refused and bounded ones go to the head, as
// before (CheckConsistency).

// chainCRAQ reports whether this replica is a chain member serving strong
// reads at any member (SU, AUSI).
func (r *Replica) chainCRAQ() bool {
	co := r.opts.Chain
	return co != nil && co.Mode != chain.AU
}

// chainReads reports whether a read at level c is a chain member's strong
// read (chainRead) rather than a leader's.
func (r *Replica) chainReads(c level.Consistency) bool {
	return r.chainCRAQ() && needsLeader(c)
}

// indexChain indexes the keys each entry (a chain entry as the host's log
// holds it: chainEntry) writes, at its op, as an update not yet committed
// here: the driver, before the Ready's messages leave. They leave the index
// as the host applies them (publishReadable: min(applied, R), R the commit
// point).
func (r *Replica) indexChain(es []core.Entry) {
	for i := range es {
		e := &es[i]
		ce, err := fromLogEntry(*e)
		if err != nil {
			continue // apply reports it
		}
		req, err := decodeChainOp(ce.Op)
		if err != nil || len(req.Data) == 0 {
			continue
		}
		if _, _, ok, _ := decodeForget(req.Data); ok {
			continue
		}
		_, op, err := decodeOp(req.Data)
		if err != nil {
			continue
		}
		if ks, vals := chainBlind(&op, e.Op); vals != nil {
			r.upd.addHeld(e.Op, ks, vals)
		} else {
			r.upd.add(e.Op, op.WrittenKeys())
		}
		if op.Kind == kv.KindTxPrepare && e.Op > r.chainTxPrepared.Load() {
			r.chainTxPrepared.Store(e.Op)
		}
		if op.WritesAll() || kv.IsSlotKind(op.Kind) {
			// Every key is dirty until it is applied (chainTry: the floor).
			// A slot-table op too: its keys are the table's, but it changes
			// which keys this group serves — a member acknowledges upstream
			// before its host applies, so the head may answer a hand-over
			// (and the destination take writes) while a member would still
			// serve the slot's keys clean under its old table.
			r.upd.flushed(e.Op)
			if e.Op > r.chainDirtyAll.Load() {
				r.chainDirtyAll.Store(e.Op)
			}
		}
		if mutation.On && r.mut.chainReadDirty {
			// Deliberately broken (tests): the dirty value served at once,
			// from the async overlay's path (leaderCheck exempts its keys).
			r.overlay(e.Op, &op, false)
		}
	}
}

// chainBlind returns, for a blind write — one whose effect on each key it
// writes depends on nothing the key held: a plain SET (NilextEligible: no
// NX/XX/GET, no KEEPTTL, an expiry still ahead), MSET and DEL — the keys
// it writes and what it leaves each holding (a copy: the entry's buffers
// are the log's), for chainHeldRead; nil for anything else (INCR, APPEND,
// SET NX, a hash write, an expiry change, a script, ...: their value is
// the key's state at apply, which only the engine computes). A write whose
// apply would refuse a key (kv.CheckKey) is not blind either: the whole
// op fails there and leaves every key as it was.
func chainBlind(op *kv.Op, at uint64) ([][]byte, []overlayEntry) {
	switch op.Kind {
	case kv.KindSet:
		if !NilextEligible(op) || kv.CheckKey(op.Key) != nil {
			return nil, nil
		}
		return [][]byte{op.Key}, []overlayEntry{heldValue(at, op.Value, kv.EncodeMeta(kv.TypeString, op.ExpireAt))}
	case kv.KindMSet:
		if !NilextEligible(op) {
			return nil, nil
		}
		ks := make([][]byte, 0, len(op.Keys)/2)
		vals := make([]overlayEntry, 0, len(op.Keys)/2)
		for i := 0; i+1 < len(op.Keys); i += 2 {
			if kv.CheckKey(op.Keys[i]) != nil {
				return nil, nil
			}
			ks = append(ks, op.Keys[i])
			vals = append(vals, heldValue(at, op.Keys[i+1], nil)) // MSET clears expiries
		}
		return ks, vals
	case kv.KindDel:
		if len(op.Keys) == 0 {
			return nil, nil
		}
		vals := make([]overlayEntry, len(op.Keys))
		for i, k := range op.Keys {
			if kv.CheckKey(k) != nil {
				return nil, nil
			}
			vals[i] = overlayEntry{op: at, tomb: true}
		}
		return op.Keys, vals
	}
	return nil, nil
}

func heldValue(at uint64, v, meta []byte) overlayEntry {
	e := overlayEntry{op: at, value: bytes.Clone(v), meta: bytes.Clone(meta)}
	if e.value == nil {
		e.value = []byte{}
	}
	return e
}

// chainOutcome is what a chain member's read check found.
type chainOutcome uint8

const (
	chainServed  chainOutcome = iota // clean: the result is the answer
	chainToTail                      // dirty here: the tail answers
	chainWait                        // dirty at the tail (or none known): wait for need
	chainNoLease                     // no lease published: ask the driver
)

// chainTry checks a chain member's strong read of op without waiting.
func (r *Replica) chainTry(op kv.Op) (kv.Result, uint64, chainOutcome, error) {
	ls := r.lease.Load()
	if ls == nil || ls.follower || r.now() >= ls.until {
		return kv.Result{}, 0, chainNoLease, nil
	}
	res, need, R, err := r.leaderCheck(op, false)
	if err != nil {
		return kv.Result{}, 0, chainServed, err
	}
	if f := r.chainDirtyAll.Load(); f > R {
		// An op writing keys it does not name (WritesAll: a flush, a
		// script, a cross-group decide or resolve) or a slot-table op is
		// here and not yet committed here: indexChain raised the index's
		// floor to it, and every key is dirty until it is applied.
		// cadNeed's fallback below the floor, the engine's versions, does
		// not show it (a key the tail already flushed read here as its old
		// value: TestChainCRAQReadWhileAFlushIsInFlight). Not the floor
		// itself: it also starts at the engine's last version, which a
		// restart's committed prefix covers — but not under the mutation
		// chainCommitIgnoresEngine, whose member would then send every
		// read on for ever (TestChainMemoryTailMutation).
		need = max(need, f)
	}
	if need <= R {
		r.st.chainClean.Add(1)
		r.st.localReads.Add(1)
		return res, 0, chainServed, nil
	}
	if t := r.chainTail.Load(); t != 0 && t != r.cfg.Self {
		return kv.Result{}, need, chainToTail, nil
	}
	return kv.Result{}, need, chainWait, nil
}

// chainRead serves a chain member's strong read (the comment above).
func (r *Replica) chainRead(ctx context.Context, op kv.Op) (kv.Result, error) {
	res, need, out, err := r.chainTry(op)
	switch {
	case err != nil || out == chainServed:
		return res, err
	case out == chainToTail:
		if res, ok, err := r.chainVersionRead(ctx, op); ok {
			return res, err
		}
		return kv.Result{}, r.toTail()
	case out == chainWait:
		r.st.chainWaits.Add(1)
		if r.chainDurable() {
			return r.chainDurableWait(ctx, op, need)
		}
		if err := r.waitApplied(ctx, need, r.opts.RequestTimeout); err != nil {
			return kv.Result{}, err
		}
		return r.readLocal(op)
	}
	// No lease published (just started, or between leases): the driver
	// grants the read at this member's whole history (chainCore.Read), a
	// superset of every key's latest update here.
	if err := r.linearizable(ctx, &op); err != nil {
		return kv.Result{}, err
	}
	if r.chainDurable() {
		return r.chainDurableWait(ctx, op, 0)
	}
	return r.readLocal(op)
}

// Strong reads at the durable point (AUSI; docs/design/chain.md, "Strong
// reads at the durable point"). Under AUSI a commit is every member
// holding an update in memory, before any disk has it: a value served at
// the commit point could be taken by a power cut of every member after a
// client read it (its write unanswered: a sync write is answered at the
// durable point), and a later read would return the older value. So, as
// CAD's reads, a strong read returns a value only once it is at the
// durable point DA: R is DA there (chainCore.Ready), so a clean key's
// latest update is durable already (chainTry), and every other path —
// the wait at the tail, the version query's answer, the fallback without
// a lease — reads the engine, which holds every committed update, and
// serves what it read only if each update it showed is at most R, else
// waits for R to pass it and reads again (chainDurableRead).

// chainDurable reports whether this member's strong reads are held to the
// durable point: a chain member under AUSI. Under SU DA moves with LA (the
// engine never shows an update above it), and AU serves no strong read.
func (r *Replica) chainDurable() bool {
	co := r.opts.Chain
	return co != nil && co.Mode == chain.AUSI
}

// chainDurableWait is chainDurableRead for the waits of chainRead, given
// the request's timeout, failing as waitApplied does when it runs out.
func (r *Replica) chainDurableWait(ctx context.Context, op kv.Op, need uint64) (kv.Result, error) {
	res, done, err := r.chainDurableRead(ctx, op, need, r.opts.RequestTimeout)
	if err != nil || done {
		return res, err
	}
	if r.isLeader.Load() {
		return kv.Result{}, ErrCannotServe
	}
	return kv.Result{}, r.redirect()
}

// chainDurableRead serves op from the engine once it applied need and
// every update the engine showed the read is at the durable point R, within
// d (done false: it ran out). The check comes after the engine read: every
// update of a key at most engineTop (loaded after the read) and above R is
// still in the update index (pruned at min(applied, R)), so the largest
// (chainShown) bounds what the read returned. If it is above R, the read
// waits for R to pass it and answers what it read — not a second read: that
// value was committed at the read, which came after every write answered
// before the read began (need), and is durable once R passed it; a second
// read of a hot key would find the next update above R each time and wait
// until its deadline (TestChainAUSIHotKeyReadIsNotStarved).
func (r *Replica) chainDurableRead(ctx context.Context, op kv.Op, need uint64, d time.Duration) (kv.Result, bool, error) {
	deadline := time.Now().Add(d)
	if done, err := r.untilApplied(ctx, need, d, nil); !done || err != nil {
		return kv.Result{}, false, err
	}
	res, err := r.readLocal(op)
	if err != nil {
		return kv.Result{}, true, err
	}
	top, R := r.engineTop.Load(), r.readable.Load()
	if shown := r.chainShown(&op, top, R); shown > R {
		r.st.chainDurableWaits.Add(1)
		if done, err := r.until(ctx, &r.readable, shown, time.Until(deadline), nil); !done || err != nil {
			return kv.Result{}, false, err
		}
	}
	return res, true, nil
}

// chainShown bounds the newest update of what op reads that an engine read
// showing ops up to top returned, for the check against R: each key's
// latest update at most top (keyUpdates.needAtMost), an op writing every
// key (chainDirtyAll) if at most top, and top itself for a scan or an index
// that does not know every op above R (after a restart, below a flush's
// floor).
func (r *Replica) chainShown(op *kv.Op, top, R uint64) uint64 {
	var need uint64
	if f := r.chainDirtyAll.Load(); f <= top {
		need = f
	}
	keys := r.readKeysOf(op)
	if keys == nil || !r.upd.complete(R) {
		return max(need, top)
	}
	for _, k := range keys {
		need = max(need, r.upd.needAtMost(k, top))
	}
	return need
}

// toTail is the error that sends a read dirty here to the tail: the front
// door forwards it there, also when the request asked for redirects (a
// -MOVED names a leader: the Go client would send its writes to the tail).
func (r *Replica) toTail() error {
	r.st.chainToTail.Add(1)
	t := r.chainTail.Load()
	return &NotLeaderError{Leader: t, Addr: r.addrs.client(r, t), ReadAt: true}
}

// CRAQ's version query (docs/design/chain.md, "The version query"). A
// member where a key read is dirty asks the tail, at the tail's front door
// (Options.AskTail: KEFIR.CHAINVERSION), for its version v: the tail's
// commit point, which is at least every op the tail has acknowledged — every write
// answered before the read began is at most v (the head answers a write
// once the tail's acknowledgement reached it), and the tail answers only
// under its lease, as the tail, in the member's epoch. The member then
// needs, for each key read, the latest of its updates at most v (its
// index: every op up to v passed through this member, indexed before it
// was passed on, or is applied here) and answers from its engine — which
// holds committed state only — once it applied that far. Its value is then
// the key's value at v or later, committed, taken after the read began:
// linearizable. An update held here and not yet at the tail is above v,
// so it is neither waited for nor served. If the tail's version is ahead
// of this member's apply (the acknowledgement is on its way) the member
// waits, at most chainVersionWait; if that runs out, or the query fails
// (an older tail that knows no KEFIR.CHAINVERSION, a tail that is no
// longer one, no answer in chainVersionAsk), the read goes to the tail
// whole, as before. Saved: the read's value on the hop and the read's
// work at the tail, not the hop.

const (
	// chainVersionAsk bounds the version query's round trip.
	chainVersionAsk = 200 * time.Millisecond
	// chainVersionWait bounds how long a member waits to apply up to the
	// version the tail answered before it sends the read on whole. The
	// acknowledgements up to it left the tail before its answer did, so
	// they are a hop and a driver round or two away: on loopback under
	// load, with a 2 ms bound, 3 of about 2,900 such reads fell back
	// (bench/chain-reads.sh). Short, because a waiting read holds every
	// reply pipelined behind it on its connection; the forward past it
	// costs one hop.
	chainVersionWait = 5 * time.Millisecond
)

// ErrNotChainTail refuses a version query (ChainVersion) at a replica that
// cannot answer one: not a chain member under SU or AUSI, not the tail,
// without its lease, or in another epoch than the asker's. The asker sends
// its read to the tail whole.
var ErrNotChainTail = errors.New("vrshard: not this chain's tail")

// chainVersionRead serves a strong read of a key dirty here by the version
// query (above); ok false: it could not, and the read goes to the tail.
func (r *Replica) chainVersionRead(ctx context.Context, op kv.Op) (res kv.Result, ok bool, err error) {
	t := r.chainTail.Load()
	if r.opts.AskTail == nil || t == 0 || t == r.cfg.Self {
		return kv.Result{}, false, nil
	}
	v, err := r.askVersion(ctx, t, r.addrs.client(r, t), r.chainEpoch.Load())
	if err != nil {
		if ctx.Err() != nil {
			return kv.Result{}, true, ctx.Err()
		}
		r.st.chainVersionFallbacks.Add(1)
		return kv.Result{}, false, nil
	}
	if res, ok, err := r.chainHeldRead(op, v); ok {
		return res, true, err
	}
	need := r.chainNeedAt(&op, v)
	if mutation.On && r.mut.chainVersionUnchecked {
		need = 0 // Deliberately broken (tests): the engine's value as it is.
	}
	wait := chainVersionWait
	if mutation.On && r.mut.chainVersionWait > 0 {
		wait = r.mut.chainVersionWait
	}
	if r.applied.Load() < need {
		r.st.chainVersionWaited.Add(1) // the acknowledgement still on its way here
	}
	var done bool
	if r.chainDurable() {
		// Under AUSI the engine may hold committed updates above v and
		// above the durable point: served once durable.
		res, done, err = r.chainDurableRead(ctx, op, need, wait)
	} else if done, err = r.untilApplied(ctx, need, wait, nil); done && err == nil {
		res, err = r.readLocal(op)
	}
	if err != nil && !done {
		return kv.Result{}, true, err
	}
	if !done {
		r.st.chainVersionFallbacks.Add(1)
		return kv.Result{}, false, nil
	}
	if err == nil {
		r.st.chainVersionReads.Add(1)
		r.st.localReads.Add(1)
	}
	return res, true, err
}

// chainHeldRead answers a read of one key at the tail's version v from the
// update this member holds and has not applied (CRAQ proper: its store
// holds the dirty version, and the tail's version makes it the committed
// one), if the key's latest update at most v is held here and blind
// (chainBlind): its value is then the key's value at v — committed (at
// most v), and no older than any write answered before the read began (at
// most v too, and before it in the log) — without waiting for this
// member's apply, which the acknowledgement still on its way up would
// bring. ok false: not such a read; the caller takes the engine's way
// (chainNeedAt).
//
// Only a read of one key (GET, STRLEN, and MGET and EXISTS of one key): a
// held value is the key's state at exactly v, and the engine's other keys
// may be at another op, so a read of several keys could return a state no
// prefix of the log had. Not while an op writing every key or a slot-table
// op is in flight here (chainDirtyAll above what was applied): such an op
// at most v overrides the key's update without naming it in the index.
// Not if the index may miss ops above the commit point (complete: after a
// restart, below a flush's floor). An update above v — not yet at the tail
// — is never served: heldAtMost looks at ops up to v only (the mutation
// chainHeldNewest serves the newest held one).
func (r *Replica) chainHeldRead(op kv.Op, v uint64) (kv.Result, bool, error) {
	if !r.opts.ChainHeldReads || r.chainDurable() {
		// Not under AUSI: a held update is not applied here, so it is
		// above R (at most applied), and may not be durable yet.
		return kv.Result{}, false, nil
	}
	key, one := oneKeyRead(&op)
	if !one {
		return kv.Result{}, false, nil
	}
	if mutation.On && r.mut.chainHeldNewest {
		v = ^uint64(0) // Deliberately broken (tests): the newest held update.
	}
	// chainDirtyAll first: every op writing every key that is at most v was
	// indexed (before it was passed on towards the tail) before the tail
	// answered, so the load sees it; if it is applied by the load of
	// applied, every such op is.
	dirtyAll := r.chainDirtyAll.Load()
	applied := r.applied.Load()
	// A key a prepared cross-group transaction write-locks refuses plain
	// writes at apply (kv.txLockGate: the entry becomes a no-op), which
	// the held entry cannot show: while the engine may hold any lock, or a
	// prepare not applied yet may take one, the engine's way. Read after
	// applied: a lock the ops up to applied took is visible (the applier
	// stores it before it publishes applied), and a prepare at most v was
	// indexed before the tail could answer v (as chainDirtyAll).
	if dirtyAll > applied || !r.upd.complete(r.readable.Load()) || r.app.txLocked.Load() || r.chainTxPrepared.Load() > applied {
		return kv.Result{}, false, nil
	}
	n, e, blind := r.upd.heldAtMost(key, v)
	if n <= applied || !blind {
		// Applied here (the engine shows it: no wait), or a write whose
		// value only its apply computes (the wait).
		return kv.Result{}, false, nil
	}
	res, err := r.readWith(op, map[string]overlayEntry{string(key): e})
	if err == nil {
		r.st.chainHeldReads.Add(1)
		r.st.chainVersionReads.Add(1)
		r.st.localReads.Add(1)
	}
	return res, true, err
}

// oneKeyRead returns the key of a read of one key whose answer is that
// key's string value or absence (chainHeldRead).
func oneKeyRead(op *kv.Op) ([]byte, bool) {
	switch op.Kind {
	case kv.KindGet, kv.KindStrlen:
		return op.Key, true
	case kv.KindMGet, kv.KindExists:
		if len(op.Keys) == 1 {
			return op.Keys[0], true
		}
	}
	return nil, false
}

// chainNeedAt is the op this member must have applied to answer op at the
// tail's version v: for each key read, its latest update at most v here
// (keyUpdates.needAtMost), and an op writing every key (chainDirtyAll) if
// it is at most v, else v itself. A scan, or an index that does not know every op above
// R (after a restart, below a flush's floor), waits for every update of
// what it reads up to v (cadNeed, capped at v).
func (r *Replica) chainNeedAt(op *kv.Op, v uint64) uint64 {
	// chainDirtyAll is only the highest op writing every key: with it
	// above v, a lower one at most v may still be in flight here, its
	// writes in no per-key index (a script's, a flush's), so the member
	// applies up to v itself. Below R it is applied: nothing to wait for.
	need := min(r.chainDirtyAll.Load(), v)
	R := r.readable.Load()
	keys := r.readKeysOf(op)
	if keys == nil || !r.upd.complete(R) {
		return max(need, min(r.cadNeed(op, R, nil), v))
	}
	for _, k := range keys {
		need = max(need, r.upd.needAtMost(k, v))
	}
	return need
}

// ChainVersion answers a member's version query (KEFIR.CHAINVERSION epoch)
// at the tail: its commit point as its core last handed it out, at least
// every op it has acknowledged (handle stores it before the Ready's
// messages leave) and not its own updates still to persist (SU), which
// a member need not wait for: no write among them has been answered. Refused (ErrNotChainTail)
// unless this replica is the tail of an SU or AUSI chain in epoch, under
// its lease: a tail the master gave up on must not answer — the master
// waits out its lease before another member commits without it.
func (r *Replica) ChainVersion(epoch uint64) (uint64, error) {
	if !r.chainCRAQ() {
		return 0, fmt.Errorf("%w: not a chain member serving strong reads at any member (SU, AUSI)", ErrNotChainTail)
	}
	if ls := r.lease.Load(); ls == nil || ls.follower || r.now() >= ls.until {
		return 0, fmt.Errorf("%w: member %d holds no lease", ErrNotChainTail, r.cfg.Self)
	}
	if e := r.chainEpoch.Load(); e != epoch {
		return 0, fmt.Errorf("%w: member %d is in epoch %d, the asker in %d", ErrNotChainTail, r.cfg.Self, e, epoch)
	}
	if t := r.chainTail.Load(); t != r.cfg.Self {
		return 0, fmt.Errorf("%w: member %d is not the tail (%d is)", ErrNotChainTail, r.cfg.Self, t)
	}
	r.st.chainVersionAnswers.Add(1)
	return r.chainCommitted.Load(), nil
}
