package server

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/storage"
)

// Key expiry commands (docs/design/expiry.md): SET's EX|PX|EXAT|PXAT|KEEPTTL,
// SETEX, PSETEX, GETEX, EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT, PERSIST (writes)
// and TTL, PTTL, EXPIRETIME, PEXPIRETIME (reads), with Redis's replies and
// errors. A relative TTL becomes an absolute time here, with the same clock
// reading the op carries as Now: the state machine decides expiry with Now
// only, and every replica agrees (kv/expiry.go). A follower forwards the
// command as received, so the leader's front door does this conversion.

// expiryNow is the front door's clock in unix milliseconds.
var expiryNow = func() int64 { return time.Now().UnixMilli() }

// parseSet parses SET with its options (command.ParseSetInto) into *op (the
// zero Op) at the front door's clock, copying the key and value into the
// arena (args alias the reader's buffer).
func parseSet(op *kv.Op, args [][]byte, a *arena) error {
	// The clock only for a SET with options: ParseSet uses now only for an
	// expiry, and a clock read per plain SET is ~6 % of a pipelined SET's
	// CPU (docs/design/one-house.md, "Before and after").
	var now int64
	if len(args) > 3 {
		now = expiryNow()
	}
	err := command.ParseSetInto(op, args, now)
	op.Key, op.Value = a.copy(op.Key), a.copy(op.Value)
	return err
}

// parseExpiryWrite parses the expiry write commands other than SET
// (command.ParseExpiryWrite) at the front door's clock, copying their bytes
// into the arena; ok false: spec is not one of them.
func parseExpiryWrite(spec *command.Spec, args [][]byte, a *arena) (op kv.Op, ok bool, err error) {
	op, ok, err = command.ParseExpiryWrite(spec.Name, args, expiryNow())
	if ok && err == nil {
		op.Key = a.copy(op.Key)
		if op.Value != nil { // SETEX, PSETEX
			op.Value = a.copy(op.Value)
		}
	}
	return op, ok, err
}

// parseExpiryRead parses TTL, PTTL, EXPIRETIME and PEXPIRETIME; ok false: spec
// is none of them. The read's Now is the serving replica's (kv.Read).
func parseExpiryRead(spec *command.Spec, args [][]byte) (kv.Op, bool) {
	unit := int64(-1)
	switch spec.Name {
	case "TTL":
		unit = kv.UnitTTL
	case "PTTL":
		unit = kv.UnitPTTL
	case "EXPIRETIME":
		unit = kv.UnitExpireTime
	case "PEXPIRETIME":
		unit = kv.UnitPExpireTime
	}
	if unit < 0 {
		return kv.Op{}, false
	}
	return kv.Op{Kind: kv.KindTTL, Key: args[1], Delta: unit}, true
}

// Active expiry: the leader (a single node: the node) deletes expired keys
// in the background, so that keys nobody reads again do not stay on disk.
// Each tick (Config.ActiveExpiry, default 100 ms, Redis's hz 10) samples
// keys with meta from a cursor that walks the keyspace and deletes the
// expired ones (kv.KindExpireIfDue, which rechecks each key); while more
// than a tenth of a sample had expired it samples again, for at most a
// quarter of the tick (Redis's adaptive cycle). The decision is
// shard.ExpiryRound's. In a replica group the replica host runs the cycle
// itself, at the leader, on its clock (vrshard/expiry.go: the simulator
// drives it there); the node hands it the tick (ReplicaSpec.ActiveExpiry)
// and runs the cycle here only as a single node. Replicas never delete on
// their own: what a follower applies is the leader's deletes.

// DefaultActiveExpiry is the active expiry tick.
const DefaultActiveExpiry = shard.DefaultActiveExpiry

// activeExpiry is the background cycle's state.
type activeExpiry struct {
	stop, done chan struct{}
	expire     []byte        // a single node's active expiry walk of the keys
	deleted    atomic.Uint64 // keys deleted by a single node's cycle (INFO, tests)
	sweep      walkCursors   // the sweeper's walks of hash generation markers
	swept      atomic.Uint64 // hash rows the sweeper deleted (tests)
}

// walkCursors are where a background walk goes on: over the node's one
// engine, or at a node of several groups (Config.Groups) one per hosted
// group, each walked where this node leads the group.
type walkCursors struct {
	one    []byte
	groups map[cluster.GroupID][]byte
}

// walker walks db, the engine of replica rep whose group is grp (nil: a
// single node), from cursor for at most budget, and returns where it goes on.
type walker func(db *storage.DB, rep shard.Replica, grp cluster.Group, cursor []byte, budget time.Duration) []byte

// each runs walk over the node's engine, or over every hosted group's with
// an equal share of budget.
func (w *walkCursors) each(s *Server, budget time.Duration, walk walker) {
	if s.multi == nil {
		w.one = walk(s.db, s.shard, s.grp, w.one, budget)
		return
	}
	hosted := s.multi.Hosted()
	if w.groups == nil {
		w.groups = map[cluster.GroupID][]byte{}
	}
	for _, lg := range hosted {
		id := lg.Spec.ID
		w.groups[id] = walk(lg.Hosted.Engine, lg.Hosted.Replica, lg.Hosted.Group, w.groups[id], budget/time.Duration(len(hosted)))
	}
}

// startActiveExpiry starts the cycle unless Config.ActiveExpiry is negative.
func (s *Server) startActiveExpiry() {
	every := s.cfg.ActiveExpiry
	if every < 0 {
		return
	}
	if every == 0 {
		every = DefaultActiveExpiry
	}
	ae := &activeExpiry{stop: make(chan struct{}), done: make(chan struct{})}
	s.expiry = ae
	go func() {
		defer close(ae.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ae.stop:
				return
			case <-t.C:
			}
			s.expiryCycle(ae, every/4)
			s.hashSweepCycle(ae, every/4)
		}
	}()
}

// stopActiveExpiry stops the cycle and waits for it, before the shard closes.
func (s *Server) stopActiveExpiry() {
	if ae := s.expiry; ae != nil {
		close(ae.stop)
		<-ae.done
	}
}

// expiryCycle runs one tick's rounds, within budget, over a single node's
// engine (a replica runs its own: vrshard/expiry.go).
func (s *Server) expiryCycle(ae *activeExpiry, budget time.Duration) {
	if s.grp != nil || s.multi != nil {
		return
	}
	ae.expire = s.expiryWalk(ae, s.db, ae.expire, budget)
}

// expiryWalk runs rounds over db from cursor and returns where the walk
// goes on.
func (s *Server) expiryWalk(ae *activeExpiry, db *storage.DB, cursor []byte, budget time.Duration) []byte {
	start := time.Now()
	for {
		keys, next, more, err := shard.ExpiryRound(db, cursor, expiryNow())
		if err != nil {
			s.log.Warn("active expiry", "err", err)
			return cursor
		}
		cursor = next
		if len(keys) > 0 {
			// Now is stamped by the shard: the op rechecks each key with it.
			w := []shard.WriteReq{{Op: kv.Op{Kind: kv.KindExpireIfDue, Keys: keys}}}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			p, err := s.shard.Apply(ctx, w)
			for i := range w {
				if err == nil {
					err = w[i].Err
				}
			}
			if err == nil {
				err = s.shard.Wait(ctx, p)
			}
			cancel()
			if err != nil {
				s.log.Debug("active expiry: delete", "keys", len(keys), "err", err)
				return cursor
			}
			for i := range w {
				ae.deleted.Add(uint64(w[i].Result.Int))
			}
		}
		if !more || time.Since(start) > budget {
			return cursor
		}
		select {
		case <-ae.stop:
			return cursor
		default:
		}
	}
}

// expiredKeys is how many keys this node's active expiry deleted (INFO
// stats expired_keys): while it led, on a replica (its host counts them), on
// a node of several groups in all of them.
func (s *Server) expiredKeys() uint64 {
	switch {
	case s.multi != nil:
		n := uint64(0)
		for _, lg := range s.multi.Hosted() {
			n += lg.Hosted.Group.Stats().ExpiredKeys
		}
		return n
	case s.grp != nil:
		return s.grp.Stats().ExpiredKeys
	case s.expiry == nil:
		return 0
	}
	return s.expiry.deleted.Load()
}

// The orphan-row sweeper (docs/design/hashes.md, "Garbage") runs in the
// same background cycle, after active expiry, on the node that leads: each
// tick it walks up to hashSweepMarkers generation markers from its cursor
// (shard.FindHashGarbage) and proposes replicated sweep ops
// (kv.KindHSweep) deleting up to hashSweepRows rows of dead generations,
// each op rechecking at apply that its generation is dead; it goes on while
// it finds garbage, for at most the tick's budget. That bounds the rows
// deleted to about hashSweepRows per round (one replicated op, one sync),
// rounds to a quarter of the tick. A follower skips it and drops its cursor.
const (
	hashSweepMarkers = 256
	hashSweepRows    = 1024
)

func (s *Server) hashSweepCycle(ae *activeExpiry, budget time.Duration) {
	// At a node of several groups each sweep op goes to the group whose
	// engine was walked, which holds the rows and the marker, not by its
	// hash's key: once a slot moved, the key's slot is another group's, and
	// generations are numbered per group (docs/design/cluster.md).
	ae.sweep.each(s, budget, func(db *storage.DB, rep shard.Replica, grp cluster.Group, cursor []byte, b time.Duration) []byte {
		return s.hashSweepWalk(ae, db, rep, grp, cursor, b)
	})
}

// hashSweepWalk runs sweep rounds over db, the engine of replica rep whose
// group is grp (nil: a single node), from cursor, and returns where the
// walk goes on.
func (s *Server) hashSweepWalk(ae *activeExpiry, db *storage.DB, rep shard.Replica, grp cluster.Group, cursor []byte, budget time.Duration) []byte {
	if grp != nil && !grp.State().IsLeader {
		return nil // a new leader starts its own walk
	}
	start := time.Now()
	for {
		ops, next, err := shard.FindHashGarbage(db, cursor, hashSweepMarkers, hashSweepRows)
		if err != nil {
			s.log.Warn("hash sweep", "err", err)
			return cursor
		}
		cursor = next
		if len(ops) == 0 {
			return cursor
		}
		w := make([]shard.WriteReq, len(ops))
		for i := range ops {
			w[i].Op = ops[i]
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		p, err := rep.Apply(ctx, w)
		if err == nil {
			err = rep.Wait(ctx, p)
		}
		cancel()
		for i := range w {
			if err == nil && w[i].Err != nil {
				err = w[i].Err
			}
			ae.swept.Add(uint64(w[i].Result.Int))
		}
		if err != nil {
			s.log.Debug("hash sweep: delete", "ops", len(ops), "err", err)
			return cursor
		}
		if next == nil || time.Since(start) > budget {
			return cursor
		}
		select {
		case <-ae.stop:
			return cursor
		default:
		}
	}
}
