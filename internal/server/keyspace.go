package server

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
)

// Issue 27's keyspace and string long-tail commands at the front door:
// writes become kv ops (evaluated by kv.Apply on every engine), reads run
// one or more ordinary kv reads (GET, EXISTS, KEFIR.SCAN's range read) at
// the connection's level, through the same path as any read (inline,
// deferred, forwarded to the leader), and shape Redis's reply from them.

// parseMoreWrite parses the writes of this file for parseWrite; handled
// false for any other command.
func parseMoreWrite(spec *command.Spec, args [][]byte, a *arena) (op kv.Op, handled bool, err error) {
	op, handled, err = command.ParseKeyspaceWrite(spec.Name, args)
	if !handled {
		return parseHashWrite(spec, args, a) // hash.go
	}
	// The op aliases args (the reader's buffer): its bytes go to the arena.
	op.Key, op.Value, op.Keys = a.copy(op.Key), a.copy(op.Value), a.copyArgs(op.Keys)
	return op, true, err
}

func parseBitOffset(b []byte) (int64, error) { return command.ParseBitOffset(b) }

// moreReads are the reads readMore serves, by command ID (read's check of
// every read, a GET's included, is then an index, not a string hash).
var moreReads = func() []bool {
	m := make([]bool, command.Count())
	for _, n := range []string{"SCAN", "KEYS", "RANDOMKEY", "TYPE", "TOUCH", "OBJECT", "KEFIR.GROUPSCAN",
		"GETRANGE", "SUBSTR", "GETBIT", "BITCOUNT", "BITPOS", "LCS", "BITFIELD_RO"} {
		m[command.MustLookup(n).ID] = true
	}
	for _, n := range hashReads {
		m[command.MustLookup(n).ID] = true
	}
	return m
}()

// errWouldWait: an inline read (c.inline) could not be served at once; the
// command is run again on a goroutine (readInline), so nothing is written.
var errWouldWait = errors.New("read would wait")

// readPath runs one kv read at cons by the replica's cheapest path: inline
// (TryRead; errWouldWait if it would wait), deferred (ReadDeferred: the
// reply may be held with the batch's, p) or plain Read. The one place
// read and readMore choose it. after is sess advanced by the read.
//
// A keyspace scan on a node of several groups reads every group, and one
// result cannot advance every group's part of the session: it goes to
// cluster.Multi.Scan, which returns the advanced session.
func (c *conn) readPath(op kv.Op, cons level.Consistency, sess shard.Session) (res kv.Result, after shard.Session, p shard.Pending, err error) {
	switch {
	case c.inline:
		var ok bool
		if res, ok = c.srv.shard.TryRead(op, cons); !ok {
			return res, sess, p, errWouldWait
		}
	case op.Kind == kv.KindScan && c.srv.multi != nil:
		res, after, err = c.srv.multi.Scan(context.Background(), op, cons, sess)
		return res, after, p, err
	case c.srv.reads.Deferred:
		// A read of a value the leader's log holds but has not made durable
		// is answered now and its reply held with the batch's (release), so
		// the connection's later commands do not wait behind it.
		res, p, err = c.srv.shard.ReadDeferred(context.Background(), op, cons, sess)
	default:
		res, err = c.srv.shard.Read(context.Background(), op, cons, sess)
	}
	if err != nil {
		return res, sess, p, err
	}
	return res, sess.AfterRead(res.Pos()), p, nil
}

// readOp runs one kv read as readPath does, merging a deferred read's
// pending wait into the connection's and advancing the session.
func (c *conn) readOp(op kv.Op, cons level.Consistency, sess shard.Session, session *shard.Session) (kv.Result, error) {
	res, after, p, err := c.readPath(op, cons, sess)
	if err != nil {
		return res, err
	}
	c.pending = c.pending.Merge(p)
	// Merged: every op of the command read at sess, and *session holds
	// what the earlier ones advanced.
	*session = session.Merge(after)
	return res, nil
}

// readMore serves the reads of moreReads: parse, run the kv reads, then
// write the reply (the session token first for KEFIR.CALL SESSION). Nothing
// is written before every read succeeded, so a read the replica cannot
// serve is forwarded whole to the leader, and an inline one rerun whole.
func (c *conn) readMore(spec *command.Spec, args [][]byte, o callOpts) error {
	cons := o.cons
	if cons.IsZero() {
		cons = c.cons
	}
	sess := c.sess
	if o.session {
		sess = o.sess
	}
	if spec.Name == "KEFIR.GROUPSCAN" {
		return c.groupScan(args, cons, sess, o)
	}
	after := sess
	run := func(op kv.Op) (kv.Result, error) { return c.readOp(op, cons, sess, &after) }
	reply, err := c.evalMore(spec, args, run)
	if errors.Is(err, errWouldWait) {
		c.wouldWait = true
		return nil
	}
	if errors.Is(err, cluster.ErrNotLeader) {
		return c.forwardRead(args, cons, sess, o, err)
	}
	if err != nil {
		return err
	}
	if o.session {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(after.String())
	} else {
		c.sess = after
	}
	reply(c)
	return nil
}

// evalMore runs the reads of one command with run and returns how to write
// its reply; a parse error or a read's error comes before any reply.
func (c *conn) evalMore(spec *command.Spec, args [][]byte, run func(kv.Op) (kv.Result, error)) (func(*conn), error) {
	switch spec.Name {
	case "SCAN":
		return scanCommand(args, run)
	case "KEYS":
		keys, err := command.Keys(args[1], run, shard.DefaultMaxScan)
		if err != nil {
			return nil, err
		}
		return func(c *conn) {
			_ = c.w.WriteArrayHeader(len(keys))
			for _, k := range keys {
				_ = c.w.WriteBulk(k)
			}
		}, nil
	case "RANDOMKEY":
		return replyOf(command.RandomKey(run, rand.IntN))
	case "TYPE":
		t, err := command.KeyType(args[1], run)
		if err != nil {
			return nil, err
		}
		return func(c *conn) { _ = c.w.WriteSimple(t) }, nil
	case "TOUCH":
		res, err := run(kv.Op{Kind: kv.KindExists, Keys: args[1:]})
		if err != nil {
			return nil, err
		}
		return func(c *conn) { _ = c.w.WriteInt(res.Int) }, nil
	case "OBJECT":
		return replyOf(command.Object(args, run))
	case "GETRANGE", "SUBSTR":
		r, err := command.GetRange(args, run)
		if err != nil {
			return nil, err
		}
		return func(c *conn) { _ = c.w.WriteBulk(r) }, nil
	case "GETBIT":
		return intOrErr(command.GetBit(args, run))
	case "BITFIELD_RO":
		ops, err := kv.ParseBitField(args[2:], true)
		if err != nil {
			return nil, errf("ERR %s", err)
		}
		v, _, err := command.GetString(run, args[1])
		if err != nil {
			return nil, err
		}
		_, reply := kv.RunBitField(append([]byte(nil), v...), ops)
		return func(c *conn) { c.writeReply(reply) }, nil
	case "BITCOUNT":
		return intOrErr(command.BitCount(args, run))
	case "BITPOS":
		return intOrErr(command.BitPos(args, run))
	case "LCS":
		return replyOf(command.LCS(args, run))
	}
	if reply, ok, err := evalHash(spec, args, run); ok { // hash.go
		return reply, err
	}
	return nil, errf("ERR %s is not a read", strings.ToLower(spec.Name))
}

// replyOf is the front door's writer of a command.Reply (or err).
func replyOf(r command.Reply, err error) (func(*conn), error) {
	if err != nil {
		return nil, err
	}
	return func(c *conn) { r(c.w) }, nil
}

func intReply(n int64) func(*conn) { return func(c *conn) { _ = c.w.WriteInt(n) } }

// intOrErr is the reply of an integer command: n, or err as its error.
func intOrErr(n int64, err error) (func(*conn), error) {
	if err != nil {
		return nil, err
	}
	return intReply(n), nil
}

// ---- SCAN, KEYS ----

// scanCommand is SCAN cursor [MATCH p] [COUNT n] [TYPE t] (command.Scan).
// The engine is ordered, so a cursor stands for the key to resume from:
// every key after the last one returned. One call reads up to COUNT keys
// from there (one ordered range read at the connection's level) and returns
// those MATCH and TYPE keep — possibly none, with a cursor to go on, as
// Redis may. A key present for the whole iteration is returned once, and
// one written or deleted during it may or may not be.
func scanCommand(args [][]byte, run func(kv.Op) (kv.Result, error)) (func(*conn), error) {
	start, err := scanCursors.resume(args[1])
	if err != nil {
		return nil, err
	}
	sa, err := command.ParseScanArgs(args)
	if err != nil {
		return nil, err
	}
	keys, last, err := sa.Page(start, run, int(min(sa.Count, shard.DefaultMaxScan)))
	if err != nil {
		return nil, err
	}
	next := "0"
	if last != nil {
		next = scanCursors.issue(last)
	}
	return func(c *conn) {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(next)
		_ = c.w.WriteArrayHeader(len(keys))
		for _, k := range keys {
			_ = c.w.WriteBulk(k)
		}
	}, nil
}

func rangeEnded(res kv.Result, limit int) bool { return command.RangeEnded(res, limit) }

// SCAN cursors (command.CursorOf): every node keeps the keys of the cursors
// it issued (cursorTable). A cursor whose key a node does not have (issued by
// a node that has since died, or evicted) resumes at its 3-byte prefix
// (command.CursorPrefix). Two keys with one fingerprint (1 in 2^38 per pair)
// keep the first key's entry, and the second's cursor carries hash 0, which
// always resumes at the prefix.
type cursorTable struct {
	mu       sync.Mutex
	cur, old map[uint64][]byte
}

// cursorGen bounds the table: a generation of this many cursors is dropped
// whole when the next one fills (iterations older than that fall back to
// their prefix).
const cursorGen = 1 << 16

var scanCursors = &cursorTable{cur: map[uint64][]byte{}, old: map[uint64][]byte{}}

// issue returns the cursor that resumes after last.
func (t *cursorTable) issue(last []byte) string {
	c := command.CursorOf(last, true)
	t.mu.Lock()
	defer t.mu.Unlock()
	if k, ok := t.cur[c]; ok && string(k) != string(last) {
		return strconv.FormatUint(command.CursorOf(last, false), 10)
	}
	if k, ok := t.old[c]; ok && string(k) != string(last) {
		return strconv.FormatUint(command.CursorOf(last, false), 10)
	}
	if len(t.cur) >= cursorGen {
		t.old, t.cur = t.cur, make(map[uint64][]byte, cursorGen)
	}
	t.cur[c] = append([]byte(nil), last...)
	return strconv.FormatUint(c, 10)
}

// resume returns the key a SCAN with cursor arg starts at ("0": the first).
func (t *cursorTable) resume(arg []byte) ([]byte, error) {
	c, err := command.ParseCursor(arg)
	if err != nil || c == 0 {
		return nil, err
	}
	t.mu.Lock()
	k, ok := t.cur[c]
	if !ok {
		k, ok = t.old[c]
	}
	t.mu.Unlock()
	if ok {
		return command.After(k), nil
	}
	// Not issued here (or forgotten): resume at the prefix, before the key.
	return command.CursorPrefix(c), nil
}

// groupScan serves KEFIR.GROUPSCAN group start end limit: one group's part
// of a keyspace scan at cons (at level session for the session sess, which
// the asking node sends under KEFIR.CALL SESSION), which a node of several
// groups that cannot serve the group asks of its leader
// (cluster.Multi.GroupScan; the reply is cluster.GroupScanReply). A node
// that cannot serve it either forwards it to the leader it knows, as any
// read.
func (c *conn) groupScan(args [][]byte, cons level.Consistency, sess shard.Session, o callOpts) error {
	if c.srv.multi == nil {
		return errf("ERR KEFIR.GROUPSCAN needs a node of several groups")
	}
	g, err := strconv.ParseUint(string(args[1]), 10, 32)
	if err != nil || g == 0 {
		return errf("ERR KEFIR.GROUPSCAN takes a group id")
	}
	if c.inline {
		c.wouldWait = true // it may wait for the group's leader, or forward: not on an event loop
		return nil
	}
	if len(args) == 3 && eq(args[2], "COUNT") {
		db, ok := c.srv.multi.Engine(cluster.GroupID(g))
		if !ok {
			leader, addr, _ := c.srv.multi.Leader(cluster.GroupID(g))
			return c.forwardRead(args, cons, sess, o, &cluster.NotLeaderError{Leader: leader, Addr: addr})
		}
		return c.w.WriteInt(engineUserKeys(db))
	}
	if len(args) != 5 {
		return errf("ERR KEFIR.GROUPSCAN group start end limit | KEFIR.GROUPSCAN group COUNT")
	}
	limit, err := strconv.Atoi(string(args[4]))
	if err != nil || limit < 0 {
		return errf("ERR KEFIR.GROUPSCAN takes a non-negative limit")
	}
	op := kv.Op{Kind: kv.KindScan, Key: args[2], Limit: min(limit, shard.DefaultMaxScan)}
	if len(args[3]) > 0 {
		op.End = args[3]
	}
	part, err := c.srv.multi.GroupScan(context.Background(), cluster.GroupID(g), op, cons, sess)
	if errors.Is(err, cluster.ErrNotLeader) {
		return c.forwardRead(args, cons, sess, o, err)
	}
	if err != nil {
		return err
	}
	// The session advanced by the part's read, as any read's (the asking
	// node takes the part's version and view from the reply itself; the
	// token first under KEFIR.CALL SESSION keeps the shape a forwarded
	// read's reply has, which forwardRead above also writes).
	after := sess.AfterRead(part.Res.Pos())
	if o.session {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(after.String())
	} else {
		c.sess = after
	}
	return c.w.WriteValue(cluster.GroupScanReply(part))
}
