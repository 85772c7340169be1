package vrshard

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// A blind write that apply will reject (an MSET with a reserved or empty
// key: kv.CheckKey fails and the whole MSET writes nothing) must not be
// answered before it is applied, nor enter the overlay: its reply is the
// error, and no read may ever return one of its values. Every fsync is held
// while the write is in flight, so a read of its valid key finds it pending.
// With the earlyRejectable mutation (the behaviour before the fix) a sync
// MSET took §12's ordered point (OK at its op, the valid key's value
// overlaid): a deferred read on another connection returned a value the key
// never had, and the writer's connection got no reply at all (Wait failed
// with the apply error); a cad or async MSET was even acknowledged OK.
func TestRejectedBlindWriteIsNeverAnsweredEarlyNorRead(t *testing.T) {
	reserved := string(kv.ReservedPrefix) + "x"
	for _, tc := range []struct {
		d    level.Durability
		key  string
		want error
	}{
		{level.Sync, reserved, kv.ErrReservedKey},
		{level.Sync, "", kv.ErrInvalidOp},
		{level.CAD, reserved, kv.ErrReservedKey},
		{level.Async, "", kv.ErrInvalidOp},
	} {
		t.Run(fmt.Sprintf("%v-%q", tc.d, tc.key), func(t *testing.T) {
			if bad := rejectedBlindWrite(t, tc.d, tc.key, tc.want, false); len(bad) > 0 {
				for _, b := range bad {
					t.Error(b)
				}
			}
		})
	}
	for _, d := range []level.Durability{level.Sync, level.CAD, level.Async} {
		t.Run(fmt.Sprintf("earlyRejectable-%v", d), func(t *testing.T) {
			bad := rejectedBlindWrite(t, d, reserved, kv.ErrReservedKey, true)
			if len(bad) == 0 {
				t.Fatal("earlyRejectable: a rejected blind write was answered early and the test did not notice")
			}
			for _, b := range bad {
				t.Logf("caught: %s", b)
			}
		})
	}
}

// rejectedBlindWrite runs the schedule above and returns what went wrong.
func rejectedBlindWrite(t *testing.T, d level.Durability, key string, want error, broken bool) (bad []string) {
	if broken {
		mutation.Require(t)
	}
	leader, gates, _ := heldLeader(t, func(o *Options) { o.mut.earlyRejectable = broken }, "k", "v0")
	ctx := context.Background()

	type out struct {
		w shard.WriteReq
		p shard.Pending
	}
	applied := make(chan out, 1)
	go func() {
		mset := kv.Op{Kind: kv.KindMSet, Keys: [][]byte{[]byte("k"), []byte("v1"), []byte(key), []byte("bad")}}
		reqs := []shard.WriteReq{{Op: mset, Durability: d, ID: shard.ReqID{Client: 9, Seq: 1}}}
		p, err := leader.Apply(ctx, reqs)
		if err != nil {
			reqs[0].Err = err
		}
		applied <- out{reqs[0], p}
	}()
	// Let the MSET reach the leader's log (it cannot commit: no fsync can
	// finish), then read k as another connection would.
	testgroup.Until(2*time.Second, time.Millisecond, func() bool { return leader.Stats().Proposals >= 2 })
	time.Sleep(20 * time.Millisecond)
	type rd struct {
		res kv.Result
		p   shard.Pending
		err error
	}
	readc := make(chan rd, 1)
	go func() {
		res, p, err := leader.ReadDeferred(ctx, get("k"), level.ConsLinearizable, shard.Session{})
		readc <- rd{res, p, err}
	}()
	time.Sleep(50 * time.Millisecond)
	gates.release()

	var a out
	select {
	case a = <-applied:
	case <-time.After(5 * time.Second):
		t.Fatal("Apply never returned")
	}
	switch werr := a.w.Err; {
	case werr == nil:
		if werr = leader.Wait(ctx, a.p); werr == nil {
			bad = append(bad, fmt.Sprintf("MSET with key %q acknowledged OK (%+v); want %v", key, a.w.Result, want))
		} else {
			bad = append(bad, fmt.Sprintf("MSET with key %q answered %+v at its ordered point, then Wait failed (%v): the writer's batch gets no reply; want the error %v as its reply", key, a.w.Result, werr, want))
		}
	case !errors.Is(werr, want):
		bad = append(bad, fmt.Sprintf("MSET with key %q: %v; want %v", key, werr, want))
	}
	r := <-readc
	if r.err == nil {
		r.err = leader.Wait(ctx, r.p)
	}
	if r.err != nil {
		t.Fatalf("read of k: %v", r.err)
	}
	if string(r.res.Bulk) != "v0" {
		bad = append(bad, fmt.Sprintf("read of k returned %q (version %d), a value of an MSET that wrote nothing; want v0", r.res.Bulk, r.res.Version))
	}
	if res, err := leader.Read(ctx, get("k"), level.ConsLinearizable, shard.Session{}); err != nil || string(res.Bulk) != "v0" {
		bad = append(bad, fmt.Sprintf("k after the MSET: %+v, %v; want v0", res, err))
	}
	return bad
}
