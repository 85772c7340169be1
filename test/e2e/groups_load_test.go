package e2e

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/client"
	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// groupLoad is the workload the groups' membership tests (add-group,
// replace-node, remove-group) run while the cluster changes under it: four
// checked clients (linearizable reads, sync writes and CAS, recorded for
// the linearizability checker) on keys, and two sync writers of fresh keys
// whose acknowledged writes are kept to be read back at the end. Each
// client and writer dials all of live, starting at a different node.
type groupLoad struct {
	rec   *check.Recorder
	stop  atomic.Bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	acked map[string]string
}

// startGroupLoad starts the load; onAck (nil: none) is told of each write a
// writer got acknowledged. It stops at the test's end if not before.
func startGroupLoad(t *testing.T, live, keys []string, onAck func(key string)) *groupLoad {
	t.Helper()
	l := &groupLoad{rec: check.NewRecorder(nil), acked: map[string]string{}}
	checkedClients(t, &l.wg, &l.stop, l.rec, live, keys, 4, nil)
	for wi := range 2 {
		c := dialGroup(t, append(live[wi%len(live):], live[:wi%len(live)]...))
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; !l.stop.Load(); i++ {
				k, v := fmt.Sprintf("w%d-%d", wi, i), fmt.Sprintf("val-%d-%d", wi, i)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				err := c.Put(ctx, k, []byte(v), client.WithDurability(client.Sync))
				cancel()
				if err == nil {
					l.Ack(k, v)
					if onAck != nil {
						onAck(k)
					}
				}
			}
		}()
	}
	t.Cleanup(l.Stop)
	return l
}

// Stop stops the clients and writers and waits for them.
func (l *groupLoad) Stop() { l.stop.Store(true); l.wg.Wait() }

// Ack records an acknowledged write the test made itself.
func (l *groupLoad) Ack(k, v string) {
	l.mu.Lock()
	l.acked[k] = v
	l.mu.Unlock()
}

// Acked returns the acknowledged writes so far.
func (l *groupLoad) Acked() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.acked)
}

// CheckLinearizable fails the test unless the checked clients' history is
// linearizable (Stop first).
func (l *groupLoad) CheckLinearizable(t *testing.T) {
	t.Helper()
	h := l.rec.History()
	if v := check.Linearizable(h, check.LinOptions{Timeout: 30 * time.Second, Strict: true}); !v.OK {
		t.Fatalf("history of %d ops is not linearizable: %+v", len(h.Ops), v)
	} else {
		t.Logf("linearizable: %d ops checked", v.Checked)
	}
}

// readBack fails the test unless every write of want reads back at node
// addr's own replicas (eventual reads are served where they land), within
// 20 s.
func readBack(t *testing.T, addr string, want map[string]string) {
	t.Helper()
	c := dialGroup(t, []string{addr})
	missing := map[string]string{}
	var lastErr error
	testgroup.Until(20*time.Second, 100*time.Millisecond, func() bool {
		clear(missing)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for k, v := range want {
			got, err := c.Get(ctx, k, client.WithConsistency(client.Eventual))
			if err != nil || string(got) != v {
				missing[k], lastErr = string(got), err
			}
		}
		return len(missing) == 0
	})
	if len(missing) > 0 {
		t.Fatalf("%s: %d of %d acknowledged writes not read back (e.g. %v, last error %v)", addr, len(missing), len(want), missing, lastErr)
	}
}
