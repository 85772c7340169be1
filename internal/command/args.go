package command

import (
	"bytes"
	"fmt"
	"math"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
)

// The argument parsers of the commands the front door and Lua scripts both
// run (redis.call), so a script's SET or EXPIRE is read exactly as a
// client's is. They are pure: the ops they return alias args (a caller that
// keeps an op past its args copies the bytes), and a relative expiry is made
// absolute with the now they are given (the front door's clock, or a
// script's op's Now).

// ReplyError is a command's error reply, prefix included ("ERR …").
type ReplyError string

func (e ReplyError) Error() string { return string(e) }

var (
	// ErrSyntax is Redis's reply to options it does not accept.
	ErrSyntax = ReplyError("ERR syntax error")
	// ErrNotInt is Redis's reply to an argument that is not a 64-bit integer.
	ErrNotInt = ReplyError("ERR value is not an integer or out of range")
)

// Eq reports whether b is upper, ignoring case (upper is upper-case).
func Eq(b []byte, upper string) bool {
	return len(b) == len(upper) && bytes.EqualFold(b, []byte(upper))
}

// ParseInt reads a decimal 64-bit integer as Redis does (string2ll: no
// '+', no leading zero, no "-0"; ErrNotInt).
func ParseInt(b []byte) (int64, error) {
	n, err := kv.ParseInt(b)
	if err != nil {
		return 0, ErrNotInt
	}
	return n, nil
}

// expireUnit says how an expiry argument is read.
type expireUnit uint8

const (
	unitEX   expireUnit = iota + 1 // seconds from now
	unitPX                         // milliseconds from now
	unitEXAT                       // unix seconds
	unitPXAT                       // unix milliseconds
)

func errExpireTime(cmd string) error {
	return ReplyError(fmt.Sprintf("ERR invalid expire time in '%s' command", cmd))
}

// expireAt turns SET's, SETEX's or GETEX's expiry argument (which must be
// positive) into an absolute time in unix ms, as Redis's
// getExpireMillisecondsOrReply does.
func expireAt(arg []byte, unit expireUnit, now int64, cmd string) (int64, error) {
	n, err := ParseInt(arg)
	if err != nil {
		return 0, err
	}
	if n <= 0 || ((unit == unitEX || unit == unitEXAT) && n > math.MaxInt64/1000) {
		return 0, errExpireTime(cmd)
	}
	if unit == unitEX || unit == unitEXAT {
		n *= 1000
	}
	if unit == unitEX || unit == unitPX {
		if n > math.MaxInt64-now {
			return 0, errExpireTime(cmd)
		}
		n += now
	}
	return n, nil
}

// parseExpireOpt reads an EX|PX|EXAT|PXAT option at args[i] (GETEX and
// SET): ok false if args[i] is none of them.
func parseExpireOpt(args [][]byte, i int) (unit expireUnit, ok bool) {
	switch {
	case Eq(args[i], "EX"):
		return unitEX, true
	case Eq(args[i], "PX"):
		return unitPX, true
	case Eq(args[i], "EXAT"):
		return unitEXAT, true
	case Eq(args[i], "PXAT"):
		return unitPXAT, true
	}
	return 0, false
}

// ParseSet parses SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]
// in any order, refusing what Redis's parseExtendedStringArgumentsOrReply
// refuses (NX with XX, two different expiry options, one with KEEPTTL) and
// accepting what it accepts (an option twice: the last expiry wins). The op
// carries now as its Now only if it has an expiry.
func ParseSet(args [][]byte, now int64) (kv.Op, error) {
	var op kv.Op
	err := ParseSetInto(&op, args, now)
	return op, err
}

// ParseSetInto is ParseSet into *op, which must be the zero Op: a front
// door's pipelined SET parses into its batch's slot rather than copying a
// ~200-byte Op up through returns (docs/design/one-house.md, "Before and
// after").
func ParseSetInto(op *kv.Op, args [][]byte, now int64) error {
	op.Kind, op.Key, op.Value = kv.KindSet, args[1], args[2]
	var unit expireUnit
	var arg []byte
	for i := 3; i < len(args); i++ {
		switch u, isExp := parseExpireOpt(args, i); {
		case Eq(args[i], "NX") && op.Cond != kv.IfPresent:
			op.Cond = kv.IfAbsent
		case Eq(args[i], "XX") && op.Cond != kv.IfAbsent:
			op.Cond = kv.IfPresent
		case Eq(args[i], "GET"):
			op.ReturnOld = true
		case Eq(args[i], "KEEPTTL") && unit == 0:
			op.TTL = kv.TTLKeep
		case isExp && (unit == 0 || unit == u) && op.TTL == 0 && i+1 < len(args):
			unit, arg = u, args[i+1]
			i++
		default:
			return ErrSyntax
		}
	}
	if unit != 0 {
		at, err := expireAt(arg, unit, now, "set")
		if err != nil {
			return err
		}
		op.Now, op.ExpireAt = now, at
	}
	return nil
}

// ParseExpiryWrite parses the expiry write commands other than SET (name is
// the command's table name): SETEX, PSETEX, GETEX, EXPIRE, PEXPIRE,
// EXPIREAT, PEXPIREAT, PERSIST; ok false: name is none of them.
func ParseExpiryWrite(name string, args [][]byte, now int64) (op kv.Op, ok bool, err error) {
	switch name {
	case "SETEX", "PSETEX":
		unit, cmd := unitEX, "setex"
		if name == "PSETEX" {
			unit, cmd = unitPX, "psetex"
		}
		at, err := expireAt(args[2], unit, now, cmd)
		if err != nil {
			return op, true, err
		}
		return kv.Op{Kind: kv.KindSet, Key: args[1], Value: args[3], Now: now, ExpireAt: at}, true, nil

	case "GETEX":
		op = kv.Op{Kind: kv.KindGetEx, Key: args[1], Now: now}
		var unit expireUnit
		var arg []byte
		for i := 2; i < len(args); i++ {
			switch u, isExp := parseExpireOpt(args, i); {
			case Eq(args[i], "PERSIST") && unit == 0:
				op.TTL = kv.TTLPersist
			case isExp && (unit == 0 || unit == u) && op.TTL == 0 && i+1 < len(args):
				unit, arg = u, args[i+1]
				i++
			default:
				return op, true, ErrSyntax
			}
		}
		if unit != 0 {
			if op.ExpireAt, err = expireAt(arg, unit, now, "getex"); err != nil {
				return op, true, err
			}
		}
		return op, true, nil

	case "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT":
		when, err := ParseInt(args[2])
		if err != nil {
			return op, true, err
		}
		op = kv.Op{Kind: kv.KindExpire, Key: args[1], Now: now}
		var nx, xx, gt, lt bool
		for _, o := range args[3:] {
			switch {
			case Eq(o, "NX"):
				nx, op.TTL = true, op.TTL|kv.TTLNX
			case Eq(o, "XX"):
				xx, op.TTL = true, op.TTL|kv.TTLXX
			case Eq(o, "GT"):
				gt, op.TTL = true, op.TTL|kv.TTLGT
			case Eq(o, "LT"):
				lt, op.TTL = true, op.TTL|kv.TTLLT
			default:
				return op, true, ReplyError("ERR Unsupported option " + string(o))
			}
		}
		if nx && (xx || gt || lt) {
			return op, true, ReplyError("ERR NX and XX, GT or LT options at the same time are not compatible")
		}
		if gt && lt {
			return op, true, ReplyError("ERR GT and LT options at the same time are not compatible")
		}
		// EXPIRE takes any integer (one in the past deletes the key); only
		// an overflow is refused, as Redis's expireGenericCommand does.
		cmd := strings.ToLower(name)
		if name == "EXPIRE" || name == "EXPIREAT" {
			if when > math.MaxInt64/1000 || when < math.MinInt64/1000 {
				return op, true, errExpireTime(cmd)
			}
			when *= 1000
		}
		if name == "EXPIRE" || name == "PEXPIRE" {
			if when > math.MaxInt64-now {
				return op, true, errExpireTime(cmd)
			}
			when += now
		}
		op.ExpireAt = when
		if op.ExpireAt == 0 {
			op.ExpireAt = -1 // 0 means "no expiry" in an op; any time <= Now deletes alike
		}
		return op, true, nil

	case "PERSIST":
		return kv.Op{Kind: kv.KindPersist, Key: args[1], Now: now}, true, nil
	}
	return op, false, nil
}
