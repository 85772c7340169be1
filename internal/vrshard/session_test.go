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
)

// A session token can carry the op of a write the leader answered before
// applying it: a cad write (acknowledged once a majority holds it in
// memory), an async one (once appended) or a sync blind write answered at
// its ordered point (docs/design/cad.md §12). A session read with that token
// at the leader must wait for the write's apply however long the commit
// takes — the write is in the leader's log — and return it, not fail with
// "session token is ahead" once FollowerWait passed. Every log fsync is held
// here for 4 × FollowerWait, so nothing commits before that; a follower
// keeps its rule (FollowerWait, then a redirect to the leader).
func TestSessionReadAtTheLeaderWaitsForItsWriteInTheLog(t *testing.T) {
	if err := sessionReadsBehindHeldWrites(t, nil); err != nil {
		t.Fatal(err)
	}
}

// With sessionWaitLimited (the rule before session 9) the same reads fail
// with shard.ErrSessionAhead: the test above can fail.
func TestSessionWaitLimitedFailsAReadOfItsOwnWrite(t *testing.T) {
	mutation.Require(t)
	err := sessionReadsBehindHeldWrites(t, func(o *Options) { o.mut.sessionWaitLimited = true })
	if err == nil {
		t.Fatal("sessionWaitLimited: every session read still returned its write")
	}
	if !errors.Is(err, shard.ErrSessionAhead) {
		t.Fatalf("sessionWaitLimited: %v; want shard.ErrSessionAhead", err)
	}
	t.Logf("mutation caught: %v", err)
}

// sessionReadsBehindHeldWrites writes k1 at cad, k2 at async and k3 at sync
// (Apply, answered at its ordered point) at a leader whose log fsyncs are
// all held, starts a session read of each key at the leader with the token
// its write returned, checks that a follower redirects the same read after
// FollowerWait, and releases the fsyncs after 4 × FollowerWait. It returns
// the first read that did not return its write.
func sessionReadsBehindHeldWrites(t *testing.T, tune func(*Options)) error {
	const wait = 50 * time.Millisecond
	c, gates, _ := gatedCluster(t, func(o *Options) {
		o.RequestTimeout = 10 * time.Second
		o.FollowerWait = wait
		if tune != nil {
			tune(o)
		}
	})
	li := c.leader(5 * time.Second)
	leader := c.reps[li]
	ctx := context.Background()
	w0, err := leader.Write(ctx, set("k0", "v0"), level.Sync, shard.ReqID{})
	if err != nil {
		t.Fatal(err)
	}
	c.waitApplied(w0.Version, 5*time.Second)
	gates.hold()
	t.Cleanup(gates.release)

	type write struct {
		k   string
		ver uint64
	}
	var ws []write
	for i, d := range []level.Durability{level.CAD, level.Async} {
		k := fmt.Sprintf("k%d", i+1)
		res, err := leader.Write(ctx, set(k, "v-"+k), d, shard.ReqID{})
		if err != nil || res.Version <= w0.Version {
			t.Fatalf("%v SET %s with every fsync held: %+v, %v; want OK at once", d, k, res, err)
		}
		ws = append(ws, write{k, res.Version})
	}
	w3, p3 := applyOne(t, leader, set("k3", "v-k3"), level.Sync, shard.ReqID{})
	if w3.Err != nil || len(p3.Acks) != 1 {
		t.Fatalf("sync SET k3 with every fsync held: %+v, %+v; want OK at its ordered point", w3, p3)
	}
	ws = append(ws, write{"k3", w3.Result.Version})
	if in := leader.Info(); in.Applied >= ws[0].ver {
		t.Fatalf("applied %d with every fsync held; the writes (from op %d) must not be", in.Applied, ws[0].ver)
	}

	type out struct {
		k   string
		res kv.Result
		err error
	}
	got := make(chan out, len(ws))
	for _, w := range ws {
		go func() {
			res, err := leader.Read(ctx, get(w.k), level.ConsSession, shard.Session{LastWrite: w.ver})
			got <- out{w.k, res, err}
		}()
	}

	// A follower has the writes in its log too, but it waits FollowerWait
	// only, then redirects.
	f := c.reps[(li+1)%3]
	began := time.Now()
	if _, err := f.Read(ctx, get("k1"), level.ConsSession, shard.Session{LastWrite: ws[0].ver}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("session read at a follower behind the token: %v; want a redirect (ErrNotLeader)", err)
	}
	if d := time.Since(began); d < wait || d > 2*time.Second {
		t.Fatalf("a follower redirected after %v; want FollowerWait (%v)", d, wait)
	}

	var first error
	note := func(err error) {
		if first == nil {
			first = err
		}
	}
	n := 0
	timer := time.NewTimer(4 * wait)
	defer timer.Stop()
wait:
	for n < len(ws) {
		select {
		case o := <-got:
			n++
			note(fmt.Errorf("session read of %s returned before its write was applied: %+v, %w", o.k, o.res, o.err))
		case <-timer.C:
			break wait
		}
	}
	gates.release()
	for ; n < len(ws); n++ {
		o := <-got
		if o.err != nil {
			note(fmt.Errorf("session read of %s: %w", o.k, o.err))
		} else if string(o.res.Bulk) != "v-"+o.k {
			note(fmt.Errorf("session read of %s: %+v; want v-%s", o.k, o.res, o.k))
		}
	}
	if err := leader.Wait(ctx, p3); err != nil {
		t.Fatalf("Wait for the sync write: %v", err)
	}
	return first
}

// A token beyond the leader's log — a write a view change lost, a token from
// another group — still fails with shard.ErrSessionAhead after FollowerWait
// (the client is told at once; RequestTimeout is 10 s here), at the leader and
// in the middle of a log that has unapplied writes.
func TestSessionTokenBeyondTheLeadersLogFails(t *testing.T) {
	const wait = 50 * time.Millisecond
	leader, _, _ := heldLeader(t, func(o *Options) {
		o.RequestTimeout = 10 * time.Second
		o.FollowerWait = wait
	}, "k", "v0")
	ctx := context.Background()
	res, err := leader.Write(ctx, set("k", "v1"), level.CAD, shard.ReqID{})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = leader.Read(ctx, get("k"), level.ConsSession, shard.Session{LastWrite: res.Version + 1000})
	if !errors.Is(err, shard.ErrSessionAhead) {
		t.Fatalf("session token beyond the leader's log (ends at %d): %v; want shard.ErrSessionAhead", res.Version, err)
	}
	if d := time.Since(began); d < wait || d > 2*time.Second {
		t.Fatalf("ErrSessionAhead after %v; want after FollowerWait (%v)", d, wait)
	}
	t.Logf("%v", err)
}

// A session read waiting at the leader for a write in its log ends with a
// redirect as soon as the leader learns it was deposed (publish wakes it),
// not when RequestTimeout (6 s here) runs out. The old leader is cut off,
// takes an async write (acknowledged once appended, so it never commits),
// and the read with its token waits; the others elect a new leader, and
// when the link heals the old leader joins the new view.
func TestSessionReadAtADeposedLeaderRedirects(t *testing.T) {
	if d, err := sessionReadAtDeposedLeader(t, false); err != nil {
		t.Fatal(err)
	} else if d > 2*time.Second {
		t.Fatalf("the read ended %v after the heal; want it woken when leadership changed", d)
	}
}

// With noLeaderWake the read waits for RequestTimeout (6 s) instead: the
// test above can fail.
func TestNoLeaderWakeHoldsASessionReadAtADeposedLeader(t *testing.T) {
	d, err := sessionReadAtDeposedLeader(t, true)
	if err != nil {
		t.Fatal(err)
	}
	if d < 2*time.Second {
		t.Fatalf("noLeaderWake: the read still ended %v after the heal", d)
	}
	t.Logf("mutation caught: the read ended %v after the heal", d)
}

// sessionReadAtDeposedLeader returns how long after the heal the read ended,
// and an error if it did not end with a redirect.
func sessionReadAtDeposedLeader(t *testing.T, noWake bool) (time.Duration, error) {
	if noWake {
		mutation.Require(t)
	}
	c := newCluster(t, 3, func(o *Options) {
		o.RequestTimeout = 6 * time.Second
		o.FollowerWait = 50 * time.Millisecond
		o.mut.noLeaderWake = noWake
	})
	if _, err := c.write(set("x", "old"), shard.ReqID{}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	old := c.leader(time.Second)
	c.isolate(old, true)
	// A blind cad write returns from Apply at its ordered point, in the cut-off
	// leader's log and never acknowledged: the session token names a version
	// that leader holds but cannot apply.
	w, _ := applyOne(t, c.reps[old], set("x", "lost"), level.CAD, shard.ReqID{})
	if w.Err != nil || w.Result.Version == 0 {
		t.Fatalf("cad write at the cut-off leader: %+v", w)
	}
	res := w.Result
	type out struct {
		res kv.Result
		err error
	}
	got := make(chan out, 1)
	go func() {
		r, err := c.reps[old].Read(context.Background(), get("x"), level.ConsSession, shard.Session{LastWrite: res.Version})
		got <- out{r, err}
	}()
	newLeaderBesides(t, c, old)
	select {
	case o := <-got:
		t.Fatalf("the cut-off leader answered a session read of its uncommitted write: %+v, %v", o.res, o.err)
	default:
	}
	c.isolate(old, false)
	healed := time.Now()
	o := <-got
	d := time.Since(healed)
	if o.err == nil {
		// No member of the new view had the write: it is lost.
		return d, fmt.Errorf("session read at the deposed leader returned %+v; its write was never replicated", o.res)
	}
	if !errors.Is(o.err, shard.ErrUnavailable) || errors.Is(o.err, shard.ErrSessionAhead) {
		return d, fmt.Errorf("session read at the deposed leader: %w; want a redirect (unavailable)", o.err)
	}
	t.Logf("%v after %v", o.err, d)
	return d, nil
}

// A write in the leader's log that cannot commit (every log fsync held)
// holds a session read with its token for RequestTimeout, as every leader
// wait, and then fails with ErrCannotServe: the group cannot commit now, the
// session is not lost (not shard.ErrSessionAhead).
func TestSessionReadOfAWriteThatCannotCommitTimesOut(t *testing.T) {
	const timeout = 2 * time.Second
	leader, _, _ := heldLeader(t, func(o *Options) {
		o.RequestTimeout = timeout
		o.FollowerWait = 50 * time.Millisecond
	}, "k", "v0")
	ctx := context.Background()
	res, err := leader.Write(ctx, set("k", "v1"), level.CAD, shard.ReqID{})
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = leader.Read(ctx, get("k"), level.ConsSession, shard.Session{LastWrite: res.Version})
	if !errors.Is(err, ErrCannotServe) {
		t.Fatalf("session read of a write that cannot commit: %v; want ErrCannotServe", err)
	}
	if d := time.Since(began); d < timeout-100*time.Millisecond {
		t.Fatalf("ErrCannotServe after %v; want after RequestTimeout (%v)", d, timeout)
	}
}
