package vrshard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// txCommit is a KEFIR.TX commit from start with checks and writes (one
// group: origin zero).
func txCommit(t testing.TB, start uint64, checks []kv.TxCheck, writes ...kv.Op) kv.Op {
	t.Helper()
	op, err := kv.NewTxCommit(start, kv.TxSI, kv.TxOrigin{}, checks, writes)
	if err != nil {
		t.Fatal(err)
	}
	return op
}

// readableAt waits until replica l's early check reads a state with op v
// (min(readable, applied), txDoomed).
func (c *cluster) readableAt(l int, v uint64) {
	c.t.Helper()
	r := c.reps[l]
	if !testgroup.Until(5*time.Second, time.Millisecond, func() bool { return min(r.readable.Load(), r.applied.Load()) >= v }) {
		c.t.Fatalf("replica %d: readable %d, applied %d: not at op %d", l, r.readable.Load(), r.applied.Load(), v)
	}
}

// logMark is what a log entry changes: every replica's commit point, the
// leader's proposals and fsyncs.
type logMark struct {
	commits           []uint64
	proposals, fsyncs uint64
	earlyAborts       uint64
}

func (c *cluster) mark(l int) logMark {
	var m logMark
	for _, r := range c.reps {
		m.commits = append(m.commits, r.Info().Commit)
	}
	st := c.reps[l].Stats()
	m.proposals, m.fsyncs, m.earlyAborts = st.Proposals, st.Fsyncs, c.reps[l].EarlyAborts()
	return m
}

// An EXEC whose watched key, and a commit whose checked key, the leader's
// committed state already shows rewritten are answered at once — the null
// array, the -TXABORT conflict — with no log entry: no proposal, no commit
// at any replica, no fsync. The same requests proposed (early aborts off)
// get the same replies from apply, through a log entry each.
func TestEarlyAbortLeavesNoLogEntry(t *testing.T) {
	mutation.Require(t)
	c := newCluster(t, 3, nil)
	l := c.leader(5 * time.Second)
	first, err := c.write(set("k", "1"), shard.ReqID{Client: 1, Seq: 1}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.reps[l].Read(context.Background(), kv.Op{Kind: kv.KindWatch, Keys: [][]byte{[]byte("k")}}, level.ConsLinearizable, shard.Session{})
	if err != nil || len(w.Array) != 1 {
		t.Fatalf("watch read: %+v, %v", w, err)
	}
	second, err := c.write(set("k", "2"), shard.ReqID{Client: 1, Seq: 2}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.waitApplied(second.Version, 5*time.Second)
	c.readableAt(l, second.Version)

	exec := execOp([]kv.Watch{{Key: []byte("k"), Seen: w.Array[0]}}, []string{"SET", "k", "x"})
	commit := txCommit(t, first.Version, []kv.TxCheck{{Key: []byte("k"), Version: first.Version}}, set("k", "y"))
	wantAbort := fmt.Sprintf("-TXABORT conflict on key 'k': written at version %d after the transaction's start version %d\r\n", second.Version, first.Version)
	replies := func(seq uint64) (string, string) {
		t.Helper()
		e, err := c.write(exec, shard.ReqID{Client: 2, Seq: seq}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		cm, err := c.write(commit, shard.ReqID{Client: 2, Seq: seq + 1}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return string(e.Bulk), string(cm.Bulk)
	}

	before := c.mark(l)
	e, cm := replies(1)
	after := c.mark(l)
	if e != string(kv.NullArray) || cm != wantAbort {
		t.Fatalf("early: exec %q, commit %q; want %q and %q", e, cm, kv.NullArray, wantAbort)
	}
	if fmt.Sprint(after.commits) != fmt.Sprint(before.commits) || after.proposals != before.proposals || after.fsyncs != before.fsyncs {
		t.Fatalf("early aborts went through the log: commits %v -> %v, proposals %d -> %d, fsyncs %d -> %d",
			before.commits, after.commits, before.proposals, after.proposals, before.fsyncs, after.fsyncs)
	}
	if after.earlyAborts != before.earlyAborts+2 {
		t.Fatalf("early aborts %d -> %d, want 2 more", before.earlyAborts, after.earlyAborts)
	}

	c.reps[l].mut.noEarlyAbort = true // apply decides, through the log
	e2, cm2 := replies(3)
	logged := c.mark(l)
	if e2 != e || cm2 != cm {
		t.Fatalf("apply answers exec %q, commit %q; the early check answered %q, %q", e2, cm2, e, cm)
	}
	if logged.proposals != after.proposals+2 || logged.earlyAborts != after.earlyAborts {
		t.Fatalf("without early aborts: proposals %d -> %d, early aborts %d -> %d; want 2 proposals, no early abort",
			after.proposals, logged.proposals, after.earlyAborts, logged.earlyAborts)
	}
	c.expectValue(l, "k", "2")
}

// A commit retried with its request id after it committed is answered from
// the client table, never aborted early: in the leader's state its own write
// is the newer version of the key it checked.
func TestEarlyAbortAnswersARetryFromTheClientTable(t *testing.T) {
	c := newCluster(t, 3, nil)
	l := c.leader(5 * time.Second)
	first, err := c.write(set("k", "1"), shard.ReqID{}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	commit := txCommit(t, first.Version, []kv.TxCheck{{Key: []byte("k"), Version: first.Version}}, set("k", "2"))
	id := shard.ReqID{Client: 3, Seq: 1}
	res, err := c.write(commit, id, 5*time.Second)
	want := fmt.Sprintf(":%d\r\n", res.Version)
	if err != nil || string(res.Bulk) != want {
		t.Fatalf("commit: %q, %v", res.Bulk, err)
	}
	c.waitApplied(res.Version, 5*time.Second)
	c.readableAt(l, res.Version)
	again, err := c.write(commit, id, 5*time.Second)
	if err != nil || string(again.Bulk) != want {
		t.Fatalf("retry: %q, %v; want the first reply %q from the client table", again.Bulk, err, want)
	}
	if n := c.reps[l].EarlyAborts(); n != 0 {
		t.Fatalf("%d early aborts", n)
	}
	// Another request with the same (now stale) check is aborted early.
	stale, err := c.write(commit, shard.ReqID{Client: 3, Seq: 2}, 5*time.Second)
	if err != nil || c.reps[l].EarlyAborts() != 1 {
		t.Fatalf("a new request with the stale check: %q, %v, %d early aborts; want one", stale.Bulk, err, c.reps[l].EarlyAborts())
	}
}

// sparesCommittable runs, on a group tuned by tune, transactions that
// validation commits and the early check must not abort: two commits from
// one start that set different bits of one key (ranged checks), and a
// commit whose key is still at the version it read.
func sparesCommittable(t *testing.T, tune func(*Options)) error {
	c := newCluster(t, 3, tune)
	l := c.leader(5 * time.Second)
	base, err := c.write(set("b", "\x00"), shard.ReqID{}, 5*time.Second)
	if err != nil {
		return err
	}
	bit := func(off int64, seq uint64) (kv.Result, error) {
		op := txCommit(t, base.Version, []kv.TxCheck{{Key: []byte("b"), Version: base.Version, Ranges: []kv.TxRange{{Lo: uint64(off), Hi: uint64(off) + 1}}}},
			kv.Op{Kind: kv.KindSetBit, Key: []byte("b"), Delta: off, Value: []byte{'1'}})
		return c.write(op, shard.ReqID{Client: 4, Seq: seq}, 5*time.Second)
	}
	one, err := bit(1, 1)
	if err != nil || one.Version == 0 {
		return fmt.Errorf("first bit: %q, %v", one.Bulk, err)
	}
	c.readableAt(l, one.Version)
	two, err := bit(6, 2)
	if err != nil || two.Version == 0 {
		return fmt.Errorf("a second bit of the key from the same start: %q, %v; want a commit (different bits)", two.Bulk, err)
	}
	c.readableAt(l, two.Version)
	cur := txCommit(t, two.Version, []kv.TxCheck{{Key: []byte("b"), Version: two.Version}}, set("b", "z"))
	three, err := c.write(cur, shard.ReqID{Client: 4, Seq: 3}, 5*time.Second)
	if err != nil || three.Version == 0 {
		return fmt.Errorf("a commit whose key is at the version it read: %q, %v; want a commit", three.Bulk, err)
	}
	if n := c.reps[l].EarlyAborts(); n != 0 {
		return fmt.Errorf("%d early aborts", n)
	}
	return nil
}

func TestEarlyAbortSparesCommittableTransactions(t *testing.T) {
	if err := sparesCommittable(t, nil); err != nil {
		t.Fatal(err)
	}
}

// The early check that ignores a commit's ranges, and the one that counts a
// key still at the version the transaction read as rewritten, abort what
// validation commits: caught.
func TestEarlyAbortMutationsCaught(t *testing.T) {
	mutation.Require(t)
	for name, tune := range map[string]func(*Options){
		"doomKeyGrain": func(o *Options) { o.mut.doomKeyGrain = true },
		"doomOnEqual":  func(o *Options) { o.mut.doomOnEqual = true },
	} {
		t.Run(name, func(t *testing.T) {
			err := sparesCommittable(t, tune)
			if err == nil {
				t.Fatalf("%s not caught", name)
			}
			t.Logf("caught: %v", err)
		})
	}
}

// BenchmarkTxDoomedCheck is the leader's early check of a commit of two keys
// that passes it (the cost every commit pays) and of one it dooms.
func BenchmarkTxDoomedCheck(b *testing.B) {
	c := newCluster(b, 3, nil)
	l := c.leader(5 * time.Second)
	var v [3]uint64
	for i, k := range []string{"a", "b", "a"} {
		res, err := c.write(set(k, "1"), shard.ReqID{}, 5*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		v[i] = res.Version
	}
	c.readableAt(l, v[2])
	r := c.reps[l]
	for _, tc := range []struct {
		name string
		seen uint64
	}{{"passes", v[2]}, {"doomed", v[0]}} {
		op := txCommit(b, v[2], []kv.TxCheck{{Key: []byte("a"), Version: tc.seen}, {Key: []byte("b"), Version: v[1]}}, set("a", "2"), set("b", "2"))
		op.Now = time.Now().UnixMilli()
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				if _, doomed := r.txDoomed(&op, shard.ReqID{Client: 9, Seq: 1}); doomed != (tc.name == "doomed") {
					b.Fatalf("doomed %v", doomed)
				}
			}
		})
	}
}
