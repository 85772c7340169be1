//go:build linux

// Command fsyncloop measures what one log fsync costs on this disk for the three
// ways a WAL can grow (docs/design/cad.md §9): each of -n files (three replicas on one
// disk: -n 3) is written in a loop, -size bytes then fdatasync, for -d, and the
// fdatasync calls' percentiles are printed.
//
//	-mode append     the file grows: every fdatasync commits the file system's journal
//	-mode overwrite  the bytes were written (zeros) and synced beforehand: no metadata
//	-mode fallocate  the space was fallocated but never written: the extents change
//
// With -size below a page (the replication WAL's sync batches are a few hundred bytes:
// docs/design/write-path.md) the loop mimics the log's in-place steps; then
//
//	-pad       each batch starts on a fresh 4 KiB page (the tail of the previous page is
//	           left as it is): no page is written twice
//	-gap D     pause D between a sync and the next write: ext4 updates a file's mtime
//	           at most once a clock tick (4 ms here), and without a journal an
//	           fdatasync then writes the inode's block too (docs/design/write-path.md);
//	           a log synced at a slower rate pays that more often
//	-sync how  fdatasync (default); dsync: pwritev2(RWF_DSYNC), write and sync in one call;
//	           odsync: the file opened O_DSYNC, every write synchronous
//
// With -stagger D the files sync in rounds, as one replicated write does: file 0 (the
// leader's log) writes and syncs at the round's start, the others (the followers') D
// later (a network hop), and the next round starts when all are done; the syncs'
// percentiles are printed per file. A device flush that is running when another is
// asked for must finish before the next one starts, so a follower's fdatasync can wait
// for the rest of the leader's as well as its own.
//
// Run it under the bench lock: flock /tmp/kefir-bench.lock go run ./cadbench/fsyncloop
// -mode append -n 3 (from bench/).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	mode := flag.String("mode", "append", "append, overwrite or fallocate")
	n := flag.Int("n", 3, "files written at once")
	d := flag.Duration("d", 3*time.Second, "duration")
	size := flag.Int("size", 4096, "bytes written before each fdatasync")
	pad := flag.Bool("pad", false, "start each batch on a fresh 4 KiB page")
	zeros := flag.Bool("zeros", false, "write zeros (as this probe did before 2026-12-05) instead of data")
	how := flag.String("sync", "fdatasync", "fdatasync, dsync (pwritev2 RWF_DSYNC) or odsync (O_DSYNC)")
	gap := flag.Duration("gap", 0, "pause between a sync and the next write (a replica's log syncs every ~1 ms at one client)")
	stagger := flag.Duration("stagger", -1, "sync in rounds, files 1..n-1 this long after file 0 (-1: free-running loops)")
	dir := flag.String("dir", "", "directory for the files (default: a new one under TMPDIR)")
	flag.Parse()
	if *dir == "" {
		var err error
		if *dir, err = os.MkdirTemp("", "fsyncloop"); err != nil {
			fail(err)
		}
		defer os.RemoveAll(*dir)
	}
	const prealloc = 64 << 20
	if *stagger >= 0 {
		if err := rounds(*dir, *n, *size, prealloc, *d, *stagger); err != nil {
			fail(err)
		}
		return
	}
	res := make([][]time.Duration, *n)
	errs := make([]error, *n)
	var wg sync.WaitGroup
	for i := range *n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = loop(filepath.Join(*dir, fmt.Sprintf("f%d", i)), *mode, *size, prealloc, *d, *gap, *pad, *zeros, *how)
		}()
	}
	wg.Wait()
	var all []time.Duration
	for i, r := range res {
		if errs[i] != nil {
			fail(errs[i])
		}
		all = append(all, r...)
	}
	if len(all) == 0 {
		fail(fmt.Errorf("no fdatasync completed"))
	}
	slices.Sort(all)
	q := func(p float64) time.Duration { return all[int(p*float64(len(all)-1))] }
	fmt.Printf("%s n=%d size=%d pad=%v zeros=%v sync=%s: %d syncs, p50 %v p90 %v p99 %v\n", *mode, *n, *size, *pad, *zeros, *how, len(all), q(0.5), q(0.9), q(0.99))
}

// loop writes size bytes and syncs name until d has passed (or prealloc bytes are
// used) and returns each sync's duration (with -sync dsync or odsync, the write's,
// which includes the sync).
func loop(name, mode string, size int, prealloc int64, d, gap time.Duration, pad, zeros bool, how string) ([]time.Duration, error) {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fd := int(f.Fd())
	switch mode {
	case "append":
	case "overwrite":
		if _, err := f.WriteAt(make([]byte, prealloc), 0); err != nil {
			return nil, fmt.Errorf("zero-fill: %w", err)
		}
	case "fallocate":
		if err := syscall.Fallocate(fd, 0, 0, prealloc); err != nil {
			return nil, fmt.Errorf("fallocate: %w", err)
		}
	default:
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	if err := syscall.Fdatasync(fd); err != nil {
		return nil, fmt.Errorf("fdatasync: %w", err)
	}
	if how == "odsync" {
		g, err := os.OpenFile(name, os.O_RDWR|unix.O_DSYNC, 0)
		if err != nil {
			return nil, err
		}
		defer g.Close()
		fd = int(g.Fd())
	}
	buf := make([]byte, size)
	for i := range buf {
		if !zeros {
			buf[i] = byte(i) | 1 // the log writes records, not zeros
		}
	}
	step := int64(size)
	if pad {
		step = (step + 4095) / 4096 * 4096
	}
	var out []time.Duration
	end := time.Now().Add(d)
	for off := int64(0); time.Now().Before(end) && off+int64(size) <= prealloc; off += step {
		if gap > 0 {
			time.Sleep(gap)
		}
		if how == "dsync" {
			t := time.Now()
			if _, err := unix.Pwritev2(fd, [][]byte{buf}, off, unix.RWF_DSYNC); err != nil {
				return nil, fmt.Errorf("pwritev2: %w", err)
			}
			out = append(out, time.Since(t))
			continue
		}
		t := time.Now()
		if _, err := syscall.Pwrite(fd, buf, off); err != nil {
			return nil, fmt.Errorf("write: %w", err)
		}
		if how == "odsync" {
			out = append(out, time.Since(t))
			continue
		}
		t = time.Now()
		if err := syscall.Fdatasync(fd); err != nil {
			return nil, fmt.Errorf("fdatasync: %w", err)
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// rounds runs -stagger: n zero-filled files, size bytes then fdatasync each, file 0 at
// the start of a round and the others stagger later, for d.
func rounds(dir string, n, size int, prealloc int64, d, stagger time.Duration) error {
	fds := make([]int, n)
	for i := range n {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteAt(make([]byte, prealloc), 0); err != nil {
			return fmt.Errorf("zero-fill: %w", err)
		}
		if err := f.Sync(); err != nil {
			return err
		}
		fds[i] = int(f.Fd())
	}
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i) | 1
	}
	res := make([][]time.Duration, n)
	errs := make([]error, n)
	end := time.Now().Add(d)
	for off := int64(0); time.Now().Before(end) && off+int64(size) <= prealloc; off += int64(size) {
		start := time.Now()
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i > 0 {
					for time.Since(start) < stagger {
						// spin: a sleep this short oversleeps by tens of µs
					}
				}
				if _, err := syscall.Pwrite(fds[i], buf, off); err != nil {
					errs[i] = err
					return
				}
				t := time.Now()
				if err := syscall.Fdatasync(fds[i]); err != nil {
					errs[i] = err
					return
				}
				res[i] = append(res[i], time.Since(t))
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
	}
	for i, r := range res {
		slices.Sort(r)
		q := func(p float64) time.Duration { return r[int(p*float64(len(r)-1))] }
		fmt.Printf("stagger=%v size=%d file %d: %d fdatasyncs, p50 %v p90 %v\n", stagger, size, i, len(r), q(0.5), q(0.9))
	}
	return nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fsyncloop:", err)
	os.Exit(1)
}
