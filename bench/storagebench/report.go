package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/kefirdb/kefir/bench/stats"
)

// Markdown renders the report: one row per cell, medians per engine, Kefir's ratio to
// Pebble and whether issue 2's target is met.
func (r *Report) Markdown() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "Command (from `bench/`): `%s`  \n", r.Command)
	fmt.Fprintf(&sb, "Started %s, took %s; %v; load average at start %v; Kefir at %v; medians of %v runs, engines interleaved cell by cell.\n\n",
		r.Started.Format("2006-01-02 15:04 UTC"), r.Elapsed, r.Machine["summary"], r.Machine["loadavg_at_start"], r.Machine["kefir_tree"], r.Config["runs"])
	if r.Limits != nil {
		fmt.Fprintf(&sb, "Physical floors on this machine, measured at the start: %s. One writer cannot exceed 1 / (write+fsync latency) durable puts per second.\n\n", r.Limits)
	}
	sb.WriteString("| workload | unit |")
	for _, e := range r.Engines {
		fmt.Fprintf(&sb, " %s |", e)
	}
	sb.WriteString(" kefir ÷ pebble, median of per-run ratios (range) | target | met |\n|---|---|")
	for range r.Engines {
		sb.WriteString("---:|")
	}
	sb.WriteString("---:|---|---|\n")
	for _, c := range r.Cells {
		fmt.Fprintf(&sb, "| %s | %s |", c.Name, c.Unit)
		for _, e := range r.Engines {
			m, ok := stats.Median(c.Samples[e]), c.Samples[e] != nil
			if ok && c.Unit == "B/key" && m < 0 {
				// Less live heap than the key bytes: the engine keeps its data outside the
				// Go heap (mmap, manual allocation), which this figure cannot see.
				sb.WriteString(" off-heap |")
				continue
			}
			fmt.Fprintf(&sb, " %s |", fmtNum(m, ok))
		}
		k, kok := c.Samples["kefir"]
		_, pok := c.Samples["pebble"]
		rs := c.pairedRatios()
		ratio := ""
		if len(rs) > 0 {
			ratio = fmt.Sprintf("%.2f×", stats.Median(rs))
			if len(rs) > 1 {
				ratio += fmt.Sprintf(" (%.2f–%.2f)", slices.Min(rs), slices.Max(rs))
			}
		}
		target, met := "", ""
		if c.Target != nil {
			target = c.Target.Text
			if kok {
				met = "**no**"
				switch {
				case c.Target.RatioVsPebble > 0 && pok && len(rs) > 0 && stats.Median(rs) >= c.Target.RatioVsPebble:
					met = "yes"
				case c.Target.Max > 0 && stats.Median(k) <= c.Target.Max:
					met = "yes"
				}
			}
		}
		fmt.Fprintf(&sb, " %s | %s | %s |\n", ratio, target, met)
	}
	lat := false
	for _, c := range r.Cells {
		lat = lat || c.P50us != nil
	}
	if lat {
		sb.WriteString("\nLatency per operation, medians over runs of p50 / p99 (µs):\n\n| workload |")
		for _, e := range r.Engines {
			fmt.Fprintf(&sb, " %s |", e)
		}
		sb.WriteString("\n|---|")
		for range r.Engines {
			sb.WriteString("---:|")
		}
		sb.WriteString("\n")
		for _, c := range r.Cells {
			if c.P50us == nil {
				continue
			}
			fmt.Fprintf(&sb, "| %s |", c.Name)
			for _, e := range r.Engines {
				if c.P50us[e] == nil {
					sb.WriteString(" – |")
					continue
				}
				fmt.Fprintf(&sb, " %s / %s |", fmtNum(stats.Median(c.P50us[e]), true), fmtNum(stats.Median(c.P99us[e]), true))
			}
			sb.WriteString("\n")
		}
	}
	extra := false
	for _, c := range r.Cells {
		extra = extra || len(c.Extra) > 0
	}
	if extra {
		sb.WriteString("\nSecondary figures (medians):\n\n| workload | figure |")
		for _, e := range r.Engines {
			fmt.Fprintf(&sb, " %s |", e)
		}
		sb.WriteString("\n|---|---|")
		for range r.Engines {
			sb.WriteString("---:|")
		}
		sb.WriteString("\n")
		for _, c := range r.Cells {
			names := make([]string, 0, len(c.Extra))
			for name := range c.Extra {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				fmt.Fprintf(&sb, "| %s | %s |", c.Name, name)
				for _, e := range r.Engines {
					v, ok := c.Extra[name][e]
					fmt.Fprintf(&sb, " %s |", fmtNum(stats.Median(v), ok))
				}
				sb.WriteString("\n")
			}
		}
	}
	if len(r.Notes) > 0 {
		sb.WriteString("\nNotes:\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&sb, "- %s\n", n)
		}
	}
	return sb.String()
}

func fmtNum(v float64, ok bool) string {
	switch {
	case !ok:
		return "–"
	case v == 0:
		return "0"
	case v >= 100 || v <= -100:
		return fmt.Sprintf("%.0f", v)
	case v >= 1 || v <= -1:
		return fmt.Sprintf("%.3g", v)
	}
	return fmt.Sprintf("%.3f", v)
}

func notes(o *options) []string {
	return []string{
		"Durability is equal: a put returns only after an fsync covering it. Kefir: Append then Sync(pos) (concurrent Syncs share one fsync). Pebble: Set(k, v, pebble.Sync) (its commit pipeline group-commits synced writes: one WAL write and one fsync per group). bbolt: DB.Batch with MaxBatchSize = writers (one read-write transaction per batch; its commit fdatasyncs data pages, then the meta page: two syncs per group).",
		fmt.Sprintf("Keys are %d bytes (a hashed 8-byte prefix + an 8-byte id); put keys are fresh random ids, so puts are inserts into a growing database that starts empty.", keySize),
		fmt.Sprintf("Read cells use %s preloaded keys with %d-byte values, loaded in key order (Pebble then flushed and left to finish compactions); %d concurrent readers; every get's value is compared with what was loaded.", human(o.n), o.getValue, o.readers),
		fmt.Sprintf("Caches: Kefir value cache and Pebble block cache %d MiB each; bbolt reads through its mmap (OS page cache). Memory per key is measured with Kefir's value cache off, so it is the index.", o.cache>>20),
		"Memory per key: live Go heap after loading (after GC) minus the heap after opening the empty engine, divided by the number of keys, minus the 16 key bytes. Pebble keeps memtables outside the Go heap (manual allocation), and bbolt keeps nothing in the heap (mmap): for them the heap figure is not their footprint; the RSS (anon) line is.",
		"Reopen: Kefir writes its hint files (Checkpoint) before Close; the time is Open plus one verified Get.",
	}
}

func machineInfo(dir string) map[string]any {
	m := map[string]any{"cpus": runtime.NumCPU(), "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m["loadavg_at_start"] = strings.TrimSpace(string(b))
	}
	m["summary"] = fmt.Sprintf("%d CPUs, %s, %s", runtime.NumCPU(), runtime.Version(), m["kernel"])
	m["kefir_tree"] = kefirTree()
	m["dir"] = dir
	return m
}

// isTmpfs reports whether dir lives on tmpfs/ramfs, where fsync is free.
func isTmpfs(dir string) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false
	}
	const tmpfsMagic, ramfsMagic = 0x01021994, 0x858458f6
	return st.Type == tmpfsMagic || st.Type == ramfsMagic
}

// kefirTree names the Kefir source the engine was built from: the commit, and whether
// internal/storage had uncommitted changes (figures move with the engine; the report
// must say which engine produced them).
func kefirTree() string {
	wd, err := os.Getwd()
	if err != nil {
		return "unknown"
	}
	root := filepath.Dir(wd) // run from bench/
	head, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	s := strings.TrimSpace(string(head))
	if dirty, err := exec.Command("git", "-C", root, "status", "--porcelain", "--", "internal/storage").Output(); err == nil && len(dirty) > 0 {
		s += " + uncommitted changes in internal/storage"
	}
	return s
}

// pairedRatios returns Kefir's figure divided by Pebble's, run by run. The engines run
// back to back within a run, so a run's ratio cancels most of the machine's drift
// between runs (on a shared machine absolute figures swing several-fold from run to
// run while the paired ratio moves far less); the report judges targets on the median
// of these ratios.
func (c *Cell) pairedRatios() []float64 {
	k, p := c.Samples["kefir"], c.Samples["pebble"]
	var out []float64
	for i := range min(len(k), len(p)) {
		if k[i] > 0 && p[i] > 0 {
			out = append(out, k[i]/p[i])
		}
	}
	return out
}
