package vrshard

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
)

// A write whose key or value the engine refuses must be refused before it is
// proposed: once committed, its apply fails and stops every replica that
// applies it (and again on every restart that replays it). Here one batch
// holds a valid SET, a SET with a key above the 64 KiB limit and an MSET
// with a value above a lowered value limit, at each durability level: the
// two get an error, the valid write is applied, and no replica stops. With
// the noSizeCheck mutation the oversize write is proposed and the leader
// stops.
func TestOversizeWritesAreRefusedBeforeTheyAreProposed(t *testing.T) {
	for _, d := range []level.Durability{level.Sync, level.CAD, level.Async} {
		t.Run(d.String(), func(t *testing.T) {
			if failed := oversizeBatch(t, d, false); failed != nil {
				t.Fatalf("a replica stopped: %v", failed)
			}
		})
	}
	t.Run("noSizeCheck", func(t *testing.T) {
		failed := oversizeBatch(t, level.Sync, true)
		if failed == nil || !strings.Contains(failed.Error(), "too large") {
			t.Fatalf("noSizeCheck: no replica stopped (%v); the mutation was not exercised", failed)
		}
		t.Logf("noSizeCheck caught: %v", failed)
	})
}

// oversizeBatch runs the batch and returns the first replica failure seen.
func oversizeBatch(t *testing.T, d level.Durability, broken bool) error {
	if broken {
		mutation.Require(t)
	}
	c := newCluster(t, 3, func(o *Options) {
		o.RequestTimeout = 2 * time.Second
		o.Storage.MaxValueSize = 1 << 10
		o.mut.noSizeCheck = broken
	})
	leader := c.reps[c.leader(5*time.Second)]
	ctx := context.Background()
	bigKey := strings.Repeat("k", 64<<10+1)
	bigVal := strings.Repeat("v", 1<<10+1)
	reqs := []shard.WriteReq{
		{Op: set("a", "1"), Durability: d, ID: shard.ReqID{Client: 7, Seq: 1}},
		{Op: set(bigKey, "x"), Durability: d, ID: shard.ReqID{Client: 7, Seq: 2}},
		{Op: kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("b"), []byte("2"), []byte("c"), []byte(bigVal)}}, Durability: d},
		{Op: set("e", "3"), Durability: d},
	}
	p, err := leader.Apply(ctx, reqs)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	werr := leader.Wait(ctx, p)
	if !broken {
		if werr != nil {
			t.Fatalf("Wait: %v", werr)
		}
		for i, want := range []bool{true, false, false, true} {
			if ok := reqs[i].Err == nil; ok != want {
				t.Fatalf("write %d: %+v, %v; want accepted=%v", i, reqs[i].Result, reqs[i].Err, want)
			}
			if !want && !errors.Is(reqs[i].Err, kv.ErrInvalidOp) {
				t.Fatalf("write %d refused with %v; want ErrInvalidOp", i, reqs[i].Err)
			}
		}
		if _, err := leader.Write(ctx, set("after", "ok"), level.Sync, shard.ReqID{}); err != nil {
			t.Fatalf("a write after the refused ones: %v", err)
		}
		if r, err := leader.Read(ctx, kv.Op{Kind: kv.KindMGet, Keys: [][]byte{[]byte("a"), []byte("b"), []byte("e")}}, level.ConsLinearizable, shard.Session{}); err != nil ||
			string(r.Array[0]) != "1" || r.Array[1] != nil || string(r.Array[2]) != "3" {
			t.Fatalf("MGET a b e: %+v, %v; want [1 nil 3]", r, err)
		}
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		for _, r := range c.reps {
			if r != nil {
				if err := r.failed(); err != nil {
					return err
				}
			}
		}
		if !broken {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// An APPEND whose result would outgrow the engine's value limit is known
// only at apply: the state machine refuses it there, as the op's error, on
// every replica alike, and the group goes on. With appendUnchecked the
// engine fails the apply batch and the replicas that apply it stop.
func TestAppendPastTheValueLimitIsRefusedAtApply(t *testing.T) {
	mutation.Require(t)
	for _, broken := range []bool{false, true} {
		t.Run(map[bool]string{false: "refused", true: "appendUnchecked"}[broken], func(t *testing.T) {
			c := newCluster(t, 3, func(o *Options) {
				o.RequestTimeout = 2 * time.Second
				o.Storage.MaxValueSize = 1 << 10
				o.mut.appendUnchecked = broken
			})
			leader := c.reps[c.leader(5*time.Second)]
			ctx := context.Background()
			chunk := strings.Repeat("a", 400)
			var last error
			for range 3 { // 400, 800, then 1200 > 1024
				_, last = leader.Write(ctx, kv.Op{Kind: kv.KindAppend, Key: []byte("k"), Value: []byte(chunk)}, level.Sync, shard.ReqID{})
			}
			if broken {
				deadline := time.Now().Add(2 * time.Second)
				for time.Now().Before(deadline) {
					for _, r := range c.reps {
						if err := r.failed(); err != nil {
							t.Logf("appendUnchecked caught: %v", err)
							return
						}
					}
					time.Sleep(5 * time.Millisecond)
				}
				t.Fatalf("appendUnchecked: no replica stopped (last APPEND: %v)", last)
			}
			if !errors.Is(last, kv.ErrInvalidOp) {
				t.Fatalf("third APPEND: %v; want ErrInvalidOp", last)
			}
			if _, err := leader.Write(ctx, set("after", "ok"), level.Sync, shard.ReqID{}); err != nil {
				t.Fatalf("a write after the refused APPEND: %v", err)
			}
			if r, err := leader.Read(ctx, kv.Op{Kind: kv.KindStrlen, Key: []byte("k")}, level.ConsLinearizable, shard.Session{}); err != nil || r.Int != 800 {
				t.Fatalf("STRLEN k: %+v, %v; want 800", r, err)
			}
			for _, r := range c.reps {
				if err := r.failed(); err != nil {
					t.Fatalf("replica stopped: %v", err)
				}
			}
		})
	}
}
