package cluster

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
	"github.com/kefirdb/kefir/internal/testgroup"
)

// The Prober's commands (GET, SET PX, EVAL) are Redis's: a redis-server
// stands in for a group's leader.

func redisDo(t *testing.T, mv *Mover, addr string, args ...string) resp.Value {
	t.Helper()
	var b [][]byte
	for _, a := range args {
		b = append(b, []byte(a))
	}
	v, err := mv.roundTrip(context.Background(), addr, b)
	if err != nil {
		t.Fatalf("%v at %s: %v", args, addr, err)
	}
	return v
}

// Writes, the probe's keys hold a token with a TTL while it runs; Stop
// deletes them, and only them: a key of the same name holding another
// value (a user's, or another probe's) stays.
func TestProberKeysHaveATTLAndStopDeletesOnlyItsOwn(t *testing.T) {
	addr := testgroup.StartRedis(t)
	prefix := ProbeKeyPrefix()
	if !strings.HasPrefix(prefix, "kefir-rebalance-probe-"+strconv.Itoa(os.Getpid())+"-") || prefix == ProbeKeyPrefix() {
		t.Fatalf("prefix %q: want the pid and a random part", prefix)
	}
	mine, theirs := prefix+"0", prefix+"1"
	pr := &Prober{Targets: [][2]string{{addr, mine}, {addr, theirs}}, Writes: true, Every: time.Millisecond, Baseline: 50 * time.Millisecond,
		Ctl: PaceController{Max: time.Second}}
	if err := pr.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := &Mover{}
	defer c.Close()
	time.Sleep(50 * time.Millisecond)
	if v := redisDo(t, c, addr, "PTTL", mine); v.Int <= 0 || v.Int > probeTTL.Milliseconds() {
		t.Fatalf("the probe's key's PTTL is %d: want a TTL up to %v", v.Int, probeTTL)
	}
	// Someone else's value under the second name when the probe stops.
	u := &Mover{}
	defer u.Close()
	pr.beforeCleanup = func() { redisDo(t, u, addr, "SET", theirs, "user") }
	pr.Stop()
	if v := redisDo(t, c, addr, "EXISTS", mine); v.Int != 0 {
		t.Fatalf("the probe's key %q is left after Stop", mine)
	}
	if v := redisDo(t, c, addr, "GET", theirs); string(v.Str) != "user" {
		t.Fatalf("%q holds %q: want the user's value", theirs, v.Str)
	}
}

// --tls: the probe reaches the leaders over TLS as the mover does.
func TestProberSpeaksTLS(t *testing.T) {
	certFile, keyFile := testgroup.LoopbackCertFiles(t)
	tlsPort := testgroup.FreePorts(t)
	testgroup.StartRedis(t, "--tls-port", strconv.Itoa(tlsPort), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", certFile, "--tls-auth-clients", "no")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	pr := &Prober{Targets: [][2]string{{addr, ProbeKeyPrefix() + "0"}}, Writes: true, TLS: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a test's own certificate
		Every: time.Millisecond, Baseline: 50 * time.Millisecond, Ctl: PaceController{Max: time.Second}}
	if err := pr.Start(context.Background()); err != nil {
		t.Fatalf("the probe over TLS: %v", err)
	}
	if r := pr.Stop(); r.SteadyP99 <= 0 {
		t.Fatalf("probe result %+v: want a steady p99", r)
	}
}

// A hung leader (accepts, never answers): Start gives up after its
// baseline plus about a probe's timeout (each round trip is bounded by
// probeTimeout; it was 10 s).
func TestProberGivesUpOnAHungLeader(t *testing.T) {
	pr := &Prober{Targets: [][2]string{{testgroup.SilentListener(t), "k"}}, Baseline: 100 * time.Millisecond, Ctl: PaceController{Max: time.Second}}
	t0 := time.Now()
	if err := pr.Start(context.Background()); err == nil {
		t.Fatal("Start succeeded against a leader that never answers")
	}
	if d := time.Since(t0); d > 3*probeTimeout {
		t.Fatalf("Start took %v against a hung leader: want about %v", d, probeTimeout)
	}
}

// A target that stops answering (its leader changed) is found again by
// Resolve: the probe goes on at the new address.
func TestProberResolvesTheLeaderAgain(t *testing.T) {
	addr := testgroup.StartRedis(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close() // a closed port: every probe fails at once
	key := ProbeKeyPrefix() + "0"
	pr := &Prober{Targets: [][2]string{{gone, key}}, Writes: true, Every: time.Millisecond, Baseline: 100 * time.Millisecond,
		Ctl:     PaceController{Max: time.Second},
		Resolve: func(context.Context) ([][2]string, error) { return [][2]string{{addr, key}}, nil }}
	if err := pr.Start(context.Background()); err != nil {
		t.Fatalf("the probe did not find the leader again: %v", err)
	}
	if r := pr.Stop(); r.SteadyP99 <= 0 {
		t.Fatalf("probe result %+v: want a steady p99", r)
	}
}

// A cancelled context (Ctrl-C) ends the baseline at once, and the probe's
// keys are deleted on the way out.
func TestProberBaselineEndsWithTheContext(t *testing.T) {
	addr := testgroup.StartRedis(t)
	key := ProbeKeyPrefix() + "0"
	pr := &Prober{Targets: [][2]string{{addr, key}}, Writes: true, Every: time.Millisecond, Baseline: 10 * time.Second,
		Ctl: PaceController{Max: time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := pr.Start(ctx); err == nil {
		t.Fatal("Start succeeded with a cancelled context")
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Fatalf("Start took %v after its context ended", d)
	}
	c := &Mover{}
	defer c.Close()
	if v := redisDo(t, c, addr, "EXISTS", key); v.Int != 0 {
		t.Fatalf("the probe's key %q is left", key)
	}
}

// The probe's decisions without its clock (observe, which the probe loop
// calls after each round trip): nothing is decided before a window is
// full; a window whose p99 is over the bound slows the move at once; a
// failed probe counts as slow; Patience quiet windows in a row speed it
// up again; Stop reports what the windows saw.
func TestProberPacesByItsWindowsP99(t *testing.T) {
	ms := time.Millisecond
	p := &Prober{Every: 5 * ms, Window: 4, Ctl: PaceController{Bound: 10 * ms, Step: 20 * ms, Start: 20 * ms, Patience: 3, Max: 250 * ms}}
	p.pause.Store(int64(p.Ctl.Pause()))
	feed := func(n int, d time.Duration) {
		for range n {
			p.observe(d, false)
		}
	}
	feed(3, 30*ms)
	if p.Pause() != 20*ms {
		t.Fatalf("three slow samples of a window of four: pause %v, want the start's 20ms kept", p.Pause())
	}
	feed(1, ms)
	if p.Pause() != 40*ms {
		t.Fatalf("a window whose p99 is 30ms (bound 10ms): pause %v, want 40ms", p.Pause())
	}
	feed(3, ms)
	p.observe(0, true)
	if p.Pause() != 80*ms {
		t.Fatalf("a window with a failed probe: pause %v, want 80ms (a failure is slow)", p.Pause())
	}
	feed(2*4, ms)
	if p.Pause() != 80*ms {
		t.Fatalf("two quiet windows (patience 3): pause %v, want 80ms kept", p.Pause())
	}
	feed(4, ms)
	if p.Pause() != 40*ms {
		t.Fatalf("three quiet windows: pause %v, want 40ms", p.Pause())
	}
	r := p.Stop()
	if r.Samples != 20 || r.Slowdowns != 2 || r.MaxPause != 80*ms || r.DuringP99 != 100*ms {
		t.Fatalf("result %+v: want 20 samples, 2 slowdowns, max pause 80ms, p99 during 100ms (the failure)", r)
	}
}

// A move to a group that owned no slot starts with one target (the
// source's); once the map records the move done, the destination owns
// slots and Resolve (Rebalancer.probeTargets) returns two. A leader change
// at the source then (during the purge) must still be followed: the
// targets the probe has are matched in order (the source's first), not
// refused for the count.
func TestProberResolvesWhenTheDestinationGainedATarget(t *testing.T) {
	addr := testgroup.StartRedis(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	key := ProbeKeyPrefix() + "0"
	pr := &Prober{Targets: [][2]string{{gone, key}}, Writes: true, Every: time.Millisecond, Baseline: 100 * time.Millisecond,
		Ctl: PaceController{Max: time.Second},
		Resolve: func(context.Context) ([][2]string, error) {
			return [][2]string{{addr, key}, {addr, ProbeKeyPrefix() + "1"}}, nil
		}}
	if err := pr.Start(context.Background()); err != nil {
		t.Fatalf("the probe did not follow the source's new leader: %v", err)
	}
	if r := pr.Stop(); r.SteadyP99 <= 0 {
		t.Fatalf("probe result %+v: want a steady p99", r)
	}
}
