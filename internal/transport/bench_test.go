package transport

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kefirdb/kefir/internal/vr"
	"github.com/kefirdb/kefir/internal/wire"
)

// Benchmarks, loopback, both ends in this process:
//
//	go test -run '^$' -bench . -benchmem ./internal/transport/
//
// PingPong/raw-tcp is the floor: one goroutine per end, blocking
// write/read of the same frame bytes on one TCP connection, no queue, no
// handoff. PingPong/transport is a request/response through two transports
// (Send → writer goroutine → TCP → reader goroutine → Handler, and back).
// Both report µs per round trip; ns/op is the same figure.

func heartbeat(from, to uint64) *vr.Message {
	return &vr.Message{Type: vr.MsgCommit, Cluster: 7, From: from, To: to, View: 3, Op: 1000, Commit: 999, HBSeq: 5}
}

func prepare(from, to uint64, entries, size int) *vr.Message {
	m := &vr.Message{Type: vr.MsgPrepare, Cluster: 7, From: from, To: to, View: 3, Op: 1000, Commit: 999, First: 1000 - uint64(entries) + 1}
	data := make([]byte, size)
	for i := range entries {
		m.Entries = append(m.Entries, vr.Entry{View: 3, Op: m.First + uint64(i), Request: vr.Request{Client: 42, ReqNum: uint64(i), Data: data}})
	}
	return m
}

// rawEcho returns a loopback TCP connection whose other end, a goroutine,
// echoes every size bytes it reads: the raw-TCP floor of the ping-pong
// benchmarks. Both close when the benchmark ends.
func rawEcho(b *testing.B, size int) net.Conn {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(nc, buf); err != nil {
				return
			}
			if _, err := nc.Write(buf); err != nil {
				return
			}
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	return nc
}

func BenchmarkPingPong(b *testing.B) {
	b.Run("raw-tcp", func(b *testing.B) {
		frame := wire.AppendFrame(nil, heartbeat(1, 2))
		nc := rawEcho(b, len(frame))
		buf := make([]byte, len(frame))
		b.ResetTimer()
		for range b.N {
			if _, err := nc.Write(frame); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(nc, buf); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/rtt")
	})
	b.Run("transport", func(b *testing.B) {
		pong := make(chan struct{}, 1)
		var echo *Endpoint
		nodes := cluster(b, 2, func(c *vrConfig) {
			if c.Self == 1 {
				c.Handler = func(uint64, []vr.Message) { pong <- struct{}{} }
			} else {
				c.Handler = func(from uint64, msgs []vr.Message) {
					for range msgs {
						_ = echo.Send(from, wire.Payload(heartbeat(2, 1)))
					}
				}
			}
		})
		echo = nodes[1].tr.ep()
		ping := heartbeat(1, 2)
		// Warm up: both connections dialed.
		mustSend(b, nodes[0].tr, 2, ping)
		<-pong
		// A driver holds its endpoint and sends its messages through it.
		ep, p := nodes[0].tr.ep(), wire.Payload(ping)
		b.ResetTimer()
		for range b.N {
			_ = ep.Send(2, p)
			<-pong
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/rtt")
	})
}

// BenchmarkPingPongSideBySide alternates blocks of 64 round trips over raw
// TCP, over two transports with Send (writer goroutine on each hop), and
// with SendAll (inline write when the writer is parked), so all three
// figures come from the same moments of a shared, noisy machine. It reports
// each mean and the ratios to raw TCP.
func BenchmarkPingPongSideBySide(b *testing.B) {
	frame := wire.AppendFrame(nil, heartbeat(1, 2))
	raw := rawEcho(b, len(frame))
	rbuf := make([]byte, len(frame))

	pong := make(chan struct{}, 1)
	var echo *Endpoint
	var inline atomic.Bool
	reply := []Outbound{{To: 1, Msg: wire.Payload(heartbeat(2, 1))}}
	nodes := cluster(b, 2, func(c *vrConfig) {
		if c.Self == 1 {
			c.Handler = func(uint64, []vr.Message) { pong <- struct{}{} }
		} else {
			c.Handler = func(from uint64, msgs []vr.Message) {
				for range msgs {
					if inline.Load() {
						_ = echo.SendAll(reply)
					} else {
						_ = echo.Send(from, reply[0].Msg)
					}
				}
			}
		}
	})
	echo = nodes[1].tr.ep()
	a := nodes[0].tr
	ping := heartbeat(1, 2)
	mustSend(b, a, 2, ping)
	<-pong
	// A driver holds its endpoint and sends its messages through it.
	ep := a.ep()
	pings := []Outbound{{To: 2, Msg: wire.Payload(ping)}}

	const block = 64
	var rawTime, sendTime, allTime time.Duration
	rounds := 0
	b.ResetTimer()
	for done := 0; done < b.N; done += 3 * block {
		t0 := time.Now()
		for range block {
			if _, err := raw.Write(frame); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(raw, rbuf); err != nil {
				b.Fatal(err)
			}
		}
		t1 := time.Now()
		inline.Store(false)
		for range block {
			_ = ep.Send(2, pings[0].Msg)
			<-pong
		}
		t2 := time.Now()
		inline.Store(true)
		for range block {
			_ = ep.SendAll(pings)
			<-pong
		}
		t3 := time.Now()
		rawTime += t1.Sub(t0)
		sendTime += t2.Sub(t1)
		allTime += t3.Sub(t2)
		rounds += block
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(rounds) / 1e3 }
	b.ReportMetric(us(rawTime), "raw-µs/rtt")
	b.ReportMetric(us(sendTime), "send-µs/rtt")
	b.ReportMetric(us(allTime), "sendall-µs/rtt")
	b.ReportMetric(float64(sendTime)/float64(rawTime), "send/raw")
	b.ReportMetric(float64(allTime)/float64(rawTime), "sendall/raw")
}

// BenchmarkStream measures one-way message throughput 1 → 2 with up to
// `window` messages in flight (the receiver's count paces the sender, so
// nothing is dropped).
func BenchmarkStream(b *testing.B) {
	for _, tc := range []struct {
		name string
		m    *vr.Message
	}{
		{"heartbeat", heartbeat(1, 2)},
		{"prepare-16x128B", prepare(1, 2, 16, 128)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			const window = 2048
			var received atomic.Int64
			more := make(chan struct{}, 1)
			nodes := cluster(b, 2, func(c *vrConfig) {
				c.QueueLen = 2 * window
				if c.Self == 2 {
					c.Handler = func(_ uint64, msgs []vr.Message) {
						received.Add(int64(len(msgs)))
						select {
						case more <- struct{}{}:
						default:
						}
					}
				}
			})
			tr := nodes[0].tr
			ep, p := tr.ep(), wire.Payload(tc.m) // as a driver holds them
			b.SetBytes(int64(len(wire.AppendFrame(nil, tc.m))))
			b.ReportAllocs()
			b.ResetTimer()
			for i := range int64(b.N) {
				for i-received.Load() >= window {
					select {
					case <-more:
					case <-time.After(time.Second):
					}
				}
				_ = ep.Send(2, p)
			}
			for received.Load() < int64(b.N) {
				<-more
			}
			b.StopTimer()
			s := tr.Stats().Link(2)
			if s.Dropped != 0 {
				b.Fatalf("%d dropped", s.Dropped)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(s.Sent)/float64(max(s.Batches, 1)), "msgs/write")
		})
	}
}

// BenchmarkSend is the cost on the driver's goroutine (encode and enqueue)
// plus the writer's, against a peer that authenticates and then discards
// the bytes (no decode on the other end to compete for the CPU).
func BenchmarkSend(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				if _, _, _, err := acceptHandshake(nc, testSecret, Identity{Node: 2, Cluster: 7, ConfigHash: derivedHash(7, 1, map[uint64]string{2: ""})}, 2, func(id uint64) bool { return id == 1 }, nil); err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, nc)
			}()
		}
	}()
	tr, err := newVR(vrConfig{Config: Config{Self: 1, Peers: map[uint64]string{2: ln.Addr().String()}, ClusterSecret: testSecret, Cluster: 7, QueueLen: 1 << 16}, Handler: func(uint64, []vr.Message) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	ep, m := tr.ep(), wire.Payload(heartbeat(1, 2)) // as a driver holds them
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		_ = ep.Send(2, m)
		if i%4096 == 4095 {
			// Pace to the writer so the figure is not a count of drops.
			for tr.Stats().Link(2).Queued > 1<<15 {
				time.Sleep(10 * time.Microsecond)
			}
		}
	}
	b.StopTimer()
	s := tr.Stats().Link(2)
	b.ReportMetric(float64(s.Sent)/float64(max(s.Batches, 1)), "msgs/write")
	b.ReportMetric(float64(s.Dropped)/float64(b.N), "dropped/op")
}
