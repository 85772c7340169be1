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
)

func main() {
	mode := flag.String("mode", "append", "append, overwrite or fallocate")
	n := flag.Int("n", 3, "files written at once")
	d := flag.Duration("d", 3*time.Second, "duration")
	size := flag.Int("size", 4096, "bytes written before each fdatasync")
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
	res := make([][]time.Duration, *n)
	errs := make([]error, *n)
	var wg sync.WaitGroup
	for i := range *n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = loop(filepath.Join(*dir, fmt.Sprintf("f%d", i)), *mode, *size, prealloc, *d)
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
	fmt.Printf("%s n=%d size=%d: %d fdatasyncs, p50 %v p90 %v p99 %v\n", *mode, *n, *size, len(all), q(0.5), q(0.9), q(0.99))
}

// loop writes size bytes and fdatasyncs name until d has passed (or prealloc bytes
// are used) and returns each fdatasync's duration.
func loop(name, mode string, size int, prealloc int64, d time.Duration) ([]time.Duration, error) {
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
	buf := make([]byte, size)
	var out []time.Duration
	end := time.Now().Add(d)
	for off := int64(0); time.Now().Before(end) && off+int64(size) <= prealloc; off += int64(size) {
		if _, err := f.WriteAt(buf, off); err != nil {
			return nil, fmt.Errorf("write: %w", err)
		}
		t := time.Now()
		if err := syscall.Fdatasync(fd); err != nil {
			return nil, fmt.Errorf("fdatasync: %w", err)
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fsyncloop:", err)
	os.Exit(1)
}
