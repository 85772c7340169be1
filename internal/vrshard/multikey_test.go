package vrshard

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// A read of several keys sees the engine at one version. Between an MGET's
// reads of x and k (the betweenKeys hook) a client writes x = x1 and, once
// that is acknowledged, k = k1, and both become readable. The MGET began
// before either, so [x0 k0] and [x1 k1] are both right; [x0 k1] is a state
// no prefix of the log had (x1 completed before k1 began, yet the read sees
// k1 and not x1). The tornMultiReads mutation — key-by-key reads of the
// latest state — returns it, so the test can fail.
func TestMultiKeyReadSeesOneEngineVersion(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "snapshot", true: "tornMultiReads"}[broken], func(t *testing.T) {
			c := newCluster(t, 3, func(o *Options) { o.mut.tornMultiReads = broken })
			leader := c.reps[c.leader(5*time.Second)]
			ctx := context.Background()
			write := func(k, v string) uint64 {
				res, err := leader.Write(ctx, set(k, v), level.Sync, shard.ReqID{})
				if err != nil {
					t.Fatal(err)
				}
				return res.Version
			}
			write("x", "x0")
			waitReadable(t, leader, write("k", "k0"))
			var once sync.Once
			leader.mut.betweenKeys = func() {
				once.Do(func() {
					write("x", "x1")
					waitReadable(t, leader, write("k", "k1"))
				})
			}
			res, err := leader.Read(ctx, kv.Op{Kind: kv.KindMGet, Keys: [][]byte{[]byte("x"), []byte("k")}}, level.ConsLinearizable, shard.Session{})
			if err != nil || len(res.Array) != 2 {
				t.Fatalf("MGET x k: %+v, %v", res, err)
			}
			x, k := string(res.Array[0]), string(res.Array[1])
			torn := x == "x0" && k == "k1"
			switch {
			case broken && torn:
				return // caught
			case broken:
				t.Fatalf("tornMultiReads: MGET = [%s %s]; the window was not exercised", x, k)
			case torn:
				t.Fatalf("MGET = [%s %s]: k1 was written after x1 was acknowledged, yet the read saw k1 and not x1", x, k)
			}
		})
	}
}
