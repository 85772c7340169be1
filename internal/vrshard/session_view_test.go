package vrshard

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/check"
	"github.com/kefirdb/kefir/internal/kv"
	"github.com/kefirdb/kefir/internal/level"
	"github.com/kefirdb/kefir/internal/mutation"
	"github.com/kefirdb/kefir/internal/shard"
	"github.com/kefirdb/kefir/internal/testgroup"
	"github.com/kefirdb/kefir/internal/transport"
)

// Issue 24, "Session tokens": a session's cad or async write is acknowledged
// once the leader and one follower hold it in memory; both lose power before
// any fsync, the third replica never saw it, and the view change that
// follows gives its op number to another client's write. A session read
// carrying the token must fail with shard.ErrSessionLost: the token names
// the write's view, and the op the replicas applied at that number was
// ordered in another one. Before, the token named the op number only, every
// replica had applied it, and the read returned the key without the
// session's own write — a read-my-writes violation the session checker
// reports (the mutation run below shows it still does).
func TestSessionTokenDetectsAWriteAViewChangeDropped(t *testing.T) {
	for _, tc := range []struct {
		name   string
		d      level.Durability
		broken bool
	}{
		{"cad", level.CAD, false},
		{"async", level.Async, false},
		{"cad without the view check", level.CAD, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, readErrs := droppedWriteSessionHistory(t, tc.d, tc.broken)
			v := check.Session(h, check.SessionOptions{})
			if tc.broken {
				if v.OK {
					t.Fatalf("the session checker passed a read that missed the session's own acknowledged write:\n%v", h)
				}
				t.Logf("the checker caught the broken session read, as it must:\n%.400s", v.String())
				return
			}
			if !v.OK {
				t.Fatalf("session guarantees:\n%v", v)
			}
			for i, err := range readErrs {
				if !errors.Is(err, shard.ErrSessionLost) {
					t.Fatalf("session read %d with the lost write's token: %v, want ErrSessionLost", i, err)
				}
			}
		})
	}
}

// droppedWriteSessionHistory runs the scenario and returns its history
// (session = client 0) and the errors of the session reads (one at the new
// leader, one at a follower).
func droppedWriteSessionHistory(t *testing.T, d level.Durability, broken bool) (check.History, []error) {
	if broken {
		mutation.Require(t)
	}
	rec := check.NewRecorder(nil)
	c, sess, res := dropSessionWrite(t, d, rec, func(o *Options) { o.mut.noSessionViews = broken })
	ctx := context.Background()

	// Another client's write takes the lost write's op number in the new view.
	var other kv.Result
	var err error
	testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool {
		other, err = c.write(set("y", "theirs"), shard.ReqID{Client: 200, Seq: 1}, 15*time.Second)
		return err == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if other.Version != res.Version {
		t.Fatalf("the new view gave op %d to the next write, not the lost write's op %d: the scenario did not reproduce", other.Version, res.Version)
	}
	c.waitApplied(other.Version, 10*time.Second)

	nl := c.leader(5 * time.Second)
	var errs []error
	for _, i := range []int{nl, (nl + 1) % 3} {
		r := rec.Invoke(check.Op{Client: 0, Kind: check.Get, Key: "x", Cons: level.ConsSession})
		got, err := c.reps[i].Read(ctx, get("x"), level.ConsSession, sess)
		errs = append(errs, err)
		switch {
		case err != nil:
			rec.Fail(r)
		default:
			rec.Complete(r, check.Result{Found: got.Kind == kv.ResBulk, Value: string(got.Bulk), Version: got.Version, Node: i})
		}
		if err == nil && !broken {
			t.Logf("replica %d served the session: %+v", c.ids[i], got)
		}
	}
	return rec.History(), errs
}

// dropSessionWrite is the scenario's first part: a session's (client 0's,
// recorded in rec) write of x at durability d (cad or async) acknowledged
// from the memory of the leader and one follower, both then power cut before
// any fsync, while the third replica was cut off; the two restart and the
// group elects a leader whose log ends before the write. It returns the
// group, the session's token (naming the lost write) and the write's result.
func dropSessionWrite(t *testing.T, d level.Durability, rec *check.Recorder, tune func(*Options)) (*cluster, shard.Session, kv.Result) {
	c, gates, mems := gatedCluster(t, func(o *Options) {
		o.RequestTimeout = 2 * time.Second
		tune(o)
	})
	t.Cleanup(gates.release)
	ctx := context.Background()
	l := c.leader(5 * time.Second)
	f1, f2 := (l+1)%3, (l+2)%3
	base, err := c.reps[l].Write(ctx, set("base", "0"), level.Sync, shard.ReqID{})
	if err != nil {
		t.Fatal(err)
	}
	c.waitApplied(base.Version, 5*time.Second)

	// f2 sees nothing from now on; nobody's log reaches the disk.
	cut := func(on bool) {
		for _, id := range c.ids {
			if id != c.ids[f2] {
				var fault transport.Fault
				fault.Partition = on
				if err := c.reps[f2].Transport().SetLinkFault(id, fault); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	cut(true)
	gates.hold()
	w := rec.Invoke(check.Op{Client: 0, Kind: check.Put, Key: "x", Value: "mine", Dur: d})
	res, err := c.reps[l].Write(ctx, set("x", "mine"), d, shard.ReqID{Client: 100, Seq: 1})
	if err != nil {
		t.Fatalf("%v write with the logs' fsyncs held: %v; want it acknowledged from memory", d, err)
	}
	rec.Complete(w, check.Result{Version: res.Version, Node: l})
	sess := shard.Session{}.AfterWrite(res.Pos())
	if !sess.WriteViewKnown {
		t.Fatalf("the write's token %q carries no view", sess)
	}

	// Power cut of the two replicas that held it: neither kept it.
	for _, i := range []int{l, f1} {
		mems[c.ids[i]].Crash(nil)
	}
	gates.release() // the held fsyncs fail on the dead disks' stale handles
	for _, i := range []int{l, f1} {
		c.kill(i)
		rec.Crash(i)
	}
	for _, i := range []int{l, f1} {
		c.open(i, false, nil)
	}
	cut(false)
	return c, sess, res
}

// Tokens: v1 stays v1 (a single node, views unknown); a known view makes a
// v2 token that parses back to the same session; bad tokens fail clearly.
func TestSessionTokenFormats(t *testing.T) {
	for _, s := range []shard.Session{
		{LastWrite: 7, MaxRead: 9},
		{LastWrite: 7, WriteView: 0, WriteViewKnown: true, MaxRead: 9},
		{LastWrite: 7, WriteView: 3, WriteViewKnown: true, MaxRead: 9, ReadView: 2, ReadViewKnown: true},
	} {
		tok := s.String()
		got, err := shard.ParseSession(tok)
		if err != nil || !reflect.DeepEqual(got, s) {
			t.Fatalf("%+v -> %q -> %+v, %v", s, tok, got, err)
		}
	}
	if tok := (shard.Session{LastWrite: 7, MaxRead: 9}).String(); tok != "v1.7.9" {
		t.Fatalf("a session without views is written %q, want the v1 format", tok)
	}
	for _, bad := range []string{"v2.1.2.3", "v2.1.x.3.4", "v2.1.-.3.-.5", "v3.1.2", "v1.1", "v1.a.2"} {
		if _, err := shard.ParseSession(bad); !errors.Is(err, shard.ErrBadSession) {
			t.Fatalf("ParseSession(%q) = %v, want ErrBadSession", bad, err)
		}
	}
}

// readsOnly judges a session's reads, not the order of its writes (below).
var readsOnly = check.SessionOptions{NoMonotonicWrites: true}

// The class, not just the one schedule: cad puts and session reads at random
// replicas under whole-cluster power cuts during disk stalls and leader power
// cuts (cadPowerCutRun's nemesis), where acknowledged cad writes are lost and
// their op numbers reused. Every session read served must include the
// session's writes and earlier reads (check.Session); a client whose session
// is refused (ErrSessionLost) starts a new one. Monotonic writes are not
// judged: a session learns that its write was lost at its next read, and a
// write it makes before that read may get a lower op number than the lost
// one (docs/consistency.md).
func TestSessionHistoryWithPowerCutsKeepsSessions(t *testing.T) {
	lost := int64(0)
	seeds := uint64(1)
	if soakOn() {
		seeds = 20 // make soak
	}
	for seed := uint64(41); seed < 41+seeds; seed++ {
		h, w := cadPowerCutRun(t, level.CAD, seed, nil, func(w *workload) { w.sessionOnly = true })
		v := check.Session(h, readsOnly)
		if !v.OK || v.Checked == 0 {
			t.Fatalf("seed %d: session guarantees (%d reads judged):\n%v", seed, v.Checked, v)
		}
		lost += w.lostSessions.Load()
		t.Logf("seed %d: %d session reads judged, %d sessions refused as lost", seed, v.Checked, w.lostSessions.Load())
	}
	t.Logf("%d sessions refused as lost in all", lost)
}

// The same schedule without the view check must break a session: proof that
// it loses acknowledged writes and reuses their op numbers where a session
// reads them.
func TestSessionHistoryWithPowerCutsBreaksSessionsWithoutTheViewCheck(t *testing.T) {
	mutation.Require(t)
	for seed := uint64(51); seed < 59; seed++ {
		h, _ := cadPowerCutRun(t, level.CAD, seed, func(o *Options) { o.mut.noSessionViews = true },
			func(w *workload) { w.sessionOnly = true })
		if v := check.Session(h, readsOnly); !v.OK {
			t.Logf("seed %d: the checker caught a session served without its own write, as it must:\n%.600s", seed, v.String())
			return
		}
	}
	t.Fatal("cad writes lost in power cuts with session reads passed the session checker in every seed without the view check: the schedule cannot see the bug")
}

// A session that writes again after its cad write was dropped, before any
// read told it, is told at that write (writeSessionCheck): the write's
// token would rise past the lost version, and the session's next read of
// the lost key would be served without it, with no error. Two cases: the
// new view's log already gave the lost write's op number to another write
// (its entry's view differs), and it has not reached that op yet (the op is
// past the new leader's log, from an earlier view). With the check off
// (writeSessionUnchecked) the first case shows the harm: the write is
// accepted at the op after the lost one, the token names it (committed, of
// the new view) instead of the lost one, and the session reads x as absent
// without an error. (Given the lost op number itself, the token keeps the
// lost write's view — versions tie — and the next read still tells.)
func TestSessionWriteAfterALostWriteIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		taken  bool // another client's write took the lost op number first
		broken bool
	}{
		{"op taken by another write", true, false},
		{"op past the new log", false, false},
		{"op taken by another write, unchecked", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.broken {
				mutation.Require(t)
			}
			c, sess, res := dropSessionWrite(t, level.CAD, check.NewRecorder(nil), func(o *Options) { o.mut.writeSessionUnchecked = tc.broken })
			if tc.taken {
				testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool {
					other, err := c.write(set("y", "theirs"), shard.ReqID{Client: 200, Seq: 1}, 15*time.Second)
					if err == nil && other.Version != res.Version {
						t.Fatalf("the other write got op %d, not the lost write's %d: the scenario did not reproduce", other.Version, res.Version)
					}
					return err == nil
				})
			}
			// The session's next write, at whichever replica leads now.
			var werr error
			var after shard.Session
			testgroup.Until(15*time.Second, 20*time.Millisecond, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				r := c.reps[c.leader(5*time.Second)]
				reqs := [1]shard.WriteReq{{Op: set("z", "mine too"), Durability: level.Sync, ID: shard.ReqID{Client: 100, Seq: 2}, Session: sess}}
				p, err := r.Apply(ctx, reqs[:])
				if err == nil {
					err = reqs[0].Err
				}
				if err == nil {
					err = r.Wait(ctx, p)
				}
				werr = err
				if err == nil {
					after = sess.AfterWrite(reqs[0].Result.Pos())
				}
				return err == nil || errors.Is(err, shard.ErrSessionLost)
			})
			if !tc.broken {
				if werr == nil {
					// Accepted: say what the leader had, and whether the
					// first write was lost at all (a linearizable read).
					l := c.leader(5 * time.Second)
					got, rerr := c.reps[l].Read(context.Background(), get("x"), level.ConsLinearizable, shard.Session{})
					t.Fatalf("the session's write after its lost write was accepted (token %q, then %q) at replica %d (view %d, log to %d, committed %d); x reads %q (%v): want ErrSessionLost",
						sess, after, c.ids[l], c.reps[l].view.Load(), c.reps[l].lastOp.Load(), c.reps[l].commit.Load(), got.Bulk, rerr)
				}
				if !errors.Is(werr, shard.ErrSessionLost) {
					t.Fatalf("the session's write after its lost write: %v; want ErrSessionLost", werr)
				}
				t.Logf("refused: %v", werr)
				return
			}
			if werr != nil {
				t.Fatalf("unchecked: the session's write failed (%v): the test would not show the harm", werr)
			}
			got, err := c.reps[c.leader(5*time.Second)].Read(context.Background(), get("x"), level.ConsSession, after)
			if err != nil {
				t.Fatalf("unchecked: the session read after the write failed (%v), want it served without the lost write", err)
			}
			if got.Kind == kv.ResBulk && string(got.Bulk) == "mine" {
				t.Fatalf("unchecked: x read back as the lost write's value: the write was not lost")
			}
			t.Logf("unchecked: token %q; the session's read of x served without its own write (%v): what the check prevents", after, got.Kind)
		})
	}
}
