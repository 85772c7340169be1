package server

import (
	"context"
	"errors"
	"hash/fnv"
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
	switch spec.Name {
	case "FLUSHDB", "FLUSHALL":
		// ASYNC and SYNC do the same: the flush is one op in the log,
		// applied like any write, and its reply waits for it.
		if len(args) > 2 || (len(args) == 2 && !eq(args[1], "ASYNC") && !eq(args[1], "SYNC")) {
			return op, true, errSyntax
		}
		return kv.Op{Kind: kv.KindFlush}, true, nil
	case "RENAME", "RENAMENX":
		op = kv.Op{Kind: kv.KindRename, Keys: [][]byte{a.copy(args[1]), a.copy(args[2])}}
		if spec.Name == "RENAMENX" {
			op.Cond = kv.IfAbsent
		}
		return op, true, nil
	case "COPY":
		op = kv.Op{Kind: kv.KindCopy, Keys: [][]byte{a.copy(args[1]), a.copy(args[2])}, Cond: kv.IfAbsent}
		for i := 3; i < len(args); i++ {
			switch {
			case eq(args[i], "REPLACE"):
				op.Cond = kv.Always
			case eq(args[i], "DB") && i+1 < len(args):
				i++
				if _, err := parseInt64(args[i]); err != nil {
					return op, true, errNotInt
				}
				if string(args[i]) != "0" {
					return op, true, errf("ERR DB index is out of range (Kefir has only database 0, so COPY cannot copy to another)")
				}
			default:
				return op, true, errSyntax
			}
		}
		return op, true, nil
	case "GETDEL":
		return kv.Op{Kind: kv.KindGetDel, Key: a.copy(args[1])}, true, nil
	case "SETRANGE":
		off, err := parseInt64(args[2])
		if err != nil {
			return op, true, err
		}
		if off < 0 {
			return op, true, errf("ERR offset is out of range")
		}
		return kv.Op{Kind: kv.KindSetRange, Key: a.copy(args[1]), Delta: off, Value: a.copy(args[3])}, true, nil
	case "INCRBYFLOAT":
		return kv.Op{Kind: kv.KindIncrByFloat, Key: a.copy(args[1]), Value: a.copy(args[2])}, true, nil
	case "MSETNX":
		if len(args)%2 != 1 {
			return op, true, errf("ERR wrong number of arguments for 'msetnx' command")
		}
		op = kv.Op{Kind: kv.KindMSetNX, Keys: a.copyArgs(args[1:])}
		return op, true, nil
	case "BITFIELD":
		// Always a write, as in Redis (one of GETs only writes nothing).
		ops, err := kv.ParseBitField(args[2:], false)
		if err != nil {
			return op, true, errf("ERR %s", err)
		}
		return kv.Op{Kind: kv.KindBitField, Key: a.copy(args[1]), Value: a.copy(kv.EncodeBitField(ops))}, true, nil
	case "SETBIT":
		off, err := parseBitOffset(args[2])
		if err != nil {
			return op, true, err
		}
		if len(args[3]) != 1 || (args[3][0] != '0' && args[3][0] != '1') {
			return op, true, errf("ERR bit is not an integer or out of range")
		}
		return kv.Op{Kind: kv.KindSetBit, Key: a.copy(args[1]), Delta: off, Value: a.copy(args[3])}, true, nil
	}
	return parseHashWrite(spec, args, a) // hash.go
}

func parseBitOffset(b []byte) (int64, error) {
	n, err := parseInt64(b)
	if err != nil || n < 0 || n > kv.MaxBitOffset {
		return 0, errf("ERR bit offset is not an integer or out of range")
	}
	return n, nil
}

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
	get := func(key []byte) ([]byte, bool, error) {
		res, err := run(kv.Op{Kind: kv.KindGet, Key: key})
		return res.Bulk, res.Kind == kv.ResBulk, err
	}
	switch spec.Name {
	case "SCAN":
		return scanCommand(args, run)
	case "KEYS":
		return keysCommand(args[1], run)
	case "RANDOMKEY":
		return randomKey(run)
	case "TYPE":
		t, err := keyType(args[1], run)
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
		return objectCommand(args, run)
	case "GETRANGE", "SUBSTR":
		start, err1 := parseInt64(args[2])
		end, err2 := parseInt64(args[3])
		if err1 != nil || err2 != nil {
			return nil, errNotInt
		}
		v, _, err := get(args[1])
		if err != nil {
			return nil, err
		}
		r := kv.GetRange(v, start, end)
		return func(c *conn) { _ = c.w.WriteBulk(r) }, nil
	case "GETBIT":
		off, err := parseBitOffset(args[2])
		if err != nil {
			return nil, err
		}
		v, _, err := get(args[1])
		if err != nil {
			return nil, err
		}
		bit := kv.GetBit(v, off)
		return func(c *conn) { _ = c.w.WriteInt(bit) }, nil
	case "BITFIELD_RO":
		ops, err := kv.ParseBitField(args[2:], true)
		if err != nil {
			return nil, errf("ERR %s", err)
		}
		v, _, err := get(args[1])
		if err != nil {
			return nil, err
		}
		_, reply := kv.RunBitField(append([]byte(nil), v...), ops)
		return func(c *conn) { c.writeReply(reply) }, nil
	case "BITCOUNT":
		return bitCount(args, get)
	case "BITPOS":
		return bitPos(args, get)
	case "LCS":
		return lcsCommand(args, run)
	}
	if reply, ok, err := evalHash(spec, args, run); ok { // hash.go
		return reply, err
	}
	return nil, errf("ERR %s is not a read", strings.ToLower(spec.Name))
}

// keyType is TYPE's answer for key: none, string or hash (a GET of a hash
// answers WRONGTYPE; hashes are the only other type so far).
func keyType(key []byte, run func(kv.Op) (kv.Result, error)) (string, error) {
	res, err := run(kv.Op{Kind: kv.KindGet, Key: key})
	switch {
	case errors.Is(err, kv.ErrWrongKind):
		return "hash", nil
	case err != nil:
		return "", err
	case res.Kind == kv.ResBulk:
		return "string", nil
	}
	return "none", nil
}

// lcsCommand is LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN],
// over one snapshot of both keys (an MGET); a missing key is an empty string.
func lcsCommand(args [][]byte, run func(kv.Op) (kv.Result, error)) (func(*conn), error) {
	var getLen, getIdx, withLen bool
	var minLen int64
	for j := 3; j < len(args); j++ {
		switch {
		case eq(args[j], "IDX"):
			getIdx = true
		case eq(args[j], "LEN"):
			getLen = true
		case eq(args[j], "WITHMATCHLEN"):
			withLen = true
		case eq(args[j], "MINMATCHLEN") && j+1 < len(args):
			n, err := parseInt64(args[j+1])
			if err != nil {
				return nil, err
			}
			minLen = max(n, 0)
			j++
		default:
			return nil, errSyntax
		}
	}
	if getLen && getIdx {
		return nil, errf("ERR If you want both the length and indexes, please just use IDX.")
	}
	res, err := run(kv.Op{Kind: kv.KindMGet, Keys: args[1:3]})
	if err != nil {
		return nil, err
	}
	lcs, n, matches, ok := kv.LCS(res.Array[0], res.Array[1], !getLen, getIdx, minLen)
	if !ok {
		return nil, errf("ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len")
	}
	switch {
	case getIdx:
		return func(c *conn) {
			_ = c.w.WriteMapHeader(2)
			_ = c.w.WriteBulkString("matches")
			_ = c.w.WriteArrayHeader(len(matches))
			for _, m := range matches {
				if withLen {
					_ = c.w.WriteArrayHeader(3)
				} else {
					_ = c.w.WriteArrayHeader(2)
				}
				for _, r := range [][2]int64{m.A, m.B} {
					_ = c.w.WriteArrayHeader(2)
					_ = c.w.WriteInt(r[0])
					_ = c.w.WriteInt(r[1])
				}
				if withLen {
					_ = c.w.WriteInt(m.Len)
				}
			}
			_ = c.w.WriteBulkString("len")
			_ = c.w.WriteInt(n)
		}, nil
	case getLen:
		return intReply(n), nil
	}
	return func(c *conn) { _ = c.w.WriteBulk(lcs) }, nil
}

func intReply(n int64) func(*conn) { return func(c *conn) { _ = c.w.WriteInt(n) } }

// bitUnit parses BITCOUNT/BITPOS's BYTE|BIT.
func bitUnit(b []byte) (isBit bool, err error) {
	switch {
	case eq(b, "BIT"):
		return true, nil
	case eq(b, "BYTE"):
		return false, nil
	}
	return false, errSyntax
}

// bitCount is BITCOUNT key [start end [BYTE|BIT]]; like Redis 7.0, a missing
// key answers 0 before the range is parsed.
func bitCount(args [][]byte, get func([]byte) ([]byte, bool, error)) (func(*conn), error) {
	v, ok, err := get(args[1])
	if err != nil {
		return nil, err
	}
	if !ok {
		return intReply(0), nil
	}
	switch len(args) {
	case 2:
		return intReply(kv.BitCount(v, false, 0, 0, false)), nil
	case 4, 5:
		start, err1 := parseInt64(args[2])
		end, err2 := parseInt64(args[3])
		if err1 != nil || err2 != nil {
			return nil, errNotInt
		}
		isBit := false
		if len(args) == 5 {
			if isBit, err = bitUnit(args[4]); err != nil {
				return nil, err
			}
		}
		return intReply(kv.BitCount(v, true, start, end, isBit)), nil
	}
	return nil, errSyntax
}

// bitPos is BITPOS key bit [start [end [BYTE|BIT]]], parsed in Redis 7.0's
// order: the bit, then (for an existing key) the range.
func bitPos(args [][]byte, get func([]byte) ([]byte, bool, error)) (func(*conn), error) {
	bit, err := parseInt64(args[2])
	if err != nil {
		return nil, err
	}
	if bit != 0 && bit != 1 {
		return nil, errf("ERR The bit argument must be 1 or 0.")
	}
	v, ok, err := get(args[1])
	if err != nil {
		return nil, err
	}
	if !ok {
		return intReply(kv.BitPos(nil, false, bit, false, 0, false, 0, false)), nil
	}
	if len(args) > 6 {
		return nil, errSyntax
	}
	var start, end int64
	isBit := false
	if len(args) >= 4 {
		if start, err = parseInt64(args[3]); err != nil {
			return nil, err
		}
	}
	if len(args) == 6 {
		if isBit, err = bitUnit(args[5]); err != nil {
			return nil, err
		}
	}
	if len(args) >= 5 {
		if end, err = parseInt64(args[4]); err != nil {
			return nil, err
		}
	}
	return intReply(kv.BitPos(v, true, bit, len(args) >= 4, start, len(args) >= 5, end, isBit)), nil
}

// objectCommand is OBJECT ENCODING|FREQ|IDLETIME|REFCOUNT key. ENCODING
// answers what Redis would pick for the value (int, embstr, raw), which is
// what tools use it for; Kefir keeps neither access times nor frequencies,
// so FREQ answers Redis's "not tracked" error and IDLETIME an error of its
// own (docs/commands.md).
func objectCommand(args [][]byte, run func(kv.Op) (kv.Result, error)) (func(*conn), error) {
	sub := strings.ToLower(string(args[1]))
	switch sub {
	case "encoding", "freq", "idletime", "refcount":
	case "help":
		return func(c *conn) {
			lines := []string{"OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
				"ENCODING <key>", "    Return the kind of internal representation used in order to store the value", "    associated with a <key>.",
				"REFCOUNT <key>", "    Return the number of references of the value associated with the specified", "    <key>. (Always 1.)",
				"FREQ <key>, IDLETIME <key>", "    Not tracked by Kefir.",
				"HELP", "    Print this help."}
			_ = c.w.WriteArrayHeader(len(lines))
			for _, l := range lines {
				_ = c.w.WriteSimple(l)
			}
		}, nil
	default:
		return nil, errf("ERR unknown subcommand '%s'. Try OBJECT HELP.", clip(args[1]))
	}
	if len(args) != 3 {
		return nil, errf("ERR wrong number of arguments for 'object|%s' command", sub)
	}
	res, err := run(kv.Op{Kind: kv.KindGet, Key: args[2]})
	isHash := errors.Is(err, kv.ErrWrongKind) // a hash: present, not a string
	if err != nil && !isHash {
		return nil, err
	}
	if !isHash && res.Kind != kv.ResBulk {
		return func(c *conn) { _ = c.w.WriteNull() }, nil
	}
	switch sub {
	case "freq":
		return nil, errf("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.")
	case "idletime":
		return nil, errf("ERR OBJECT IDLETIME is not supported: Kefir does not track access times")
	case "refcount":
		return intReply(1), nil
	}
	enc := stringEncoding(res.Bulk)
	if isHash {
		if enc, err = hashEncoding(args[2], run); err != nil { // hash.go
			return nil, err
		}
	}
	return func(c *conn) { _ = c.w.WriteBulkString(enc) }, nil
}

// stringEncoding is the encoding Redis gives a string value it stores: int
// for an integer it can hold as a long (at most 20 bytes, canonical form),
// embstr up to 44 bytes, raw above.
func stringEncoding(v []byte) string {
	if len(v) <= 20 {
		if _, err := kv.ParseInt(v); err == nil {
			return "int"
		}
	}
	if len(v) <= 44 {
		return "embstr"
	}
	return "raw"
}

// ---- SCAN, KEYS, RANDOMKEY ----

// scanDefaultCount is SCAN's COUNT when none is given (Redis's 10).
const scanDefaultCount = 10

// scanCommand is SCAN cursor [MATCH p] [COUNT n] [TYPE t]. The engine is
// ordered, so a cursor stands for the key to resume from: every key after the
// last one returned. One call reads up to COUNT keys from there (one ordered
// range read at the connection's level, bounded to MATCH's literal prefix)
// and returns those MATCH and TYPE keep — possibly none, with a cursor to go
// on, as Redis may. A key present for the whole iteration is returned once,
// and one written or deleted during it may or may not be.
func scanCommand(args [][]byte, run func(kv.Op) (kv.Result, error)) (func(*conn), error) {
	start, err := scanCursors.resume(args[1])
	if err != nil {
		return nil, err
	}
	count := int64(scanDefaultCount)
	var pattern []byte
	var typ []byte
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			return nil, errSyntax
		}
		switch {
		case eq(args[i], "COUNT"):
			n, err := parseInt64(args[i+1])
			if err != nil {
				return nil, err
			}
			if n < 1 {
				return nil, errSyntax
			}
			count = n
		case eq(args[i], "MATCH"):
			pattern = args[i+1]
		case eq(args[i], "TYPE"):
			typ = args[i+1]
		default:
			return nil, errSyntax
		}
	}
	if string(pattern) == "*" {
		pattern = nil
	}
	op := kv.Op{Kind: kv.KindScan, Key: start, Limit: int(min(count, shard.DefaultMaxScan))}
	if prefix := kv.LiteralPrefix(pattern); len(prefix) > 0 {
		if string(op.Key) < string(prefix) {
			op.Key = prefix
		}
		op.End = kv.PrefixEnd(prefix)
	}
	var keys [][]byte
	next := "0"
	if op.End == nil || string(op.Key) < string(op.End) {
		res, err := run(op)
		if err != nil {
			return nil, err
		}
		for i := 0; i < len(res.Array); i += 2 {
			k := res.Array[i]
			if pattern != nil && !kv.Match(pattern, k) {
				continue
			}
			if typ != nil {
				// The scan's values do not say their type: a TYPE filter
				// asks each key (strings and hashes are all there is so far).
				t, err := keyType(k, run)
				if err != nil {
					return nil, err
				}
				if !eq(typ, strings.ToUpper(t)) {
					continue
				}
			}
			keys = append(keys, k)
		}
		if !rangeEnded(res, op.Limit) {
			next = scanCursors.issue(res.Array[len(res.Array)-2])
		}
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

// keysCommand is KEYS pattern: every matching key, read in ordered pages of
// the scan limit over the pattern's literal prefix. Each page is one
// snapshot; the pages together are a SCAN's guarantee, not one snapshot.
func keysCommand(pattern []byte, run func(kv.Op) (kv.Result, error)) (func(*conn), error) {
	prefix := kv.LiteralPrefix(pattern)
	op := kv.Op{Kind: kv.KindScan, Key: prefix, End: kv.PrefixEnd(prefix), Limit: shard.DefaultMaxScan}
	keys := [][]byte{}
	for {
		res, err := run(op)
		if err != nil {
			return nil, err
		}
		for i := 0; i < len(res.Array); i += 2 {
			if kv.Match(pattern, res.Array[i]) {
				keys = append(keys, res.Array[i])
			}
		}
		if rangeEnded(res, op.Limit) {
			break
		}
		op.Key = after(res.Array[len(res.Array)-2])
	}
	return func(c *conn) {
		_ = c.w.WriteArrayHeader(len(keys))
		for _, k := range keys {
			_ = c.w.WriteBulk(k)
		}
	}, nil
}

// randomKey is RANDOMKEY: one of the (up to) randomWindow keys at or after
// a random point of the key space, wrapping to the first keys, picked
// uniformly. The engine orders keys and has no rank, so a point alone
// picks the key after the widest gaps: keys that share a prefix ("k1" ..
// "k30") sit in one narrow gap of the printable range, and every point
// outside it landed on the first one. The window spreads the pick over
// the keys there: a key space of up to randomWindow keys is sampled
// uniformly; a larger one still favours keys after wide gaps (Redis's is
// not exactly uniform either). The front door picks the point and the
// key, so the state machine stays deterministic.
func randomKey(run func(kv.Op) (kv.Result, error)) (func(*conn), error) {
	// Printable bytes: keys mostly are, and a point above them all would
	// wrap to the first keys every time.
	var from [8]byte
	for i := range from {
		from[i] = byte(' ' + rand.IntN('~'-' '+1))
	}
	var keys [][]byte
	res, err := run(kv.Op{Kind: kv.KindScan, Key: from[:], Limit: randomWindow})
	if err != nil {
		return nil, err
	}
	for i := 0; i < len(res.Array); i += 2 {
		keys = append(keys, res.Array[i])
	}
	if len(keys) < randomWindow {
		// Wrapped: the first keys, before the point, fill the window.
		end := from[:]
		if len(keys) == 0 {
			end = nil
		}
		res, err := run(kv.Op{Kind: kv.KindScan, End: end, Limit: randomWindow - len(keys)})
		if err != nil {
			return nil, err
		}
		for i := 0; i < len(res.Array); i += 2 {
			keys = append(keys, res.Array[i])
		}
	}
	if len(keys) == 0 {
		return func(c *conn) { _ = c.w.WriteNull() }, nil
	}
	k := keys[rand.IntN(len(keys))]
	return func(c *conn) { _ = c.w.WriteBulk(k) }, nil
}

// randomWindow is how many keys RANDOMKEY picks among.
const randomWindow = 64

// rangeEnded reports whether a range read of limit keys that returned res
// reached the end of its range: fewer keys than asked for, and not because
// the read stopped at kv.MaxScanBytes of keys and values.
func rangeEnded(res kv.Result, limit int) bool {
	if len(res.Array)/2 >= limit {
		return false
	}
	size := 0
	for _, b := range res.Array {
		size += len(b)
	}
	return size < kv.MaxScanBytes
}

// after returns the first key after k.
func after(k []byte) []byte { return append(append(make([]byte, 0, len(k)+1), k...), 0) }

// SCAN cursors. Clients parse a cursor as an unsigned 64-bit decimal
// (redis-cli's strtoull, go-redis's ParseUint), so it cannot carry a key.
// It carries a fingerprint of the key to resume after instead:
//
//	bit 62 set | first 3 bytes of the key (24 bits) | hash of the key (38 bits, never 0)
//
// and every node keeps the keys of the cursors it issued (cursorTable). A
// cursor whose key a node does not have (issued by a node that has since
// died, or evicted) resumes at its 3-byte prefix with trailing zero bytes
// dropped, which sorts at or before the key: the iteration returns some keys
// again, as Redis's may, and misses none. The hash tells two keys with one
// prefix apart; two with one fingerprint (1 in 2^38 per pair) keep the first
// key's entry, and the second's cursor carries hash 0, which always resumes
// at the prefix.
type cursorTable struct {
	mu       sync.Mutex
	cur, old map[uint64][]byte
}

// cursorGen bounds the table: a generation of this many cursors is dropped
// whole when the next one fills (iterations older than that fall back to
// their prefix).
const cursorGen = 1 << 16

var scanCursors = &cursorTable{cur: map[uint64][]byte{}, old: map[uint64][]byte{}}

func cursorOf(key []byte, withHash bool) uint64 {
	var p [3]byte
	copy(p[:], key)
	c := uint64(1)<<62 | (uint64(p[0])<<16|uint64(p[1])<<8|uint64(p[2]))<<38
	if withHash {
		h := fnv.New64a()
		_, _ = h.Write(key)
		hv := h.Sum64() & (1<<38 - 1)
		if hv == 0 {
			hv = 1
		}
		c |= hv
	}
	return c
}

// issue returns the cursor that resumes after last.
func (t *cursorTable) issue(last []byte) string {
	c := cursorOf(last, true)
	t.mu.Lock()
	defer t.mu.Unlock()
	if k, ok := t.cur[c]; ok && string(k) != string(last) {
		return strconv.FormatUint(cursorOf(last, false), 10)
	}
	if k, ok := t.old[c]; ok && string(k) != string(last) {
		return strconv.FormatUint(cursorOf(last, false), 10)
	}
	if len(t.cur) >= cursorGen {
		t.old, t.cur = t.cur, make(map[uint64][]byte, cursorGen)
	}
	t.cur[c] = append([]byte(nil), last...)
	return strconv.FormatUint(c, 10)
}

// resume returns the key a SCAN with cursor arg starts at ("0": the first).
func (t *cursorTable) resume(arg []byte) ([]byte, error) {
	c, err := strconv.ParseUint(string(arg), 10, 64)
	if err != nil {
		return nil, errf("ERR invalid cursor")
	}
	if c == 0 {
		return nil, nil
	}
	t.mu.Lock()
	k, ok := t.cur[c]
	if !ok {
		k, ok = t.old[c]
	}
	t.mu.Unlock()
	if ok {
		return after(k), nil
	}
	// Not issued here (or forgotten): resume at the prefix, before the key.
	p := []byte{byte(c >> 54), byte(c >> 46), byte(c >> 38)}
	for len(p) > 0 && p[len(p)-1] == 0 {
		p = p[:len(p)-1]
	}
	return p, nil
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
