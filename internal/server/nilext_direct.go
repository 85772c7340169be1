package server

import (
	"context"
	"errors"
	"strconv"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/shard"
)

// KEFIR.TOPOLOGY and KEFIR.NILEXT: what the Go client needs to run the
// nilext fast path itself (docs/design/resp-extensions.md, "Nilext fast
// path"). The client learns the group and whether the fast path is on from
// KEFIR.TOPOLOGY, sends each nilext update to every replica with
// KEFIR.NILEXT, and completes it on a supermajority of the acks (one view,
// the leader's included); the replica only appends to its d-log and says in
// which view it did. A single ack is not a completion, which the reply's
// shape (three integers, no +OK) makes plain to a redis-cli user.

// topology answers KEFIR.TOPOLOGY:
//
//	[cluster-id, view, leader-id, nilext (0|1), self-id, [[id, client-addr], ...]]
//
// Members come in leader order (view v is led by members[v mod n]), which
// the client needs to believe an ack's leader flag. A single node answers
// zeros and no members.
func (c *conn) topology() error {
	w := c.w
	s := c.srv
	_ = w.WriteArrayHeader(6)
	if s.grp == nil {
		for range 5 {
			_ = w.WriteInt(0)
		}
		return w.WriteArrayHeader(0)
	}
	in := s.grp.State()
	nilext := int64(0)
	if s.grp.NilextOn() {
		nilext = 1
	}
	_ = w.WriteInt(int64(s.cfg.ClusterID))
	_ = w.WriteInt(int64(in.View))
	_ = w.WriteInt(int64(in.Leader))
	_ = w.WriteInt(nilext)
	_ = w.WriteInt(int64(s.cfg.ReplicaID))
	members := s.groupMembers() // a reconfigured group's, membership.go
	_ = w.WriteArrayHeader(len(members))
	for _, m := range members {
		_ = w.WriteArrayHeader(2)
		_ = w.WriteInt(int64(m.ID))
		_ = w.WriteBulkString(m.ClientAddr)
	}
	return nil
}

// nilextTake answers KEFIR.NILEXT client seq durability SET k v | MSET k v ...
// with this replica's ack [view, replica-id, leader (0|1)].
func (c *conn) nilextTake(args [][]byte) error {
	if c.srv.grp == nil || !c.srv.grp.NilextOn() {
		return errf("ERR KEFIR.NILEXT: the nilext fast path is off on this node")
	}
	if eq(args[1], "BATCH") {
		return c.nilextTakeBatch(args[2:])
	}
	client, err1 := strconv.ParseUint(string(args[1]), 10, 64)
	seq, err2 := strconv.ParseUint(string(args[2]), 10, 64)
	if err1 != nil || err2 != nil || client == 0 || seq == 0 {
		return errf("ERR KEFIR.NILEXT: client id and request number must be non-zero unsigned integers")
	}
	d, err := level.ParseDurability(string(args[3]))
	if err != nil {
		return errf("ERR KEFIR.NILEXT: %s", err.Error())
	}
	var op kv.Op
	rest := args[4:]
	switch {
	case eq(rest[0], "SET") && len(rest) == 3:
		// No options: SET with NX, XX or GET reports state and is not nilext.
		op = kv.Op{Kind: kv.KindSet, Key: rest[1], Value: rest[2]}
	case eq(rest[0], "MSET") && len(rest) >= 3 && len(rest)%2 == 1:
		op = kv.Op{Kind: kv.KindMSet, Keys: rest[1:]}
	default:
		return errf("ERR KEFIR.NILEXT takes only SET key value or MSET key value [key value ...]")
	}
	// The arguments alias the reader's buffer; NilextTake copies what the
	// d-log keeps before it returns.
	ack, err := c.srv.grp.NilextTake(context.Background(), shard.ReqID{Client: client, Seq: seq}, op, d)
	if err != nil {
		return nilextTakeError(err)
	}
	return writeNilextAck(c.w, ack)
}

// writeNilextAck writes one replica's ack [view, replica-id, leader (0|1)].
func writeNilextAck(w *resp.Writer, a cluster.NilextAck) error {
	leader := int64(0)
	if a.Leader {
		leader = 1
	}
	_ = w.WriteArrayHeader(3)
	_ = w.WriteInt(int64(a.View))
	_ = w.WriteInt(int64(a.From))
	return w.WriteInt(leader)
}

// nilextTakeError: -ERR for what the client got wrong (it must not retry the
// same request), -UNAVAILABLE for what this replica cannot do now (no ack
// from it this time; the client may still complete on the others, or fall
// back to the ordered path).
func nilextTakeError(err error) error {
	var nl *cluster.NotLeaderError
	var bad *cluster.RequestError
	switch {
	case errors.As(err, &bad), errors.Is(err, level.ErrUnknownLevel):
		return errf("ERR KEFIR.NILEXT: %s", err.Error())
	case errors.As(err, &nl):
		return errf("UNAVAILABLE KEFIR.NILEXT: replica not normal (view change or recovery)")
	}
	// A request already in flight here, and anything else this replica
	// cannot do now.
	return errf("UNAVAILABLE KEFIR.NILEXT: %s", err.Error())
}

// maxNilextBatch bounds one KEFIR.NILEXT BATCH.
const maxNilextBatch = 4096

// errNilextBatchSyntax is built once, not on every batch.
var errNilextBatchSyntax = &replyError{"ERR KEFIR.NILEXT BATCH n [client seq durability pairs key value ...] x n"}

// nilextTakeBatch answers KEFIR.NILEXT BATCH n [client seq durability pairs k v ...]×n
// with an array of n replies, each this replica's ack [view, replica-id,
// leader] or an error for that update alone. The updates (any client ids)
// go to the VR driver together and share one fsync: a client sends one batch
// per replica for all the writes it has in flight.
func (c *conn) nilextTakeBatch(args [][]byte) error {
	bad := errNilextBatchSyntax
	if len(args) < 1 {
		return bad
	}
	n, err := strconv.Atoi(string(args[0]))
	if err != nil || n < 1 || n > maxNilextBatch {
		return bad
	}
	args = args[1:]
	ups := make([]cluster.NilextDirect, n)
	pre := make([]error, n) // parse errors, per update
	for i := range n {
		if len(args) < 4 {
			return bad
		}
		pairs, err := strconv.Atoi(string(args[3]))
		if err != nil || pairs < 1 || len(args) < 4+2*pairs {
			return bad
		}
		client, err1 := strconv.ParseUint(string(args[0]), 10, 64)
		seq, err2 := strconv.ParseUint(string(args[1]), 10, 64)
		d, err3 := level.ParseDurability(string(args[2]))
		pairsKV := args[4 : 4+2*pairs]
		args = args[4+2*pairs:]
		switch {
		case err1 != nil || err2 != nil || client == 0 || seq == 0:
			pre[i] = errf("ERR KEFIR.NILEXT: client id and request number must be non-zero unsigned integers")
		case err3 != nil:
			pre[i] = errf("ERR KEFIR.NILEXT: %s", err3.Error())
		case pairs == 1:
			ups[i] = cluster.NilextDirect{ID: shard.ReqID{Client: client, Seq: seq}, Durability: d,
				Op: kv.Op{Kind: kv.KindSet, Key: pairsKV[0], Value: pairsKV[1]}}
		default:
			ups[i] = cluster.NilextDirect{ID: shard.ReqID{Client: client, Seq: seq}, Durability: d,
				Op: kv.Op{Kind: kv.KindMSet, Keys: pairsKV}}
		}
	}
	if len(args) != 0 {
		return bad
	}
	var take []cluster.NilextDirect
	var at []int
	for i := range ups {
		if pre[i] == nil {
			take, at = append(take, ups[i]), append(at, i)
		}
	}
	// The arguments alias the reader's buffer; NilextTakeBatch copies what
	// the d-log keeps before it returns.
	acks, errs := c.srv.grp.NilextTakeBatch(context.Background(), take)
	res := pre // the parse errors, then the driver's
	ackAt := make([]int, n)
	for j, i := range at {
		if errs[j] != nil {
			res[i] = nilextTakeError(errs[j])
		}
		ackAt[i] = j
	}
	w := c.w
	_ = w.WriteArrayHeader(n)
	for i := range n {
		if res[i] != nil {
			_ = w.WriteError(errorText(res[i]))
			continue
		}
		_ = writeNilextAck(w, acks[ackAt[i]])
	}
	return nil
}
