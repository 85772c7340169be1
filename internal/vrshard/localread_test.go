package vrshard

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// TryRead serves at once only what a waiting read would return at once: a
// key whose latest update is a cad write not yet readable is left to Read
// (which waits, and releases the held batch), while other keys are served.
// With the noDurabilityWait mutation TryRead serves the key anyway — the
// value from before an acknowledged write.
func TestTryReadLeavesUnreadableKeysToRead(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "checked", true: "noDurabilityWait"}[broken], func(t *testing.T) {
			// The cad write's batch is held for 5 s: it stays unreadable
			// until a read waits for it.
			c := newCluster(t, 3, func(o *Options) { o.CadSyncDelay = 5 * time.Second })
			l := c.leader(5 * time.Second)
			for _, kv := range [][2]string{{"a", "0"}, {"b", "0"}} {
				if _, err := c.write(set(kv[0], kv[1]), shard.ReqID{}, 5*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			c.waitApplied(c.reps[l].Info().Commit, 5*time.Second)
			r := c.reps[l]
			if res, ok := r.TryRead(get("a"), level.ConsLinearizable); !ok || string(res.Bulk) != "0" {
				t.Fatalf("TryRead(a) = %q, %v before the cad write; want \"0\", true", res.Bulk, ok)
			}
			if _, err := r.Write(context.Background(), set("a", "1"), level.CAD, shard.ReqID{Client: 5, Seq: 1}); err != nil {
				t.Fatal(err)
			}
			r.mut.noDurabilityWait = broken
			res, ok := r.TryRead(get("a"), level.ConsLinearizable)
			if ok != broken {
				t.Fatalf("mutated=%t: TryRead(a) = %q, %v after an acknowledged cad write that is not readable", broken, res.Bulk, ok)
			}
			if broken {
				return
			}
			if res, ok := r.TryRead(get("b"), level.ConsLinearizable); !ok || string(res.Bulk) != "0" {
				t.Fatalf("TryRead(b) = %q, %v: a key without a pending write must not wait", res.Bulk, ok)
			}
			start := time.Now()
			res, err := r.Read(context.Background(), get("a"), level.ConsLinearizable, shard.Session{})
			if err != nil || string(res.Bulk) != "1" {
				t.Fatalf("Read(a) = %q, %v; want \"1\"", res.Bulk, err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("Read(a) took %v: it waited for the held batch's deadline", d)
			}
			if res, ok := r.TryRead(get("a"), level.ConsLinearizable); !ok || string(res.Bulk) != "1" {
				t.Fatalf("TryRead(a) = %q, %v once readable; want \"1\", true", res.Bulk, ok)
			}
			if st := r.Stats(); st.LocalReads == 0 || st.LocalReads > st.LeaseReads {
				t.Fatalf("stats: %d local of %d lease reads", st.LocalReads, st.LeaseReads)
			}
		})
	}
}

// TryTxBegin, TryRead of the whole keyspace without the engine read
// (docs/design/transactions.md, "On the event loop"), starts a transaction
// at once only where TxBegin would not wait: not while an acknowledged cad
// write is unreadable, whose key a snapshot taken then would read from
// before it. With the noDurabilityWait mutation it begins anyway, and the
// snapshot misses the write. TxBegin waits for it, and TryTxBegin serves
// once it is readable.
func TestTryTxBeginLeavesUnreadableWritesToTxBegin(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "checked", true: "noDurabilityWait"}[broken], func(t *testing.T) {
			c := newCluster(t, 3, func(o *Options) { o.CadSyncDelay = 5 * time.Second })
			l := c.leader(5 * time.Second)
			if _, err := c.write(set("a", "0"), shard.ReqID{}, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			c.waitApplied(c.reps[l].Info().Commit, 5*time.Second)
			r := c.reps[l]
			var snap *shard.TxSnap
			var ok bool
			if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { snap, ok = r.TryTxBegin(); return ok }) {
				t.Fatal("TryTxBegin at the leader, nothing pending: never served (no lease?)")
			}
			snap.Close()
			if _, err := r.Write(context.Background(), set("a", "1"), level.CAD, shard.ReqID{Client: 5, Seq: 1}); err != nil {
				t.Fatal(err)
			}
			r.mut.noDurabilityWait = broken
			snap, ok = r.TryTxBegin()
			if ok != broken {
				t.Fatalf("mutated=%t: TryTxBegin served = %v after an acknowledged cad write that is not readable", broken, ok)
			}
			if broken {
				v, _, _, _, err := snap.Get([]byte("a"))
				snap.Close()
				if err != nil || string(v) != "0" {
					t.Fatalf("mutated: the snapshot reads a = %q, %v; want the stale \"0\"", v, err)
				}
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			snap, err := r.TxBegin(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			v, _, _, _, err := snap.Get([]byte("a"))
			snap.Close()
			if err != nil || string(v) != "1" {
				t.Fatalf("TxBegin's snapshot reads a = %q, %v; want \"1\"", v, err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("TxBegin took %v: it waited for the held batch's deadline", d)
			}
			if !testgroup.Until(5*time.Second, 5*time.Millisecond, func() bool { snap, ok = r.TryTxBegin(); return ok }) {
				t.Fatal("TryTxBegin once the write is readable: never served")
			}
			snap.Close()
		})
	}
}
