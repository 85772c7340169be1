// Package limits measures this machine's physical floors that every benchmark row is
// judged against (issue 8 §6, ARCHITECTURE §10): the loopback TCP round trip (no
// network request can beat it) and the latency of a small write plus fdatasync (no
// durable write can beat it).
//
// It must not import any Kefir package.
package limits

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// Result holds the medians and 99th percentiles in microseconds.
type Result struct {
	LoopbackRTTP50us float64 `json:"loopback_rtt_p50_us"`
	LoopbackRTTP99us float64 `json:"loopback_rtt_p99_us"`
	FsyncP50us       float64 `json:"fsync_4k_p50_us"`
	FsyncP99us       float64 `json:"fsync_4k_p99_us"`
}

// String is a one-line summary for reports.
func (r Result) String() string {
	return fmt.Sprintf("loopback round trip p50 %.1f µs (p99 %.1f); 4 KiB write+fdatasync p50 %.0f µs (p99 %.0f)",
		r.LoopbackRTTP50us, r.LoopbackRTTP99us, r.FsyncP50us, r.FsyncP99us)
}

// Measure runs both probes: n round trips and n synced writes in dir.
func Measure(dir string, n int) (Result, error) {
	var r Result
	rtt, err := LoopbackRTT(n)
	if err != nil {
		return r, err
	}
	fs, err := FsyncLatency(dir, n)
	if err != nil {
		return r, err
	}
	r.LoopbackRTTP50us, r.LoopbackRTTP99us = pct(rtt, 50), pct(rtt, 99)
	r.FsyncP50us, r.FsyncP99us = pct(fs, 50), pct(fs, 99)
	return r, nil
}

func pct(ds []time.Duration, p float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return float64(s[i]) / 1e3
}

// LoopbackRTT returns n ping-pong round trips of 1 byte over a loopback TCP connection.
func LoopbackRTT(n int) ([]time.Duration, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var b [1]byte
	out := make([]time.Duration, 0, n)
	for i := 0; i < n+n/10; i++ {
		t := time.Now()
		if _, err := c.Write(b[:]); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return nil, err
		}
		if i >= n/10 { // the first tenth warms up
			out = append(out, time.Since(t))
		}
	}
	return out, nil
}

// FsyncLatency returns n latencies of appending 4 KiB to a file in dir and fdatasyncing it.
func FsyncLatency(dir string, n int) ([]time.Duration, error) {
	f, err := os.CreateTemp(dir, "limits-fsync-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	out := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if _, err := f.Write(buf); err != nil {
			return nil, err
		}
		if err := fdatasync(f); err != nil {
			return nil, fmt.Errorf("fdatasync %s: %w", filepath.Base(f.Name()), err)
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
