// Command reshardvs is the client side of bench/reshard-vs.sh (issue 28,
// "Performance"): against one cluster — Redis Cluster or Kefir groups, both
// spoken to by the same go-redis ClusterClient — it loads N keys of S bytes,
// runs a closed-loop GET/SET workload, starts a slot move (a shell command:
// `redis-cli --cluster reshard …` or `kefir cluster move-slots …`) once the
// steady window has passed, keeps the load on until a while after the move
// finished, and reports per second and per phase: throughput, p50/p99/max,
// errors, and the servers' CPU seconds (from /proc/PID/stat) in each phase.
//
// Every operation's completion time and latency are kept (16 bytes each), so
// the phases are cut exactly at the move's start and end rather than at
// whole seconds.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kefirdb/kefir/internal/kv"
	"github.com/redis/go-redis/v9"
)

type sample struct {
	at  time.Duration // completion, since the workload's start
	lat time.Duration
	err bool
}

func main() {
	name := flag.String("system", "", "the row's name")
	addrs := flag.String("addrs", "", "client addresses of the cluster's nodes, comma-separated")
	pids := flag.String("pids", "", "the servers' process ids, comma-separated (CPU from /proc)")
	keys := flag.Int("keys", 50000, "keys loaded (key:%09d)")
	size := flag.Int("size", 64, "value bytes")
	clients := flag.Int("c", 16, "closed-loop clients")
	reads := flag.Float64("reads", 0.5, "fraction of GETs (the rest SETs of a whole value)")
	warm := flag.Duration("warm", 2*time.Second, "load before the steady window (not counted)")
	steady := flag.Duration("steady", 10*time.Second, "the steady window, before the move")
	after := flag.Duration("after", 3*time.Second, "load after the move finished")
	move := flag.String("move", "", "shell command that moves the slots")
	moveTimeout := flag.Duration("move-timeout", 10*time.Minute, "bound on the move")
	lastSlot := flag.Int("moved-slots-end", 5460, "the moved slots are 0..this (for the data size)")
	jsonOut := flag.String("json", "", "append the summary as one JSON line to this file")
	flag.Parse()
	if *addrs == "" || *move == "" {
		fmt.Fprintln(os.Stderr, "reshardvs: need -addrs and -move")
		os.Exit(2)
	}
	if err := run(*name, strings.Split(*addrs, ","), parsePids(*pids), *keys, *size, *clients, *reads, *warm, *steady, *after, *move, *moveTimeout, *lastSlot, *jsonOut); err != nil {
		fmt.Fprintln(os.Stderr, "reshardvs:", err)
		os.Exit(1)
	}
}

func parsePids(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if p, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func key(i int) string { return fmt.Sprintf("key:%09d", i) }

func run(name string, addrs []string, pids []int, nkeys, size, clients int, reads float64, warm, steady, after time.Duration,
	move string, moveTimeout time.Duration, lastSlot int, jsonOut string) error {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: 16, PoolSize: clients + 8,
		ReadTimeout: 15 * time.Second, WriteTimeout: 15 * time.Second})
	defer rdb.Close()
	ctx := context.Background()
	val := bytes.Repeat([]byte("v"), size)

	// Load, pipelined per node by the client; and count the moved slots' keys.
	t0 := time.Now()
	moved := 0
	for i := range nkeys {
		if int(kv.KeySlot([]byte(key(i)))) <= lastSlot {
			moved++
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var loadErr atomic.Value
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := int(next.Add(500)) - 500
				if lo >= nkeys {
					return
				}
				p := rdb.Pipeline()
				for i := lo; i < min(lo+500, nkeys); i++ {
					p.Set(ctx, key(i), val, 0)
				}
				if _, err := p.Exec(ctx); err != nil {
					loadErr.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := loadErr.Load().(error); err != nil {
		return fmt.Errorf("load: %w", err)
	}
	fmt.Printf("%s: loaded %d keys of %d B in %.1f s; %d keys (%.1f MB of values) in slots 0-%d\n",
		name, nkeys, size, time.Since(t0).Seconds(), moved, float64(moved*size)/1e6, lastSlot)

	// The workload.
	start := time.Now()
	var stop atomic.Bool
	per := make([][]sample, clients)
	errMsgs := make([]map[string]int, clients)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(c), 77))
			buf := make([]sample, 0, 1<<16)
			msgs := map[string]int{}
			for !stop.Load() {
				k := key(r.IntN(nkeys))
				t := time.Now()
				var err error
				if r.Float64() < reads {
					err = rdb.Get(ctx, k).Err()
				} else {
					err = rdb.Set(ctx, k, val, 0).Err()
				}
				now := time.Now()
				bad := err != nil && !errors.Is(err, redis.Nil)
				buf = append(buf, sample{at: now.Sub(start), lat: now.Sub(t), err: bad})
				if bad {
					msgs[fmt.Sprintf("%.1fs %v", now.Sub(start).Seconds(), err)]++
					time.Sleep(10 * time.Millisecond)
				}
			}
			per[c], errMsgs[c] = buf, msgs
		}()
	}
	time.Sleep(warm)
	cpuSteady0 := cpuOf(pids)
	steadyFrom := time.Since(start)
	time.Sleep(steady)
	cpuMove0 := cpuOf(pids)
	moveFrom := time.Since(start)
	mctx, cancel := context.WithTimeout(ctx, moveTimeout)
	cmd := exec.CommandContext(mctx, "sh", "-c", move)
	var mout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &mout, &mout
	moveErr := cmd.Run()
	cancel()
	moveTo := time.Since(start)
	cpuMove1 := cpuOf(pids)
	var moverCPU time.Duration
	if cmd.ProcessState != nil {
		moverCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	time.Sleep(after)
	stop.Store(true)
	wg.Wait()
	end := time.Since(start)

	var all []sample
	for _, b := range per {
		all = append(all, b...)
	}
	slices.SortFunc(all, func(a, b sample) int { return int(a.at - b.at) })

	// Per second.
	fmt.Printf("%s: per second (s since start, phase, ops/s, p50 ms, p99 ms, max ms, errors)\n", name)
	for s := time.Duration(0); s < end; s += time.Second {
		ph := "warm"
		switch {
		case s+time.Second <= steadyFrom:
		case s >= moveFrom && s < moveTo:
			ph = "move"
		case s+time.Second > moveFrom && s < moveTo:
			ph = "move*"
		case s >= moveTo:
			ph = "after"
		default:
			ph = "steady"
		}
		st := stats(window(all, s, s+time.Second), min(time.Second, end-s))
		fmt.Printf("  %3d %-6s %7.0f %7.2f %7.2f %8.1f %d\n", int(s/time.Second), ph, st.rate, ms(st.p50), ms(st.p99), ms(st.max), st.errs)
	}
	sd, mv := stats(window(all, steadyFrom, moveFrom), moveFrom-steadyFrom), stats(window(all, moveFrom, moveTo), moveTo-moveFrom)
	// After the move: a second look at the steady state, for a box whose
	// other load drifts (a ratio far from after_ops ÷ steady_ops is noise).
	af := stats(window(all, moveTo, end), end-moveTo)
	cpuSteady := (cpuMove0 - cpuSteady0).Seconds()
	cpuMove := (cpuMove1 - cpuMove0).Seconds()
	sum := map[string]any{
		"system": name, "keys": nkeys, "value_bytes": size, "clients": clients, "reads": reads,
		"moved_keys": moved, "moved_value_mb": float64(moved*size) / 1e6,
		"steady_ops": sd.rate, "move_ops": mv.rate, "ratio": mv.rate / sd.rate,
		"steady_p50_ms": ms(sd.p50), "steady_p99_ms": ms(sd.p99), "steady_max_ms": ms(sd.max),
		"move_p50_ms": ms(mv.p50), "move_p99_ms": ms(mv.p99), "move_max_ms": ms(mv.max),
		"p99_ratio": float64(mv.p99) / float64(sd.p99),
		"move_s":    (moveTo - moveFrom).Seconds(), "move_errors": mv.errs, "steady_errors": sd.errs,
		"server_cpu_s_move": cpuMove, "server_cores_move": cpuMove / (moveTo - moveFrom).Seconds(),
		"server_cores_steady": cpuSteady / (moveFrom - steadyFrom).Seconds(),
		"mover_cpu_s":         moverCPU.Seconds(), "move_ok": moveErr == nil,
		"after_ops": af.rate, "after_p99_ms": ms(af.p99),
	}
	fmt.Printf("%s: after the move %.0f ops/s (p99 %.2f ms)\n", name, af.rate, ms(af.p99))
	fmt.Printf("%s: steady %.0f ops/s (p50 %.2f p99 %.2f max %.1f ms), during the move %.0f ops/s = %.2f× (p50 %.2f p99 %.2f = %.2f× max %.1f ms), %d errors during / %d steady;"+
		" move %.2f s for %d keys (%.1f MB of values); server CPU %.2f s during the move (%.2f cores, steady %.2f cores), the mover %.2f s\n",
		name, sd.rate, ms(sd.p50), ms(sd.p99), ms(sd.max), mv.rate, mv.rate/sd.rate, ms(mv.p50), ms(mv.p99), float64(mv.p99)/float64(sd.p99), ms(mv.max),
		mv.errs, sd.errs, (moveTo - moveFrom).Seconds(), moved, float64(moved*size)/1e6, cpuMove, cpuMove/(moveTo-moveFrom).Seconds(),
		cpuSteady/(moveFrom-steadyFrom).Seconds(), moverCPU.Seconds())
	printed := 0
	for _, m := range errMsgs {
		for e, n := range m {
			if printed++; printed <= 20 {
				fmt.Printf("%s: error ×%d at %s\n", name, n, e)
			}
		}
	}
	out := strings.TrimSpace(mout.String())
	if len(out) > 2000 {
		out = "…" + out[len(out)-2000:]
	}
	fmt.Printf("%s: the move's output (tail):\n%s\n", name, out)
	if jsonOut != "" {
		f, err := os.OpenFile(jsonOut, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		b, _ := json.Marshal(sum)
		_, err = f.Write(append(b, '\n'))
		f.Close()
		if err != nil {
			return err
		}
	}
	if moveErr != nil {
		return fmt.Errorf("the move (%s): %w", move, moveErr)
	}
	return nil
}

// window returns the samples that completed in [from, to) (all is sorted).
func window(all []sample, from, to time.Duration) []sample {
	i, _ := slices.BinarySearchFunc(all, from, func(s sample, t time.Duration) int { return int(s.at - t) })
	j, _ := slices.BinarySearchFunc(all, to, func(s sample, t time.Duration) int { return int(s.at - t) })
	return all[i:j]
}

type phase struct {
	rate          float64
	p50, p99, max time.Duration
	errs          int
}

// stats of ss, completed over a window of span.
func stats(ss []sample, span time.Duration) phase {
	if len(ss) == 0 || span <= 0 {
		return phase{}
	}
	lats := make([]time.Duration, len(ss))
	var p phase
	for i, s := range ss {
		lats[i] = s.lat
		if s.err {
			p.errs++
		}
	}
	slices.Sort(lats)
	p.rate = float64(len(ss)-p.errs) / span.Seconds()
	p.p50 = lats[len(lats)/2]
	p.p99 = lats[len(lats)*99/100]
	p.max = lats[len(lats)-1]
	return p
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// cpuOf sums user and system time of pids (and their reaped children) from
// /proc/PID/stat.
func cpuOf(pids []int) time.Duration {
	hz := 100.0 // USER_HZ on Linux
	var ticks float64
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// Fields after the command: state is f[0]; utime, stime are fields 14, 15 of stat (f[11], f[12]).
		for _, i := range []int{11, 12} {
			v, _ := strconv.ParseFloat(f[i], 64)
			ticks += v
		}
	}
	return time.Duration(ticks / hz * float64(time.Second))
}
