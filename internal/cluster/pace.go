package cluster

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/resp"
)

// The adaptive rate limit of a move (issue 28: "rate-limited so foreground
// p99 stays within 2× of steady state"; docs/design/cluster.md, "The
// adaptive rate limit"): a probe reads a key of the source group and one of
// the destination group at their leaders every few milliseconds, the p99 of
// its last samples goes to a PaceController, and the mover rests the
// controller's pause after each page outside the hand-over's window
// (Mover.Pacer) instead of the fixed --page-pause.

// PaceController turns the foreground's measured p99 into the pause a mover
// takes after each page. Pure: its caller measures and sleeps. It doubles
// the pause (at least to Step) as soon as the p99 is above Bound, halves it
// only after Patience observations in a row under half of Bound (to Min
// once under Step), and keeps it otherwise; the pause stays within [Min,
// Max]. Slow to speed up, quick to slow down: the probe samples the leaders
// during the pauses too, when the move leaves them alone, so one quiet
// window says little about the next page.
type PaceController struct {
	Bound     time.Duration // the p99 to stay under: 2× the steady p99
	Min, Max  time.Duration // the pause's limits
	Step      time.Duration // the smallest pause above Min
	Start     time.Duration // the first pause (0: Min), before any observation
	Patience  int           // observations under Bound/2 in a row before a halving (0: 1)
	pause     time.Duration
	primed    bool
	slowdowns int
	quiet     int
}

// Observe takes the p99 of the latest samples and returns the next pause.
func (c *PaceController) Observe(p99 time.Duration) time.Duration {
	if !c.primed {
		c.pause, c.primed = c.first(), true
	}
	switch {
	case p99 > c.Bound:
		c.pause = max(2*c.pause, c.Step)
		c.slowdowns++
		c.quiet = 0
	case p99 < c.Bound/2:
		if c.quiet++; c.quiet >= max(c.Patience, 1) {
			c.quiet = 0
			c.pause /= 2
			if c.pause < c.Step {
				c.pause = c.Min
			}
		}
	default:
		c.quiet = 0
	}
	c.pause = min(max(c.pause, c.Min), c.Max)
	return c.pause
}

// Pause is the current pause.
func (c *PaceController) Pause() time.Duration {
	if !c.primed {
		return c.first()
	}
	return c.pause
}

func (c *PaceController) first() time.Duration { return min(max(c.Start, c.Min), c.Max) }

// Slowdowns counts the observations above Bound.
func (c *PaceController) Slowdowns() int { return c.slowdowns }

// Percentile returns the q-quantile (0..1) of samples (nearest rank; 0 for
// none). It sorts samples.
func Percentile(samples []time.Duration, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	slices.Sort(samples)
	i := int(q*float64(len(samples))+0.999999) - 1
	return samples[min(max(i, 0), len(samples)-1)]
}

// Prober measures the foreground's latency at a move's two groups while it
// runs and paces the move by it (a Mover's Pacer).
type Prober struct {
	// Targets are (address, key) pairs, probed in turn; Writes makes
	// every other probe of a target a SET of its key instead of a GET: a
	// move's imports and purges go through the groups' logs, which a read
	// never waits for. The keys should be names no user has
	// (ProbeKeyPrefix); a SET writes a random token with a TTL of
	// probeTTL (each refreshes it), and Stop deletes a key only if it
	// still holds the token, so that a probe killed or cut off leaves
	// nothing behind for long and never deletes what it did not write.
	Targets  [][2]string
	Writes   bool
	Password string
	TLS      *tls.Config
	// Every is the time between probes (default 5 ms); Window the samples
	// whose p99 the controller observes (default 20: a decision every
	// ~100 ms, so that a move of a few seconds is paced from its first
	// pages; the p99 of 20 is their maximum, which errs on the slow side).
	Every  time.Duration
	Window int
	// Baseline is how long the steady p99 is measured before the move
	// (default 1 s); Floor the least Bound (default 1 ms: below it the
	// probe's own noise dominates).
	Baseline, Floor time.Duration
	Ctl             PaceController
	Logf            func(format string, args ...any)
	// Resolve, if set, returns the targets anew (the same keys, at the
	// groups' leaders now, in the same order; more of them once the
	// destination owns slots, of which the probe takes its first ones);
	// the probe calls it after resolveAfter failures in a row at a
	// target, so that a leader change does not pin the pause at its
	// maximum for the rest of the move.
	Resolve func(ctx context.Context) ([][2]string, error)

	// beforeCleanup, for tests, runs just before the keys are deleted.
	beforeCleanup func()

	pause  atomic.Int64
	win    []time.Duration // the window being filled (the probe loop's own)
	mu     sync.Mutex
	steady time.Duration
	during []time.Duration
	maxP   time.Duration
	stop   context.CancelFunc
	done   chan struct{}
}

// Pause is the pause the mover takes now (Mover.Pacer).
func (p *Prober) Pause() time.Duration { return time.Duration(p.pause.Load()) }

// Start measures the steady p99 for Baseline, sets the controller's Bound to
// twice it (at least Floor), and probes on until Stop, adjusting the pause.
func (p *Prober) Start(ctx context.Context) error {
	if len(p.Targets) == 0 {
		return fmt.Errorf("rebalance: the probe has no target")
	}
	if p.Every <= 0 {
		p.Every = 5 * time.Millisecond
	}
	if p.Window <= 0 {
		p.Window = 20
	}
	if p.Baseline <= 0 {
		p.Baseline = time.Second
	}
	if p.Floor <= 0 {
		p.Floor = time.Millisecond
	}
	p.Targets = slices.Clone(p.Targets)   // Resolve may change its addresses
	mvs := make([]*Mover, len(p.Targets)) // one connection per target (Mover.roundTrip)
	for i := range mvs {
		mvs[i] = &Mover{Password: p.Password, TLS: p.TLS, rtTimeout: probeTimeout}
	}
	token := randomToken()
	ttl := []byte(strconv.FormatInt(probeTTL.Milliseconds(), 10))
	n := 0
	fails := make([]int, len(p.Targets))
	resolve := func(i int) {
		if fails[i]++; fails[i] < resolveAfter || p.Resolve == nil {
			return
		}
		clear(fails)
		ts, err := p.Resolve(ctx)
		if err == nil && len(ts) < len(p.Targets) {
			err = fmt.Errorf("%d targets for the probe's %d", len(ts), len(p.Targets))
		}
		if err != nil {
			if p.Logf != nil {
				p.Logf("the probe could not find the leaders again: %v", err)
			}
			return
		}
		// Matched in order, the source's first: a destination that owned
		// no slot when the probe started has a target once the move is
		// done, which the probe leaves out: its targets, their
		// connections and the keys it deletes are fixed at its start.
		for j := range p.Targets {
			if ts[j][0] != p.Targets[j][0] {
				if p.Logf != nil {
					p.Logf("the probe's target %q moves from %s to %s", p.Targets[j][1], p.Targets[j][0], ts[j][0])
				}
				mvs[j].close()
				p.Targets[j][0] = ts[j][0]
			}
		}
	}
	probe := func() (time.Duration, error) {
		i := n % len(p.Targets)
		cmd := [][]byte{[]byte("GET"), []byte(p.Targets[i][1])}
		if p.Writes && (n/len(p.Targets))%2 == 1 {
			cmd = [][]byte{[]byte("SET"), []byte(p.Targets[i][1]), []byte(token), []byte("PX"), ttl}
		}
		n++
		t0 := time.Now()
		v, err := mvs[i].roundTrip(context.Background(), p.Targets[i][0], cmd)
		if err == nil && v.Kind == resp.Error {
			err = fmt.Errorf("%s", v.Str)
		}
		d := time.Since(t0)
		if err != nil {
			resolve(i)
		} else {
			fails[i] = 0
		}
		return d, err
	}
	cleanup := func() {
		if p.beforeCleanup != nil {
			p.beforeCleanup()
		}
		for i, m := range mvs {
			if p.Writes {
				v, err := m.roundTrip(context.Background(), p.Targets[i][0], [][]byte{[]byte("EVAL"), []byte(delIfToken), []byte("1"), []byte(p.Targets[i][1]), []byte(token)})
				if err == nil && v.Kind == resp.Error {
					err = fmt.Errorf("%s", v.Str)
				}
				if err != nil && p.Logf != nil {
					p.Logf("the probe's key %q at %s is left (its TTL, %v, removes it): %v", p.Targets[i][1], p.Targets[i][0], probeTTL, err)
				}
			}
			m.close()
		}
	}
	var base []time.Duration
	tk := time.NewTicker(p.Every)
	for end := time.Now().Add(p.Baseline); time.Now().Before(end); {
		if d, err := probe(); err == nil {
			base = append(base, d)
		}
		select {
		case <-ctx.Done():
			tk.Stop()
			cleanup()
			return ctx.Err()
		case <-tk.C:
		}
	}
	tk.Stop()
	if len(base) == 0 {
		cleanup()
		return fmt.Errorf("rebalance: the latency probe got no answer from %v in %v", p.Targets, p.Baseline)
	}
	// The p99 of all the baseline's samples (about its two largest of
	// ~200), not the median of its windows' p99s (about the 95th
	// percentile): the controller then watches 20-sample windows, whose
	// p99 is mostly under it in the same conditions, so twice it leaves
	// room for the box's own noise. The median made the bound so tight on
	// a shared box that a 25k-key move took 30-88 s (run 4).
	p.steady = Percentile(base, 0.99)
	p.Ctl.Bound = max(2*p.steady, p.Floor)
	p.pause.Store(int64(p.Ctl.Pause()))
	p.maxP = p.Ctl.Pause()
	ctx, p.stop = context.WithCancel(ctx)
	p.done = make(chan struct{})
	go func() {
		defer close(p.done)
		defer cleanup()
		tk := time.NewTicker(p.Every)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			d, err := probe()
			p.observe(d, err != nil)
		}
	}()
	return nil
}

// observe takes one probe's round trip during the move (failed: no answer,
// counted as slow) into the current window and, once the window holds
// Window samples, gives their p99 to the controller and publishes its
// pause. The probe loop's only decision, apart from its clock: a test
// feeds it samples directly.
func (p *Prober) observe(d time.Duration, failed bool) {
	if failed {
		d = p.Every * 20
	}
	p.win = append(p.win, d)
	p.mu.Lock()
	p.during = append(p.during, d)
	p.mu.Unlock()
	if len(p.win) < p.Window {
		return
	}
	q := Percentile(p.win, 0.99)
	p.win = p.win[:0]
	old := p.Ctl.Pause()
	now := p.Ctl.Observe(q)
	p.pause.Store(int64(now))
	p.mu.Lock()
	p.maxP = max(p.maxP, now)
	p.mu.Unlock()
	if now != old && p.Logf != nil {
		p.Logf("probe p99 %v (bound %v): page pause %v -> %v", q.Round(10*time.Microsecond), p.Ctl.Bound, old, now)
	}
}

// probeTTL is the probe keys' TTL: many probe periods (each SET refreshes
// it), short enough that a probe killed outright leaves its keys for
// seconds only. probeTimeout bounds one probe's round trip: a hung leader
// counts as slow, and Stop returns within about two of them.
const (
	probeTTL     = 5 * time.Second
	probeTimeout = time.Second
	resolveAfter = 5
)

// delIfToken deletes KEYS[1] if it holds ARGV[1] (the probe's token).
const delIfToken = `if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`

// ProbeKeyPrefix returns the prefix of one rebalance's probe keys:
// "kefir-rebalance-probe-", the process id and random hex, so that no
// user's key and no other rebalance's probe has its names.
func ProbeKeyPrefix() string {
	return fmt.Sprintf("kefir-rebalance-probe-%d-%s-", os.Getpid(), randomToken()[:8])
}

func randomToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (Go 1.24)
	return hex.EncodeToString(b[:])
}

// ProbeResult is what a Prober saw.
type ProbeResult struct {
	SteadyP99, Bound, DuringP99, MaxPause time.Duration
	Samples, Slowdowns                    int
}

// Stop ends the probe and returns what it saw.
func (p *Prober) Stop() ProbeResult {
	if p.stop != nil {
		p.stop()
		<-p.done
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return ProbeResult{SteadyP99: p.steady, Bound: p.Ctl.Bound, DuringP99: Percentile(p.during, 0.99), MaxPause: p.maxP,
		Samples: len(p.during), Slowdowns: p.Ctl.Slowdowns()}
}
