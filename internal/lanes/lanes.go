// Package lanes gives writes their request ids, for every sender that draws
// its own: the Go client (client/lanes.go) and a node forwarding a plain
// client's write to its leader (internal/cluster/forward.go).
//
// A replica group's client table (docs/design/client-table.md) keeps, per
// client id, only the latest executed request number and its result: a retry
// of request n is answered from the table while n is the latest, and refused
// as stale once n+1 executed. That is at-most-once only for a sender with one
// request of an id outstanding at a time. So every write takes a lane: a
// random client id and its request counter, used by one write at a time. The
// write's request id is (lane id, next number), kept across all its retries,
// and the lane goes back to the pool only once the write's outcome is settled
// (a reply, or it was not sent to a node that could run it). A lane whose
// write's outcome is unknown is dropped, not put back: the request may still
// be queued somewhere. The pool holds as many lanes as writes were ever in
// flight at once, so the tables hold that many ids per sender.
package lanes

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
)

// Lane is a client id and its request counter, used by one write at a time.
type Lane struct {
	ID  uint64
	Seq uint64
}

// Next advances the lane's counter and returns the request number for the
// write that took the lane.
func (l *Lane) Next() uint64 {
	l.Seq++
	return l.Seq
}

// Pool is a sender's free lanes. The zero value is ready to use.
type Pool struct {
	mu     sync.Mutex
	free   []*Lane
	closed bool
}

// Get returns a free lane (a new one if none is free), or nil once the pool
// is closed.
func (p *Pool) Get() *Lane {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if n := len(p.free); n > 0 {
		l := p.free[n-1]
		p.free = p.free[:n-1]
		return l
	}
	return &Lane{ID: RandomID()}
}

// Put returns a lane whose write's outcome is settled.
func (p *Pool) Put(l *Lane) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.free = append(p.free, l)
	}
}

// Close empties the pool; Get returns nil from now on.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.free = nil
}

// RandomID returns a random non-zero request client id.
func RandomID() uint64 {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic("lanes: crypto/rand failed: " + err.Error())
		}
		if id := binary.LittleEndian.Uint64(b[:]); id != 0 {
			return id
		}
	}
}
