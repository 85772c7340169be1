package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// pool is a set of pipelined connections that calls share: a Client's own
// (the leader of a single group, found through the addresses given to Dial
// and -MOVED), and in a cluster one per node the slot map routes keys to
// (route.go). It is one mechanism for both: a pool with a fixed address
// (fixed) never follows a -MOVED, the slot map decides where calls go.
type pool struct {
	c     *Client
	addrs []string // where conn looks when no leader is known
	slots []slot
	next  atomic.Uint32
	// leader is the node the last -MOVED named (nil: none known). Slots whose
	// connection goes elsewhere move to it on their next call. Nil for ever
	// in a pool of one node (route.go).
	leader atomic.Pointer[string]
	// aware: the pool's connections say READWRITE when they open, which
	// makes them a Redis Cluster client's at the server (docs/cluster.md):
	// a call of any kind for a slot the node does not lead is answered
	// -MOVED <slot> <addr> instead of forwarded, so a stale slot map is
	// noticed by plain reads too, not only by calls that ask for redirects.
	aware bool
	// txs are the connections transactions run on at this pool's node
	// (txn.go): in a cluster, a transaction goes to its first key's group's
	// leader's pool, as a keyed call does.
	txs txConns
}

func newPool(c *Client, addrs []string, size int, aware bool) *pool {
	p := &pool{}
	p.init(c, addrs, size, aware)
	return p
}

func (p *pool) init(c *Client, addrs []string, size int, aware bool) {
	p.c, p.addrs, p.slots, p.aware = c, addrs, make([]slot, size), aware
}

func (p *pool) close() {
	p.txs.close()
	for i := range p.slots {
		p.slots[i].close()
	}
}

type slot struct {
	mu sync.Mutex // serialises dialing for this slot
	c  *conn
	// calls counts the calls in progress on this slot, dialing included
	// (pick); failedAt is when its last dial failed (unix nanoseconds, 0:
	// it did not).
	calls    atomic.Int32
	failedAt atomic.Int64
	live     atomic.Bool // its connection worked at its last use (connFor)
}

// slotFailPause is how long pick avoids a slot whose dial failed while
// another slot may serve: an idle-looking slot that cannot connect would
// otherwise draw every call (a server at its connection limit, a node down).
const slotFailPause = time.Second

// pick returns the slot for a call's first attempt: the one with the fewest
// calls in progress, ties going round robin from next, passing over slots
// whose dial failed within slotFailPause. A server answers a connection's
// pipelined commands in order, so one slow command — a sync write waiting
// for its fsync, a read waiting for durability — holds every reply behind
// it; round robin sends 1/n of new calls onto that queue, while the least
// busy connection is usually one that is not stuck. (A call whose caller
// gave up no longer counts, though its command may still be queued.)
func (p *pool) pick() int {
	n := len(p.slots)
	start := int((p.next.Add(1) - 1) % uint32(n))
	var now int64 // read only if a slot failed: every call passes here
	best, bestCalls := -1, int32(0)
	for k := 0; k < n; k++ {
		i := (start + k) % n
		sl := &p.slots[i]
		if f := sl.failedAt.Load(); f != 0 {
			if now == 0 {
				now = time.Now().UnixNano()
			}
			if now-f < int64(slotFailPause) {
				continue
			}
		}
		if v := sl.calls.Load(); best < 0 || v < bestCalls {
			best, bestCalls = i, v
			if v == 0 {
				break
			}
		}
	}
	if best < 0 {
		return start // every slot failed lately: try again in turn
	}
	return best
}

// connFor returns slot i's connection with the slot's call count raised
// (the caller lowers it when the call ends). If slot i cannot connect, it is
// marked failed (pick then passes it over for a while) and a slot whose
// connection was live at its last use serves instead, if there is one:
// another connection of the pool may well work while this one cannot be
// opened (a server at its connection limit). Slots never dialed or failed
// are not tried here, so an unreachable cluster costs one dial per call.
func (p *pool) connFor(ctx context.Context, i int) (*slot, *conn, error) {
	sl := &p.slots[i]
	cn, err := p.use(ctx, sl)
	if err == nil || errors.Is(err, ErrAuth) || errors.Is(err, ErrClosed) {
		return sl, cn, err
	}
	for k := 1; k < len(p.slots); k++ {
		if alt := &p.slots[(i+k)%len(p.slots)]; alt.live.Load() {
			if acn, aerr := p.use(ctx, alt); aerr == nil {
				return alt, acn, nil
			}
		}
	}
	return sl, nil, err
}

// use returns slot sl's connection with the slot's call count raised, and
// records whether it could connect (live, failedAt).
func (p *pool) use(ctx context.Context, sl *slot) (*conn, error) {
	sl.calls.Add(1)
	cn, err := p.conn(ctx, sl)
	if err != nil {
		sl.calls.Add(-1)
		sl.failedAt.Store(time.Now().UnixNano())
		sl.live.Store(false)
		return nil, err
	}
	// Loads first: every call passes here, and a store each time would bounce
	// the slot's cache line between the callers' cores for nothing.
	if sl.failedAt.Load() != 0 {
		sl.failedAt.Store(0)
	}
	if !sl.live.Load() {
		sl.live.Store(true)
	}
	return cn, nil
}

// conn returns slot s's connection, dialing it if it is missing or dead.
func (p *pool) conn(ctx context.Context, s *slot) (*conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.c.closed.Load() {
		return nil, ErrClosed
	}
	hint := p.leader.Load()
	if s.c != nil && s.c.healthy() && (hint == nil || s.c.addr == *hint) {
		return s.c, nil
	}
	if hint != nil {
		cn, err := p.c.dialAs(ctx, *hint, p.aware)
		if err == nil {
			if s.c != nil {
				s.c.closeWhenIdle()
			}
			s.c = cn
			return cn, nil
		}
		if errors.Is(err, ErrAuth) {
			return nil, err
		}
		p.leader.CompareAndSwap(hint, nil) // it is gone; find another node
	}
	if s.c != nil && s.c.healthy() {
		return s.c, nil
	}
	var errs []error
	for _, addr := range p.addrs {
		cn, err := p.c.dialAs(ctx, addr, p.aware)
		if err == nil {
			s.c = cn
			return cn, nil
		}
		if errors.Is(err, ErrAuth) {
			return nil, err
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, errors.Join(errs...))
}
