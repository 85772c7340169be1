package vrshard

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
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
