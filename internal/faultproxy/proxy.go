// Package faultproxy is a TCP proxy that end-to-end tests put between Kefir
// processes (or between a client and a node) to inject network faults from Go:
// per-direction delay (fixed plus jitter), blackholing a direction (bytes
// vanish, the connection stays open, as under a partition), cutting every open
// connection, refusing new ones, and healing.
//
// TCP never reorders bytes, so delay is applied per chunk with release times
// kept monotonic within a connection: jitter varies latency, not order.
// Message-level reordering, duplication and loss belong to the simulator
// (internal/sim).
//
// It is test infrastructure: it imports only the standard library and no Kefir
// package, and it must not be imported by production code.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Direction is one half of a proxied connection.
type Direction int

const (
	// Up carries bytes from the connecting side to the upstream address.
	Up Direction = iota
	// Down carries bytes from upstream back to the connecting side.
	Down
)

func (d Direction) String() string {
	if d == Up {
		return "up"
	}
	return "down"
}

// Faults is the fault state of one direction.
type Faults struct {
	Delay     time.Duration // added to every chunk
	Jitter    time.Duration // plus a uniform random [0, Jitter)
	Blackhole bool          // discard bytes instead of forwarding them
}

// Stats counts what the proxy did.
type Stats struct {
	Accepted, Rejected, Cut int64
	Forwarded, Discarded    [2]int64 // bytes, indexed by Direction
}

// Proxy forwards connections accepted on Addr to an upstream address.
type Proxy struct {
	upstream string
	ln       net.Listener

	mu     sync.Mutex
	faults [2]Faults
	reject bool
	rng    *rand.Rand
	conns  map[*link]struct{}
	closed bool

	accepted, rejected, cut atomic.Int64
	forwarded, discarded    [2]atomic.Int64
	wg                      sync.WaitGroup
}

// link is one proxied connection pair.
type link struct {
	client, server net.Conn
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		l.server.Close()
	})
}

// New starts a proxy on 127.0.0.1 (a free port) forwarding to upstream. seed
// drives jitter, so delays are reproducible for a given arrival sequence.
func New(upstream string, seed uint64) (*Proxy, error) {
	return Listen("127.0.0.1:0", upstream, seed)
}

// Listen starts a proxy on listenAddr forwarding to upstream.
func Listen(listenAddr, upstream string, seed uint64) (*Proxy, error) {
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen %s: %w", listenAddr, err)
	}
	p := &Proxy{upstream: upstream, ln: ln, rng: rand.New(rand.NewPCG(seed, 0x70726f7879)), conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Upstream is the address the proxy forwards to.
func (p *Proxy) Upstream() string { return p.upstream }

// Set replaces the faults of one direction. Delay changes apply to bytes read
// from now on; bytes already queued keep their release time.
func (p *Proxy) Set(d Direction, f Faults) {
	p.mu.Lock()
	p.faults[d] = f
	p.mu.Unlock()
}

// Delay sets a direction's fixed delay and jitter, keeping its blackhole state.
func (p *Proxy) Delay(d Direction, fixed, jitter time.Duration) {
	p.mu.Lock()
	p.faults[d].Delay, p.faults[d].Jitter = fixed, jitter
	p.mu.Unlock()
}

// Blackhole makes a direction discard (on) or forward (off) bytes.
func (p *Proxy) Blackhole(d Direction, on bool) {
	p.mu.Lock()
	p.faults[d].Blackhole = on
	p.mu.Unlock()
}

// Partition blackholes both directions: the link is cut but connections stay
// open, as under a real partition (peers find out only by timeouts).
func (p *Proxy) Partition() {
	p.Blackhole(Up, true)
	p.Blackhole(Down, true)
}

// RejectNew makes the proxy close new connections as soon as they are
// accepted (on), or accept them again (off).
func (p *Proxy) RejectNew(on bool) {
	p.mu.Lock()
	p.reject = on
	p.mu.Unlock()
}

// CutAll closes every open connection (both sides see a reset or EOF). New
// connections are accepted unless RejectNew is on.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		p.cut.Add(1)
		l.close()
	}
}

// Heal removes every fault: no delay, no blackhole, new connections accepted.
// Bytes discarded while blackholed stay lost.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.faults = [2]Faults{}
	p.reject = false
	p.mu.Unlock()
}

// Stats returns counters so far.
func (p *Proxy) Stats() Stats {
	s := Stats{Accepted: p.accepted.Load(), Rejected: p.rejected.Load(), Cut: p.cut.Load()}
	for d := range 2 {
		s.Forwarded[d] = p.forwarded[d].Load()
		s.Discarded[d] = p.discarded[d].Load()
	}
	return s
}

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to finish.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.CutAll()
	p.wg.Wait()
	if err != nil {
		return fmt.Errorf("faultproxy: close: %w", err)
	}
	return nil
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		p.mu.Lock()
		reject, closed := p.reject, p.closed
		p.mu.Unlock()
		if reject || closed {
			p.rejected.Add(1)
			c.Close()
			continue
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	s, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	l := &link{client: c, server: s}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close()
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(l, Up, c, s) }()
	go func() { defer wg.Done(); p.pipe(l, Down, s, c) }()
	wg.Wait()
	l.close()
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

type chunk struct {
	data    []byte
	release time.Time
}

// forward writes q's chunks to dst at their release times until q is closed
// (true) or a write fails (false).
func (p *Proxy) forward(d Direction, q <-chan chunk, dst net.Conn) bool {
	clk, err := newClock()
	if err != nil {
		clk = nil // time.Sleep, with its coarser precision
	} else {
		defer clk.close()
	}
	var (
		next   chunk
		have   bool // next holds a chunk taken from q but not yet due
		closed bool
		out    net.Buffers
	)
	for !closed {
		if !have {
			ch, ok := <-q
			if !ok {
				return true
			}
			next = ch
		}
		have = false
		if clk == nil || clk.sleepUntil(next.release) != nil {
			if wait := time.Until(next.release); wait > 0 {
				time.Sleep(wait)
			}
		}
		// Everything queued that is due by now goes out in the same write
		// (one writev): under load a direction then costs one wake-up and
		// one syscall per batch, not per chunk.
		out = append(out[:0], next.data)
		n := len(next.data)
		now := time.Now()
	coalesce:
		for {
			select {
			case ch, ok := <-q:
				if !ok {
					closed = true
					break coalesce
				}
				if ch.release.After(now) {
					next, have = ch, true
					break coalesce
				}
				out = append(out, ch.data)
				n += len(ch.data)
			default:
				break coalesce
			}
		}
		bufs := out // WriteTo consumes its receiver; out keeps the backing array
		if _, err := bufs.WriteTo(dst); err != nil {
			return false
		}
		clear(out) // let the chunks' bytes be collected
		p.forwarded[d].Add(int64(n))
	}
	return true
}

// pipe copies src to dst for one direction. A reader stamps each chunk with
// its release time and queues it; a writer forwards chunks as soon as they are
// due, waiting on a timerfd clock (precise to tens of microseconds, where
// time.Sleep rounds sub-millisecond waits up to a millisecond or more) and
// coalescing every chunk already due into one write. EOF is passed on as a
// half-close once the queued bytes are out; an error on either side resets
// the whole link, as a real connection reset would.
func (p *Proxy) pipe(l *link, d Direction, src, dst net.Conn) {
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if !p.forward(d, q, dst) {
			l.close()
			for range q { // drain so the reader never blocks
			}
		}
	}()
	var last time.Time
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			f := p.faults[d]
			var jitter time.Duration
			if f.Jitter > 0 {
				jitter = time.Duration(p.rng.Int64N(int64(f.Jitter)))
			}
			p.mu.Unlock()
			if f.Blackhole {
				p.discarded[d].Add(int64(n))
			} else {
				release := time.Now().Add(f.Delay + jitter)
				if release.Before(last) {
					release = last // bytes keep their order
				}
				last = release
				q <- chunk{data: append([]byte(nil), buf[:n]...), release: release}
			}
		}
		if err != nil {
			close(q)
			<-done
			if !errors.Is(err, io.EOF) {
				l.close()
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
	}
}
