package command

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
)

// Reply writes a command's reply: to the front door's connection, or to a
// RESP2 buffer, an op's reply (internal/script runs OBJECT and LCS inside
// transactions and scripts so).
type Reply func(w *resp.Writer)

func errorf(format string, args ...any) error { return ReplyError(fmt.Sprintf(format, args...)) }

func intReply(n int64) Reply { return func(w *resp.Writer) { _ = w.WriteInt(n) } }

// Clip is b for an error message: at most 64 bytes, quoted without its quotes.
func Clip(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	q := strconv.Quote(string(b))
	return q[1 : len(q)-1]
}

// ObjectSubcommand is OBJECT's subcommand (lower case), or Redis's error
// for an unknown one or a wrong number of arguments: errors Redis answers
// when the command is queued in a transaction (its subcommands are commands
// of their own there).
func ObjectSubcommand(args [][]byte) (string, error) {
	sub := strings.ToLower(string(args[1]))
	switch sub {
	case "help":
		return sub, nil
	case "encoding", "freq", "idletime", "refcount":
		if len(args) != 3 {
			return "", errorf("ERR wrong number of arguments for 'object|%s' command", sub)
		}
		return sub, nil
	}
	return "", errorf("ERR unknown subcommand '%s'. Try OBJECT HELP.", Clip(args[1]))
}

// LCS is LCS key1 key2 [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN],
// over one snapshot of both keys (an MGET); a missing key is an empty string.
func LCS(args [][]byte, run Run) (Reply, error) {
	var getLen, getIdx, withLen bool
	var minLen int64
	for j := 3; j < len(args); j++ {
		switch {
		case Eq(args[j], "IDX"):
			getIdx = true
		case Eq(args[j], "LEN"):
			getLen = true
		case Eq(args[j], "WITHMATCHLEN"):
			withLen = true
		case Eq(args[j], "MINMATCHLEN") && j+1 < len(args):
			n, err := ParseInt(args[j+1])
			if err != nil {
				return nil, err
			}
			minLen = max(n, 0)
			j++
		default:
			return nil, ErrSyntax
		}
	}
	if getLen && getIdx {
		return nil, errorf("ERR If you want both the length and indexes, please just use IDX.")
	}
	// Both keys in one read, strings only (ReturnOld): a key of another
	// type is Redis's error, not an empty string.
	res, err := run(kv.Op{Kind: kv.KindMGet, Keys: args[1:3], ReturnOld: true})
	if errors.Is(err, kv.ErrWrongKind) {
		return nil, errorf("ERR The specified keys must contain string values")
	}
	if err != nil {
		return nil, err
	}
	lcs, n, matches, ok := kv.LCS(res.Array[0], res.Array[1], !getLen, getIdx, minLen)
	if !ok {
		return nil, errorf("ERR Insufficient memory, transient memory for LCS exceeds proto-max-bulk-len")
	}
	switch {
	case getIdx:
		return func(w *resp.Writer) {
			_ = w.WriteMapHeader(2)
			_ = w.WriteBulkString("matches")
			_ = w.WriteArrayHeader(len(matches))
			for _, m := range matches {
				if withLen {
					_ = w.WriteArrayHeader(3)
				} else {
					_ = w.WriteArrayHeader(2)
				}
				for _, r := range [][2]int64{m.A, m.B} {
					_ = w.WriteArrayHeader(2)
					_ = w.WriteInt(r[0])
					_ = w.WriteInt(r[1])
				}
				if withLen {
					_ = w.WriteInt(m.Len)
				}
			}
			_ = w.WriteBulkString("len")
			_ = w.WriteInt(n)
		}, nil
	case getLen:
		return intReply(n), nil
	}
	return func(w *resp.Writer) { _ = w.WriteBulk(lcs) }, nil
}

// Object is OBJECT ENCODING|FREQ|IDLETIME|REFCOUNT key. ENCODING
// answers what Redis would pick for the value (int, embstr, raw), which is
// what tools use it for; Kefir keeps neither access times nor frequencies,
// so FREQ answers Redis's "not tracked" error and IDLETIME an error of its
// own (docs/commands.md).
func Object(args [][]byte, run Run) (Reply, error) {
	sub, err := ObjectSubcommand(args)
	if err != nil {
		return nil, err
	}
	if sub == "help" {
		return func(w *resp.Writer) {
			lines := []string{"OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
				"ENCODING <key>", "    Return the kind of internal representation used in order to store the value", "    associated with a <key>.",
				"REFCOUNT <key>", "    Return the number of references of the value associated with the specified", "    <key>. (Always 1.)",
				"FREQ <key>, IDLETIME <key>", "    Not tracked by Kefir.",
				"HELP", "    Print this help."}
			_ = w.WriteArrayHeader(len(lines))
			for _, l := range lines {
				_ = w.WriteSimple(l)
			}
		}, nil
	}
	res, err := run(kv.Op{Kind: kv.KindGet, Key: args[2]})
	isHash := errors.Is(err, kv.ErrWrongKind) // a hash: present, not a string
	if err != nil && !isHash {
		return nil, err
	}
	if !isHash && res.Kind != kv.ResBulk {
		return func(w *resp.Writer) { _ = w.WriteNull() }, nil
	}
	switch sub {
	case "freq":
		return nil, errorf("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.")
	case "idletime":
		return nil, errorf("ERR OBJECT IDLETIME is not supported: Kefir does not track access times")
	case "refcount":
		return intReply(1), nil
	}
	enc := stringEncoding(res.Bulk)
	if isHash {
		if enc, err = hashEncoding(args[2], run); err != nil { // hash.go
			return nil, err
		}
	}
	return func(w *resp.Writer) { _ = w.WriteBulkString(enc) }, nil
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

// hashEncoding is OBJECT ENCODING of a hash, by Redis 7's default rule: a
// listpack while it has at most 128 fields and no field or value over 64
// bytes, else a hashtable. (Kefir stores every hash the same way: a row per
// field; the name is what tools expect.)
func hashEncoding(key []byte, run Run) (string, error) {
	res, err := run(kv.Op{Kind: kv.KindHLen, Key: key})
	if err != nil || res.Int > 128 {
		return "hashtable", err
	}
	all, err := run(kv.Op{Kind: kv.KindHGetAll, Key: key})
	if err != nil {
		return "", err
	}
	for _, b := range all.Array {
		if len(b) > 64 {
			return "hashtable", nil
		}
	}
	return "listpack", nil
}
