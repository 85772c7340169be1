package server

import (
	"bytes"
	"errors"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/script"
)

// Transactions at the front door (docs/design/transactions.md): MULTI starts
// queueing the connection's commands (checked for arity, unknown names and
// whether a transaction may hold them, answered +QUEUED); EXEC turns them and
// the connection's watches into one kv.KindExec op, proposed like any
// ordered write (a follower forwards it as KEFIR.EXEC, which carries the
// whole transaction, so the leader needs none of this connection's state).
// WATCH is a linearizable read (kv.KindWatch) of what each key looks like
// now; the state machine compares it again at EXEC's apply.

// txState is a connection's transaction: its queue after MULTI and its
// watches, which only EXEC, DISCARD and UNWATCH (and the connection's end)
// clear.
type txState struct {
	// cmds are the queued commands (copies: the reader's buffer is reused),
	// keys every key they name, dirty that a command was refused while
	// queueing (EXEC answers EXECABORT, as Redis).
	cmds  [][][]byte
	keys  [][]byte
	dirty bool
	// writes: a queued command is an update (else EXEC is a read).
	writes bool
	// watches are WATCH's observations, in order.
	watches []kv.Watch
}

var (
	execSpec      = command.MustLookup("EXEC")
	watchSpec     = command.MustLookup("WATCH")
	kefirExecSpec = command.MustLookup("KEFIR.EXEC")
	// KEFIR.EXECRO is a transaction of reads only, served as a read.
	kefirExecROSpec = command.MustLookup("KEFIR.EXECRO")
	kefirExecROName = []byte("KEFIR.EXECRO")
	errExecAbort    = &replyError{"EXECABORT Transaction discarded because of previous errors."}
	errTooManyTx    = errf("ERR a transaction holds at most %d commands", kv.MaxTxCommands)
)

// queueTx queues a command sent inside MULTI (nil: +QUEUED was written). An
// error refuses it and marks the transaction dirty (the caller does).
func (c *conn) queueTx(spec *command.Spec, args [][]byte) error {
	if err := script.Queueable(spec, args); err != nil {
		return err
	}
	if len(c.tx.cmds) >= kv.MaxTxCommands {
		return errTooManyTx
	}
	argv := make([][]byte, len(args))
	for i, a := range args {
		argv[i] = bytes.Clone(a)
		if argv[i] == nil {
			argv[i] = []byte{}
		}
	}
	c.tx.cmds = append(c.tx.cmds, argv)
	// A script reads keys it does not declare: even EVAL_RO runs in an
	// EXEC that is a write, applied over the whole keyspace's state, not a
	// read of the transaction's keys.
	c.tx.writes = c.tx.writes || spec.IsUpdate() || isScript(spec)
	txCmdKeys(spec, argv, func(k []byte) bool {
		c.tx.keys = append(c.tx.keys, k)
		return true
	})
	c.flushWrites()
	return c.w.WriteSimple("QUEUED")
}

// txCmdKeys calls f with each key a queued command names (forSpecKeys,
// cluster.go), until f answers false; a script's are its declared keys.
func txCmdKeys(spec *command.Spec, argv [][]byte, f func(key []byte) bool) {
	if !isScript(spec) {
		forSpecKeys(spec, argv, f)
		return
	}
	for _, k := range command.ScriptKeys(argv) {
		if !f(k) {
			return
		}
	}
}

// resolveScripts turns the transaction's EVALSHA (EVALSHA_RO) of a script
// this node knows into EVAL (EVAL_RO) with its body, as a follower forwards an EVALSHA
// (forwardedScript): the log carries bodies, so no replica needs this
// node's cache. It looks the SHA up at EXEC, as Redis does; an unknown one
// stays EVALSHA, which answers NOSCRIPT as the command's element. An EVAL's
// body that compiles is cached, as EVAL outside MULTI caches it.
func (c *conn) resolveScripts() {
	for i, argv := range c.tx.cmds {
		switch {
		case command.Eq(argv[0], "EVALSHA"), command.Eq(argv[0], "EVALSHA_RO"):
			if body, ok := c.srv.scripts.get(argv[1]); ok {
				name := "EVAL"
				if command.Eq(argv[0], "EVALSHA_RO") {
					name = "EVAL_RO"
				}
				c.tx.cmds[i] = append([][]byte{[]byte(name), body}, argv[2:]...)
			}
		case command.Eq(argv[0], "EVAL"), command.Eq(argv[0], "EVAL_RO"):
			if _, err := script.Compile(argv[1]); err == nil {
				c.srv.scripts.put(argv[1], false)
			}
		}
	}
}

// resetTx ends the transaction and forgets the watches.
func (c *conn) resetTx() {
	c.multi = false
	c.tx = txState{}
}

// execArgs turns the transaction into the KEFIR.EXEC command that carries it
// (what the log's op is parsed from, and what a follower forwards), and ends
// it. The bytes are in the batch's arena.
func (c *conn) execArgs() ([][]byte, error) {
	defer c.resetTx()
	if c.tx.dirty {
		return nil, errExecAbort
	}
	c.resolveScripts()
	ws := c.tx.watches
	if mutation.On && mut.execSkipsWatches.Load() {
		ws = nil // the deliberate bug: EXEC never compares its watches
	}
	args := make([][]byte, 0, 2+len(c.tx.keys)+len(ws))
	args = append(args, c.arena.copy([]byte(kefirExecSpec.Name)), c.arena.copy(kv.EncodeTx(nil, c.tx.cmds, ws)))
	for _, k := range c.tx.keys {
		args = append(args, c.arena.copy(k))
	}
	for _, w := range ws {
		args = append(args, c.arena.copy(w.Key))
	}
	if c.srv.clusterOn {
		// Every key of the transaction, watched or written, in one slot
		// (Redis Cluster's rule): the op is one group's.
		if err := crossSlot(kefirExecSpec, args); err != nil {
			return nil, err
		}
	}
	return args, nil
}

// parseExec is KEFIR.EXEC's and KEFIR.EXECRO's parse: args[1] is the
// transaction (kv.EncodeTx), args[2:] its keys. A corrupt transaction is
// refused here, never logged. a is the batch's arena for a write, nil for
// a read (which runs before the next command is read).
func parseExec(args [][]byte, a *arena) (kv.Op, error) {
	cmds, watches, err := kv.DecodeTx(args[1])
	if err != nil {
		return kv.Op{}, errf("ERR %s: %v", args[0], err)
	}
	// The keys must name every key of the commands and the watches: they
	// route the op and stand for what it writes (Op.WrittenKeys: the
	// barriers and indexes of writes by key). EXEC builds them so; a
	// client's own KEFIR.EXEC is checked.
	named := make(map[string]bool, len(args)-2)
	for _, k := range args[2:] {
		named[string(k)] = true
	}
	missing := false
	for _, argv := range cmds {
		if spec, ok := command.Lookup(argv[0]); ok {
			txCmdKeys(spec, argv, func(k []byte) bool {
				missing = missing || !named[string(k)]
				return !missing
			})
		}
	}
	for _, w := range watches {
		missing = missing || !named[string(w.Key)]
	}
	if missing {
		return kv.Op{}, errf("ERR %s: a key of the transaction is not among its keys", args[0])
	}
	cp := func(b []byte) []byte { return b }
	kind := kv.KindExecRO
	if a != nil {
		cp, kind = a.copy, kv.KindExec
	}
	op := kv.Op{Kind: kind, Value: cp(args[1]), Keys: make([][]byte, len(args)-2)}
	for i := 2; i < len(args); i++ {
		op.Keys[i-2] = cp(args[i])
	}
	op.Delta = int64(len(op.Keys))
	return op, nil
}

// watch runs WATCH key...: a read of each key's observation (kv.Observe) at
// the linearizable level, through the normal read path (a follower forwards
// it to the leader as KEFIR.WATCH), kept until EXEC, DISCARD or UNWATCH.
func (c *conn) watch(args [][]byte, o callOpts) error {
	cons := level.ConsLinearizable
	if err := c.srv.shard.CheckConsistency(cons); unsupported(err) {
		cons = c.cons // a deployment without linearizable reads: its strongest default
	}
	op := kv.Op{Kind: kv.KindWatch, Keys: args[1:]}
	var seen [][]byte
	if c.awaitTxWriters(op.Keys); c.wouldWait {
		return nil // a commit in flight writes a watched key: a worker waits for it
	}
	res, after, p, err := c.readPath(op, cons, c.sess)
	switch {
	case errors.Is(err, errWouldWait):
		c.wouldWait = true
		return nil
	case errors.Is(err, cluster.ErrNotLeader):
		if o.redirect {
			return c.srv.router.Redirect(err)
		}
		if e, ok := cluster.SlotRedirect(err); ok && c.clusterAware {
			return e
		}
		addr, _ := c.srv.router.LeaderFor(err)
		fargs := append([][]byte{[]byte("KEFIR.WATCH")}, args[1:]...)
		fc := &cluster.Call{Args: fargs, Cons: cons, Sess: c.sess}
		c.srv.router.Forward(addr, []*cluster.Call{fc})
		if fc.Err != nil {
			return fc.Err
		}
		if fc.Reply.Kind == resp.Error {
			return &replyError{string(fc.Reply.Str)}
		}
		if fc.Reply.Kind != resp.Array || len(fc.Reply.Elems) != len(args)-1 {
			return errf("ERR WATCH: the leader answered KEFIR.WATCH with %s", fc.Reply.Kind)
		}
		for _, e := range fc.Reply.Elems {
			seen = append(seen, e.Str)
		}
		c.sess = c.sess.Merge(fc.NewSess)
	case err != nil:
		return err
	default:
		c.pending = c.pending.Merge(p)
		c.sess = after
		seen = res.Array
	}
	for i, k := range args[1:] {
		c.tx.watches = append(c.tx.watches, kv.Watch{Key: bytes.Clone(k), Seen: bytes.Clone(seen[i])})
	}
	return c.w.WriteSimple("OK")
}

// resp3Shape is how an element of EXEC's reply reads on a RESP3 connection.
// The state machine spells a transaction's replies in RESP2 (one reply for
// every connection, kept in the client's row for a retry); RESP3 spells a
// few commands' otherwise, and EXEC's elements follow their commands', as
// Redis's do.
type resp3Shape uint8

const (
	resp3AsIs  resp3Shape = iota
	resp3Map              // HGETALL, LCS … IDX: the flat array of pairs is a map
	resp3Pairs            // HRANDFIELD key count WITHVALUES: an array of [field, value]
)

// resp3Shapes are the shapes of the queued commands' replies if the
// connection speaks RESP3 and one of them reads otherwise there (nil else).
func (c *conn) resp3Shapes() []resp3Shape {
	if c.w.Protocol() != 3 || c.tx.dirty {
		return nil
	}
	var shapes []resp3Shape
	for i, argv := range c.tx.cmds {
		s := resp3AsIs
		switch {
		case command.Eq(argv[0], "HGETALL"):
			s = resp3Map
		case command.Eq(argv[0], "HRANDFIELD") && len(argv) == 4:
			s = resp3Pairs
		case command.Eq(argv[0], "LCS"):
			for _, a := range argv[3:] {
				if command.Eq(a, "IDX") {
					s = resp3Map
				}
			}
		}
		if s != resp3AsIs && shapes == nil {
			shapes = make([]resp3Shape, len(c.tx.cmds))
		}
		if shapes != nil {
			shapes[i] = s
		}
	}
	return shapes
}

// execToResp3 respells EXEC's reply v, RESP2's, by its elements' shapes
// (resp3Shapes; nil: v as it is). An element that is not the array its
// command answers (an error) stays as it is.
func execToResp3(v resp.Value, shapes []resp3Shape) resp.Value {
	if shapes == nil || v.Kind != resp.Array || len(v.Elems) != len(shapes) {
		return v
	}
	for i, s := range shapes {
		e := &v.Elems[i]
		if s == resp3AsIs || e.Kind != resp.Array || len(e.Elems)%2 != 0 {
			continue
		}
		switch s {
		case resp3Map:
			e.Kind = resp.Map
		case resp3Pairs:
			pairs := make([]resp.Value, len(e.Elems)/2)
			for j := range pairs {
				pairs[j] = resp.Value{Kind: resp.Array, Elems: e.Elems[2*j : 2*j+2]}
			}
			e.Elems = pairs
		}
	}
	return v
}
