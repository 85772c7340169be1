package resptxn

import (
	"context"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// Redis runs MULTI/EXEC blocks atomically, and WATCH makes interactive
// transactions optimistic ones: both histories are strictly serializable.
// Sent one micro-op per block, or interactively without WATCH, the same
// workload is caught breaking even snapshot isolation.
func TestRedisMultiExec(t *testing.T) {
	addr := testgroup.StartRedis(t)
	for _, c := range []struct {
		name     string
		register bool
		mode     Mode
	}{
		{"list-append", false, Atomic},
		{"rw-register", true, Atomic},
		{"list-append watch", false, Watch},
		{"rw-register watch", true, Watch},
		{"list-append split", false, Split},
		{"list-append no watch", false, NoWatch},
		{"rw-register no watch", true, NoWatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &Runner{Addr: addr, Mode: c.mode}
			defer r.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			w := check.TxnWorkload{Seed: 1, Processes: 6, Keys: 4, Register: c.register, KeyPrefix: c.name + ":"}
			h, err := check.RunTxns(ctx, r, w, 1500)
			if err != nil {
				t.Fatal(err)
			}
			ok, failed, unknown := h.Outcomes()
			if unknown > 0 || ok < 300 || (c.mode == Watch) != (failed > 0) {
				t.Fatalf("%d committed, %d aborted, %d unknown of 1500", ok, failed, unknown)
			}
			t.Logf("%d committed, %d aborted", ok, failed)
			if c.mode == Atomic || c.mode == Watch {
				if v := check.CheckTxns(h, check.TxnOptions{Model: check.StrictSerializable, Sessions: true}); !v.OK {
					t.Fatal(v)
				}
				return
			}
			if v := check.CheckTxns(h, check.TxnOptions{Model: check.SnapshotIsolation}); v.OK {
				t.Fatal("broken transactions pass snapshot isolation")
			}
			t.Logf("caught: %v", check.AnalyzeTxns(h, check.TxnOptions{Model: check.SnapshotIsolation}).Names())
		})
	}
}
