package script

import (
	"bytes"
	"math"
	"strconv"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
)

// The commands a script may call and how their arguments become kv ops.
//
// This is a second reading of these commands' arguments: the front door's
// (internal/server parseWrite, parseSet, parseExpiryWrite, hash.go) reads
// the clock and copies into its connection's arena, and the server cannot be
// imported from here (the engines import this package). Both follow Redis's
// argument rules; TestScriptRepliesMatchRedis (internal/server) compares
// them with redis-server. Moving the front door's parsers into a pure
// package both use is the follow-up (docs/design/scripting.md, "Left").

// replyErr is an error whose text is the whole reply (prefix included).
type replyErr string

func (e *replyErr) Error() string { return string(*e) }

func errReply(s string) error { e := replyErr(s); return &e }

var (
	errSyntax = errReply("ERR syntax error")
	errNotInt = errReply("ERR value is not an integer or out of range")
)

// shape says how a result is turned into the command's reply.
type shape uint8

const (
	asIs   shape = iota
	setNX        // SETNX: OK → 1, nil → 0
	first        // HGET: the one element of the array
	exists       // HEXISTS: 1 if the one element of the array is there, else 0
)

func shaped(res kv.Result, s shape) kv.Result {
	switch s {
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
	}
	return res
}

func eq(b []byte, upper string) bool {
	return len(b) == len(upper) && bytes.EqualFold(b, []byte(upper))
}

func parseInt(b []byte) (int64, error) {
	if len(b) == 0 || len(b) > 20 {
		return 0, errNotInt
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, errNotInt
	}
	return n, nil
}

// parse turns a script's command into an op. A relative expiry (SET EX,
// EXPIRE) is left relative (Delta = relative): resolve makes it absolute
// with the script's clock.
func parse(spec *command.Spec, a [][]byte) (kv.Op, shape, error) {
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
		op, err := parseSet(a)
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
	case "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT":
		op, err := parseExpire(spec.Name, a)
		return op, asIs, err
	case "PERSIST":
		return kv.Op{Kind: kv.KindPersist, Key: a[1]}, asIs, nil
	case "TTL", "PTTL":
		unit := int64(kv.UnitTTL)
		if spec.Name == "PTTL" {
			unit = kv.UnitPTTL
		}
		return kv.Op{Kind: kv.KindTTL, Key: a[1], Delta: unit}, asIs, nil
	case "GETDEL":
		return kv.Op{Kind: kv.KindGetDel, Key: a[1]}, asIs, nil
	case "SETEX", "PSETEX":
		n, err := parseInt(a[2])
		if err != nil {
			return kv.Op{}, asIs, err
		}
		if n <= 0 || (spec.Name == "SETEX" && n > math.MaxInt64/1000) {
			return kv.Op{}, asIs, errReply("ERR invalid expire time in '" + lower(spec.Name) + "' command")
		}
		if spec.Name == "SETEX" {
			n *= 1000
		}
		return kv.Op{Kind: kv.KindSet, Key: a[1], Value: a[3], ExpireAt: n, Delta: relative}, asIs, nil
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
	}
	return kv.Op{}, asIs, errReply("ERR command '" + spec.Name + "' is not supported in Kefir scripts (see docs/design/scripting.md)")
}

// parseSet parses SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL],
// with the front door's rules (internal/server parseSet).
func parseSet(a [][]byte) (kv.Op, error) {
	op := kv.Op{Kind: kv.KindSet, Key: a[1], Value: a[2]}
	unit := ""
	var arg []byte
	for i := 3; i < len(a); i++ {
		u := ""
		for _, x := range []string{"EX", "PX", "EXAT", "PXAT"} {
			if eq(a[i], x) {
				u = x
			}
		}
		switch {
		case eq(a[i], "NX") && op.Cond != kv.IfPresent:
			op.Cond = kv.IfAbsent
		case eq(a[i], "XX") && op.Cond != kv.IfAbsent:
			op.Cond = kv.IfPresent
		case eq(a[i], "GET"):
			op.ReturnOld = true
		case eq(a[i], "KEEPTTL") && unit == "":
			op.TTL = kv.TTLKeep
		case u != "" && (unit == "" || unit == u) && op.TTL == 0 && i+1 < len(a):
			unit, arg = u, a[i+1]
			i++
		default:
			return op, errSyntax
		}
	}
	if unit != "" {
		n, err := parseInt(arg)
		if err != nil {
			return op, err
		}
		if n <= 0 || ((unit == "EX" || unit == "EXAT") && n > math.MaxInt64/1000) {
			return op, errReply("ERR invalid expire time in 'set' command")
		}
		if unit == "EX" || unit == "EXAT" {
			n *= 1000
		}
		op.ExpireAt = n
		if unit == "EX" || unit == "PX" {
			op.Delta = relative
		}
	}
	return op, nil
}

// relative in a SET's or EXPIRE's Delta (unused by those kinds) marks an
// ExpireAt that is milliseconds from Now: resolve adds the script's Now.
const relative = 1

func parseExpire(name string, a [][]byte) (kv.Op, error) {
	when, err := parseInt(a[2])
	if err != nil {
		return kv.Op{}, err
	}
	op := kv.Op{Kind: kv.KindExpire, Key: a[1]}
	var nx, xx, gt, lt bool
	for _, o := range a[3:] {
		switch {
		case eq(o, "NX"):
			nx, op.TTL = true, op.TTL|kv.TTLNX
		case eq(o, "XX"):
			xx, op.TTL = true, op.TTL|kv.TTLXX
		case eq(o, "GT"):
			gt, op.TTL = true, op.TTL|kv.TTLGT
		case eq(o, "LT"):
			lt, op.TTL = true, op.TTL|kv.TTLLT
		default:
			return op, errReply("ERR Unsupported option " + string(o))
		}
	}
	if nx && (xx || gt || lt) {
		return op, errReply("ERR NX and XX, GT or LT options at the same time are not compatible")
	}
	if gt && lt {
		return op, errReply("ERR GT and LT options at the same time are not compatible")
	}
	if name == "EXPIRE" || name == "EXPIREAT" {
		if when > math.MaxInt64/1000 || when < math.MinInt64/1000 {
			return op, errReply("ERR invalid expire time in '" + lower(name) + "' command")
		}
		when *= 1000
	}
	op.ExpireAt = when
	if name == "EXPIRE" || name == "PEXPIRE" {
		op.Delta = relative
	} else if op.ExpireAt == 0 {
		op.ExpireAt = -1 // 0 means "no expiry" in an op; any time <= Now deletes alike
	}
	return op, nil
}

// resolve makes a relative expiry absolute with the script's clock (the
// op's Now), refusing an overflow as Redis does.
func resolve(op *kv.Op, now int64, name string) error {
	if (op.Kind != kv.KindSet && op.Kind != kv.KindExpire) || op.Delta != relative {
		return nil
	}
	op.Delta = 0
	if op.ExpireAt > 0 && op.ExpireAt > math.MaxInt64-now {
		return errReply("ERR invalid expire time in '" + lower(name) + "' command")
	}
	op.ExpireAt += now
	if op.Kind == kv.KindExpire && op.ExpireAt == 0 {
		op.ExpireAt = -1 // 0 means "no expiry" in an op
	}
	return nil
}

func lower(s string) string { return string(bytes.ToLower([]byte(s))) }
