package vrshard

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	kcluster "github.com/kefirdb/kefir/internal/cluster"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/core"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/vr"
)

// The nilext fast path (Skyros; internal/vr nilext.go, ARCHITECTURE §5.2),
// on when Options.Nilext is set. Experimental.
//
// Driver side: every replica passes nilext updates it receives (MsgNilext,
// from whichever node coordinates them) to the core's Nilext, writes the
// core's Ready.DLog records into the same log batch as entries (one fsync;
// a log segment starts with the whole live d-log, so a roll loses none) and
// hands them back in State.DLog on restart, and sends each Ready.NilextAck
// to the node that coordinated the update (MsgNilextAck). A linearizable
// read at the leader first asks the core's ReadNilext: a read of a key with
// a pending nilext update waits until the d-log is ordered and applied.
//
// Coordinator side (NilextApply): this node sends the update to every
// replica, itself included, and completes it on vr.NilextSupermajority acks
// of one view including that view's leader (vr.NilextTracker). Without them
// within NilextTimeout the update falls back to the ordered path with the
// same request id: the client table makes the two copies apply once.
//
// Identities: the core's d-log cleanup (nxExecuted) relies on a client
// having one request outstanding, so the coordinator never sends two
// concurrent updates under one client id. It keeps a pool of identities
// (random client ids, increasing request numbers), takes one per update and
// puts it back only after a fast completion; an identity whose update fell
// back is retired, since the ordered copy may still be in flight.

// nxKey is a nilext update's identity.
type nxKey struct{ client, req uint64 }

// Call states.
const (
	nxPending   int32 = iota
	nxDone            // completed on a supermajority: the write is linearized
	nxFailed          // the local replica refused it (not normal): fall back
	nxAbandoned       // the caller timed out: fall back
)

type nxCall struct {
	req   vr.NilextRequest
	tr    *vr.NilextTracker
	state atomic.Int32
	wait  *batchWait
	born  time.Time
	acks  []vr.NilextAck // mutation nilextMajority only

	// A direct call (NilextTake) waits for this replica's own ack only:
	// the client that sent it counts the supermajority. The driver sets ack,
	// or err when it refuses the update, before it settles the call.
	direct bool
	ack    vr.NilextAck
	err    error
}

// settle moves a pending call to state s; only the first settle counts.
func (c *nxCall) settle(s int32) bool {
	if !c.state.CompareAndSwap(nxPending, s) {
		return false
	}
	if c.wait.left.Add(-1) == 0 {
		close(c.wait.done)
	}
	return true
}

type nxIdent struct{ client, seq uint64 }

// nxIdents is the pool of coordinator identities. It also holds, for
// direct updates (NilextTake), the highest request number this replica took
// from each client id (high, driver goroutine only) and the counters of the
// direct path.
type nxIdents struct {
	mu   sync.Mutex
	free []nxIdent
	rand func() uint64 // Replica.rand

	high                      map[uint64]uint64
	directTaken, directRefuse atomic.Uint64
}

func (p *nxIdents) get() nxIdent {
	p.mu.Lock()
	defer p.mu.Unlock()
	var id nxIdent
	if n := len(p.free); n > 0 {
		id = p.free[n-1]
		p.free = p.free[:n-1]
	} else {
		id.client = p.rand() | 1
	}
	id.seq++
	return id
}

func (p *nxIdents) put(id nxIdent) {
	p.mu.Lock()
	p.free = append(p.free, id)
	p.mu.Unlock()
}

// NilextOn reports whether the fast path is on.
func (r *Replica) NilextOn() bool { return r.opts.Nilext }

// NilextEligible reports whether op is a nilext update the fast path takes:
// plain SET (no NX/XX/GET) and MSET, as internal/command classifies them.
func NilextEligible(op *kv.Op) bool {
	switch op.Kind {
	case kv.KindSet:
		// A SET with an expiry still in the future writes what the op alone
		// says (value and meta); KEEPTTL (meta from state) and an expiry
		// already past (a deletion) are not blind.
		return op.Cond == kv.Always && !op.ReturnOld && op.TTL == 0 && (op.ExpireAt == 0 || op.ExpireAt > op.Now)
	case kv.KindMSet:
		return len(op.Keys) > 0 && len(op.Keys)%2 == 0
	}
	return false
}

// nilextKeys copies the keys op writes: the core keeps them in its d-log,
// and callers reuse op's buffers once the call returns.
func nilextKeys(op *kv.Op) [][]byte {
	if op.Kind == kv.KindSet {
		return [][]byte{bytes.Clone(op.Key)}
	}
	ks := make([][]byte, 0, len(op.Keys)/2)
	for i := 0; i < len(op.Keys); i += 2 {
		ks = append(ks, bytes.Clone(op.Keys[i]))
	}
	return ks
}

// NilextApply runs writes through the fast path, this node coordinating:
// every write must be NilextEligible and carry no request id. Writes that
// complete get Result OK and Err nil. The indexes it returns are writes that
// did not complete within NilextTimeout (or that this replica could not
// take): their ID is set to the identity the fast path used, and the caller
// must apply them through the ordered path (Apply here, or forwarding to the
// leader) with that ID, so a copy already in some d-log is applied once.
// After a timeout the fast path rests for NilextBackoff: writes in that time
// come back at once as fallbacks with no ID (nothing was sent).
func (r *Replica) NilextApply(ctx context.Context, reqs []shard.WriteReq) ([]int, error) {
	if err := r.failed(); err != nil {
		return nil, err
	}
	if !r.opts.Nilext {
		return nil, vr.ErrNilextOff
	}
	if r.clock.Now().UnixNano() < r.nxCool.Load() {
		// A recent write missed the supermajority (a replica is down or
		// slow): take the ordered path at once instead of waiting out
		// NilextTimeout on every write; the fast path is tried again after
		// NilextBackoff. Nothing was sent, so no id needs carrying over.
		fb := make([]int, len(reqs))
		for i := range reqs {
			fb[i] = i
		}
		r.st.nxFallbacks.Add(uint64(len(reqs)))
		return fb, nil
	}
	if fb, split, err := r.nilextApplyValid(ctx, reqs); split {
		return fb, err
	}
	bw, calls, ids := r.nilextCalls(reqs)
	select {
	case r.nxc <- calls:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-r.done:
		return nil, r.closedErr()
	}
	r.awaitBatch(ctx, bw, r.opts.NilextTimeout)
	return r.nilextSettle(reqs, calls, ids), ctx.Err()
}

// nilextCalls makes the coordinated calls of NilextApply's writes, each
// with a coordinator identity from the pool, and their batchWait.
func (r *Replica) nilextCalls(reqs []shard.WriteReq) (bw *batchWait, calls []*nxCall, ids []nxIdent) {
	bw = &batchWait{done: make(chan struct{})}
	bw.left.Store(int32(len(reqs)))
	calls = make([]*nxCall, len(reqs))
	ids = make([]nxIdent, len(reqs))
	ts := r.clock.Now().UnixNano()
	now := r.clock.Now()
	for i := range reqs {
		q := &reqs[i]
		if !NilextEligible(&q.Op) || !q.ID.IsZero() {
			panic("vrshard: NilextApply with an ineligible write or one with an id")
		}
		ids[i] = r.nxIDs.get()
		calls[i] = &nxCall{
			req: vr.NilextRequest{
				Request: vr.Request{Client: ids[i].client, ReqNum: ids[i].seq, Data: encodeOp(nil, header{ts: ts}, &q.Op)},
				Keys:    nilextKeys(&q.Op),
				Sync:    q.Durability == level.Sync || q.Durability.IsZero(),
			},
			tr: vr.NewNilextTracker(r.cfg.Members), wait: bw, born: now,
		}
	}
	return bw, calls, ids
}

// nilextSettle ends NilextApply's wait: a call still pending is abandoned
// (and the fast path rests), a completed one is answered OK in reqs, and
// the others are returned as fallbacks, their ID set to the identity the
// fast path used.
func (r *Replica) nilextSettle(reqs []shard.WriteReq, calls []*nxCall, ids []nxIdent) []int {
	var fallback []int
	for i, c := range calls {
		if c.settle(nxAbandoned) {
			r.nxCool.Store(r.clock.Now().Add(r.opts.NilextBackoff).UnixNano())
		}
		if c.state.Load() == nxDone {
			r.nxIDs.put(ids[i])
			reqs[i].Result, reqs[i].Err = kv.Result{Kind: kv.ResOK}, nil
			r.st.nxFast.Add(1)
			continue
		}
		reqs[i].ID = shard.ReqID{Client: ids[i].client, Seq: ids[i].seq}
		fallback = append(fallback, i)
		r.st.nxFallbacks.Add(1)
	}
	return fallback
}

// nilextApplyValid keeps off the fast path the writes of reqs that apply
// would reject (nilextValid: an empty or reserved key, a key or value above
// the engine's limits): acknowledged before they are applied, they would be
// answered OK and write nothing — or stop every replica that applies them.
// They come back as fallbacks with no ID (nothing was sent), for the ordered
// path to answer with their error; the others take the fast path (split:
// some were kept off, fb and err are NilextApply's).
func (r *Replica) nilextApplyValid(ctx context.Context, reqs []shard.WriteReq) (fb []int, split bool, err error) {
	if mutation.On && r.mut.nilextUnchecked {
		return nil, false, nil
	}
	var ok []int
	for i := range reqs {
		if r.nilextValid(&reqs[i].Op) == nil {
			ok = append(ok, i)
		}
	}
	if len(ok) == len(reqs) {
		return nil, false, nil
	}
	var subFB []int
	if len(ok) > 0 {
		sub := make([]shard.WriteReq, len(ok))
		for j, i := range ok {
			sub[j] = reqs[i]
		}
		subFB, err = r.NilextApply(ctx, sub)
		for j, i := range ok {
			reqs[i] = sub[j]
		}
	}
	isFB := make([]bool, len(reqs))
	for _, j := range subFB {
		isFB[ok[j]] = true
	}
	okSet := make([]bool, len(reqs))
	for _, i := range ok {
		okSet[i] = true
	}
	refused := 0
	for i := range reqs {
		if !okSet[i] || isFB[i] {
			fb = append(fb, i) // in request order, as the ordered path must apply them
			if !okSet[i] {
				refused++
			}
		}
	}
	r.st.nxFallbacks.Add(uint64(refused))
	return fb, true, err
}

// ErrNilextResting: the fast path rests after a recent timeout (see
// NilextApply) and did not take the write; use the ordered path.
var ErrNilextResting = errors.New("vrshard: nilext fast path resting after a timeout; use the ordered path")

// NilextWrite is one nilext write through the fast path, falling back to
// this replica's ordered path (Write) with the fast path's id, which it
// returns (zero when the write completed fast). A follower's fallback
// returns *NotLeaderError: retry at the leader with that id. While the fast
// path rests it returns ErrNilextResting and sends nothing.
func (r *Replica) NilextWrite(ctx context.Context, op kv.Op, d level.Durability) (kv.Result, shard.ReqID, error) {
	reqs := [1]shard.WriteReq{{Op: op, Durability: d}}
	fb, err := r.NilextApply(ctx, reqs[:])
	if err != nil {
		return kv.Result{}, reqs[0].ID, err
	}
	if len(fb) == 0 {
		return reqs[0].Result, shard.ReqID{}, nil
	}
	if reqs[0].ID.IsZero() {
		return kv.Result{}, shard.ReqID{}, ErrNilextResting
	}
	res, err := r.Write(ctx, op, d, reqs[0].ID)
	return res, reqs[0].ID, err
}

// ---- driver goroutine: the coordinator ----

// nilextCoord is the nilext fast path's driver-side state and policy, VR's
// extension of the host: VR's adapter owns it (vrCore.nx) and steps the
// nilext messages into it (take, ack), and the host's generic paths reach
// it only as their engineExt — the d-log records it adds to a log batch,
// the acks it routes once a batch is written, the entries it says were
// acknowledged before they were ordered (group commit, nilext_gc.go), the
// reads of pending keys it registers, its sweeps on ticks and new views.
// Open makes one for a VR replica with Options.Nilext; without it a
// replica runs none (NilextApply refuses, and a nilext message from a
// peer is dropped unacked, so its coordinator falls back).
type nilextCoord struct {
	r *Replica // the host: its network, clocks, counters, mutations
	c *vrCore  // VR's core: the d-log, the updates' acks
	// wait holds the calls this replica coordinates (and direct takes
	// waiting for this replica's ack); origin the coordinator of each
	// update not acked yet; view the view of the last sweep.
	wait   map[nxKey]*nxCall
	origin map[nxKey]uint64
	view   uint64
}

var _ engineExt = (*nilextCoord)(nil)

func newNilextCoord(r *Replica, c *vrCore) *nilextCoord {
	return &nilextCoord{r: r, c: c, wait: map[nxKey]*nxCall{}, origin: map[nxKey]uint64{}}
}

// nxStart hands calls (NilextApply's, NilextTake's) to the coordinator.
// Without one (the fast path is off) every call fails.
func (r *Replica) nxStart(calls []*nxCall) {
	if r.nx == nil {
		for _, c := range calls {
			if c.direct {
				c.err = r.mapErr(vr.ErrNilextOff)
			}
			c.settle(nxFailed)
		}
		return
	}
	r.nx.start(r.now(), calls)
}

// start registers coordinated calls, takes them locally and sends them to
// every other member in one message each.
func (n *nilextCoord) start(now int64, calls []*nxCall) {
	r := n.r
	reqs := make([]vr.NilextRequest, 0, len(calls))
	for _, c := range calls {
		if c.direct {
			n.takeDirect(now, c)
			continue
		}
		k := nxKey{c.req.Client, c.req.ReqNum}
		n.wait[k] = c
		n.origin[k] = r.cfg.Self
		if err := n.c.Nilext(now, c.req); err != nil {
			// Not normal (a view change): the others could not complete it
			// without our ack if we lead, and we cannot tell; fall back.
			delete(n.wait, k)
			delete(n.origin, k)
			c.settle(nxFailed)
			continue
		}
		reqs = append(reqs, c.req)
	}
	if len(reqs) == 0 {
		return
	}
	for _, to := range r.cfg.Members {
		if to == r.cfg.Self {
			continue
		}
		r.st.nxSent.Add(1)
		_ = r.net.Send(to, n.c.NilextMessage(to, reqs))
	}
}

// take takes the updates coordinator `from` sent into the core's d-log
// (VR's adapter steps the nilext messages, vrcore.go stepNilext, and has
// checked the group identity).
func (n *nilextCoord) take(now int64, from uint64, reqs []vr.NilextRequest) {
	for _, q := range reqs {
		k := nxKey{q.Client, q.ReqNum}
		n.origin[k] = from
		if err := n.c.Nilext(now, q); err != nil {
			delete(n.origin, k) // no ack: the coordinator falls back
		}
	}
}

func (n *nilextCoord) ack(a vr.NilextAck) {
	k := nxKey{a.Client, a.ReqNum}
	c := n.wait[k]
	if c == nil {
		return
	}
	if c.state.Load() != nxPending {
		delete(n.wait, k)
		return
	}
	if c.direct {
		delete(n.wait, k)
		c.ack = a
		c.settle(nxDone)
		return
	}
	done := c.tr.Add(a)
	if mutation.On && n.r.mut.nilextMajority {
		done = c.majority(a, n.c.Config())
	}
	if done {
		delete(n.wait, k)
		c.settle(nxDone)
	}
}

// majority is the deliberately wrong completion rule (tests only).
func (c *nxCall) majority(a vr.NilextAck, cfg vr.Config) bool {
	c.acks = append(c.acks, a)
	n, leader := 0, false
	for _, b := range c.acks {
		if b.View == a.View {
			n++
			leader = leader || (b.Leader && cfg.LeaderOf(b.View) == b.From)
		}
	}
	return leader && n >= len(cfg.Members)/2+1
}

// route sends the core's acks to the updates' coordinators.
func (n *nilextCoord) route(acks []vr.NilextAck) {
	r := n.r
	var out map[uint64][]vr.NilextAck
	for _, a := range acks {
		k := nxKey{a.Client, a.ReqNum}
		to, ok := n.origin[k]
		if !ok {
			continue // restored from disk, or its coordinator is unknown: it retransmits or falls back
		}
		delete(n.origin, k)
		if to == r.cfg.Self {
			n.ack(a)
			continue
		}
		if out == nil {
			out = map[uint64][]vr.NilextAck{}
		}
		out[to] = append(out[to], a)
	}
	for to, as := range out {
		// One message per run of acks that share view and leader flag.
		for len(as) > 0 {
			k := 1
			for k < len(as) && as[k].View == as[0].View && as[k].Leader == as[0].Leader {
				k++
			}
			r.st.nxAcksSent.Add(uint64(k))
			_ = r.net.Send(to, n.c.NilextAcksMessage(to, as[:k]))
			as = as[k:]
		}
	}
}

// sweep forgets abandoned calls and, on a view change, coordinators of
// updates the core will not ack any more (it dropped its d-log).
func (n *nilextCoord) sweep(viewChanged bool) {
	for k, c := range n.wait {
		if c.state.Load() != nxPending {
			delete(n.wait, k)
			continue
		}
		if viewChanged && c.direct {
			// The core dropped (or re-ordered) its d-log and will not ack
			// this copy: tell its client now instead of at its timeout.
			delete(n.wait, k)
			c.err = &NotLeaderError{}
			c.settle(nxFailed)
		}
	}
	if viewChanged || len(n.origin) > 1<<20 {
		clear(n.origin)
	}
}

// The host's hooks (engineExt).

func (n *nilextCoord) readyExtra() (pending, urgent bool) {
	for i := range n.c.dlog {
		if n.c.dlog[i].Sync {
			urgent = true // its ack waits for the fsync
			break
		}
	}
	return len(n.c.dlog) > 0 || len(n.c.nxAcks) > 0, urgent
}

// logExtra writes the d-log records with the batch (one fsync); a new
// segment starts with the whole live d-log, so a roll loses none.
func (n *nilextCoord) logExtra(w *wal, whole bool) {
	if whole {
		w.addDLog(n.c.DLogRecords())
		return
	}
	w.addDLog(n.c.dlog)
}

func (n *nilextCoord) written() {
	if len(n.c.nxAcks) > 0 {
		n.route(n.c.nxAcks)
	}
}

// preAcked: an entry the leader ordered from the d-log was acknowledged on
// the fast path; its clients do not wait for its fsync.
func (n *nilextCoord) preAcked(client, req uint64) bool { return n.c.InDLog(client, req) }

// readFirst: a read of a key with a pending nilext update waits until the
// core has ordered the d-log and it is committed (a slow-path read, released
// in ReadStates as a read-index read).
func (n *nilextCoord) readFirst(now int64, ctx uint64, op *kv.Op) bool {
	slow, err := n.c.ReadNilext(now, ctx, n.readKeys(op))
	if err == nil && slow {
		n.r.st.nxSlowReads.Add(1)
		return true
	}
	return false
}

func (n *nilextCoord) tick() { n.sweep(false) }

func (n *nilextCoord) round(info core.Info) {
	if info.View != n.view {
		n.view = info.View
		n.sweep(true)
	}
}

// publish publishes the nilext figures of VR's Info (taken by the Info
// call publish just made).
func (n *nilextCoord) publish() {
	vi, r := &n.c.info, n.r
	r.dlogLen.Store(int64(vi.DLogLen))
	r.nxCycles.Store(vi.NilextCycles)
	r.nxStaleWaits.Store(vi.NilextStaleWaits)
	r.dlogStale.Store(vi.DLogStale)
}

// readKeys returns the keys a linearizable read of op depends on, for
// ReadNilext. A scan depends on every pending key in its range; a read-only
// script on every pending key (its Key and End are nil).
func (n *nilextCoord) readKeys(op *kv.Op) [][]byte {
	if mutation.On && n.r.mut.ttlNoReadKey && op.Kind == kv.KindTTL {
		return nil // the mutation (readKeysOf)
	}
	switch op.Kind {
	case kv.KindGet, kv.KindStrlen, kv.KindTTL, kv.KindHGet, kv.KindHLen, kv.KindHGetAll, kv.KindHScan:
		// A hash read depends on its user key: every hash write names it;
		// an expiry read (TTL…) on its key's metadata, which its writes
		// rewrite (TestExpiryReadsTheWriteBefore).
		return [][]byte{op.Key}
	case kv.KindMGet, kv.KindExists, kv.KindWatch, kv.KindExecRO:
		return op.Keys
	case kv.KindScan, kv.KindEvalRO:
		var ks [][]byte
		for _, q := range n.c.DLog() {
			for _, k := range q.Keys {
				if bytes.Compare(k, op.Key) >= 0 && (op.End == nil || bytes.Compare(k, op.End) < 0) {
					ks = append(ks, k)
				}
			}
		}
		return ks
	}
	return nil
}

// ---- the d-log on disk ----

// recDLog: count uvarint, then per update: client, reqnum, data, key count,
// keys, sync byte. A segment's d-log is the union of its recDLog records
// (the core drops what the client table shows applied).
const recDLog = 6

func (w *wal) addDLog(es []vr.NilextRequest) {
	if len(es) == 0 {
		return
	}
	w.record(recDLog, func(b []byte) []byte {
		b = binary.AppendUvarint(b, uint64(len(es)))
		for i := range es {
			q := &es[i]
			b = binary.AppendUvarint(b, q.Client)
			b = binary.AppendUvarint(b, q.ReqNum)
			b = appendBytes(b, q.Data)
			b = binary.AppendUvarint(b, uint64(len(q.Keys)))
			for _, k := range q.Keys {
				b = appendBytes(b, k)
			}
			if q.Sync {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
		return b
	})
}

func (st *walState) applyDLog(p []byte) error {
	r := reader{b: p}
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		return ErrCorruptEntry
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		q := vr.NilextRequest{Request: vr.Request{Client: r.uvarint(), ReqNum: r.uvarint()}}
		q.Data = append([]byte(nil), r.bytes()...)
		nk := r.uvarint()
		if nk > uint64(len(r.b)) {
			return ErrCorruptEntry
		}
		for j := uint64(0); j < nk && r.err == nil; j++ {
			q.Keys = append(q.Keys, append([]byte(nil), r.bytes()...))
		}
		q.Sync = r.byte() == 1
		if r.err == nil {
			st.dlog = append(st.dlog, q)
		}
	}
	return r.err
}

// ---- updates straight from a client (the Go client's broadcast) ----

// Errors of NilextTake callers branch on.
var (
	// ErrNilextStale: this replica already took a later request of the
	// client id. A client has one nilext update outstanding per id and sends
	// them in order, so an older one arriving now is a misuse (or a copy
	// delayed past its successor): it gets no ack, since the core would
	// count it executed once the later one is applied.
	ErrNilextStale = errors.New("vrshard: nilext request older than one this replica already took from its client id")
	// ErrNilextBusy: the same request is already waiting for its ack here.
	ErrNilextBusy = errors.New("vrshard: nilext request already in flight at this replica")
	// ErrNilextInvalid: the update is not one the fast path may take.
	ErrNilextInvalid = errors.New("vrshard: not a valid nilext update")
)

// maxNilextClients bounds NilextTake's per-client memory.
const maxNilextClients = 1 << 16

// NilextTake appends a nilext update a client sent to every replica itself
// (RESP KEFIR.NILEXT, docs/design/resp-extensions.md) to this replica's
// d-log and returns this replica's ack: its view, its id and whether it leads
// that view. The ack of a sync update comes once the d-log record is on disk.
// The client, not this replica, completes the update on
// vr.NilextSupermajority acks of one view including the leader's, and falls
// back to the ordered path (Write with the same id) without them.
//
// Everything a client controls is checked here, because a plain RESP user
// can send it: the op must be a nilext update (NilextEligible) within the
// engine's key and value limits (a lazily applied update must not fail
// later), the id must be non-zero, and an id older than one this replica
// already took from the same client is refused (ErrNilextStale).
func (r *Replica) NilextTake(ctx context.Context, id shard.ReqID, op kv.Op, d level.Durability) (vr.NilextAck, error) {
	if err := r.failed(); err != nil {
		return vr.NilextAck{}, err
	}
	if !r.opts.Nilext {
		return vr.NilextAck{}, vr.ErrNilextOff
	}
	if err := r.nilextValidTake(id, &op, d); err != nil {
		r.nxIDs.directRefuse.Add(1)
		return vr.NilextAck{}, err
	}
	c := r.directCall(id, &op, d, r.clock.Now().UnixNano(), &batchWait{done: make(chan struct{})})
	c.wait.left.Store(1)
	select {
	case r.nxc <- []*nxCall{c}:
	case <-ctx.Done():
		return vr.NilextAck{}, ctx.Err()
	case <-r.done:
		return vr.NilextAck{}, r.closedErr()
	}
	r.awaitBatch(ctx, c.wait, r.opts.RequestTimeout)
	if c.settle(nxAbandoned) {
		if err := ctx.Err(); err != nil {
			return vr.NilextAck{}, err
		}
		return vr.NilextAck{}, fmt.Errorf("%w: no ack within %v", shard.ErrUnavailable, r.opts.RequestTimeout)
	}
	if c.state.Load() == nxDone {
		return c.ack, nil
	}
	return vr.NilextAck{}, c.err
}

// directCall is the call of a direct update (NilextTake, NilextTakeBatch,
// NilextTakeStepped) stamped ts, settled through bw.
func (r *Replica) directCall(id shard.ReqID, op *kv.Op, d level.Durability, ts int64, bw *batchWait) *nxCall {
	return &nxCall{
		req: vr.NilextRequest{
			Request: vr.Request{Client: id.Client, ReqNum: id.Seq, Data: encodeOp(nil, header{ts: ts}, op)},
			Keys:    nilextKeys(op),
			Sync:    d == level.Sync || d.IsZero(),
		},
		wait: bw, born: r.clock.Now(), direct: true,
	}
}

func (r *Replica) nilextValidTake(id shard.ReqID, op *kv.Op, d level.Durability) error {
	if id.Client == 0 || id.Seq == 0 {
		return fmt.Errorf("%w: client id and request number must be non-zero", ErrNilextInvalid)
	}
	if err := r.nilextValid(op); err != nil {
		return err
	}
	return r.CheckDurability(d)
}

// nilextValid checks a client's nilext op before it enters a d-log: once
// acknowledged it must apply without an execution error.
func (r *Replica) nilextValid(op *kv.Op) error {
	if !NilextEligible(op) {
		return fmt.Errorf("%w: only a plain SET or an MSET of key/value pairs", ErrNilextInvalid)
	}
	for _, k := range op.WrittenKeys() {
		// An empty or reserved key fails at apply and the write (an MSET:
		// all of it) writes nothing.
		if err := kv.CheckKey(k); err != nil && !(mutation.On && r.mut.nilextUnchecked) {
			return fmt.Errorf("%w: %w", ErrNilextInvalid, err)
		}
	}
	if err := r.oversize(op); err != nil {
		return fmt.Errorf("%w: %w", ErrNilextInvalid, err)
	}
	return nil
}

// takeDirect runs a NilextTake on the driver goroutine.
func (n *nilextCoord) takeDirect(now int64, c *nxCall) {
	r := n.r
	k := nxKey{c.req.Client, c.req.ReqNum}
	refuse := func(err error) {
		r.nxIDs.directRefuse.Add(1)
		c.err = err
		c.settle(nxFailed)
	}
	if w := n.wait[k]; w != nil && w.state.Load() == nxPending {
		refuse(ErrNilextBusy)
		return
	}
	if r.nxIDs.high == nil || len(r.nxIDs.high) > maxNilextClients {
		// Forgetting is safe for clients that keep the one-outstanding rule;
		// it only weakens the check against misuse for a moment.
		r.nxIDs.high = map[uint64]uint64{}
	}
	if h := r.nxIDs.high[c.req.Client]; h > c.req.ReqNum {
		refuse(fmt.Errorf("%w: %d after %d", ErrNilextStale, c.req.ReqNum, h))
		return
	}
	n.wait[k] = c
	n.origin[k] = r.cfg.Self
	if err := n.c.Nilext(now, c.req); err != nil {
		delete(n.wait, k)
		delete(n.origin, k)
		refuse(r.mapErr(err))
		return
	}
	r.nxIDs.high[c.req.Client] = c.req.ReqNum
	r.nxIDs.directTaken.Add(1)
	if mutation.On && r.mut.directAckEarly {
		// The mutation: this replica's ack before its d-log record is
		// durable (the core acks a sync update only once it is).
		view, st := n.c.ViewStatus()
		delete(n.wait, k)
		c.ack = vr.NilextAck{Client: c.req.Client, ReqNum: c.req.ReqNum, From: r.cfg.Self, View: view,
			Leader: st == vr.Normal && n.c.Config().LeaderOf(view) == r.cfg.Self}
		c.settle(nxDone)
	}
}

// NilextDirectStats reports how many direct updates (NilextTake) this
// replica acknowledged and refused.
func (r *Replica) NilextDirectStats() (taken, refused uint64) {
	return r.nxIDs.directTaken.Load(), r.nxIDs.directRefuse.Load()
}

// NilextDirect is one update of a NilextTakeBatch.
type NilextDirect = kcluster.NilextDirect

// NilextTakeBatch is NilextTake for several updates (from several client
// ids) at once: one hand-off to the driver, one wait, and for sync updates
// one shared fsync. acks[i] is valid when errs[i] is nil.
func (r *Replica) NilextTakeBatch(ctx context.Context, ups []NilextDirect) (acks []vr.NilextAck, errs []error) {
	acks, errs = make([]vr.NilextAck, len(ups)), make([]error, len(ups))
	if err := r.failed(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return acks, errs
	}
	if !r.opts.Nilext {
		for i := range errs {
			errs[i] = vr.ErrNilextOff
		}
		return acks, errs
	}
	bw := &batchWait{done: make(chan struct{})}
	calls := make([]*nxCall, len(ups))
	var send []*nxCall
	ts := r.clock.Now().UnixNano()
	for i := range ups {
		u := &ups[i]
		if err := r.nilextValidTake(u.ID, &u.Op, u.Durability); err != nil {
			r.nxIDs.directRefuse.Add(1)
			errs[i] = err
			continue
		}
		calls[i] = r.directCall(u.ID, &u.Op, u.Durability, ts, bw)
		send = append(send, calls[i])
	}
	if len(send) == 0 {
		return acks, errs
	}
	bw.left.Store(int32(len(send)))
	fail := func(err error) ([]vr.NilextAck, []error) {
		for i, c := range calls {
			if c != nil {
				errs[i] = err
			}
		}
		return acks, errs
	}
	select {
	case r.nxc <- send:
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-r.done:
		return fail(r.closedErr())
	}
	r.awaitBatch(ctx, bw, r.opts.RequestTimeout)
	for i, c := range calls {
		switch {
		case c == nil:
		case c.settle(nxAbandoned):
			errs[i] = fmt.Errorf("%w: no ack within %v", shard.ErrUnavailable, r.opts.RequestTimeout)
			if err := ctx.Err(); err != nil {
				errs[i] = err
			}
		case c.state.Load() == nxDone:
			acks[i] = c.ack
		default:
			errs[i] = c.err
		}
	}
	return acks, errs
}

// awaitBatch waits until every call of bw has settled, d has passed, ctx
// has ended or the replica has closed; the caller settles what is left.
func (r *Replica) awaitBatch(ctx context.Context, bw *batchWait, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-bw.done:
	case <-timer.C:
	case <-ctx.Done():
	case <-r.done:
	}
}

// ---- stepped mode (stepped.go) ----

// SteppedTake is NilextTake without waiting: the update goes to the driver
// (nxStart, the direct path: takeDirect), and Poll reports this replica's
// ack once the core gave it — for a sync update, once the d-log record is
// durable — or an error (refused; no ack within RequestTimeout on the
// replica's clock). The client, not this replica, completes the update on
// a supermajority of acks and falls back to the ordered path with the
// same id without them.
type SteppedTake struct {
	r        *Replica
	c        *nxCall
	deadline time.Time
	ack      vr.NilextAck
	err      error
	done     bool
}

// NilextTakeStepped starts a direct nilext update (NilextTake's checks,
// then the driver's take).
func (r *Replica) NilextTakeStepped(id shard.ReqID, op kv.Op, d level.Durability) *SteppedTake {
	st := &SteppedTake{r: r, deadline: r.clock.Now().Add(r.opts.RequestTimeout)}
	if err := r.failed(); err != nil {
		st.err, st.done = err, true
		return st
	}
	if !r.opts.Nilext {
		st.err, st.done = vr.ErrNilextOff, true
		return st
	}
	if err := r.nilextValidTake(id, &op, d); err != nil {
		r.nxIDs.directRefuse.Add(1)
		st.err, st.done = err, true
		return st
	}
	st.c = r.directCall(id, &op, d, r.clock.Now().UnixNano(), &batchWait{done: make(chan struct{})})
	st.c.wait.left.Store(1)
	r.nxStart([]*nxCall{st.c})
	r.afterStep()
	st.Poll()
	return st
}

// Poll advances the take and reports whether it is finished (Result).
func (st *SteppedTake) Poll() bool {
	if st.done {
		return true
	}
	select {
	case <-st.c.wait.done:
	default:
		if st.r.clock.Now().Before(st.deadline) {
			return false
		}
	}
	switch {
	case st.c.settle(nxAbandoned):
		st.err = fmt.Errorf("%w: no ack within %v", shard.ErrUnavailable, st.r.opts.RequestTimeout)
	case st.c.state.Load() == nxDone:
		st.ack = st.c.ack
	default:
		st.err = st.c.err
	}
	st.done = true
	return true
}

// Result is this replica's ack (after Poll reported it finished).
func (st *SteppedTake) Result() (vr.NilextAck, error) { return st.ack, st.err }
