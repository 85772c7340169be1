package server

import (
	"math/rand/v2"
	"strings"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/shard"
)

// The hash commands at the front door (docs/design/hashes.md): writes are
// kv ops evaluated by kv.Apply on every engine; reads are one kv hash read
// each (kv.KindHGet, KindHLen, KindHGetAll: one state, through the same path
// as any read — inline, deferred, forwarded), from which Redis's reply is
// shaped here.

// hsetSpec is the commonest hash write's, parsed straight into its batch
// slot (parseWriteInto).
var hsetSpec = command.MustLookup("HSET")

// parseHSetInto parses HSET, HMSET or HSETNX (name, for the error) key field
// value [field value ...] into *op (the zero Op), copying its bytes into the
// arena. parseWriteInto calls it for HSET directly: building an Op and
// copying it up two returns cost a pipelined HSET ~250 instructions
// (docs/design/hashes.md).
func parseHSetInto(op *kv.Op, name string, args [][]byte, a *arena) error {
	if len(args)%2 != 0 {
		return errf("ERR wrong number of arguments for '%s' command", strings.ToLower(name))
	}
	op.Kind = kv.KindHSet
	op.Key, op.Keys = a.copyKeyArgs(args[1:])
	return nil
}

// parseHashWrite parses the hash writes for parseMoreWrite; handled false
// for any other command.
func parseHashWrite(spec *command.Spec, args [][]byte, a *arena) (op kv.Op, handled bool, err error) {
	switch spec.Name {
	case "HSET", "HMSET", "HSETNX":
		if err := parseHSetInto(&op, spec.Name, args, a); err != nil {
			return op, true, err
		}
		switch spec.Name {
		case "HMSET":
			op.Delta = 1 // answers OK
		case "HSETNX":
			op.Cond = kv.IfAbsent
		}
		return op, true, nil
	case "HDEL":
		op = kv.Op{Kind: kv.KindHDel}
		op.Key, op.Keys = a.copyKeyArgs(args[1:])
		return op, true, nil
	case "HINCRBY":
		n, err := parseInt64(args[3])
		if err != nil {
			return op, true, err
		}
		return kv.Op{Kind: kv.KindHIncrBy, Key: a.copy(args[1]), Keys: [][]byte{a.copy(args[2])}, Delta: n}, true, nil
	case "HINCRBYFLOAT":
		return kv.Op{Kind: kv.KindHIncrByFloat, Key: a.copy(args[1]), Keys: [][]byte{a.copy(args[2])}, Value: a.copy(args[3])}, true, nil
	}
	return op, false, nil
}

// hashReads are the hash reads evalHash serves (readMore's moreReads).
var hashReads = []string{"HGET", "HMGET", "HEXISTS", "HSTRLEN", "HLEN", "HGETALL", "HKEYS", "HVALS", "HSCAN", "HRANDFIELD"}

// evalHash runs a hash read with run and returns how to write its reply;
// handled false for any other command.
func evalHash(spec *command.Spec, args [][]byte, run func(kv.Op) (kv.Result, error)) (reply func(*conn), handled bool, err error) {
	key := args[1]
	switch spec.Name {
	case "HGET", "HMGET", "HEXISTS", "HSTRLEN":
		res, err := run(kv.Op{Kind: kv.KindHGet, Key: key, Keys: args[2:]})
		if err != nil {
			return nil, true, err
		}
		v := res.Array[0]
		switch spec.Name {
		case "HGET":
			return func(c *conn) { c.writeNullable(v) }, true, nil
		case "HEXISTS":
			return intReply(boolInt(v != nil)), true, nil
		case "HSTRLEN":
			return intReply(int64(len(v))), true, nil
		}
		return func(c *conn) { c.writeResult(res) }, true, nil
	case "HLEN":
		res, err := run(kv.Op{Kind: kv.KindHLen, Key: key})
		if err != nil {
			return nil, true, err
		}
		return intReply(res.Int), true, nil
	case "HGETALL", "HKEYS", "HVALS":
		res, err := run(kv.Op{Kind: kv.KindHGetAll, Key: key})
		if err != nil {
			return nil, true, err
		}
		a := res.Array
		if spec.Name == "HGETALL" {
			return func(c *conn) {
				_ = c.w.WriteMapHeader(len(a) / 2)
				for _, b := range a {
					_ = c.w.WriteBulk(b)
				}
			}, true, nil
		}
		from := 0 // HKEYS
		if spec.Name == "HVALS" {
			from = 1
		}
		return func(c *conn) {
			_ = c.w.WriteArrayHeader(len(a) / 2)
			for i := from; i < len(a); i += 2 {
				_ = c.w.WriteBulk(a[i])
			}
		}, true, nil
	case "HSCAN":
		reply, err := hscan(args, run)
		return reply, true, err
	case "HRANDFIELD":
		reply, err := replyOf(command.HRandField(args, run, rand.IntN))
		return reply, true, err
	}
	return nil, false, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (c *conn) writeNullable(v []byte) {
	if v == nil {
		_ = c.w.WriteNull()
	} else {
		_ = c.w.WriteBulk(v)
	}
}

// hscan is HSCAN key cursor [MATCH pattern] [COUNT n] [NOVALUES]. The
// rows of a hash are ordered by field, so, as SCAN's, a cursor stands for
// the field to resume after (hscanCursors: an unsigned decimal, as clients
// parse it, that any node resumes — at worst a little before the field — so
// it survives a leader change). One call reads one page of the hash's rows
// from there (kv.KindHScan: one state), of max(COUNT, hscanPage) fields:
// a hash of at most hscanPage fields comes back whole with cursor 0, as
// Redis answers for the small hashes it keeps as a listpack. Every field
// present for the whole iteration is returned at least once.
func hscan(args [][]byte, run func(kv.Op) (kv.Result, error)) (func(*conn), error) {
	start, err := hscanCursors.resume(args[2])
	if err != nil {
		return nil, err
	}
	ha, err := command.ParseHScanArgs(args)
	if err != nil {
		return nil, err
	}
	limit := int(min(max(ha.Count, hscanPage), shard.DefaultMaxScan))
	out, last, err := ha.Page(args[1], start, run, limit)
	if err != nil {
		return nil, err
	}
	next := "0"
	if last != nil {
		next = hscanCursors.issue(last)
	}
	return func(c *conn) {
		_ = c.w.WriteArrayHeader(2)
		_ = c.w.WriteBulkString(next)
		_ = c.w.WriteArrayHeader(len(out))
		for _, b := range out {
			_ = c.w.WriteBulk(b)
		}
	}, nil
}

// hscanPage is HSCAN's smallest page: Redis's listpack bound
// (hash-max-listpack-entries), so a small hash comes back in one call.
const hscanPage = 128

// hscanCursors are HSCAN's cursors: fields, fingerprinted as SCAN's keys.
var hscanCursors = &cursorTable{cur: map[uint64][]byte{}, old: map[uint64][]byte{}}
