package resptxn

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// Redis runs MULTI/EXEC blocks atomically: the generated workload's history
// is strictly serializable. Sent one micro-op per block instead, the same
// workload is caught breaking even snapshot isolation.
func TestRedisMultiExec(t *testing.T) {
	addr := testgroup.StartRedis(t)
	for _, c := range []struct {
		name     string
		register bool
		split    bool
	}{
		{"list-append", false, false},
		{"rw-register", true, false},
		{"list-append split", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &Runner{Addr: addr, Split: c.split}
			defer r.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			w := check.TxnWorkload{Seed: 1, Processes: 6, Keys: 4, Register: c.register, KeyPrefix: c.name + ":"}
			h, err := check.RunTxns(ctx, r, w, 1500)
			if err != nil {
				t.Fatal(err)
			}
			ok, failed, unknown := h.Outcomes()
			if ok != 1500 {
				t.Fatalf("%d committed, %d aborted, %d unknown of 1500", ok, failed, unknown)
			}
			v := check.CheckTxns(h, check.TxnOptions{Model: check.StrictSerializable, Sessions: true})
			if !c.split {
				if !v.OK {
					t.Fatal(v)
				}
				return
			}
			if v := check.CheckTxns(h, check.TxnOptions{Model: check.SnapshotIsolation}); v.OK {
				t.Fatal("non-atomic transactions pass snapshot isolation")
			}
			t.Logf("split: %v", check.AnalyzeTxns(h, check.TxnOptions{Model: check.SnapshotIsolation}).Names())
		})
	}
}
