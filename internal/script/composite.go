package script

import (
	"bytes"

	"github.com/kefirdb/kefir/internal/command"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/resp"
)

// The commands a script or a transaction runs as several reads, or whose
// reply is not one op's result shaped: the front door's shaping
// (internal/command), given the overlay's reads. Those that read the
// keyspace (KEYS, SCAN, DBSIZE) read the overlay merged into the store's
// key order (kv's mergeScan): the transaction's own earlier writes and
// deletions count, expired keys do not.

// scanPage is a keyspace read's page inside an op: the op reads one state,
// so pages serve only to bound each read.
const scanPage = kv.OpScanLimit

var composites = map[string]func(a [][]byte, run command.Run) (kv.Result, error){
	"TYPE": func(a [][]byte, run command.Run) (kv.Result, error) {
		t, err := command.KeyType(a[1], run)
		return kv.Result{Kind: kv.ResReply, Bulk: []byte("+" + t + "\r\n")}, err
	},
	"GETRANGE": getRange,
	"SUBSTR":   getRange,
	"GETBIT":   intOf(command.GetBit),
	"BITCOUNT": intOf(command.BitCount),
	"BITPOS":   intOf(command.BitPos),
	"KEYS": func(a [][]byte, run command.Run) (kv.Result, error) {
		keys, err := command.Keys(a[1], run, scanPage)
		return kv.Result{Kind: kv.ResArray, Array: keys}, err
	},
	"DBSIZE": func(a [][]byte, run command.Run) (kv.Result, error) {
		keys, err := command.Keys([]byte("*"), run, scanPage)
		return kv.Result{Kind: kv.ResInt, Int: int64(len(keys))}, err
	},
	"SCAN":   scan,
	"HSCAN":  hscan,
	"OBJECT": written(command.Object),
	"LCS":    written(command.LCS),
}

// written runs a command whose reply the front door's RESP writer writes
// (command.Reply): into a RESP2 buffer, the op's reply.
func written(f func([][]byte, command.Run) (command.Reply, error)) func([][]byte, command.Run) (kv.Result, error) {
	return func(a [][]byte, run command.Run) (kv.Result, error) { return toResult(f(a, run)) }
}

// toResult writes r into a RESP2 buffer: the op's reply.
func toResult(r command.Reply, err error) (kv.Result, error) {
	if err != nil {
		return kv.Result{}, err
	}
	var buf bytes.Buffer
	w := resp.NewWriter(&buf, 0)
	r(w)
	if err := w.Flush(); err != nil {
		return kv.Result{}, err
	}
	return kv.Result{Kind: kv.ResReply, Bulk: buf.Bytes()}, nil
}

func getRange(a [][]byte, run command.Run) (kv.Result, error) {
	v, err := command.GetRange(a, run)
	return kv.Result{Kind: kv.ResBulk, Bulk: append([]byte{}, v...)}, err
}

func intOf(f func([][]byte, command.Run) (int64, error)) func([][]byte, command.Run) (kv.Result, error) {
	return func(a [][]byte, run command.Run) (kv.Result, error) {
		n, err := f(a, run)
		return kv.Result{Kind: kv.ResInt, Int: n}, err
	}
}

// scan is SCAN inside an op: from where the cursor resumes (cursor 0: the
// first key; another, its prefix, command.CursorPrefix — a node's table of
// the keys of its cursors is node-local state, which an op must not read)
// to the end of the keyspace, with cursor 0. Redis's COUNT is a hint and a
// SCAN may answer any number of keys: one op reads one state, and a cursor
// it issued could resume only at its key's prefix, which would return the
// same page again and again in a keyspace of keys that share one.
func scan(a [][]byte, run command.Run) (kv.Result, error) {
	c, err := command.ParseCursor(a[1])
	if err != nil {
		return kv.Result{}, err
	}
	sa, err := command.ParseScanArgs(a)
	if err != nil {
		return kv.Result{}, err
	}
	return rest(command.CursorPrefix(c), func(start []byte) ([][]byte, []byte, error) {
		return sa.Page(start, run, scanPage)
	})
}

// hscan is HSCAN inside an op: as scan, the rest of the hash from where the
// cursor resumes, with cursor 0.
func hscan(a [][]byte, run command.Run) (kv.Result, error) {
	c, err := command.ParseCursor(a[2])
	if err != nil {
		return kv.Result{}, err
	}
	ha, err := command.ParseHScanArgs(a)
	if err != nil {
		return kv.Result{}, err
	}
	return rest(command.CursorPrefix(c), func(start []byte) ([][]byte, []byte, error) {
		return ha.Page(a[1], start, run, scanPage)
	})
}

// rest reads pages from start to the end of their range (page's last is
// nil) and answers their elements as one SCAN or HSCAN reply, cursor 0.
func rest(start []byte, page func(start []byte) (elems [][]byte, last []byte, err error)) (kv.Result, error) {
	var out [][]byte
	for {
		elems, last, err := page(start)
		if err != nil {
			return kv.Result{}, err
		}
		out = append(out, elems...)
		if last == nil {
			b := append([]byte("*2\r\n"), "$1\r\n0\r\n"...)
			return kv.Result{Kind: kv.ResReply, Bulk: appendResult(b, kv.Result{Kind: kv.ResArray, Array: out})}, nil
		}
		start = command.After(last)
	}
}

// runComposite runs the composite command argv (parse said composite);
// RANDOMKEY and HRANDFIELD pick with rnd, the op's random source.
func runComposite(argv [][]byte, rnd *kv.OpRand, run command.Run) (kv.Result, error) {
	spec, _ := command.Lookup(argv[0])
	switch spec.Name {
	case "RANDOMKEY":
		return toResult(command.RandomKey(run, rnd.IntN))
	case "HRANDFIELD":
		return toResult(command.HRandField(argv, run, rnd.IntN))
	}
	return composites[spec.Name](argv, run)
}
