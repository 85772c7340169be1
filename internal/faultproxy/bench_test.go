package faultproxy

import (
	"bufio"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"
)

// BenchmarkRoundTrip sends one line through the proxy to an echo server and
// waits for it to come back, as a PING over an emulated link does. The ideal
// is 2 × the one-way delay plus the direct round trip; the benchmark reports
// the median (p50-µs), its excess over 2 × delay (over-ideal-%) and the CPU the
// whole process (proxy + echo + client) spent per round trip (cpu-µs/op).
//
//	flock /tmp/kefir-bench.lock go test -run - -bench RoundTrip -benchtime 2000x ./internal/faultproxy
func BenchmarkRoundTrip(b *testing.B) {
	for _, d := range []time.Duration{0, 250 * time.Microsecond, time.Millisecond} {
		b.Run("delay="+d.String(), func(b *testing.B) {
			e := newEcho(b)
			p, err := New(e.ln.Addr().String(), 1)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			p.Delay(Up, d, 0)
			p.Delay(Down, d, 0)
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			rd := bufio.NewReader(c)
			msg := []byte("PING\n")
			lat := make([]time.Duration, 0, b.N)
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := rd.ReadBytes('\n'); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			cpu := cpuTime() - cpu0
			slices.Sort(lat)
			p50 := lat[len(lat)/2]
			b.ReportMetric(float64(p50)/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100])/1e3, "p99-µs")
			if d > 0 {
				b.ReportMetric(100*float64(p50-2*d)/float64(2*d), "over-ideal-%")
			}
			b.ReportMetric(float64(cpu)/1e3/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
