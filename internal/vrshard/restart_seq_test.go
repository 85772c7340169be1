package vrshard

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/transport"
)

// Writes without a request id are matched to their entries by (proposer, local
// seq). Entries a leader proposed before a restart can commit after it, when it
// leads again: they must not complete the new incarnation's writes (found by
// review: the seq used to restart at 0).
func TestLocalWritesAreNotAnsweredByThePreviousIncarnationsEntries(t *testing.T) {
	var reqTimeout atomic.Int64
	reqTimeout.Store(int64(300 * time.Millisecond))
	c := newCluster(t, 3, func(o *Options) {
		o.VR.ViewChangeTimeout = time.Second
		o.VR.LeaseDuration = 100 * time.Millisecond
		o.RequestTimeout = time.Duration(reqTimeout.Load())
	})
	l := c.leader(10 * time.Second)
	base, err := c.write(set("base", "0"), shard.ReqID{Client: 1, Seq: 1}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range c.ids {
		if id != c.ids[l] {
			if err := c.reps[l].Transport().SetLinkFault(id, transport.Fault{Partition: true}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const old = 20
	var wg sync.WaitGroup
	for i := range old {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.reps[l].Write(context.Background(), set(fmt.Sprint("old", i), "x"), level.Sync, shard.ReqID{})
			if err == nil {
				t.Errorf("old write %d committed while partitioned", i)
			}
		}()
	}
	wg.Wait()
	t.Logf("leader %d before restart: %+v (base version %d)", c.ids[l], c.reps[l].Info(), base.Version)
	c.closeAll()
	reqTimeout.Store(int64(20 * time.Second))
	c.open(l, false, nil)
	// Alone, the restarted leader starts view changes v+1, v+2, ...; wait for
	// a view it leads, then let one peer join it.
	testgroup.Until(15*time.Second, 2*time.Millisecond, func() bool {
		in := c.reps[l].Info()
		return in.View > 0 && in.View%3 == uint64(l)
	})
	t.Logf("restarted alone: %+v", c.reps[l].Info())
	type out struct {
		i   int
		res kv.Result
		err error
	}
	outs := make(chan out, old)
	stopAt := time.Now().Add(20 * time.Second)
	for i := range old {
		go func() {
			for {
				res, err := c.reps[l].Write(context.Background(), set(fmt.Sprint("new", i), "y"), level.Sync, shard.ReqID{})
				if err != nil && time.Now().Before(stopAt) {
					if _, _, ok := LeaderOf(err); ok || err.Error() != "" {
						time.Sleep(100 * time.Microsecond)
						continue
					}
				}
				outs <- out{i, res, err}
				return
			}
		}()
	}
	c.open((l+1)%3, false, nil)
	bad := 0
	for range old {
		o := <-outs
		if o.err != nil {
			t.Logf("new write %d: %v", o.i, o.err)
			continue
		}
		if o.res.Version <= base.Version+old {
			bad++
			t.Errorf("new write %d answered with version %d: that op is one of the previous incarnation's writes (<= %d)", o.i, o.res.Version, base.Version+old)
			r, err := c.reps[l].Read(context.Background(), get(fmt.Sprint("new", o.i)), level.ConsLinearizable, shard.Session{})
			t.Logf("  linearizable GET new%d right after its +OK: %+v %v", o.i, r, err)
		}
	}
	t.Logf("%d of %d new writes answered with an old op's result", bad, old)
}
