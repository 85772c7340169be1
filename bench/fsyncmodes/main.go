// Command fsyncmodes measures fdatasync latency after a small write in three ways a log
// can grow its file: appending to a file preallocated with fallocate(KEEP_SIZE) (Kefir's
// storage WAL today), appending to a plain file (the replication WAL today), and
// overwriting a segment that was zero-filled and synced in advance. An append changes
// the file's size, so fdatasync must also journal the inode; an overwrite of written
// blocks does not. Rounds alternate the modes, because this machine's disk is shared.
//
//	go run ./fsyncmodes -dir /work/main -n 2000 -rounds 3
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

type mode int

const (
	keepSize mode = iota
	plain
	zeroFilled
)

func (m mode) String() string {
	return [...]string{"append, fallocate(KEEP_SIZE)", "append, plain file", "overwrite, zero-filled"}[m]
}

func main() {
	dir := flag.String("dir", ".", "directory on the disk to measure (files are removed afterwards)")
	n := flag.Int("n", 2000, "fsyncs per mode and round")
	rounds := flag.Int("rounds", 3, "rounds; each runs every mode once")
	size := flag.Int("write", 2800, "bytes written before each fsync (≈ 50 SETs of Kefir's storage WAL)")
	seg := flag.Int64("segment", 64<<20, "segment size for the preallocated and zero-filled modes")
	flag.Parse()
	if int64(*n)*int64(*size) > *seg {
		log.Fatalf("fsyncmodes: %d writes of %d bytes do not fit a %d-byte segment", *n, *size, *seg)
	}
	for r := 1; r <= *rounds; r++ {
		fmt.Printf("round %d:", r)
		for _, m := range []mode{keepSize, plain, zeroFilled} {
			p50, p99, err := run(filepath.Join(*dir, fmt.Sprintf(".fsyncmodes-%d", m)), m, *n, *size, *seg)
			if err != nil {
				log.Fatalf("fsyncmodes: %v: %v", m, err)
			}
			fmt.Printf("  %s p50 %v p99 %v;", m, p50.Round(time.Microsecond), p99.Round(time.Microsecond))
		}
		fmt.Println()
	}
}

func run(name string, m mode, n, size int, seg int64) (p50, p99 time.Duration, err error) {
	f, err := os.Create(name)
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(name)
	defer f.Close()
	switch m {
	case keepSize:
		if err := syscall.Fallocate(int(f.Fd()), 1 /* FALLOC_FL_KEEP_SIZE */, 0, seg); err != nil {
			return 0, 0, fmt.Errorf("fallocate: %w", err)
		}
	case zeroFilled:
		zero := make([]byte, 1<<20)
		for off := int64(0); off < seg; off += int64(len(zero)) {
			if _, err := f.Write(zero[:min(int64(len(zero)), seg-off)]); err != nil {
				return 0, 0, err
			}
		}
		if _, err := f.Seek(0, 0); err != nil {
			return 0, 0, err
		}
	}
	if err := f.Sync(); err != nil {
		return 0, 0, err
	}
	rec := make([]byte, size)
	ds := make([]time.Duration, 0, n)
	for range n {
		if _, err := f.Write(rec); err != nil {
			return 0, 0, err
		}
		t := time.Now()
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return 0, 0, fmt.Errorf("fdatasync: %w", err)
		}
		ds = append(ds, time.Since(t))
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100], nil
}
