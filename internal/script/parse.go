package script

import (
	"bytes"
	"math"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
)

// The commands a script may call and how their arguments become kv ops.
// SET and the expiry commands are read by the parsers the front door uses
// (internal/command ParseSet, ParseExpiryWrite), at the script's clock (its
// op's Now); the others are one line each here. Both follow Redis's
// argument rules; TestScriptRepliesMatchRedis (internal/server) compares
// them with redis-server.

func errReply(s string) error { return command.ReplyError(s) }

// shape says how a result is turned into the command's reply.
type shape uint8

const (
	asIs   shape = iota
	setNX        // SETNX: OK → 1, nil → 0
	first        // HGET: the one element of the array
	exists       // HEXISTS: 1 if the one element of the array is there, else 0
	// bitFieldRO: BITFIELD_RO, a GET whose op carries the subcommands in
	// Value (which a GET ignores): they run over the value read, as the
	// front door runs them over its GET (kv.RunBitField).
	bitFieldRO
	hstrlen // HSTRLEN: the length of the one element of the array
	hkeys   // HKEYS: the fields of HGETALL's array
	hvals   // HVALS: the values of HGETALL's array
	// composite: a command of several reads or a reply of its own (TYPE,
	// KEYS, SCAN, BITCOUNT...; composite.go), run by runComposite rather
	// than as one op.
	composite
)

// shaped turns op's result into its command's reply.
func shaped(op *kv.Op, res kv.Result, s shape) kv.Result {
	switch s {
	case bitFieldRO:
		ops, err := kv.DecodeBitField(op.Value)
		if err != nil {
			// parse encoded them: not reached.
			return kv.Result{Kind: kv.ResReply, Bulk: []byte("-ERR " + err.Error() + "\r\n")}
		}
		var v []byte
		if res.Kind == kv.ResBulk {
			v = bytes.Clone(res.Bulk)
		}
		_, reply := kv.RunBitField(v, ops)
		return kv.Result{Kind: kv.ResReply, Bulk: reply}
	case setNX:
		if res.Kind == kv.ResOK {
			return kv.Result{Kind: kv.ResInt, Int: 1}
		}
		return kv.Result{Kind: kv.ResInt, Int: 0}
	case first:
		if res.Kind == kv.ResArray && len(res.Array) == 1 && res.Array[0] != nil {
			return kv.Result{Kind: kv.ResBulk, Bulk: res.Array[0]}
		}
		return kv.Result{Kind: kv.ResNil}
	case exists:
		if res.Kind == kv.ResArray && len(res.Array) == 1 && res.Array[0] != nil {
			return kv.Result{Kind: kv.ResInt, Int: 1}
		}
		return kv.Result{Kind: kv.ResInt, Int: 0}
	case hstrlen:
		if res.Kind == kv.ResArray && len(res.Array) == 1 {
			return kv.Result{Kind: kv.ResInt, Int: int64(len(res.Array[0]))}
		}
	case hkeys, hvals:
		out := kv.Result{Kind: kv.ResArray, Array: [][]byte{}}
		from := 0
		if s == hvals {
			from = 1
		}
		for i := from; i < len(res.Array); i += 2 {
			out.Array = append(out.Array, res.Array[i])
		}
		return out
	}
	return res
}

func parseInt(b []byte) (int64, error) { return command.ParseInt(b) }

// parse turns a script's command into an op; now is the script's clock (a
// relative expiry, SET EX or EXPIRE, becomes absolute with it).
func parse(spec *command.Spec, a [][]byte, now int64) (kv.Op, shape, error) {
	switch spec.Name {
	case "GET":
		return kv.Op{Kind: kv.KindGet, Key: a[1]}, asIs, nil
	case "STRLEN":
		return kv.Op{Kind: kv.KindStrlen, Key: a[1]}, asIs, nil
	case "MGET":
		return kv.Op{Kind: kv.KindMGet, Keys: a[1:]}, asIs, nil
	case "EXISTS":
		return kv.Op{Kind: kv.KindExists, Keys: a[1:]}, asIs, nil
	case "DEL", "UNLINK":
		return kv.Op{Kind: kv.KindDel, Keys: a[1:]}, asIs, nil
	case "SET":
		op, err := command.ParseSet(a, now)
		return op, asIs, err
	case "SETNX":
		return kv.Op{Kind: kv.KindSet, Key: a[1], Value: a[2], Cond: kv.IfAbsent}, setNX, nil
	case "GETSET":
		return kv.Op{Kind: kv.KindGetSet, Key: a[1], Value: a[2]}, asIs, nil
	case "APPEND":
		return kv.Op{Kind: kv.KindAppend, Key: a[1], Value: a[2]}, asIs, nil
	case "MSET":
		if len(a)%2 != 1 {
			return kv.Op{}, asIs, errReply("ERR wrong number of arguments for 'mset' command")
		}
		return kv.Op{Kind: kv.KindMSet, Keys: a[1:]}, asIs, nil
	case "INCR", "DECR", "INCRBY", "DECRBY":
		op := kv.Op{Kind: kv.KindIncrBy, Key: a[1], Delta: 1}
		if len(a) == 3 {
			n, err := parseInt(a[2])
			if err != nil {
				return op, asIs, err
			}
			op.Delta = n
		}
		if spec.Name[0] == 'D' {
			if op.Delta == math.MinInt64 {
				return op, asIs, errReply("ERR decrement would overflow")
			}
			op.Delta = -op.Delta
		}
		return op, asIs, nil
	case "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT", "PERSIST", "SETEX", "PSETEX", "GETEX":
		op, _, err := command.ParseExpiryWrite(spec.Name, a, now)
		return op, asIs, err
	case "TTL", "PTTL":
		unit := int64(kv.UnitTTL)
		if spec.Name == "PTTL" {
			unit = kv.UnitPTTL
		}
		return kv.Op{Kind: kv.KindTTL, Key: a[1], Delta: unit}, asIs, nil
	case "GETDEL":
		return kv.Op{Kind: kv.KindGetDel, Key: a[1]}, asIs, nil
	case "INCRBYFLOAT":
		return kv.Op{Kind: kv.KindIncrByFloat, Key: a[1], Value: a[2]}, asIs, nil
	case "EXPIRETIME", "PEXPIRETIME":
		unit := int64(kv.UnitExpireTime)
		if spec.Name == "PEXPIRETIME" {
			unit = kv.UnitPExpireTime
		}
		return kv.Op{Kind: kv.KindTTL, Key: a[1], Delta: unit}, asIs, nil
	case "HSET", "HMSET", "HSETNX":
		if len(a)%2 != 0 {
			return kv.Op{}, asIs, errReply("ERR wrong number of arguments for '" + lower(spec.Name) + "' command")
		}
		op := kv.Op{Kind: kv.KindHSet, Key: a[1], Keys: a[2:]}
		switch spec.Name {
		case "HMSET":
			op.Delta = 1 // answers OK (as the front door's hash.go)
		case "HSETNX":
			op.Cond = kv.IfAbsent
		}
		return op, asIs, nil
	case "HDEL":
		return kv.Op{Kind: kv.KindHDel, Key: a[1], Keys: a[2:]}, asIs, nil
	case "HINCRBY":
		n, err := parseInt(a[3])
		if err != nil {
			return kv.Op{}, asIs, err
		}
		return kv.Op{Kind: kv.KindHIncrBy, Key: a[1], Keys: a[2:3], Delta: n}, asIs, nil
	case "HGET":
		return kv.Op{Kind: kv.KindHGet, Key: a[1], Keys: a[2:3]}, first, nil
	case "HEXISTS":
		return kv.Op{Kind: kv.KindHGet, Key: a[1], Keys: a[2:3]}, exists, nil
	case "HMGET":
		return kv.Op{Kind: kv.KindHGet, Key: a[1], Keys: a[2:]}, asIs, nil
	case "HLEN":
		return kv.Op{Kind: kv.KindHLen, Key: a[1]}, asIs, nil
	case "HSTRLEN":
		return kv.Op{Kind: kv.KindHGet, Key: a[1], Keys: a[2:3]}, hstrlen, nil
	case "HGETALL":
		return kv.Op{Kind: kv.KindHGetAll, Key: a[1]}, asIs, nil
	case "HKEYS":
		return kv.Op{Kind: kv.KindHGetAll, Key: a[1]}, hkeys, nil
	case "HVALS":
		return kv.Op{Kind: kv.KindHGetAll, Key: a[1]}, hvals, nil
	case "HINCRBYFLOAT":
		return kv.Op{Kind: kv.KindHIncrByFloat, Key: a[1], Keys: a[2:3], Value: a[3]}, asIs, nil
	case "KEFIR.CAS":
		return kv.Op{Kind: kv.KindCAS, Key: a[1], Expected: a[2], Value: a[3]}, asIs, nil
	case "TOUCH":
		return kv.Op{Kind: kv.KindExists, Keys: a[1:]}, asIs, nil
	case "RANDOMKEY", "HRANDFIELD":
		return kv.Op{}, composite, nil // picked with the op's random source (runComposite)
	case "BITFIELD":
		// Always a write, as at the front door and in Redis (one of GETs
		// only writes nothing; EVAL_RO refuses it, as Redis does).
		ops, err := kv.ParseBitField(a[2:], false)
		if err != nil {
			return kv.Op{}, asIs, errReply("ERR " + err.Error())
		}
		return kv.Op{Kind: kv.KindBitField, Key: a[1], Value: kv.EncodeBitField(ops)}, asIs, nil
	case "BITFIELD_RO":
		ops, err := kv.ParseBitField(a[2:], true)
		if err != nil {
			return kv.Op{}, asIs, errReply("ERR " + err.Error())
		}
		return kv.Op{Kind: kv.KindGet, Key: a[1], Value: kv.EncodeBitField(ops)}, bitFieldRO, nil
	}
	if composites[spec.Name] != nil {
		return kv.Op{}, composite, nil
	}
	if op, ok, err := command.ParseKeyspaceWrite(spec.Name, a); ok {
		return op, asIs, err // RENAME, RENAMENX, COPY, SETRANGE, MSETNX, SETBIT, FLUSHDB, FLUSHALL
	}
	return kv.Op{}, asIs, notCallable("ERR command '" + spec.Name + "' is not supported in Kefir scripts (see docs/design/scripting.md)")
}

// notCallable is parse's error for a command scripts and transactions cannot
// run; its text is the reply (errText). Its own type, so that a transaction
// refuses such a command when it is queued (Queueable), not at EXEC.
type notCallable string

func (e notCallable) Error() string { return string(e) }

func lower(s string) string { return string(bytes.ToLower([]byte(s))) }
