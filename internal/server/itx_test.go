package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kefir "github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// KEFIR.TX's commands and replies on a single node: snapshot reads, own
// writes, commit, conflicts, limits.
func TestTxCommands(t *testing.T) {
	s := startServer(t, nil)
	a, b := dial(t, s), dial(t, s)
	a.expect(`
SET x 1 => OK
SET y 1 => OK
KEFIR.TX BEGIN SI => (integer) 1
KEFIR.TX GET 1 x => "1"
KEFIR.TX SET 1 x 5 => OK
KEFIR.TX GET 1 x => "5"
KEFIR.TX INCRBY 1 n 3 => (integer) 3
KEFIR.TX MGET 1 x y n => ["5", "1", "3"]
KEFIR.TX DEL 1 y zz => (integer) 1
KEFIR.TX EXISTS 1 x y n => (integer) 2
KEFIR.TX INCRBY 1 x notanumber => ERR value is not an integer or out of range
KEFIR.TX GET 2 x => ERR no such transaction*
KEFIR.TX BEGIN RC => ERR unknown isolation level 'RC' (SI or SERIALIZABLE, and READONLY)
KEFIR.TX FOO 1 => ERR unknown subcommand 'FOO'*
KEFIR.TX SET 1 x => ERR wrong number of arguments for 'kefir.tx|set' command
`)
	// A commit after another connection's: the snapshot does not see it.
	b.expect(`
SET x 99 => OK
`)
	a.expect(`
KEFIR.TX GET 1 x => "5"
KEFIR.TX COMMIT 1 => TXABORT conflict on key 'x': written at version*
KEFIR.TX GET 1 x => ERR no such transaction*
MGET x y n => ["99", "1", (nil)]
KEFIR.TX BEGIN => (integer) 2
KEFIR.TX INCRBY 2 n 7 => (integer) 7
KEFIR.TX DEL 2 y => (integer) 1
KEFIR.TX COMMIT 2 => (integer)*
MGET x y n => ["99", (nil), "7"]
KEFIR.TX BEGIN => (integer) 3
KEFIR.TX GET 3 n => "7"
KEFIR.TX ABORT 3 => OK
KEFIR.TX COMMIT 3 => ERR no such transaction*
`)
	// A read-only transaction commits whatever committed since its start.
	a.expect(`
KEFIR.TX BEGIN => (integer) 4
KEFIR.TX GET 4 x => "99"
`)
	b.expect(`
SET x 100 => OK
`)
	a.expect(`
KEFIR.TX GET 4 x => "99"
KEFIR.TX COMMIT 4 => (integer)*
`)
	// Limits: the write set, open transactions per connection, lifetime.
	h := strings.TrimPrefix(b.do("KEFIR.TX", "BEGIN"), "(integer) ")
	var buf []byte
	for i := 0; i < txMaxWrites; i++ {
		buf = appendCmd(buf, "KEFIR.TX", "SET", h, "w"+strconv.Itoa(i), "v")
	}
	if _, err := b.nc.Write(buf); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < txMaxWrites; i++ {
		if r := b.reply(); r != "OK" {
			t.Fatalf("write %d: %s", i, r)
		}
	}
	b.expect(`
KEFIR.TX SET ` + h + ` one more => ERR transaction write set is full (at most 4096 writes, 8388608 bytes)*
KEFIR.TX ABORT ` + h + ` => OK
`)
	for i := 0; i < txMaxOpen; i++ {
		a.do("KEFIR.TX", "BEGIN")
	}
	a.expect(`
KEFIR.TX BEGIN => ERR too many open transactions on this connection (at most 16)*
`)
	old := txMaxAge
	txMaxAge = time.Millisecond
	defer func() { txMaxAge = old }()
	time.Sleep(5 * time.Millisecond)
	a.expect(`
KEFIR.TX GET 5 x => TXABORT transaction too old: open for*
KEFIR.TX GET 5 x => ERR no such transaction*
`)
}

// txRunner runs the checker's transactions through the Go client's Txn: a
// list is its elements joined by spaces, an append a read and a write of
// the key; a register holds its value's digits.
type txRunner struct {
	c   *kefir.Client
	iso kefir.Isolation
}

func (r *txRunner) Run(ctx context.Context, t check.Txn) ([]check.Mop, error) {
	var out []check.Mop
	// A transaction of reads only runs READONLY: the checker checks those
	// too, and readOnlyAborts that none aborted.
	readOnly := !slices.ContainsFunc(t.Mops, func(m check.Mop) bool { return m.Kind != check.MopRead })
	err := r.c.Txn(ctx, func(tx *kefir.Tx) error {
		out = append(out[:0], t.Mops...)
		for i := range out {
			m := &out[i]
			if m.Kind == check.MopWrite {
				if err := tx.Set(ctx, m.Key, []byte(strconv.Itoa(m.Value))); err != nil {
					return err
				}
				continue
			}
			v, err := tx.Get(ctx, m.Key)
			if err != nil && !errors.Is(err, kefir.ErrNotFound) {
				return err
			}
			if m.Kind == check.MopRead && m.List == nil { // a register
				m.Value, _ = strconv.Atoi(string(v))
				continue
			}
			list := []int{}
			for _, f := range strings.Fields(string(v)) {
				n, _ := strconv.Atoi(f)
				list = append(list, n)
			}
			if m.Kind == check.MopRead {
				m.List = list
				continue
			}
			if err := tx.Set(ctx, m.Key, fmt.Appendf(v, " %d", m.Value)); err != nil {
				return err
			}
		}
		return nil
	}, &kefir.TxOptions{Isolation: r.iso, MaxAttempts: 1, ReadOnly: readOnly})
	if errors.Is(err, kefir.ErrTxAborted) {
		return nil, fmt.Errorf("%w: %w", check.ErrTxnAborted, err)
	}
	return out, err
}

// runTxCheck runs n list-append transactions of 4 processes over keys
// keys through KEFIR.TX at addrs and judges the history under model. With
// contended, the run must have both commits and aborts.
func runTxCheck(t *testing.T, addrs []string, iso kefir.Isolation, model check.TxnModel, seed int64, n, keys int, contended bool) check.Verdict {
	t.Helper()
	h := runTxns(t, addrs, iso, check.TxnWorkload{Seed: seed, Processes: 4, Keys: keys, KeyPrefix: fmt.Sprintf("s%d-", seed)}, n, contended)
	return check.CheckTxns(h, check.TxnOptions{Model: model})
}

// runTxns runs n transactions of w through KEFIR.TX at addrs.
func runTxns(t *testing.T, addrs []string, iso kefir.Isolation, w check.TxnWorkload, n int, contended bool) check.TxnHistory {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := kefir.Dial(ctx, addrs, kefir.WithRetryUnavailable(10*time.Second), kefir.WithMaxRetries(5))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := check.RunTxns(ctx, &txRunner{c: c, iso: iso}, w, n)
	if err != nil {
		t.Fatal(err)
	}
	outcomes := map[check.Outcome]int{}
	for _, x := range h.Txns {
		outcomes[x.Outcome]++
	}
	t.Logf("iso %d: %d transactions, %d committed, %d aborted, %d unknown", iso, len(h.Txns), outcomes[check.OK], outcomes[check.Failed], outcomes[check.Unknown])
	if contended && (outcomes[check.OK] == 0 || outcomes[check.Failed] == 0) {
		t.Fatalf("%d committed, %d aborted: the workload has no contention", outcomes[check.OK], outcomes[check.Failed])
	}
	return h
}

// The transaction checker (Elle-style) over concurrent list-append
// transactions through KEFIR.TX: SERIALIZABLE passes strict
// serializability, SI passes snapshot isolation.
func TestTxCheckerPasses(t *testing.T) {
	s := startServer(t, nil)
	addrs := []string{s.ClientAddr().String()}
	for _, c := range []struct {
		seed  int64
		iso   kefir.Isolation
		model check.TxnModel
	}{{1, kefir.Serializable, check.StrictSerializable}, {2, kefir.SnapshotIsolation, check.SnapshotIsolation}} {
		h := runTxns(t, addrs, c.iso, check.TxnWorkload{Seed: c.seed, Processes: 4, Keys: 4, KeyPrefix: fmt.Sprintf("s%d-", c.seed)}, 300, true)
		if v := check.CheckTxns(h, check.TxnOptions{Model: c.model}); !v.OK {
			t.Fatalf("%v: %+v", c.model, v)
		}
		ro, aborted := readOnlyAborts(h)
		if ro == 0 || aborted > 0 {
			t.Fatalf("%v: %d of %d read-only transactions aborted (none may; and some must run)", c.model, aborted, ro)
		}
		t.Logf("%v: %d read-only transactions, none aborted", c.model, ro)
	}
}

// readOnlyAborts counts the transactions of h that only read (run READONLY
// by txRunner) and those of them that did not commit.
func readOnlyAborts(h check.TxnHistory) (readOnly, aborted int) {
	for _, x := range h.Txns {
		if slices.ContainsFunc(x.Mops, func(m check.Mop) bool { return m.Kind != check.MopRead }) {
			continue
		}
		readOnly++
		if x.Outcome != check.OK {
			aborted++
		}
	}
	return readOnly, aborted
}

// A commit that skips the conflict window's check (the mutation) is caught
// by the checker: lost appends show as cycles.
func TestTxCheckerCatchesSkippedWindowCheck(t *testing.T) {
	mutation.Require(t)
	s := startServer(t, nil)
	itxMut.skipWindow.Store(true)
	defer itxMut.skipWindow.Store(false)
	addrs := []string{s.ClientAddr().String()}
	for seed := int64(1); seed <= 5; seed++ {
		v := runTxCheck(t, addrs, kefir.SnapshotIsolation, check.SnapshotIsolation, seed, 200, 3, false)
		if !v.OK {
			t.Logf("seed %d: caught: %s", seed, v.Violations[0].Reason)
			return
		}
	}
	t.Fatal("the checker passed commits that skip the window check")
}

// A commit retried with its request id across a leader change is applied
// once: the new leader answers it from the client table (the op was
// replicated with its reply), and the counter it increments holds one
// increment.
func TestTxCommitRetriedAcrossLeaderChangeAppliesOnce(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	c := dial(t, g.nodes[l])
	c.expect(`
SET n 10 => OK
KEFIR.TX BEGIN => (integer) 1
KEFIR.TX INCRBY 1 n 1 => (integer) 11
`)
	op := c.do("KEFIR.TX", "PREPARE", "1")
	enc, err := strconv.Unquote(op)
	if err != nil {
		t.Fatalf("PREPARE: %s", op)
	}
	first := c.do("KEFIR.CALL", "REQID", "77", "1", "CMD", "KEFIR.TXAPPLY", enc)
	if !strings.HasPrefix(first, "(integer)") {
		t.Fatalf("commit: %s", first)
	}
	g.nodes[l].Close()
	var nl int
	var again string
	deadline := time.Now().Add(20 * time.Second)
	for {
		nl = -1
		for i, s := range g.nodes {
			if i != l && s.Status().Role == "leader" {
				nl = i
			}
		}
		if nl >= 0 {
			again = dial(t, g.nodes[nl]).do("KEFIR.CALL", "REQID", "77", "1", "CMD", "KEFIR.TXAPPLY", enc)
			if !strings.HasPrefix(again, "UNAVAILABLE") && !strings.HasPrefix(again, "MOVED") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new leader answered: %s", again)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if again != first {
		t.Fatalf("retried commit answered %s, the first %s", again, first)
	}
	if got := dial(t, g.nodes[nl]).do("GET", "n"); got != `"11"` {
		t.Fatalf("n = %s after the retried commit, want 11", got)
	}
}

// Transactions through the Go client on a replica group keep strict
// serializability across a leader change in the middle of the run.
func TestTxCheckerAcrossLeaderChange(t *testing.T) {
	g := startGroup(t)
	l := g.leader(t)
	var addrs []string
	for _, s := range g.nodes {
		addrs = append(addrs, s.ClientAddr().String())
	}
	var stopped atomic.Bool
	go func() {
		time.Sleep(300 * time.Millisecond)
		stopped.Store(true)
		g.nodes[l].Close()
	}()
	v := runTxCheck(t, addrs, kefir.Serializable, check.StrictSerializable, 9, 300, 4, false)
	if !stopped.Load() {
		t.Log("the run ended before the leader stopped")
	}
	if !v.OK {
		t.Fatalf("%+v", v)
	}
}

// The levels differ where they should: over rw-register transactions (a
// read of some keys, a blind write of others; a key retired after two
// writes, so reads of its first versions say much), SI histories pass snapshot
// isolation but show write skew (G2-item) to the serializable check, which
// SERIALIZABLE histories pass.
func TestTxCheckerSIWriteSkew(t *testing.T) {
	s := startServer(t, nil)
	addrs := []string{s.ClientAddr().String()}
	skew := false
	for seed := int64(1); seed <= 6 && !skew; seed++ {
		w := check.TxnWorkload{Seed: seed, Processes: 4, Keys: 3, Register: true, MaxMops: 4, MaxWritesPerKey: 2, KeyPrefix: fmt.Sprintf("r%d-", seed)}
		h := runTxns(t, addrs, kefir.SnapshotIsolation, w, 300, false)
		if v := check.CheckTxns(h, check.TxnOptions{Model: check.SnapshotIsolation}); !v.OK {
			t.Fatalf("SI history fails snapshot isolation: %+v", v)
		}
		if v := check.CheckTxns(h, check.TxnOptions{Model: check.Serializable}); !v.OK {
			t.Logf("seed %d: SI history not serializable: %s", seed, v.Violations[0].Reason)
			skew = true
		}
		w.KeyPrefix = fmt.Sprintf("R%d-", seed)
		h = runTxns(t, addrs, kefir.Serializable, w, 300, false)
		if v := check.CheckTxns(h, check.TxnOptions{Model: check.StrictSerializable}); !v.OK {
			t.Fatalf("SERIALIZABLE history: %+v", v)
		}
	}
	if !skew {
		t.Fatal("no SI history showed write skew in 6 runs")
	}
}

// Fine-grained conflicts (digest 001 IA-0 (2)) through the front door:
// two transactions flipping different bits of one key both commit and the
// value holds both; the same bit aborts the second; a GET makes the read
// whole under SERIALIZABLE, which ACCESS narrows again.
func TestTxFineGrainedBits(t *testing.T) {
	s := startServer(t, nil)
	a, b := dial(t, s), dial(t, s)
	for _, iso := range []string{"SI", "SERIALIZABLE"} {
		k := "bits" + iso
		a.expect(`
SET ` + k + ` AA => OK
`)
		h := txBegin(t, a, iso)
		hb := txBegin(t, b, iso)
		a.expect(`
KEFIR.TX GETBIT ` + h + ` ` + k + ` 1 => (integer) 1
KEFIR.TX SETBIT ` + h + ` ` + k + ` 1 0 => (integer) 1
KEFIR.TX GETRANGE ` + h + ` ` + k + ` 0 0 => "\x01"
`)
		b.expect(`
KEFIR.TX SETBIT ` + hb + ` ` + k + ` 14 1 => (integer) 0
KEFIR.TX SETRANGE ` + hb + ` ` + k + ` 3 xy => (integer) 5
KEFIR.TX COMMIT ` + hb + ` => (integer)*
`)
		a.expect(`
KEFIR.TX COMMIT ` + h + ` => (integer)*
GET ` + k + ` => "\x01C\x00xy"
`)
		// The same bit: the second aborts.
		h = txBegin(t, a, iso)
		hb = txBegin(t, b, iso)
		a.expect(`
KEFIR.TX SETBIT ` + h + ` ` + k + ` 9 1 => (integer) 1
KEFIR.TX COMMIT ` + h + ` => (integer)*
`)
		b.expect(`
KEFIR.TX SETBIT ` + hb + ` ` + k + ` 9 0 => (integer) 1
KEFIR.TX COMMIT ` + hb + ` => TXABORT conflict on key '` + k + `'*
`)
		// A whole-key write in the window conflicts with every range.
		h = txBegin(t, a, iso)
		b.expect(`
SET ` + k + ` AA => OK
`)
		a.expect(`
KEFIR.TX SETBIT ` + h + ` ` + k + ` 30 1 => (integer) 0
KEFIR.TX COMMIT ` + h + ` => TXABORT conflict on key '` + k + `'*
`)
	}
	// SERIALIZABLE: a GET of the key is a whole read (the other's bit
	// conflicts) unless ACCESS declared what the transaction uses of it.
	for _, declare := range []bool{false, true} {
		a.expect(`
SET r AA => OK
`)
		h := txBegin(t, a, "SERIALIZABLE")
		if declare {
			a.expect(`
KEFIR.TX ACCESS ` + h + ` r 0 0 => OK
`)
		}
		a.expect(`
KEFIR.TX GET ` + h + ` r => "AA"
KEFIR.TX SET ` + h + ` out 1 => OK
`)
		hb := txBegin(t, b, "SI")
		b.expect(`
KEFIR.TX SETBIT ` + hb + ` r 15 0 => (integer) 1
KEFIR.TX COMMIT ` + hb + ` => (integer)*
`)
		want := "TXABORT conflict on key 'r'*"
		if declare {
			want = "(integer)*"
		}
		a.expect(`
KEFIR.TX COMMIT ` + h + ` => ` + want + `
`)
	}
	h := txBegin(t, a, "SI")
	a.expect(`
KEFIR.TX ACCESS ` + h + ` r 5 2 => ERR KEFIR.TX ACCESS takes a byte range*
KEFIR.TX SETBIT ` + h + ` r 5 2 => ERR bit is not an integer or out of range
`)
}

func txBegin(t *testing.T, c *client, iso string) string {
	t.Helper()
	r := c.do("KEFIR.TX", "BEGIN", iso)
	h, ok := strings.CutPrefix(r, "(integer) ")
	if !ok {
		t.Fatalf("KEFIR.TX BEGIN %s => %s", iso, r)
	}
	return h
}

// BITFIELD and BITFIELD_RO at the front door (replies as redis-server
// 7.0.15's), and inside KEFIR.TX: two transactions incrementing different
// fields of one key both commit; the same field aborts the second.
func TestBitFieldCommands(t *testing.T) {
	s := startServer(t, nil)
	a, b := dial(t, s), dial(t, s)
	a.expect(`
BITFIELD c INCRBY u2 100 1 OVERFLOW SAT INCRBY u2 102 1 => [(integer) 1, (integer) 1]
BITFIELD c OVERFLOW FAIL INCRBY u2 102 4 => [(nil)]
BITFIELD s SET i8 0 -100 GET i8 0 INCRBY i8 0 -100 GET u8 0 => [(integer) 0, (integer) -100, (integer) 56, (integer) 56]
BITFIELD_RO s GET u8 0 GET i4 4 => [(integer) 56, (integer) -8]
BITFIELD_RO s SET u8 0 1 => ERR BITFIELD_RO only supports the GET subcommand
BITFIELD s GET u64 0 => ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is.
BITFIELD s OVERFLOW BAD => ERR Invalid OVERFLOW type specified
BITFIELD s GET u8 => ERR syntax error
BITFIELD e GET u8 0 => [(integer) 0]
EXISTS e => (integer) 0
`)
	for _, same := range []bool{false, true} {
		a.expect(`
SET f AAAA => OK
`)
		h, hb := txBegin(t, a, "SERIALIZABLE"), txBegin(t, b, "SERIALIZABLE")
		off := "#2"
		if same {
			off = "#0"
		}
		a.expect(`
KEFIR.TX BITFIELD ` + h + ` f GET u8 #0 => [(integer) 65]
KEFIR.TX BITFIELD ` + h + ` f INCRBY u8 #0 1 => [(integer) 66]
`)
		b.expect(`
KEFIR.TX BITFIELD ` + hb + ` f INCRBY u8 ` + off + ` 2 => [(integer) 67]
KEFIR.TX COMMIT ` + hb + ` => (integer)*
`)
		if same {
			a.expect(`
KEFIR.TX COMMIT ` + h + ` => TXABORT conflict on key 'f'*
GET f => "CAAA"
`)
		} else {
			a.expect(`
KEFIR.TX COMMIT ` + h + ` => (integer)*
GET f => "BACA"
`)
		}
	}
}

// SETRANGE answers the value's length: under SERIALIZABLE that is a read,
// which a concurrent write that grew the value invalidates; under SI only
// the bytes written are checked.
func TestTxSetRangeReadsTheLength(t *testing.T) {
	s := startServer(t, nil)
	a, b := dial(t, s), dial(t, s)
	for _, iso := range []string{"SI", "SERIALIZABLE"} {
		a.expect(`
SET k abc => OK
`)
		h, hb := txBegin(t, a, iso), txBegin(t, b, iso)
		a.expect(`
KEFIR.TX SETRANGE ` + h + ` k 0 x => (integer) 3
`)
		b.expect(`
KEFIR.TX SETRANGE ` + hb + ` k 5 y => (integer) 6
KEFIR.TX COMMIT ` + hb + ` => (integer)*
`)
		want := map[string]string{"SI": "(integer)*", "SERIALIZABLE": "TXABORT conflict on key 'k'*"}[iso]
		a.expect(`
KEFIR.TX COMMIT ` + h + ` => ` + want + `
`)
	}
}

// A key that expires between a transaction's read and its COMMIT is a
// conflict (kv.TxValidate counts it version 0), under SI for a written key
// and under SERIALIZABLE for a read one; a key that had expired before the
// read is noted absent and is none. Before, the INCRBY that answered 6 in the
// transaction committed and landed 1.
func TestTxCommitOverAKeyThatExpiredDuringTheTransaction(t *testing.T) {
	s := startServer(t, nil)
	a := dial(t, s)
	a.expect(`
SET k 5 PX 1500 => OK
SET r 1 PX 1500 => OK
SET gone 1 PX 1 => OK
KEFIR.TX BEGIN SI => (integer) 1
KEFIR.TX INCRBY 1 k 1 => (integer) 6
KEFIR.TX BEGIN SERIALIZABLE => (integer) 2
KEFIR.TX GET 2 r => "1"
KEFIR.TX SET 2 w x => OK
`)
	time.Sleep(50 * time.Millisecond) // gone has expired
	a.expect(`
KEFIR.TX BEGIN => (integer) 3
KEFIR.TX GET 3 gone => (nil)
KEFIR.TX INCRBY 3 gone 1 => (integer) 1
`)
	time.Sleep(1600 * time.Millisecond) // k and r have expired
	a.expect(`
KEFIR.TX COMMIT 1 => TXABORT conflict on key 'k': deleted or expired*
KEFIR.TX COMMIT 2 => TXABORT conflict on key 'r': deleted or expired*
KEFIR.TX COMMIT 3 => (integer)*
MGET k w gone => [(nil), (nil), "1"]
`)
}

// A transaction older than txMaxAge on a connection left idle is ended by
// its timer: its snapshot unpinned without a command of the connection's
// (before, it stayed pinned until the next one, forever for an idle
// client), and its next command answers TXABORT.
func TestTxExpiredOnAnIdleConnectionIsUnpinned(t *testing.T) {
	old := txMaxAge
	txMaxAge = 100 * time.Millisecond
	defer func() { txMaxAge = old }()
	s := startServer(t, nil)
	a := dial(t, s)
	base := s.db.Stats().Snapshots
	a.expect(`
SET x 1 => OK
KEFIR.TX BEGIN => (integer) 1
KEFIR.TX GET 1 x => "1"
`)
	if n := s.db.Stats().Snapshots; n != base+1 {
		t.Fatalf("%d snapshots open during the transaction, want %d", n, base+1)
	}
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool { return s.db.Stats().Snapshots == base }) {
		t.Fatalf("the expired transaction's snapshot is still pinned (%d open, want %d)", s.db.Stats().Snapshots, base)
	}
	a.expect(`
KEFIR.TX GET 1 x => TXABORT transaction too old*
KEFIR.TX GET 1 x => ERR no such transaction*
`)
}

// An ended transaction's struct serves the connection's next BEGIN
// (itxConn.free), and nothing of the first carries over: its read of x is
// not the second's, whose blind write of x commits though x changed after
// that read (with the first one's record kept, the commit validated x at
// the version the first read saw, and aborted); and the reused struct's
// timer is armed again: the third transaction still expires and unpins.
func TestTxReusedTransactionStartsClean(t *testing.T) {
	old := txMaxAge
	txMaxAge = 300 * time.Millisecond
	defer func() { txMaxAge = old }()
	s := startServer(t, nil)
	a := dial(t, s)
	base := s.db.Stats().Snapshots
	a.expect(`
SET x 1 => OK
KEFIR.TX BEGIN => (integer) 1
KEFIR.TX GET 1 x => "1"
KEFIR.TX ABORT 1 => OK
SET x 2 => OK
KEFIR.TX BEGIN => (integer) 2
KEFIR.TX SET 2 x 3 => OK
KEFIR.TX COMMIT 2 => (integer) *
GET x => "3"
KEFIR.TX BEGIN => (integer) 3
KEFIR.TX GET 3 x => "3"
`)
	if !testgroup.Until(5*time.Second, 10*time.Millisecond, func() bool { return s.db.Stats().Snapshots == base }) {
		t.Fatalf("the reused transaction's snapshot is still pinned after its lifetime (%d open, want %d)", s.db.Stats().Snapshots, base)
	}
	a.expect(`
KEFIR.TX GET 3 x => TXABORT transaction too old*
`)
}

// The write set's bounds hold for the write that would cross them: a write
// whose bytes take the set past txMaxWriteBytes, or a DEL of more keys than
// the set has room for, is refused, whatever the set held before (the check
// was of what was already buffered, so one more write of up to the value
// limit, or a DEL of any number of keys, went in past the bound), and the
// commit lands what was accepted.
func TestTxWriteSetBytesBoundTheWriteThatCrossesIt(t *testing.T) {
	s := startServer(t, nil)
	a := dial(t, s)
	half := strings.Repeat("x", txMaxWriteBytes/2)
	a.expect(`KEFIR.TX BEGIN => (integer) 1`)
	if r := a.do("KEFIR.TX", "SET", "1", "a", half); r != "OK" {
		t.Fatalf("first half: %s", r)
	}
	if r := a.do("KEFIR.TX", "SET", "1", "b", half); !strings.HasPrefix(r, "ERR transaction write set is full") {
		t.Fatalf("a write past %d bytes: %s, want the write set's error", txMaxWriteBytes, r)
	}
	if r := a.do("KEFIR.TX", "DEL", "1", "c", "d"); r != "(integer) 0" {
		t.Fatalf("a small write under the bound: %s", r)
	}
	a.expect(`
KEFIR.TX COMMIT 1 => (integer)*
STRLEN a => (integer) 4194304
EXISTS b => (integer) 0
`)
	// A DEL is a write per key: one naming more keys than the set may
	// hold is refused whole.
	a.expect(`KEFIR.TX BEGIN => (integer) 2`)
	del := []string{"KEFIR.TX", "DEL", "2"}
	for i := 0; i <= txMaxWrites; i++ {
		del = append(del, "k"+strconv.Itoa(i))
	}
	if r := a.do(del...); !strings.HasPrefix(r, "ERR transaction write set is full") {
		t.Fatalf("a DEL of %d keys: %s, want the write set's error", txMaxWrites+1, r)
	}
	a.expect(`KEFIR.TX ABORT 2 => OK`)
}
