package command

import (
	"errors"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
)

// The keyspace and string long-tail commands (issue 27) that the front door
// and a transaction or script (internal/script, over its overlay) both run:
// one parser and one shaping of each, given a run that evaluates a kv read
// (the front door's read path, or the overlay's). Pure: nothing here keeps a
// clock, a random source or node-local state, so what a transaction runs at
// apply is a function of its op.

// ParseKeyspaceWrite parses the writes RENAME, RENAMENX, COPY, GETDEL,
// SETRANGE, INCRBYFLOAT, MSETNX, BITFIELD, SETBIT, FLUSHDB and FLUSHALL;
// handled false for any other command. The op aliases args.
func ParseKeyspaceWrite(name string, args [][]byte) (op kv.Op, handled bool, err error) {
	switch name {
	case "FLUSHDB", "FLUSHALL":
		// ASYNC and SYNC do the same: the flush is one op in the log,
		// applied like any write, and its reply waits for it.
		if len(args) > 2 || (len(args) == 2 && !Eq(args[1], "ASYNC") && !Eq(args[1], "SYNC")) {
			return op, true, ErrSyntax
		}
		return kv.Op{Kind: kv.KindFlush}, true, nil
	case "RENAME", "RENAMENX":
		op = kv.Op{Kind: kv.KindRename, Keys: [][]byte{args[1], args[2]}}
		if name == "RENAMENX" {
			op.Cond = kv.IfAbsent
		}
		return op, true, nil
	case "COPY":
		op = kv.Op{Kind: kv.KindCopy, Keys: [][]byte{args[1], args[2]}, Cond: kv.IfAbsent}
		for i := 3; i < len(args); i++ {
			switch {
			case Eq(args[i], "REPLACE"):
				op.Cond = kv.Always
			case Eq(args[i], "DB") && i+1 < len(args):
				i++
				if _, err := ParseInt(args[i]); err != nil {
					return op, true, ErrNotInt
				}
				if string(args[i]) != "0" {
					return op, true, ReplyError("ERR DB index is out of range (Kefir has only database 0, so COPY cannot copy to another)")
				}
			default:
				return op, true, ErrSyntax
			}
		}
		return op, true, nil
	case "GETDEL":
		return kv.Op{Kind: kv.KindGetDel, Key: args[1]}, true, nil
	case "SETRANGE":
		off, err := ParseInt(args[2])
		if err != nil {
			return op, true, err
		}
		if off < 0 {
			return op, true, ReplyError("ERR offset is out of range")
		}
		return kv.Op{Kind: kv.KindSetRange, Key: args[1], Delta: off, Value: args[3]}, true, nil
	case "INCRBYFLOAT":
		return kv.Op{Kind: kv.KindIncrByFloat, Key: args[1], Value: args[2]}, true, nil
	case "MSETNX":
		if len(args)%2 != 1 {
			return op, true, ReplyError("ERR wrong number of arguments for 'msetnx' command")
		}
		return kv.Op{Kind: kv.KindMSetNX, Keys: args[1:]}, true, nil
	case "BITFIELD":
		// Always a write, as in Redis (one of GETs only writes nothing).
		ops, err := kv.ParseBitField(args[2:], false)
		if err != nil {
			return op, true, ReplyError("ERR " + err.Error())
		}
		return kv.Op{Kind: kv.KindBitField, Key: args[1], Value: kv.EncodeBitField(ops)}, true, nil
	case "SETBIT":
		off, err := ParseBitOffset(args[2])
		if err != nil {
			return op, true, err
		}
		if len(args[3]) != 1 || (args[3][0] != '0' && args[3][0] != '1') {
			return op, true, ReplyError("ERR bit is not an integer or out of range")
		}
		return kv.Op{Kind: kv.KindSetBit, Key: args[1], Delta: off, Value: args[3]}, true, nil
	}
	return op, false, nil
}

// ParseBitOffset reads a bit offset (SETBIT, GETBIT) as Redis does.
func ParseBitOffset(b []byte) (int64, error) {
	n, err := ParseInt(b)
	if err != nil || n < 0 || n > kv.MaxBitOffset {
		return 0, ReplyError("ERR bit offset is not an integer or out of range")
	}
	return n, nil
}

// Run evaluates a kv read (the front door's read path, a transaction's
// overlay).
type Run func(kv.Op) (kv.Result, error)

// KeyType is TYPE's answer for key: none, string or hash (a GET of a hash
// answers WRONGTYPE; hashes are the only other type so far).
func KeyType(key []byte, run Run) (string, error) {
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

// GetString is a GET through run: the value and whether the key holds one.
func GetString(run Run, key []byte) ([]byte, bool, error) {
	res, err := run(kv.Op{Kind: kv.KindGet, Key: key})
	return res.Bulk, res.Kind == kv.ResBulk, err
}

// bitUnit parses BITCOUNT/BITPOS's BYTE|BIT.
func bitUnit(b []byte) (isBit bool, err error) {
	switch {
	case Eq(b, "BIT"):
		return true, nil
	case Eq(b, "BYTE"):
		return false, nil
	}
	return false, ErrSyntax
}

// BitCount is BITCOUNT key [start end [BYTE|BIT]]; like Redis 7.0, a missing
// key answers 0 before the range is parsed.
func BitCount(args [][]byte, run Run) (int64, error) {
	v, ok, err := GetString(run, args[1])
	if err != nil || !ok {
		return 0, err
	}
	switch len(args) {
	case 2:
		return kv.BitCount(v, false, 0, 0, false), nil
	case 4, 5:
		start, err1 := ParseInt(args[2])
		end, err2 := ParseInt(args[3])
		if err1 != nil || err2 != nil {
			return 0, ErrNotInt
		}
		isBit := false
		if len(args) == 5 {
			if isBit, err = bitUnit(args[4]); err != nil {
				return 0, err
			}
		}
		return kv.BitCount(v, true, start, end, isBit), nil
	}
	return 0, ErrSyntax
}

// BitPos is BITPOS key bit [start [end [BYTE|BIT]]], parsed in Redis 7.0's
// order: the bit, then (for an existing key) the range.
func BitPos(args [][]byte, run Run) (int64, error) {
	bit, err := ParseInt(args[2])
	if err != nil {
		return 0, err
	}
	if bit != 0 && bit != 1 {
		return 0, ReplyError("ERR The bit argument must be 1 or 0.")
	}
	v, ok, err := GetString(run, args[1])
	if err != nil {
		return 0, err
	}
	if !ok {
		return kv.BitPos(nil, false, bit, false, 0, false, 0, false), nil
	}
	if len(args) > 6 {
		return 0, ErrSyntax
	}
	var start, end int64
	isBit := false
	if len(args) >= 4 {
		if start, err = ParseInt(args[3]); err != nil {
			return 0, err
		}
	}
	if len(args) == 6 {
		if isBit, err = bitUnit(args[5]); err != nil {
			return 0, err
		}
	}
	if len(args) >= 5 {
		if end, err = ParseInt(args[4]); err != nil {
			return 0, err
		}
	}
	return kv.BitPos(v, true, bit, len(args) >= 4, start, len(args) >= 5, end, isBit), nil
}

// GetRange is GETRANGE/SUBSTR key start end.
func GetRange(args [][]byte, run Run) ([]byte, error) {
	start, err1 := ParseInt(args[2])
	end, err2 := ParseInt(args[3])
	if err1 != nil || err2 != nil {
		return nil, ErrNotInt
	}
	v, _, err := GetString(run, args[1])
	if err != nil {
		return nil, err
	}
	return kv.GetRange(v, start, end), nil
}

// GetBit is GETBIT key offset.
func GetBit(args [][]byte, run Run) (int64, error) {
	off, err := ParseBitOffset(args[2])
	if err != nil {
		return 0, err
	}
	v, _, err := GetString(run, args[1])
	if err != nil {
		return 0, err
	}
	return kv.GetBit(v, off), nil
}

// Keys is KEYS pattern: every matching key, read in ordered pages of page
// keys over the pattern's literal prefix.
func Keys(pattern []byte, run Run, page int) ([][]byte, error) {
	prefix := kv.LiteralPrefix(pattern)
	op := kv.Op{Kind: kv.KindScan, Key: prefix, End: kv.PrefixEnd(prefix), Limit: page}
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
		if RangeEnded(res, op.Limit) {
			return keys, nil
		}
		op.Key = After(res.Array[len(res.Array)-2])
	}
}

// ScanDefaultCount is SCAN's COUNT when it names none (Redis's).
const ScanDefaultCount = 10

// ScanArgs are SCAN's options (cursor [MATCH p] [COUNT n] [TYPE t]).
type ScanArgs struct {
	Count         int64
	Pattern, Type []byte // nil: any
}

// ParseScanArgs reads SCAN's options, args[2:].
func ParseScanArgs(args [][]byte) (ScanArgs, error) {
	sa := ScanArgs{Count: ScanDefaultCount}
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			return sa, ErrSyntax
		}
		switch {
		case Eq(args[i], "COUNT"):
			n, err := ParseInt(args[i+1])
			if err != nil {
				return sa, err
			}
			if n < 1 {
				return sa, ErrSyntax
			}
			sa.Count = n
		case Eq(args[i], "MATCH"):
			sa.Pattern = args[i+1]
		case Eq(args[i], "TYPE"):
			sa.Type = args[i+1]
		default:
			return sa, ErrSyntax
		}
	}
	if string(sa.Pattern) == "*" {
		sa.Pattern = nil
	}
	return sa, nil
}

// Page is one page of a SCAN from start (the key its cursor resumes at):
// up to limit keys read from start, bounded to MATCH's literal prefix, of
// which it returns those MATCH and TYPE keep, and the last key read (nil:
// the range ended, the cursor is 0).
func (sa ScanArgs) Page(start []byte, run Run, limit int) (keys [][]byte, last []byte, err error) {
	op := kv.Op{Kind: kv.KindScan, Key: start, Limit: limit}
	if prefix := kv.LiteralPrefix(sa.Pattern); len(prefix) > 0 {
		if string(op.Key) < string(prefix) {
			op.Key = prefix
		}
		op.End = kv.PrefixEnd(prefix)
	}
	if op.End != nil && string(op.Key) >= string(op.End) {
		return nil, nil, nil
	}
	res, err := run(op)
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i < len(res.Array); i += 2 {
		k := res.Array[i]
		if sa.Pattern != nil && !kv.Match(sa.Pattern, k) {
			continue
		}
		if sa.Type != nil {
			// The scan's values do not say their type: a TYPE filter
			// asks each key (strings and hashes are all there is so far).
			t, err := KeyType(k, run)
			if err != nil {
				return nil, nil, err
			}
			if !Eq(sa.Type, strings.ToUpper(t)) {
				continue
			}
		}
		keys = append(keys, k)
	}
	if !RangeEnded(res, op.Limit) {
		last = res.Array[len(res.Array)-2]
	}
	return keys, last, nil
}

// HScanArgs are HSCAN's options (key cursor [MATCH p] [COUNT n] [NOVALUES]).
type HScanArgs struct {
	Pattern  []byte // nil: any
	Count    int64
	NoValues bool
}

// ParseHScanArgs reads HSCAN's options, args[3:].
func ParseHScanArgs(args [][]byte) (HScanArgs, error) {
	ha := HScanArgs{Count: ScanDefaultCount}
	for i := 3; i < len(args); i++ {
		switch {
		case Eq(args[i], "MATCH") && i+1 < len(args):
			ha.Pattern = args[i+1]
			i++
		case Eq(args[i], "COUNT") && i+1 < len(args):
			n, err := ParseInt(args[i+1])
			if err != nil {
				return ha, err
			}
			if n < 1 {
				return ha, ErrSyntax
			}
			ha.Count = n
			i++
		case Eq(args[i], "NOVALUES"):
			ha.NoValues = true
		default:
			return ha, ErrSyntax
		}
	}
	return ha, nil
}

// Page is one page of an HSCAN of key from the field start: up to limit
// fields read (kv.KindHScan, one state), of which it returns those MATCH
// keeps (field, value... or fields only), and the last field read (nil: the
// hash ended, the cursor is 0).
func (ha HScanArgs) Page(key, start []byte, run Run, limit int) (out [][]byte, last []byte, err error) {
	res, err := run(kv.Op{Kind: kv.KindHScan, Key: key, Value: start, Limit: limit})
	if err != nil {
		return nil, nil, err
	}
	out = make([][]byte, 0, len(res.Array))
	for i := 0; i < len(res.Array); i += 2 {
		if ha.Pattern != nil && !kv.Match(ha.Pattern, res.Array[i]) {
			continue
		}
		out = append(out, res.Array[i])
		if !ha.NoValues {
			out = append(out, res.Array[i+1])
		}
	}
	if len(res.Array)/2 >= limit {
		last = res.Array[len(res.Array)-2]
	}
	return out, last, nil
}

// RangeEnded reports whether a range read of limit keys that returned res
// reached the end of its range: fewer keys than asked for, and not because
// the read stopped at kv.MaxScanBytes of keys and values.
func RangeEnded(res kv.Result, limit int) bool {
	if len(res.Array)/2 >= limit {
		return false
	}
	size := 0
	for _, b := range res.Array {
		size += len(b)
	}
	return size < kv.MaxScanBytes
}

// After returns the first key after k.
func After(k []byte) []byte { return append(append(make([]byte, 0, len(k)+1), k...), 0) }

// SCAN cursors. Clients parse a cursor as an unsigned 64-bit decimal
// (redis-cli's strtoull, go-redis's ParseUint), so it cannot carry a key.
// It carries a fingerprint of the key to resume after instead:
//
//	bit 62 set | first 3 bytes of the key (24 bits) | hash of the key (38 bits, never 0)
//
// A node remembers the keys of the cursors it issued (internal/server); a
// cursor whose key is not remembered resumes at its 3-byte prefix
// (CursorPrefix), which sorts at or before the key: the iteration returns
// some keys again, as Redis's may, and misses none. A cursor with hash 0
// always resumes at the prefix.

// CursorOf is the cursor that stands for key (withHash false: hash 0).
func CursorOf(key []byte, withHash bool) uint64 {
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

// ParseCursor reads a SCAN (or HSCAN) cursor as Redis does, with C's
// strtoul over the whole argument: decimal digits after an optional sign, a
// negative one wrapped modulo 2^64 (-1 is 2^64-1), an empty one 0; leading
// space, other bytes or a magnitude above 2^64-1 are "invalid cursor".
func ParseCursor(arg []byte) (uint64, error) {
	s, neg := arg, false
	if len(s) > 0 && (s[0] == '+' || s[0] == '-') {
		s, neg = s[1:], s[0] == '-'
		if len(s) == 0 {
			return 0, ReplyError("ERR invalid cursor") // strtoul read nothing: the sign is left
		}
	}
	var c uint64
	if len(s) > 0 {
		var err error
		if c, err = strconv.ParseUint(string(s), 10, 64); err != nil {
			return 0, ReplyError("ERR invalid cursor")
		}
	}
	if neg {
		c = -c
	}
	return c, nil
}

// CursorPrefix is where cursor c resumes when its key is not remembered:
// its 3-byte prefix with trailing zero bytes dropped (nil for cursor 0).
func CursorPrefix(c uint64) []byte {
	if c == 0 {
		return nil
	}
	p := []byte{byte(c >> 54), byte(c >> 46), byte(c >> 38)}
	for len(p) > 0 && p[len(p)-1] == 0 {
		p = p[:len(p)-1]
	}
	return p
}
