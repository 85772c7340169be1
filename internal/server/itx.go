package server

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/cluster"
	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// Interactive transactions at the front door (KEFIR.TX; issue 29;
// docs/design/transactions.md, "Interactive transactions").
//
// A transaction is the connection's: BEGIN pins a snapshot of the engine at
// a start version the replica proves is at least as new as every write
// acknowledged before it (shard.TxSnapshots); GET, MGET and EXISTS read that
// snapshot with the transaction's own buffered writes in front of it
// (kv.TxOverlay); SET, DEL and INCRBY are evaluated there (their replies are
// the transaction's view) and buffered. COMMIT builds ONE op,
// kv.KindTxCommit: the writes, and the keys to validate with the versions the
// snapshot had of them (SI: the written keys; SERIALIZABLE: the read ones
// too), and sends it through the connection's write path as KEFIR.TXAPPLY —
// ordered in the log, forwarded to the leader from a follower, validated at
// apply on every replica. A transaction that wrote nothing commits here,
// without the log: its reads were of one committed state no older than
// BEGIN. PREPARE answers the KEFIR.TXAPPLY argument instead of sending it,
// for a client that sends it itself with its own request id (the Go client,
// whose retries across a leader change then apply it once).

// Limits (docs/design/transactions.md, "Limits").
const (
	// txMaxOpen bounds a connection's open transactions: each pins engine
	// versions that retention must keep.
	txMaxOpen = 16
	// txMaxWrites and txMaxWriteBytes bound a transaction's write set, held
	// in the front door's memory and sent as one op (one log entry).
	txMaxWrites     = 4096
	txMaxWriteBytes = 8 << 20
)

// txMaxAge is the transaction lifetime limit: an older transaction is
// aborted (its pinned versions hold garbage that compaction cannot
// reclaim): a timer armed at BEGIN unpins its snapshot and drops its write
// set when it expires (itxn.expire), so a connection left idle does not pin
// versions forever, and its next command answers TXABORT. A variable for
// tests.
var txMaxAge = 60 * time.Second

// itxMutations are the test-only mutations of this file (internal/mutation).
type itxMutations struct {
	// skipWindow: COMMIT sends no key to validate, so nothing in the conflict
	// window can abort it (the transaction checker's test shows it caught).
	skipWindow atomic.Bool
	// refreshAfterRead: a transaction takes its start version again behind
	// a commit in flight at any command, not only at its first (txRefresh):
	// its reads are then of two snapshots.
	refreshAfterRead atomic.Bool
}

var itxMut itxMutations

// itxConn is a connection's transactions.
type itxConn struct {
	next uint64
	open map[uint64]*itxn
	// free are ended transactions whose timer was stopped before it fired,
	// for the connection's next BEGINs (txBegin): a transaction's struct,
	// key map and timer cost a BEGIN five allocations that plain reads do
	// not have (docs/design/transactions.md, "Benchmarks").
	free []*itxn
}

// itxn is one open transaction. Its connection's goroutine uses it, under
// mu, which the expiry timer takes too.
type itxn struct {
	mu sync.Mutex
	// timer (txMaxAge) runs expire; expired says it did, ended that the
	// transaction ended (txEnd): both leave nothing pinned.
	timer   *time.Timer
	expired bool
	ended   bool
	iso     kv.Cond
	// readOnly: begun READONLY (txBegin): its writes are refused and its
	// first read never waits for a commit in flight (txRefresh).
	readOnly bool
	began    time.Time
	snap     *shard.TxSnap // nil until its first key on a node of several groups
	slot     int           // that key's slot (-1: not yet, or not a cluster)
	// parts are the further slots of a transaction across slots (xgtx.go).
	parts []*txPart
	// keys are the keys its commands touched: the version each first read
	// saw (get) and how each was accessed (access); touched, that a command
	// read, wrote or declared some key (txRefresh). spare are the txKeys of
	// the transactions this struct served before (itxConn.free).
	keys    map[string]*txKey
	touched bool
	spare   []*txKey
	// origin is the snapshot's account of its slot (kv.SlotOrigin): the
	// commit carries it, so that the group it reaches compares versions
	// only if they are its own.
	origin kv.TxOrigin
	now    int64 // the clock of the command reading (get's liveness)
	ov     kv.TxOverlay
	wr     []kv.Op
	bytes  int
	// view is ov in front of the snapshot as of version viewAt-1, and op
	// the read it serves (read): kept here, not made per read.
	view   kv.Getter
	viewAt uint64
	op     kv.Op
}

// read evaluates the read op over the transaction's view: its own writes in
// front of its snapshot. The view and the op live in tx: a kv.Op escapes to
// kv.Read, and one allocated per read, with the view's closure, was most of
// a snapshot read's allocations (docs/design/transactions.md, "Benchmarks").
func (tx *itxn) read(op kv.Op) (kv.Result, error) {
	if v := tx.snap.Version() + 1; tx.view == nil || tx.viewAt != v {
		tx.view, tx.viewAt = tx.ov.View(tx.getShared, v), v
	}
	tx.op = op
	res, err := kv.Read(tx.view, nil, &tx.op, 0)
	tx.op = kv.Op{} // no reference to the command's buffer past the command
	return res, err
}

// txAccess is how a transaction touched one key, for fine-grained
// conflicts (docs/design/transactions.md, "Fine-grained conflicts"): whole
// (GET, MGET, EXISTS; SET, DEL, INCRBY) or the bits SETRANGE, SETBIT,
// GETRANGE, GETBIT and ACCESS named.
type txAccess struct {
	wholeRead, wholeWrite bool
	declared              bool // ACCESS named ranges: a whole read of the key counts as those
	read, write           []kv.TxRange
}

// txKey is what a transaction knows of one key: the version its snapshot
// had of it (0: absent, or expired at the reading command's clock) once a
// command read it (noted), and how its commands accessed it.
type txKey struct {
	seen  uint64
	noted bool
	txAccess
}

// key is tx's record of key, made if it has none.
func (tx *itxn) key(key []byte) *txKey {
	k := tx.keys[string(key)]
	if k == nil {
		if n := len(tx.spare); n > 0 {
			k, tx.spare = tx.spare[n-1], tx.spare[:n-1]
		} else {
			k = &txKey{}
		}
		tx.keys[string(key)] = k
	}
	return k
}

// access is how tx's commands accessed key, for the command about to.
func (tx *itxn) access(key []byte) *txAccess {
	tx.touched = true
	return &tx.key(key).txAccess
}

// seen is the version tx's first read of key saw, if one did.
func (tx *itxn) seen(key string) (uint64, bool) {
	k := tx.keys[key]
	if k == nil || !k.noted {
		return 0, false
	}
	return k.seen, true
}

// seenKeys are the keys tx's reads noted a version of (seen), sorted: the
// commit op's bytes are a function of the transaction.
func (tx *itxn) seenKeys() []string {
	var ks []string
	for key, k := range tx.keys {
		if k.noted {
			ks = append(ks, key)
		}
	}
	slices.Sort(ks)
	return ks
}

// checkRanges is what the commit validates key against: nil (the whole
// key) unless every access of it was ranged. SI validates the written
// ranges, SERIALIZABLE the read ones too.
func (tx *itxn) checkRanges(key string) []kv.TxRange {
	k := tx.keys[key]
	if k == nil {
		return nil
	}
	a := &k.txAccess
	if a.wholeWrite || (tx.iso == kv.TxSerializable && a.wholeRead && !a.declared) {
		return nil
	}
	rs := slices.Clone(a.write)
	if tx.iso == kv.TxSerializable {
		rs = append(rs, a.read...)
	}
	if len(rs) == 0 {
		return nil
	}
	return rs
}

func bytesRange(start, end int64) kv.TxRange {
	return kv.TxRange{Lo: uint64(start) * 8, Hi: uint64(end+1) * 8}
}

var (
	errTxUnknown   = errf("ERR no such transaction (KEFIR.TX BEGIN answers a handle; COMMIT, PREPARE and ABORT end it)")
	errTxTooMany   = errf("ERR too many open transactions on this connection (at most %d): COMMIT or ABORT one first", txMaxOpen)
	errTxFull      = errf("ERR transaction write set is full (at most %d writes, %d bytes): COMMIT or ABORT it", txMaxWrites, txMaxWriteBytes)
	errTxNoSupport = errf("ERR interactive transactions are not supported by this deployment")
)

// errTxReadOnly refuses a write in a READONLY transaction; the transaction
// stays open, as after any command's error.
func errTxReadOnly(sub string) error {
	return errf("ERR cannot run KEFIR.TX %s in a READONLY transaction (begun with KEFIR.TX BEGIN … READONLY, which only reads)", sub)
}

// txSubs are KEFIR.TX's subcommands: txCmd names one without allocating.
var txSubs = []string{"GET", "BEGIN", "ABORT", "MGET", "EXISTS", "SET", "DEL", "INCRBY", "COMMIT", "PREPARE",
	"GETRANGE", "GETBIT", "SETRANGE", "SETBIT", "BITFIELD", "ACCESS"}

// parseHandle parses a transaction handle (an unsigned decimal integer)
// without allocating; an error only says it is not one.
func parseHandle(b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > 19 {
		return 0, errTxUnknown
	}
	var h uint64
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, errTxUnknown
		}
		h = h*10 + uint64(d-'0')
	}
	return h, nil
}

// txCmd runs KEFIR.TX.
func (c *conn) txCmd(args [][]byte) error {
	sub := ""
	for _, s := range txSubs {
		if eq(args[1], s) {
			sub = s
			break
		}
	}
	if sub == "" {
		sub = strings.ToUpper(string(args[1]))
	}
	if sub == "BEGIN" || (sub == "ABORT" && len(args) != 3) {
		ch, err := parseTxChain(args)
		if err != nil {
			return err
		}
		return c.txRunChain(ch)
	}
	if sub == "FEATURES" {
		// What this server's KEFIR.TX takes beyond BEGIN's first form (the
		// Go client asks once per connection; an older server answers an
		// error).
		if err := c.w.WriteArrayHeader(2); err != nil {
			return err
		}
		if err := c.w.WriteBulkString("THEN"); err != nil {
			return err
		}
		return c.w.WriteBulkString("READONLY")
	}
	if len(args) < 3 {
		return errf("ERR wrong number of arguments for 'kefir.tx|%s' command", strings.ToLower(sub))
	}
	h, err := parseHandle(args[2])
	if err != nil || c.itx == nil || c.itx.open[h] == nil {
		return errTxUnknown
	}
	tx := c.itx.open[h]
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if age := time.Since(tx.began); age > txMaxAge || tx.expired {
		c.txEnd(h)
		return errf("TXABORT transaction too old: open for %s, the limit is %s", age.Round(time.Millisecond), txMaxAge)
	}
	rest := args[3:]
	keys := rest // the keys the command names
	n, variadic := 0, false
	switch sub {
	case "COMMIT", "PREPARE", "ABORT":
	case "GET":
		n = 1
	case "MGET", "EXISTS", "DEL":
		n, variadic = 1, true
	case "BITFIELD":
		n, variadic, keys = 1, true, rest[:min(1, len(rest))]
	case "SET", "INCRBY", "GETBIT":
		n, keys = 2, rest[:min(1, len(rest))]
	case "SETRANGE", "GETRANGE", "SETBIT", "ACCESS":
		n, keys = 3, rest[:min(1, len(rest))]
	default:
		return errf("ERR unknown subcommand '%s'. Try BEGIN, GET, MGET, EXISTS, GETRANGE, GETBIT, SET, DEL, INCRBY, SETRANGE, SETBIT, BITFIELD, ACCESS, COMMIT, PREPARE, ABORT.", clip(args[1]))
	}
	if len(rest) < n || (!variadic && len(rest) != n) {
		return errf("ERR wrong number of arguments for 'kefir.tx|%s' command", strings.ToLower(sub))
	}
	switch sub {
	case "ABORT":
		c.txEnd(h)
		return c.w.WriteSimple("OK")
	case "COMMIT", "PREPARE":
		return c.txCommit(h, tx, sub == "PREPARE")
	case "SET", "INCRBY", "DEL", "SETRANGE", "SETBIT":
		if tx.readOnly {
			return errTxReadOnly(sub)
		}
	case "BITFIELD":
		if tx.readOnly {
			if bf, err := kv.ParseBitField(rest[1:], false); err == nil && kv.BitFieldWrites(bf) {
				return errTxReadOnly(sub)
			} // a malformed one answers its parse error below
		}
	}
	if c.srv.clusterOn && tx.readOnly && len(keys) > 0 {
		if err := c.txSlotsReadOnly(tx, keys); err != nil || c.wouldWait {
			return err // wouldWait: nothing done; a worker runs the command again
		}
	} else {
		if c.srv.clusterOn && tx.slot < 0 && len(keys) > 0 {
			// A node of several groups takes the start at the first key
			// (txSlot): the commits in flight that write these keys are
			// waited for first (txRefresh's rule), so the start follows them.
			if c.awaitTxWriters(keys); c.wouldWait {
				return nil // nothing done; a worker runs the command again
			}
		}
		for _, k := range keys {
			if err := c.txSlot(tx, k); err != nil || c.wouldWait {
				return err // wouldWait: nothing done; a worker runs the command again
			}
		}
	}
	if err := c.txRefresh(tx, keys); err != nil || c.wouldWait {
		return err // wouldWait: nothing done; a worker runs the command again
	}
	now := time.Now().UnixMilli()
	tx.now = now
	var res kv.Result
	var bf []kv.BitFieldOp
	if sub == "BITFIELD" {
		if bf, err = kv.ParseBitField(rest[1:], false); err != nil {
			return errf("ERR %s", err)
		}
		reads, _ := kv.BitFieldRanges(bf) // the writes are recorded with the write, below
		a := tx.access(rest[0])
		a.read = append(a.read, reads...)
		if !kv.BitFieldWrites(bf) {
			res, err = tx.read(kv.Op{Kind: kv.KindGet, Key: rest[0], Now: now})
			if err != nil {
				return c.txFail(h, err)
			}
			_, reply := kv.RunBitField(append([]byte(nil), res.Bulk...), bf)
			c.writeReply(reply)
			return nil
		}
	}
	switch sub {
	case "ACCESS":
		start, err1 := parseInt64(rest[1])
		end, err2 := parseInt64(rest[2])
		if err1 != nil || err2 != nil || start < 0 || end < start || end >= 512<<20 {
			return errf("ERR KEFIR.TX ACCESS takes a byte range 'start end', 0 <= start <= end < 512 MiB")
		}
		a := tx.access(rest[0])
		a.declared = true
		a.read = append(a.read, bytesRange(start, end))
		return c.w.WriteSimple("OK")
	case "GETRANGE", "GETBIT":
		var start, end int64
		var rng kv.TxRange
		whole := false
		if sub == "GETRANGE" {
			var err1, err2 error
			start, err1 = parseInt64(rest[1])
			end, err2 = parseInt64(rest[2])
			if err1 != nil || err2 != nil {
				return errNotInt
			}
			// An index from the end reads the length: the whole key.
			whole = start < 0 || end < 0
			rng = bytesRange(max(start, 0), max(end, 0))
		} else {
			off, perr := parseBitOffset(rest[1])
			if perr != nil {
				return perr
			}
			start, rng = off, kv.TxRange{Lo: uint64(off), Hi: uint64(off) + 1}
		}
		res, err = tx.read(kv.Op{Kind: kv.KindGet, Key: rest[0], Now: now})
		if err != nil {
			return c.txFail(h, err)
		}
		a := tx.access(rest[0])
		switch {
		case whole:
			a.wholeRead = true
		case sub == "GETBIT" || start <= end:
			a.read = append(a.read, rng)
		}
		if sub == "GETBIT" {
			return c.w.WriteInt(kv.GetBit(res.Bulk, start))
		}
		return c.w.WriteBulk(kv.GetRange(res.Bulk, start, end))
	case "GET", "MGET", "EXISTS":
		for _, k := range keys {
			tx.access(k).wholeRead = true
		}
		op := kv.Op{Kind: kv.KindGet, Key: rest[0], Now: now}
		if sub != "GET" {
			op = kv.Op{Kind: kv.KindMGet, Keys: rest, Now: now}
			if sub == "EXISTS" {
				op.Kind = kv.KindExists
			}
		}
		res, err = tx.read(op)
	default:
		if len(tx.wr) >= txMaxWrites || tx.bytes >= txMaxWriteBytes {
			return errTxFull
		}
		var ops []kv.Op
		switch sub {
		case "SET":
			ops = []kv.Op{{Kind: kv.KindSet, Key: clone(rest[0]), Value: clone(rest[1]), Now: now}}
		case "INCRBY":
			delta, perr := parseInt64(rest[1])
			if perr != nil {
				return perr
			}
			ops = []kv.Op{{Kind: kv.KindIncrBy, Key: clone(rest[0]), Delta: delta, Now: now}}
		case "DEL":
			for _, k := range rest {
				ops = append(ops, kv.Op{Kind: kv.KindDel, Keys: [][]byte{clone(k)}, Now: now})
			}
		case "SETRANGE":
			off, perr := parseInt64(rest[1])
			if perr != nil {
				return perr
			}
			if off < 0 {
				return errf("ERR offset is out of range")
			}
			ops = []kv.Op{{Kind: kv.KindSetRange, Key: clone(rest[0]), Delta: off, Value: clone(rest[2]), Now: now}}
		case "SETBIT":
			off, perr := parseBitOffset(rest[1])
			if perr != nil {
				return perr
			}
			if len(rest[2]) != 1 || (rest[2][0] != '0' && rest[2][0] != '1') {
				return errf("ERR bit is not an integer or out of range")
			}
			ops = []kv.Op{{Kind: kv.KindSetBit, Key: clone(rest[0]), Delta: off, Value: clone(rest[2]), Now: now}}
		case "BITFIELD":
			ops = []kv.Op{{Kind: kv.KindBitField, Key: clone(rest[0]), Value: kv.EncodeBitField(bf), Now: now}}
		}
		// The bounds hold for the write that would cross them, not only
		// once the set is past them: one write may be as big as the value
		// limit, and a DEL is a write per key.
		size := tx.bytes
		for i := range ops {
			size += len(ops[i].RoutingKey()) + len(ops[i].Value)
		}
		if size > txMaxWriteBytes || len(tx.wr)+len(ops) > txMaxWrites {
			return errTxFull
		}
		var count int64
		for i := range ops {
			r, aerr := tx.ov.Apply(tx.get, tx.snap.Version()+1, &ops[i], 0)
			if aerr != nil {
				err = aerr
				break
			}
			tx.wr = append(tx.wr, ops[i])
			tx.bytes += len(ops[i].RoutingKey()) + len(ops[i].Value)
			a := tx.access(ops[i].RoutingKey())
			switch o := &ops[i]; o.Kind {
			case kv.KindSetRange:
				if len(o.Value) > 0 {
					a.write = append(a.write, bytesRange(o.Delta, o.Delta+int64(len(o.Value))-1))
				}
				// Its reply is the value's length: a read of it.
				a.read = append(a.read, kv.TxLength)
			case kv.KindSetBit:
				a.write = append(a.write, kv.TxRange{Lo: uint64(o.Delta), Hi: uint64(o.Delta) + 1})
			case kv.KindBitField:
				_, w := kv.BitFieldRanges(bf)
				a.write = append(a.write, w...)
			default:
				a.wholeWrite = true
			}
			count += r.Int
			res = r
		}
		if sub == "DEL" {
			res = kv.Result{Kind: kv.ResInt, Int: count}
		}
	}
	if err != nil {
		return c.txFail(h, err)
	}
	c.writeResult(res)
	return nil
}

// txInline runs args on an event loop if it is a KEFIR.TX command that
// need not wait: GET, MGET, EXISTS, GETRANGE or GETBIT of a transaction
// whose snapshot is pinned (they read the pinned engine versions and the
// transaction's own overlay); ABORT (it unpins); PREPARE (it builds the
// commit op from the snapshot, and the client sends it through its write
// path); COMMIT of a transaction that wrote nothing (it ends here, without
// the log); and BEGIN where the replica has its linearizable read point at
// hand (a leader under a running lease: TryTxBegin, the conditions of a
// lease read on the loop). False, with nothing done, for anything else: a
// BEGIN that must wait for its read point, a COMMIT with writes (the write
// path), a buffered write (rare in the read-mostly transactions this is
// for), and the first key of a transaction on a node of several groups,
// which takes the snapshot (txStart). On a replica's loop every other
// command is handed to a worker goroutine (a futex wake and a give-back
// per command), which held a read-only c.Txn to ~0.6x the rate of the same
// plain reads (docs/design/transactions.md, "Interactive transactions").
//
// The decision holds until txCmd runs: the loop owns the connection, so no
// other command of it runs in between, and the only thing that changes a
// transaction behind it is the expiry timer, which leaves it expired —
// answered TXABORT, without waiting. The check takes tx.mu as txCmd does,
// because expire writes tx.snap under it.
func (c *conn) txInline(args [][]byte) bool {
	if len(args) < 2 || !eq(args[0], "KEFIR.TX") {
		return false
	}
	cmd := args // the command that decides: the last of a chain (txChain)
	if eq(args[1], "BEGIN") || (eq(args[1], "ABORT") && len(args) != 3) {
		ch, err := parseTxChain(args)
		switch {
		case err != nil:
			c.dispatch(args) // answered at once
			return true
		case ch.begin && (ch.then == nil || txReadSub(ch.then[1])):
			// At once where the replica has its read point at hand (a
			// leader under a running lease: TryTxBegin), else on a worker,
			// which waits. A first read behind a commit in flight waits,
			// on a worker (txRefresh sets wouldWait; txBegin undoes the
			// BEGIN).
			return c.dispatchInline(args)
		case ch.begin:
			return false // a first write: on a worker, as a write is
		case ch.then == nil:
			c.dispatch(args) // ABORTs only
			return true
		}
		// ABORTs, then a command: as that command. The ABORTs are done
		// again, as nothing, if it must wait and a worker runs the chain.
		cmd = ch.then
	}
	if len(cmd) < 3 {
		return false
	}
	var tx *itxn
	if h, err := parseHandle(cmd[2]); err == nil && c.itx != nil {
		tx = c.itx.open[h]
	}
	switch sub := cmd[1]; {
	case eq(sub, "ABORT"):
	case eq(sub, "PREPARE"):
		// Across slots it runs the two-phase commit: on a worker.
		if tx != nil && !tx.ready(func(tx *itxn) bool { return len(tx.parts) == 0 }) {
			return false
		}
	case txReadSub(sub):
		if tx != nil && !tx.ready(func(tx *itxn) bool { return tx.snap != nil }) {
			return false
		}
		return c.dispatchInline(args)
	case eq(sub, "COMMIT"):
		if tx != nil && !tx.ready(func(tx *itxn) bool { return len(tx.parts) == 0 && (tx.snap == nil || len(tx.wr) == 0) }) {
			return false
		}
	default:
		return false
	}
	// An unknown handle is answered at once, as on a worker.
	c.dispatch(args)
	return true
}

// txReadSub reports whether sub is a transaction's snapshot read.
func txReadSub(sub []byte) bool {
	return eq(sub, "GET") || eq(sub, "MGET") || eq(sub, "EXISTS") || eq(sub, "GETRANGE") || eq(sub, "GETBIT")
}

// ready reports, under tx.mu, whether tx has expired (its next command
// answers TXABORT) or f holds of it.
func (tx *itxn) ready(f func(*itxn) bool) bool {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	return tx.expired || f(tx)
}

// txFail answers a transaction command's error; a snapshot that lost its
// versions ends the transaction.
func (c *conn) txFail(h uint64, err error) error {
	var rl *errTxReadLocked
	if errors.Is(err, shard.ErrTxTooOld) || errors.As(err, &rl) {
		c.txEnd(h)
		return &replyError{err.Error()}
	}
	if msg, ok := kv.TxErrorText(err); ok {
		return &replyError{msg}
	}
	return err
}

// txChain is KEFIR.TX's chained form (docs/commands.md, "KEFIR.TX BEGIN
// … THEN"): a command that ends transactions, begins one, and runs a
// transaction command, answering only the last. Each part was a command of
// its own, parsed, dispatched and answered on the leader's loop: a read-only
// transaction of 4 GETs was 6 commands against its reads' 4
// (docs/design/transactions.md, "One command for BEGIN and the end").
//
//	KEFIR.TX ABORT handle [handle ...] [THEN <command>]
//	KEFIR.TX BEGIN [SI|SERIALIZABLE] [THEN <subcommand> handle args...]
//
// where <command> is a BEGIN (of either form) or another KEFIR.TX
// subcommand with its handle and arguments. The ABORTs end the open
// transactions named (unknown ones are skipped: a transaction already
// ended) before anything else, whatever the rest answers. A BEGIN with THEN
// takes the handle the command after it names, which must be above every
// handle the connection has used (handles only grow, so a late ABORT never
// ends a later transaction), and then runs that command in it: its reply is
// the command's. A refused BEGIN (a follower's -MOVED, too many open) begins
// nothing and answers its error, and the command is not run: nothing is read
// outside a snapshot, and a later command naming the handle answers "no
// such transaction".
type txChain struct {
	ends      [][]byte // handles to end first
	begin     bool
	beginArgs [][]byte // BEGIN's isolation word, if any
	// then is the command run last, as args whose then[1] is its
	// subcommand (then[0] is the THEN word); nil if none.
	then [][]byte
}

// parseTxChain parses KEFIR.TX BEGIN … and KEFIR.TX ABORT h… (txChain).
// Nothing is done before the whole command is parsed: a malformed one
// answers an error and ends nothing.
func parseTxChain(args [][]byte) (txChain, error) {
	var ch txChain
	i := 1
	if eq(args[i], "ABORT") {
		j := i + 1
		for j < len(args) && !eq(args[j], "THEN") {
			if _, err := parseHandle(args[j]); err != nil {
				return ch, errf("ERR KEFIR.TX ABORT takes handles (integers), not '%s'", clip(args[j]))
			}
			j++
		}
		ch.ends = args[i+1 : j]
		if len(ch.ends) == 0 {
			return ch, errf("ERR wrong number of arguments for 'kefir.tx|abort' command")
		}
		if j == len(args) {
			return ch, nil
		}
		if j+1 == len(args) {
			return ch, errf("ERR KEFIR.TX ABORT … THEN takes a command after THEN")
		}
		i = j + 1
		if !eq(args[i], "BEGIN") {
			if eq(args[i], "ABORT") {
				return ch, errf("ERR KEFIR.TX ABORT … THEN ABORT: name every handle in the first ABORT")
			}
			ch.then = args[j:]
			return ch, nil
		}
	}
	ch.begin = true
	j := i + 1
	for j < len(args) && !eq(args[j], "THEN") {
		j++
	}
	ch.beginArgs = args[i+1 : j]
	if j < len(args) {
		ch.then = args[j:]
		if len(ch.then) < 3 {
			return ch, errf("ERR KEFIR.TX BEGIN … THEN takes a subcommand and the new transaction's handle")
		}
		if eq(ch.then[1], "BEGIN") || eq(ch.then[1], "ABORT") {
			return ch, errf("ERR KEFIR.TX BEGIN … THEN %s: the command after THEN is one of the new transaction's", clip(ch.then[1]))
		}
	}
	return ch, nil
}

// txRunChain runs a parsed chain (txChain).
func (c *conn) txRunChain(ch txChain) error {
	if c.itx != nil {
		for _, e := range ch.ends {
			h, _ := parseHandle(e) // checked by parseTxChain
			if tx := c.itx.open[h]; tx != nil {
				tx.mu.Lock()
				c.txEnd(h)
				tx.mu.Unlock()
			}
		}
	}
	switch {
	case ch.begin:
		return c.txBegin(ch.beginArgs, ch.then)
	case ch.then != nil:
		return c.txCmd(ch.then)
	}
	return c.w.WriteSimple("OK")
}

// parseTxBeginArgs parses BEGIN's words: an isolation level, SI or
// SERIALIZABLE (the default), and READONLY, in either order, each at most
// once.
//
// A READONLY transaction (docs/design/transactions.md, "Read-only
// transactions") is refused every write (errTxReadOnly; it stays open, as
// after any command's error), and its first read does not wait for a commit
// in flight (txRefresh): that wait buys a read-modify-write a start after
// the commit it would otherwise lose to, and a transaction that only reads
// loses to nothing — read at the older start it is serialized there, before
// the commit, which is still a point inside its real-time interval. It never
// waits and, on a node of one replica group, never aborts (its reads are of
// one snapshot, and its COMMIT ends it without the log), except at the
// lifetime and retention limits and a rare race (a key first read by a
// later command whose version at the start was dropped before the start
// was pinned: txSnapLost). The isolation word is accepted and changes
// nothing: a transaction that only reads one snapshot is serializable.
func parseTxBeginArgs(args [][]byte) (iso kv.Cond, readOnly bool, err error) {
	iso = kv.TxSerializable
	isoSet := false
	for _, a := range args {
		switch {
		case eq(a, "READONLY") && !readOnly:
			readOnly = true
		case (eq(a, "SI") || eq(a, "SERIALIZABLE")) && !isoSet:
			isoSet = true
			if eq(a, "SI") {
				iso = kv.TxSI
			}
		case eq(a, "READONLY") || eq(a, "SI") || eq(a, "SERIALIZABLE"):
			return 0, false, errSyntax // a word twice, or SI and SERIALIZABLE
		default:
			return 0, false, errf("ERR unknown isolation level '%s' (SI or SERIALIZABLE, and READONLY)", clip(a))
		}
	}
	return iso, readOnly, nil
}

// txBegin runs KEFIR.TX BEGIN [SI|SERIALIZABLE] [READONLY] (default
// SERIALIZABLE; parseTxBeginArgs), and then, if not nil, the transaction's
// first command (txChain), whose handle the new transaction takes.
func (c *conn) txBegin(args, then [][]byte) error {
	iso, readOnly, err := parseTxBeginArgs(args)
	if err != nil {
		return err
	}
	if _, ok := c.srv.shard.(shard.TxSnapshots); !ok {
		return errTxNoSupport
	}
	if c.itx == nil {
		c.itx = &itxConn{open: map[uint64]*itxn{}}
	}
	h := c.itx.next + 1
	if then != nil {
		n, err := parseHandle(then[2])
		if err != nil {
			return errf("ERR KEFIR.TX BEGIN … THEN %s '%s': the new transaction's handle is an integer", clip(then[1]), clip(then[2]))
		}
		if n <= c.itx.next {
			// Handles only grow: a handle used before may still be named by
			// a late command (an ABORT riding a later write), which must not
			// reach a new transaction.
			return errf("ERR KEFIR.TX BEGIN … THEN names handle %d: this connection has used handles up to %d, a new one must be above", n, c.itx.next)
		}
		h = n
	}
	if len(c.itx.open) >= txMaxOpen {
		return errTxTooMany
	}
	tx := c.itx.take(iso, readOnly)
	if !c.srv.clusterOn {
		// One group: its start version is known now. On a node of several
		// groups the first key names the group (versions are a group's).
		if err := c.txStart(tx, nil); err != nil || c.wouldWait {
			c.itx.put(tx)
			return err // wouldWait: nothing done; a worker runs BEGIN again
		}
	}
	prev := c.itx.next
	c.itx.next = h
	c.itx.open[h] = tx
	if tx.timer == nil {
		tx.timer = time.AfterFunc(txMaxAge, tx.expire)
	} else {
		tx.timer.Reset(txMaxAge) // stopped before it fired (txEnd)
	}
	if then == nil {
		return c.w.WriteInt(int64(h))
	}
	err = c.txCmd(then)
	if c.wouldWait {
		// The first command must wait (on an event loop): undone, so that
		// the worker that runs the whole chain again finds it as it was.
		tx.mu.Lock()
		c.txEnd(h)
		tx.mu.Unlock()
		c.itx.next = prev
		return nil
	}
	return err
}

// take is a transaction for BEGIN: one of the connection's ended ones
// (free), or a new one.
func (x *itxConn) take(iso kv.Cond, readOnly bool) *itxn {
	n := len(x.free)
	if n == 0 {
		return &itxn{iso: iso, readOnly: readOnly, began: time.Now(), slot: -1, keys: map[string]*txKey{}}
	}
	tx := x.free[n-1]
	x.free[n-1] = nil
	x.free = x.free[:n-1]
	// Under mu, as expire reads them once the timer is armed again.
	tx.mu.Lock()
	tx.expired, tx.ended, tx.touched = false, false, false
	tx.iso, tx.readOnly, tx.began, tx.slot = iso, readOnly, time.Now(), -1
	tx.origin, tx.now, tx.bytes, tx.viewAt = kv.TxOrigin{}, 0, 0, 0
	tx.mu.Unlock()
	return tx
}

// put keeps tx, released and with no timer that may still fire, for a
// later BEGIN on the connection (take).
func (x *itxConn) put(tx *itxn) {
	if len(x.free) < txMaxOpen {
		x.free = append(x.free, tx)
	}
}

// txTryBegin is a replica that can take a transaction's start snapshot
// without waiting when it can (vrshard.Replica.TryTxBegin).
type txTryBegin interface {
	TryTxBegin() (*shard.TxSnap, bool)
}

// txStart takes tx's snapshot, in the group of key on a node of several.
// On an event loop (c.inline, txInline) it takes it only if the replica
// can without waiting, and otherwise sets c.wouldWait with nothing done.
func (c *conn) txStart(tx *itxn, key []byte) error {
	var snap *shard.TxSnap
	if c.inline {
		t, ok := c.srv.shard.(txTryBegin)
		if ok && key == nil {
			snap, ok = t.TryTxBegin()
		}
		if !ok || key != nil {
			c.wouldWait = true
			return nil
		}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if snap, err = c.srv.shard.(shard.TxSnapshots).TxBegin(ctx, key); err != nil {
			return err // a follower's not-leader error: -MOVED to the leader
		}
	}
	o, err := kv.SlotOrigin(snap.Get, key)
	if err != nil {
		snap.Close()
		return err
	}
	tx.snap, tx.origin = snap, o
	return nil
}

// txFreshWait bounds a first read's wait for the commits in flight
// (txRefresh): one that takes longer (a stalled follower, a view change) is
// not worth holding the transaction's connection for, and the read goes
// ahead from the old start. A variable for tests.
var txFreshWait = 50 * time.Millisecond

// txFresher is a replica whose leader knows which keys the EXECs and
// transaction commits it has in flight write (vrshard.Replica, txwait.go).
type txFresher interface {
	TxWriting(keys [][]byte) bool
	TxAwaitWriters(ctx context.Context, keys [][]byte) (bool, error)
}

// txRefresh makes a transaction's first command that names keys see the
// commits in flight at the leader that write them (docs/design/
// transactions.md, "Fresh first reads"): it waits until they are applied and
// takes the start version again. Read at the old start, those keys are
// about to be replaced, and a commit that checks them aborts a log round
// later. Only before the transaction touched any key (tx.touched: nothing
// read, written or declared), so that every read is of one snapshot; the new
// start is a linearizable read point taken after BEGIN's, which is all BEGIN
// promises (at least as new as every write acknowledged before it). On an
// event loop (c.inline) a wait sets c.wouldWait with nothing done, and a
// worker runs the command again. A node of several groups takes the start at
// the first key (txSlot), so there the wait comes before it, in the command
// (cluster.Multi asks the key's group) and no start is taken again. A failure
// to wait or to take the new start leaves the old one, which is as good as
// before. A READONLY transaction does not wait, unless its start already
// lost a version of keys (txSnapLost): then it waits and takes it again.
func (c *conn) txRefresh(tx *itxn, keys [][]byte) error {
	if c.srv.clusterOn || tx.snap == nil || len(keys) == 0 || (tx.touched && !(mutation.On && itxMut.refreshAfterRead.Load())) {
		return nil
	}
	if tx.readOnly {
		// READONLY: no wait (docs/design/transactions.md, "Read-only
		// transactions") — unless its snapshot already lost a version of
		// keys (txSnapLost): then a new start, after the commits in flight
		// that write them, if any.
		if !c.txSnapLost(tx, keys) {
			return nil
		}
		if c.awaitTxWriters(keys); c.wouldWait {
			return nil // the worker runs it again
		}
	} else if !c.awaitTxWriters(keys) {
		return nil // nothing waited for (or c.wouldWait: the worker runs it again)
	}
	old := tx.snap
	if err := c.txStart(tx, nil); err != nil || c.wouldWait {
		return nil // txStart left tx.snap as it was (wouldWait: a worker runs it again)
	}
	old.Close()
	return nil
}

// txSnapLost reports, for a READONLY transaction's first read, whether
// tx's snapshot no longer holds the version of one of keys. A leader pins
// the start at its readable index R, which trails what its engine applied
// by up to a round: a write applied beyond R before the pin has already
// dropped the version R reads (retention keeps a superseded version only
// for a snapshot open when it is superseded), and the read would abort
// "transaction too old" at once — in a transaction that has read nothing,
// whose start may as well be taken again (txRefresh); a read-write
// transaction's read aborts there as before, and its client retries it.
// One engine lookup per key of the first command; it reads the snapshot and changes nothing, so an event loop's
// run and a worker's run again agree.
func (c *conn) txSnapLost(tx *itxn, keys [][]byte) bool {
	for _, k := range keys {
		if _, _, _, _, err := tx.snap.GetShared(k); errors.Is(err, shard.ErrTxTooOld) {
			return true
		}
	}
	return false
}

// awaitTxWriters waits, bounded by txFreshWait, for the EXECs and
// transaction commits in flight at this node as leader that write any of
// keys, and reports whether it waited for any (then the caller reads again).
// On an event loop (c.inline) it sets c.wouldWait instead, with nothing
// done, if there is any to wait for. The wait is the first read of a
// KEFIR.TX transaction's (txRefresh) and WATCH's: both would otherwise read
// a state a commit already proposed is about to replace, and their
// transaction would abort a log round later.
func (c *conn) awaitTxWriters(keys [][]byte) bool {
	f, ok := c.srv.shard.(txFresher)
	if !ok || !f.TxWriting(keys) {
		return false
	}
	if c.inline {
		c.wouldWait = true
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), txFreshWait)
	defer cancel()
	waited, err := f.TxAwaitWriters(ctx, keys)
	return waited && err == nil // too long: read as before
}

// txLockWaiter is a node of several groups, whose reads wait for the
// prepared cross-group transactions that write their keys (cluster.Multi).
type txLockWaiter interface {
	TxLocked(keys [][]byte, writes bool) bool
	AwaitTxLocks(ctx context.Context, keys [][]byte, writes bool) error
	LeadsKey(key []byte) bool
}

// txAwaitReadLocks waits, for a READONLY transaction on a node of several
// groups, until no prepared cross-group transaction write-locks fresh, the
// keys whose slot the transaction has no snapshot of yet — as a plain read
// of them waits (cluster.Multi.AwaitTxLocks: it pushes the holder after
// 200 ms) — so that the snapshot taken next serves them. A read-write
// transaction is aborted instead when it reads a key locked at its snapshot
// (itxn.lookup), and its client retries; a read-only one would meet the same
// lock at its retry, and is promised no abort where a wait serves it
// (docs/design/transactions.md, "Read-only transactions"). On an event loop
// (c.inline) it sets c.wouldWait, with nothing done, if there is a lock.
func (c *conn) txAwaitReadLocks(tx *itxn, fresh [][]byte) error {
	w, ok := c.srv.shard.(txLockWaiter)
	if !ok || len(fresh) == 0 {
		return nil
	}
	// With no snapshot yet every key is fresh, and fresh[0] is the first
	// key, which takes the first slot.
	if tx.slot < 0 && !w.LeadsKey(fresh[0]) {
		// The first key takes the first slot's snapshot at its group's
		// leader: not here, where TxBegin answers -MOVED (a plain read at
		// a follower does not wait for a lock either).
		return nil
	}
	if !w.TxLocked(fresh, false) {
		return nil
	}
	if c.inline {
		c.wouldWait = true
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return w.AwaitTxLocks(ctx, fresh, false)
}

// txReadLockHook, if set (tests only), runs between txSlotsReadOnly's wait
// for locks and the snapshots it takes: where a prepare may slip in.
var txReadLockHook atomic.Pointer[func()]

// txSlotsReadOnly takes, for a READONLY transaction on a node of several
// groups, the snapshots of the slots of keys it has none of yet (txSlot),
// after waiting for the prepared transactions that write-lock those keys
// (txAwaitReadLocks). The wait looks at this node's replica and the first
// slot's snapshot is a linearizable read point at its leader, taken after
// it: a transaction prepared in between is in the snapshot, and the read of
// its key would abort. So the new snapshots are looked at once taken, and a
// key write-locked in one of them drops them all, to wait and take them
// again — a few times; past that the read aborts as a read-write
// transaction's does. None of them has been read from (this command's reads
// come after), so nothing is read from two snapshots.
func (c *conn) txSlotsReadOnly(tx *itxn, keys [][]byte) error {
	for attempt := 1; ; attempt++ {
		var fresh [][]byte
		for _, k := range keys {
			if !tx.hasSnapOf(cluster.Slot(k)) {
				fresh = append(fresh, k)
			}
		}
		if err := c.txAwaitReadLocks(tx, fresh); err != nil || c.wouldWait {
			return err
		}
		if h := txReadLockHook.Load(); h != nil && len(fresh) > 0 && !c.inline {
			(*h)()
		}
		for _, k := range keys {
			if err := c.txSlot(tx, k); err != nil || c.wouldWait {
				return err
			}
		}
		if len(fresh) == 0 || attempt == 3 {
			return nil
		}
		locked := false
		for _, k := range fresh {
			l, err := kv.TxWriteLocked(tx.snapOf(k).Get, k)
			if err != nil {
				return err
			}
			locked = locked || l
		}
		if !locked {
			return nil
		}
		tx.dropSnaps(fresh)
	}
}

// dropSnaps closes the snapshots of the slots of keys (none read from):
// the first slot's, and with it every further part (all taken after it), or
// the further parts of those slots.
func (tx *itxn) dropSnaps(keys [][]byte) {
	drop := map[uint16]bool{}
	for _, k := range keys {
		drop[cluster.Slot(k)] = true
	}
	if tx.slot >= 0 && drop[uint16(tx.slot)] {
		for _, p := range tx.parts {
			p.snap.Close()
		}
		tx.parts = tx.parts[:0]
		tx.snap.Close()
		tx.snap, tx.slot, tx.origin = nil, -1, kv.TxOrigin{}
		tx.view, tx.viewAt = nil, 0
		return
	}
	kept := tx.parts[:0]
	for _, p := range tx.parts {
		if drop[p.slot] {
			p.snap.Close()
			continue
		}
		kept = append(kept, p)
	}
	clear(tx.parts[len(kept):])
	tx.parts = kept
}

// hasSnapOf reports whether tx took a snapshot of slot s (its first slot's,
// or a further part's).
func (tx *itxn) hasSnapOf(s uint16) bool {
	if tx.slot == int(s) {
		return true
	}
	for _, p := range tx.parts {
		if p.slot == s {
			return true
		}
	}
	return false
}

// txSlot checks that key is in tx's slot on a node of several groups (the
// first key fixes it, and the snapshot is taken in its group).
func (c *conn) txSlot(tx *itxn, key []byte) error {
	if !c.srv.clusterOn {
		return nil
	}
	s := int(cluster.Slot(key))
	if tx.slot >= 0 {
		if s != tx.slot {
			return c.txAddPart(tx, key, uint16(s)) // xgtx.go; -CROSSSLOT without
		}
		return nil
	}
	if err := c.txStart(tx, key); err != nil {
		return err
	}
	tx.slot = s
	return nil
}

// get reads the transaction's snapshot, noting the version it saw of each
// key (its read set, and its written keys' versions at the start): 0 for a
// key not live at the reading command's clock (tx.now), as kv.TxValidate
// counts a key not live at the commit's, so that a key that expires between
// the read and the commit is a conflict and one that had already expired is
// not. The first read's note stands: the snapshot's versions do not change,
// only liveness, and a later read that finds the key expired where the first
// found it live is caught by the commit's validation, which finds it expired
// too.
func (tx *itxn) get(key []byte) ([]byte, []byte, uint64, bool, error) {
	return tx.lookup(key, false)
}

// getShared is get without the copy of the value (shard.TxSnap.GetShared):
// the view reads serve (read), whose results only go to the socket; a
// write's evaluation (kv.TxOverlay.Apply) reads with get.
func (tx *itxn) getShared(key []byte) ([]byte, []byte, uint64, bool, error) {
	return tx.lookup(key, true)
}

func (tx *itxn) lookup(key []byte, shared bool) ([]byte, []byte, uint64, bool, error) {
	snap := tx.snapOf(key)
	var d, m []byte
	var v uint64
	var ok bool
	var err error
	if shared {
		d, m, v, ok, err = snap.GetShared(key)
	} else {
		d, m, v, ok, err = snap.Get(key)
	}
	if err == nil && tx.slot >= 0 && !(mutation.On && xgtxMut.readsIgnoreLocks) {
		// On a node of several groups: a key a prepared cross-group
		// transaction writes as of the snapshot is not served (xgtx.go).
		if locked, lerr := kv.TxWriteLocked(snap.Get, key); lerr != nil {
			return nil, nil, 0, false, lerr
		} else if locked {
			return nil, nil, 0, false, &errTxReadLocked{key: clone(key)}
		}
	}
	if err == nil {
		if k := tx.key(key); !k.noted {
			k.seen, k.noted = v, true
			if !ok || kv.Expired(m, tx.now) {
				k.seen = 0
			}
		}
	}
	return d, m, v, ok, err
}

// txCommit runs COMMIT (prepare false) and PREPARE of transaction h.
func (c *conn) txCommit(h uint64, tx *itxn, prepare bool) error {
	if len(tx.parts) > 0 {
		return c.txCommitCross(h, tx, prepare) // xgtx.go
	}
	if tx.snap == nil || len(tx.wr) == 0 {
		// Nothing written: the reads were of one committed state, at least
		// as new as BEGIN; there is nothing to validate or order. The reply
		// is the start version (0 if it read nothing on a cluster node).
		var v uint64
		if tx.snap != nil {
			v = tx.snap.Version()
		}
		c.txEnd(h)
		if prepare {
			return c.w.WriteNull()
		}
		return c.w.WriteInt(int64(v))
	}
	written := map[string]bool{}
	var checks []kv.TxCheck
	for _, w := range tx.wr {
		k := w.RoutingKey()
		if written[string(k)] {
			continue
		}
		written[string(k)] = true
		if _, ok := tx.seen(string(k)); !ok {
			// A blind write: its version at the start is still needed (a
			// key deleted in the window is absent now, where it was not).
			tx.now = time.Now().UnixMilli()
			if _, _, _, _, err := tx.get(k); err != nil {
				return c.txFail(h, err)
			}
		}
		v, _ := tx.seen(string(k))
		checks = append(checks, kv.TxCheck{Key: k, Version: v, Ranges: tx.checkRanges(string(k))})
	}
	if tx.iso == kv.TxSerializable {
		for _, k := range tx.seenKeys() {
			if !written[k] {
				v, _ := tx.seen(k)
				checks = append(checks, kv.TxCheck{Key: []byte(k), Version: v, Ranges: tx.checkRanges(k)})
			}
		}
	}
	if mutation.On && itxMut.skipWindow.Load() {
		checks = nil
	}
	op, err := kv.NewTxCommit(tx.snap.Version(), tx.iso, tx.origin, checks, tx.wr)
	if err != nil {
		return err
	}
	enc := kv.AppendOp(nil, &op)
	c.txEnd(h)
	if prepare {
		return c.w.WriteBulk(enc)
	}
	c.queueTxCommit(enc)
	c.flushWrites()
	return nil
}

// queueTxCommit queues an interactive transaction's commit op (enc) as the
// writer's write: unlike a coordinator's KEFIR.TXAPPLY it carries the
// writer's session (writeSession), since its result advances that session
// as any write's does — one that carried none would let a session whose
// cad or async write was lost commit past the loss unjudged
// (writeSessionCheck, chainSessionCheck).
func (c *conn) queueTxCommit(enc []byte) {
	n := len(c.writes)
	c.queueWrite(txApplySpec, [][]byte{[]byte("KEFIR.TXAPPLY"), enc}, callOpts{})
	if len(c.writes) > n {
		c.writes[n].Session = c.writeSession(callOpts{})
	}
}

// txEnd forgets transaction h and unpins its snapshot; the caller holds
// its mu.
func (c *conn) txEnd(h uint64) {
	if tx := c.itx.open[h]; tx != nil {
		tx.ended = true
		stopped := tx.timer != nil && tx.timer.Stop()
		tx.release()
		delete(c.itx.open, h)
		if stopped {
			// expire will not run: the struct is free for the next BEGIN
			// (its caller unlocks mu before that). One whose timer fired,
			// or is firing, is left to the collector.
			c.itx.put(tx)
		}
	}
}

// release unpins tx's snapshot and drops its write set (tx.mu held).
func (tx *itxn) release() {
	if tx.snap != nil {
		tx.snap.Close()
		tx.snap = nil
	}
	for _, p := range tx.parts {
		p.snap.Close()
	}
	tx.parts = nil
	tx.wr, tx.ov, tx.view = nil, kv.TxOverlay{}, nil
	if len(tx.keys) > 64 {
		tx.keys = map[string]*txKey{} // not kept at a big transaction's size
		return
	}
	for _, k := range tx.keys {
		if len(tx.spare) < 64 {
			*k = txKey{}
			tx.spare = append(tx.spare, k)
		}
	}
	clear(tx.keys)
}

// expire is the timer's end of a transaction older than txMaxAge that its
// connection did not touch since: unpinned now, aborted at its next command
// (txCmd sees expired) or when the connection closes.
func (tx *itxn) expire() {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if !tx.ended {
		tx.expired = true
		tx.release()
	}
}

// txCloseAll ends the connection's transactions (it is closing).
func (c *conn) txCloseAll() {
	if c.itx == nil {
		return
	}
	for h, tx := range c.itx.open {
		tx.mu.Lock()
		c.txEnd(h)
		tx.mu.Unlock()
	}
}

var txApplySpec, _ = command.Lookup([]byte("KEFIR.TXAPPLY"))

// parseTxApply parses KEFIR.TXAPPLY's argument, a KindTxCommit op's
// encoding (kv.AppendOp), into the op (its bytes copied into a, the batch's
// arena). Nothing but a well-formed transaction commit is accepted.
func parseTxApply(args [][]byte, a *arena) (kv.Op, error) {
	op, err := kv.DecodeOp(a.copy(args[1]))
	switch {
	case err != nil:
	case op.Kind == kv.KindTxCommit:
		_, _, err = kv.DecodeTxCommit(&op)
	case kv.IsXgtxKind(op.Kind):
		// A cross-group transaction's op, sent by its coordinator (xgtx.go);
		// malformed ones fail at apply, on every replica alike.
	case op.Kind == kv.KindFlush && len(op.Key) > 0:
		// A group's part of a FLUSHALL at a node of several groups
		// (flush.go), routed by its key.
	default:
		err = errors.New("not a transaction commit or a group's flush")
	}
	if err != nil {
		return kv.Op{}, errf("ERR KEFIR.TXAPPLY: %v", err)
	}
	op.Now = 0 // the proposing node stamps it, as for every write
	return op, nil
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }
