package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

// Cross-group transactions: this node coordinates a KEFIR.TX transaction
// whose keys fall in several slots (docs/design/transactions.md,
// "Cross-group transactions"; kv/xgtx.go has the ops and the lock rule,
// cluster/xgtx.go the waits and the push).
//
// Each slot the transaction names is a participant with its own snapshot,
// taken at its first key: the first slot's as a single-slot transaction's
// (TxBegin, a linearizable read point at its leader), a further one from
// this node's replica of its group, leader or follower (TxSnapLocal:
// committed state). The commit is two-phase:
//
//  1. a KindTxPrepare in every participant, all at once: validated there as
//     a SERIALIZABLE commit (every key read or written must still have the
//     version its snapshot had — the snapshots are not one cut, so
//     validating the written keys alone would not isolate it), and every
//     key must be unlocked; passing, it locks them and records the writes;
//  2. a KindTxDecide at the primary (the slot of the first written key,
//     else of the first key): commit if every prepare answered PREPARED,
//     else abort. The first decision recorded wins (a push may have
//     recorded abort first): its answer is the outcome;
//  3. a KindTxResolve at every other participant that prepared, with that
//     outcome; then the reply. A resolve that fails is left to the
//     participant's leader, which pushes the transaction (cluster.RunTxPush).
//
// Three consensus rounds in series (prepares in parallel) against one for a
// transaction of one slot, which keeps its one-op commit.

// txMaxParts bounds the slots one transaction names.
const txMaxParts = 16

// txPart is a further slot of a cross-group transaction.
type txPart struct {
	slot   uint16
	snap   *shard.TxSnap
	origin kv.TxOrigin
	key    []byte // its first key: routes its ops
}

// xgtxMutations are this file's deliberate bugs (internal/mutation).
type xgtxMutations struct {
	// readsIgnoreLocks: a transaction's snapshot read of a key that a
	// prepared transaction writes is served (the value before it).
	readsIgnoreLocks bool
}

var xgtxMut xgtxMutations

// errTxReadLocked: a transaction read a key that a prepared cross-group
// transaction writes as of its snapshot. Its value there may already be
// replaced at the transaction's primary; served, a reader could see another
// group's part of that transaction and not this one. The transaction aborts
// (its client retries, from a later start).
type errTxReadLocked struct{ key []byte }

func (e *errTxReadLocked) Error() string {
	return fmt.Sprintf("TXABORT key '%s' is written by a prepared cross-group transaction at this transaction's snapshot; retry", clip(e.key))
}

// partOf returns the further participant key belongs to, nil for the
// first slot's (tx.snap).
func (tx *itxn) partOf(key []byte) *txPart {
	if len(tx.parts) == 0 {
		return nil
	}
	s := cluster.Slot(key)
	for _, p := range tx.parts {
		if p.slot == s {
			return p
		}
	}
	return nil
}

// snapOf is the snapshot key is read from.
func (tx *itxn) snapOf(key []byte) *shard.TxSnap {
	if p := tx.partOf(key); p != nil {
		return p.snap
	}
	return tx.snap
}

// txAddPart opens the participant of key's slot s (tx already has a first
// slot): on a worker, it pins this node's replica of the slot's group. On
// an event loop it sets c.wouldWait with nothing done.
func (c *conn) txAddPart(tx *itxn, key []byte, s uint16) error {
	if c.srv.multi == nil || !c.srv.cfg.CrossGroupTx {
		return cluster.ErrCrossSlot
	}
	for _, p := range tx.parts {
		if p.slot == s {
			return nil
		}
	}
	if len(tx.parts)+1 >= txMaxParts {
		return errf("ERR a transaction spans at most %d slots", txMaxParts)
	}
	if c.inline {
		c.wouldWait = true
		return nil
	}
	snap, err := c.srv.txPartSnap(key)
	if err != nil {
		return err
	}
	o, err := kv.SlotOrigin(snap.Get, key)
	if err != nil {
		snap.Close()
		return err
	}
	tx.parts = append(tx.parts, &txPart{slot: s, snap: snap, origin: o, key: clone(key)})
	return nil
}

// txPartSnap takes a further participant's snapshot: at its group's leader
// if this node leads it (a linearizable start, as BEGIN's); else from this
// node's replica, once it has applied the key's version as the leader reads
// it now (a linearizable read forwarded there), so that a write
// acknowledged before the transaction began is in it. Either way every key
// read from it is validated at the prepare.
func (s *Server) txPartSnap(key []byte) (*shard.TxSnap, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	snap, err := s.multi.TxBegin(ctx, key)
	if err == nil || !errors.Is(err, cluster.ErrNotLeader) || s.router == nil {
		return snap, err
	}
	addr, _ := s.router.LeaderFor(err)
	fc := &cluster.Call{Args: [][]byte{[]byte("GET"), key}, Cons: level.ConsLinearizable}
	s.router.Forward(addr, []*cluster.Call{fc})
	if fc.Err != nil {
		return nil, fc.Err
	}
	after := fc.NewSess.For(uint32(s.multi.GroupOf(key))).Need()
	return s.multi.TxSnapLocal(ctx, key, after)
}

// xgPart is one participant's share of the commit.
type xgPart struct {
	slot   uint16
	snap   *shard.TxSnap
	origin kv.TxOrigin
	key    []byte
	checks []kv.TxCheck
	writes []kv.Op
}

// txCommitCross commits transaction h of several slots (see the top of
// this file). PREPARE runs the same commit and answers null: there is no
// one op for the client to send (the Go client's commit is PREPARE, then
// the op it answers, unless null).
func (c *conn) txCommitCross(h uint64, tx *itxn, prepare bool) error {
	parts := []*xgPart{{slot: uint16(tx.slot), snap: tx.snap, origin: tx.origin}}
	for _, p := range tx.parts {
		parts = append(parts, &xgPart{slot: p.slot, snap: p.snap, origin: p.origin, key: p.key})
	}
	partOf := func(key []byte) *xgPart {
		s := cluster.Slot(key)
		for _, p := range parts {
			if p.slot == s {
				return p
			}
		}
		return nil
	}
	for _, w := range tx.wr {
		k := w.RoutingKey()
		if _, ok := tx.seen(string(k)); !ok {
			// A blind write: its version at the start is checked too.
			tx.now = time.Now().UnixMilli()
			if _, _, _, _, err := tx.get(k); err != nil {
				return c.txFail(h, err)
			}
		}
		p := partOf(k)
		if p == nil {
			return c.txFail(h, fmt.Errorf("cross-group commit: key %q of no participant", k))
		}
		p.writes = append(p.writes, w)
	}
	for _, k := range tx.seenKeys() { // sorted: the ops' bytes are a function of the transaction
		p := partOf([]byte(k))
		if p == nil {
			continue
		}
		if p.key == nil {
			p.key = []byte(k)
		}
		v, _ := tx.seen(k)
		p.checks = append(p.checks, kv.TxCheck{Key: []byte(k), Version: v})
	}
	primary := parts[0]
	if len(tx.wr) > 0 {
		primary = partOf(tx.wr[0].RoutingKey())
	}
	var live []*xgPart
	for _, p := range parts {
		if len(p.checks) > 0 || len(p.writes) > 0 {
			live = append(live, p)
		}
	}
	// The id starts with this node's clock: a group's low-water mark is
	// compared with it (kv.NewTxID), so a decision can be collected.
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	txid := kv.NewTxID(time.Now().UnixMilli(), nonce)
	ops := make([]kv.Op, len(live))
	for i, p := range live {
		op, err := kv.NewTxPrepare(txid, primary.key, p.snap.Version(), p.origin, p.checks, p.writes)
		if err != nil {
			return c.txFail(h, err)
		}
		ops[i] = op
	}
	c.txEnd(h) // everything is in the ops: unpin
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	committed, abort, err := c.srv.twoPhase(ctx, txid, primary.key, live, ops)
	if err != nil {
		return err
	}
	if !committed {
		return &replyError{abort}
	}
	if prepare {
		return c.w.WriteNull()
	}
	return c.w.WriteInt(0)
}

// twoPhase runs prepare, decide and resolve (see the top of this file):
// the decision sequence is cluster.TwoPhase's (the one the deterministic
// simulation runs), with ops forwarded to their groups' leaders (txOps).
func (s *Server) twoPhase(ctx context.Context, txid, primaryKey []byte, parts []*xgPart, prepares []kv.Op) (bool, string, error) {
	keys := make([][]byte, len(parts))
	for i, p := range parts {
		keys[i] = p.key
	}
	committed, abort, forget, err := cluster.TwoPhase(ctx, s.txOps, txid, primaryKey, keys, prepares)
	if err != nil {
		return false, "", errf("ERR %v", err)
	}
	if forget != nil {
		// Off the reply's path: lost, the primary's sweep settles the
		// decision (cluster.SettleTx).
		go func() {
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, _ = s.txOps(fctx, forget)
		}()
	}
	return committed, abort, nil
}

// txOps is the node's cluster.TxOpRunner: each op at its group's leader
// (txGroupOp), all at once.
func (s *Server) txOps(ctx context.Context, ops []kv.Op) ([]string, []error) {
	replies, errs := make([]string, len(ops)), make([]error, len(ops))
	if len(ops) == 1 {
		replies[0], errs[0] = s.txGroupOp(ctx, ops[0])
		return replies, errs
	}
	var wg sync.WaitGroup
	for i := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i], errs[i] = s.txGroupOp(ctx, ops[i])
		}()
	}
	wg.Wait()
	return replies, errs
}

// txGroupOp runs a two-phase op at its group's leader (writeAtLeader)
// and answers its RESP reply line ("+PREPARED", "-TXABORT ..."). The ops
// are idempotent by transaction id (a prepare again answers PREPARED, a
// decide the first decision, a resolve nothing), so a forward's retries are
// safe.
func (s *Server) txGroupOp(ctx context.Context, op kv.Op) (string, error) {
	res, fwd, err := s.writeAtLeader(ctx, op, level.Sync)
	switch {
	case err != nil:
		return "", err
	case fwd == nil:
		return strings.TrimSuffix(string(res.Bulk), "\r\n"), nil
	case fwd.Kind == resp.Error:
		return "-" + string(fwd.Str), nil
	case fwd.Kind == resp.Simple:
		return "+" + string(fwd.Str), nil
	}
	return "", fmt.Errorf("cross-group %v: unexpected reply %v", op.Kind, fwd.Kind)
}

// writeAtLeader applies op, routed by its key, at its group's leader: this
// node's replica if it leads (res), else forwarded as KEFIR.TXAPPLY (fwd:
// the leader's reply; the forwarder's lanes give it a request id, so a
// retry runs it once). The one path for the ops a node sends to another
// group on its own account: cross-group transactions' and FLUSHALL's parts
// (flush.go).
func (s *Server) writeAtLeader(ctx context.Context, op kv.Op, d level.Durability) (res kv.Result, fwd *resp.Value, err error) {
	res, err = s.shard.Write(ctx, op, d, shard.ReqID{})
	if err == nil || !errors.Is(err, cluster.ErrNotLeader) || s.router == nil {
		return res, nil, err
	}
	addr, _ := s.router.LeaderFor(err)
	fc := &cluster.Call{Args: [][]byte{[]byte("KEFIR.TXAPPLY"), kv.AppendOp(nil, &op)}, Dur: d}
	s.router.Forward(addr, []*cluster.Call{fc})
	if fc.Err != nil {
		return kv.Result{}, nil, fc.Err
	}
	return kv.Result{}, &fc.Reply, nil
}

// txPush is the node's cluster.TxPusher: cluster.PushTx over txOps.
func (s *Server) txPush(ctx context.Context, key []byte, p kv.TxPrepared) error {
	return cluster.PushTx(ctx, s.txOps, key, p)
}

// txPushPeriod is how often a leader looks for transactions left prepared.
const txPushPeriod = 250 * time.Millisecond

// startTxPush runs the push sweep of a node of several groups until ctx
// ends.
func (s *Server) startTxPush(ctx context.Context) {
	if s.multi == nil || !s.cfg.CrossGroupTx {
		return
	}
	s.multi.SetTxPusher(s.txPush)
	s.multi.SetTxOps(s.txOps)
	go s.multi.RunTxPush(ctx, txPushPeriod, time.Now)
}
